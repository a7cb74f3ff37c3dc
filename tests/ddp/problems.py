"""The small problem every test of multigpu.ddp trains on, and how they compare."""

import torch

from multigpu.core.models import ConvNet
from multigpu.core.train import TrainConfig

NUM_SAMPLES = 48  # 3 global batches of 16 per epoch, divisible by 1, 2 and 4 ranks
CONFIG = TrainConfig(epochs=2, batch_size=16, lr=0.2, momentum=0.5, seed=3)
STEPS = 6  # 2 epochs x 3 steps
EVAL_SAMPLES = 10  # not a multiple of 4 (or of 3): the padded sampler repeats 0, 1
TIMEOUT = 30.0


def make_problem(batch_norm=False):
    torch.manual_seed(0)
    model = ConvNet(in_channels=1, num_classes=3, width=4, batch_norm=batch_norm)
    X = torch.randn(NUM_SAMPLES, 1, 8, 8)
    y = torch.randint(0, 3, (NUM_SAMPLES,))
    return model.double(), X.double(), y


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key, tensor in a.items():
        torch.testing.assert_close(b[key], tensor, rtol=1e-12, atol=1e-12)


# The hard cases (tests/hard_cases.py): 41 samples and a global batch for which the
# sampler's padding would add a step per epoch (7 instead of 6 on 2 and 3 ranks, 11
# instead of 10 on 4), so only the exact sampler equals one process.
HARD_BATCH = {2: 6, 3: 6, 4: 4}
HARD_WORLD_SIZES = (2, 3, 4)


def hard_config(world_size):
    return TrainConfig(
        epochs=2, batch_size=HARD_BATCH[world_size], lr=0.2, momentum=0.5, seed=3
    )
