"""Shared test set-up: the `gpu` marker skips unless enough CUDA devices exist.

Mark a test that needs N GPUs with ``@pytest.mark.gpu(N)`` (``gpu`` alone means 1),
never with a ``skipif`` that counts devices; see docs/architecture.md, "A test".
"""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        needed = marker.args[0] if marker.args else 1
        if count < needed:
            item.add_marker(
                pytest.mark.skip(reason=f"needs {needed} CUDA GPU(s), found {count}")
            )
