"""Tests for multigpu.cluster.pin: the private APIs run only on the torch release
they are taught on, and any other release is refused in one line."""

import pytest
import torch

from multigpu.cluster.pin import TAUGHT_ON, check_torch_version


def test_the_installed_torch_is_the_one_taught_on():
    assert torch.__version__.split("+")[0] == TAUGHT_ON
    assert check_torch_version() == torch.__version__


def test_a_local_build_tag_is_accepted():
    assert check_torch_version(f"{TAUGHT_ON}+cpu") == f"{TAUGHT_ON}+cpu"


@pytest.mark.parametrize("version", ["2.15.0", "2.14.0+cu128", "2.13.1"])
def test_another_release_is_refused_in_one_line(version):
    with pytest.raises(RuntimeError, match=f"install torch=={TAUGHT_ON}") as error:
        check_torch_version(version)
    assert "\n" not in str(error.value)
    assert version in str(error.value)
