"""The small problem the tests of multigpu.zero share (and 13's exercise checker's):
an MLP of 1,573 parameters (a prime: unequal shards from 2 ranks on) and 128
samples, trained for 4 Adam steps in float64."""

import torch

from multigpu import zero
from multigpu.core.train import TrainConfig

CONFIG = TrainConfig(epochs=1, batch_size=32, lr=0.01)  # 128 samples: 4 Adam steps
STEPS = 4
TIMEOUT = 60.0  # generous: the test machine may be shared
EXACT = dict(rtol=0, atol=1e-12)  # float64: the ranks add in another order, ~1e-16


def model_and_data(sizes=(10, 32, 32, 5)):
    torch.manual_seed(0)
    data = zero.make_data(128, in_features=sizes[0], num_classes=sizes[-1])
    return zero.make_mlp(sizes), *data
