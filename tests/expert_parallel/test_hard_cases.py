"""EP x DP meets the hard cases (tests/hard_cases.py): each registry model is the
data-parallel part after a mixture-of-experts layer on the raw features, trained
on 4 ranks (the experts over 2 ranks, twice: both kinds of group) from each
rank's own seed, float32 and float64, with dropped tokens; it must equal one
process started from the weights the ranks agreed on, and keep what the case says
never moves."""

import pytest
import torch

from multigpu.expert_parallel import (
    EPDPCase,
    MoELayer,
    MoEModel,
    assemble_start,
    ep_dp_differences,
    merge_parameters,
)
from multigpu.ranks.expert_parallel import run_ep_dp_cases
from tests.hard_cases import (
    IN_FEATURES,
    NUM_SAMPLES,
    assert_kept,
    case_id,
    cases_for,
    hard_case_data,
)

WRAPPER = "expert_parallel"
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}
LAYOUTS = {"ep 2 x dp 2": 2}  # on ranks 0-3
SIZES = [11, 10, 10, 10]  # the 41 samples, unevenly


def moe_before(case, dtype: torch.dtype, seed: int) -> MoEModel:
    """A mixture of 4 experts (top-2, capacity factor 1.0) on the raw features,
    then ``case``'s model, from ``seed``."""
    torch.manual_seed(seed)
    moe = MoELayer(IN_FEATURES, 8, 4, top_k=2, capacity_factor=1.0).to(dtype)
    return MoEModel(moe, case.build(dtype, seed))


def _cases() -> list[EPDPCase]:
    cases = []
    for case in cases_for(WRAPPER):
        for dtype in (torch.float64, torch.float32):
            X, y = hard_case_data(dtype=dtype)
            for layout, ep in LAYOUTS.items():
                models = [moe_before(case, dtype, 20 + rank) for rank in range(4)]
                name = f"{case.name}, {layout}, {dtype}"
                cases.append(EPDPCase(name, models, X, y, SIZES, (0, 1, 2, 3), ep))
    return cases


@pytest.fixture(scope="module")
def trained():
    """case name -> (the EPDPCase, its ranks' results), all from one launch."""
    cases = _cases()
    results = run_ep_dp_cases(cases)
    return {case.name: (case, result) for case, result in zip(cases, results)}


def test_the_data_do_not_split_evenly():
    assert sum(SIZES) == NUM_SAMPLES and len(set(SIZES)) > 1


@pytest.mark.parametrize("case", cases_for(WRAPPER), ids=case_id)
def test_each_hard_case_trains_like_one_process(trained, case):
    for name, (ep_dp_case, results) in trained.items():
        if not name.startswith(f"{case.name},"):
            continue
        gap, _ = ep_dp_differences(ep_dp_case, results)
        assert gap < TOLERANCE[ep_dp_case.X.dtype], (name, gap)
        start = assemble_start(ep_dp_case.models, ep_dp_case.ep_size)
        trunk_start = {
            k[5:]: v for k, v in start.state_dict().items() if k[:5] == "head."
        }
        merged = merge_parameters(results)
        trunk = {k[5:]: v for k, v in merged.items() if k.startswith("head.")}
        assert_kept(case, trunk_start, trunk, name)  # frozen, unused, tied, ...
