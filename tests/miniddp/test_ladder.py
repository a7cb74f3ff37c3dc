"""A model wrapped by a step of the ladder by name (multigpu.miniddp.ladder): bad
arguments say how to fix them."""

import pytest
import torch

from multigpu import miniddp


def test_bad_arguments_say_how_to_fix_them():
    with pytest.raises(ValueError, match="Unknown strategy 'ring'. Choose one of"):
        miniddp.make_ddp(torch.nn.Linear(2, 2), "ring")
    with pytest.raises(ValueError, match="The 'flat' strategy has no buckets"):
        miniddp.make_ddp(torch.nn.Linear(2, 2), "flat", bucket_cap_mb=1)
    with pytest.raises(RuntimeError, match="needs a process group"):
        miniddp.FlatDDP(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        miniddp.BucketedDDP(torch.nn.Linear(2, 2), bucket_cap_mb=0)
