"""What the launches of tests/horovod_api run: the problem's size, the training
configuration and the fusion thresholds."""

from multigpu.core.train import TrainConfig

NUM_SAMPLES = 48  # 3 global batches of 16 per epoch, divisible by 1, 2 and 4 ranks
CONFIG = TrainConfig(epochs=2, batch_size=16, lr=0.2, momentum=0.5, seed=3)
TIMEOUT = 30.0
# About 1 KB, so that ConvNet(width=4)'s float64 gradients (3.4 KB) need several
# fusion buffers; the default (128 MB) holds them all in one.
TINY_MB = 0.001
FORMS = ("state_dict", "named_parameters", "parameters")
