"""The sampler that starts part-way through an epoch (notebook 11)."""

import pytest

from tests.snapshot.problem import small_sampler


def test_resumable_sampler_continues_with_the_indices_not_yet_used():
    sampler = small_sampler()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        full = list(sampler)
        for start in (0, 3, 10):
            sampler.set_epoch(epoch, start=start)
            assert list(sampler) == full[start:]
            assert len(sampler) == len(full) - start
    assert len(set(map(tuple, [full, list(small_sampler(rank=1))]))) == 2
    with pytest.raises(ValueError, match="outside this rank's 10 indices"):
        sampler.set_epoch(0, start=11)
