"""The script's last check: the ranks end with the same weights, and finite ones."""

import pytest
import torch

from multigpu import ddp
from tests.ddp.problems import make_problem


def test_the_line_names_the_first_differing_tensor_and_the_ranks():
    names = ["a", "b", "c"]
    same = ["1", "2", "3"]
    assert ddp.weights_disagreement(names, [same, same, same]) is None
    line = ddp.weights_disagreement(
        names, [same, ["1", "x", "y"], same, ["1", "x", "3"]]
    )
    assert line.startswith(
        "every rank holds the same weights: False: b differs between rank 0 and "
        "rank(s) 1, 3 (the first of 2 differing tensor(s) of 3), "
    )


def test_the_same_nan_on_every_rank_agrees_but_is_not_finite():
    weights = {"w": torch.tensor([1.0, float("nan")]), "b": torch.zeros(2)}
    digests = ddp.tensor_digests(weights)
    copy = ddp.tensor_digests({k: v.clone() for k, v in weights.items()})
    assert digests == copy  # the same bytes, though nan != nan
    with pytest.raises(ddp.WeightsDifferError) as error:
        ddp.check_same_weights(weights)  # no process group: this process alone
    assert str(error.value).startswith(
        "every rank holds the same weights: True, but they are not finite (nan or "
        "inf, first in w): training diverged."
    )
    ddp.check_same_weights({"b": torch.zeros(2)})  # finite: passes


@pytest.mark.parametrize("runs", [2, 4], indirect=True, ids=["world2", "world4"])
def test_ranks_with_different_weights_fail_on_every_rank(runs):
    names = list(make_problem()[0].state_dict())
    world_size = len(runs["agree"])
    assert runs["agree"] == [None] * world_size
    odd = ", ".join(str(rank) for rank in range(1, world_size, 2))
    line = (
        f"every rank holds the same weights: False: {names[1]} differs between rank "
        f"0 and rank(s) {odd} (the first of 1 differing tensor(s) of {len(names)}), "
    )
    assert all(text.startswith(line) for text in runs["disagree"]), runs["disagree"]
