"""Shared test set-up: the `gpu` marker skips unless enough CUDA devices exist, and
the `slow` marker skips unless ``MULTIGPU_SLOW=1`` is set (``make test-slow``).

Mark a test that needs N GPUs with ``@pytest.mark.gpu(N)`` (``gpu`` alone means 1),
never with a ``skipif`` that counts devices; see docs/architecture.md, "A test".
"""

import os

import pytest
import torch

from multigpu.core.models import ConvNet


def _convnet_problem(num_samples: int = 48, seed: int = 0):
    torch.manual_seed(seed)
    model = ConvNet(in_channels=1, num_classes=3, width=4).double()
    X = torch.randn(num_samples, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 3, (num_samples,))
    return model, X, y


@pytest.fixture(scope="session")
def convnet_problem():
    """A factory of the small float64 problem the training tests share:
    ``convnet_problem(num_samples=48, seed=0)`` gives ConvNet(width=4) for 3 classes
    and ``num_samples`` random 8x8 images, so "equal" means equal to ~1e-15. Each
    call builds new tensors: a test may change what it gets."""
    return _convnet_problem


def pytest_collection_modifyitems(config, items):
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    slow = os.environ.get("MULTIGPU_SLOW") == "1"
    for item in items:
        if item.get_closest_marker("slow") and not slow:
            item.add_marker(pytest.mark.skip(reason="slow: set MULTIGPU_SLOW=1"))
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        needed = marker.args[0] if marker.args else 1
        if count < needed:
            item.add_marker(
                pytest.mark.skip(reason=f"needs {needed} CUDA GPU(s), found {count}")
            )
