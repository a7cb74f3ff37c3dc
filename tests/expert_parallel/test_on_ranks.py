"""Tests for multigpu.expert_parallel on ranks, all from one launch of 4 ranks
(cases of 1, 2, 3 and 4 ranks side by side): the layer by hand equals one process
(float64 within 1e-12, float32 within 1e-6) forward and backward, with dropped
tokens, an expert that gets no token, a rank whose tokens all leave and a rank
with none; 4 experts over 3 ranks are refused by name; the bytes each rank sends
are the formula's; the autograd all-to-all equals PyTorch's; EP x DP training
equals one process, each gradient summed over its own group. A rank that guesses
its receive sizes is aborted by gloo, and the launch ends every rank."""

import functools
import multiprocessing

import pytest
import torch

from multigpu.expert_parallel import (
    all_to_all_bytes,
    assemble_start,
    balanced_all_to_all_bytes,
    capped_all_to_all_bytes,
    ep_dp_differences,
    kept_choices,
    layer_differences,
    layer_in_one_process,
)
from multigpu.ranks.expert_parallel import (
    all_to_all_parity_rank,
    ep_dp_rank,
    ep_layer_rank,
    run_guessed_sizes,
)
from multigpu.runtime.launch import SLOW_TIMEOUT_S, WorkerError, in_one_launch, spawn
from tests.expert_parallel.cases import (
    DIM,
    EXPERTS,
    FROZEN,
    LEAVING,
    TOLERANCE,
    ep_dp_cases,
    layer_cases,
)

LAYER_CASES = layer_cases()
EP_DP_CASES = ep_dp_cases()


@functools.cache
def routing_of(k: int):
    """One process's routing of layer case k (computed once)."""
    return layer_in_one_process(LAYER_CASES[k])["routing"]


@pytest.fixture(scope="module")
def launched():
    """Per case, the results of its ranks; and each rank's parity result."""
    calls = [
        (ep_layer_rank, (LAYER_CASES,)),
        (all_to_all_parity_rank, ()),
        (ep_dp_rank, (EP_DP_CASES,)),
    ]
    per_rank = spawn(in_one_launch, 4, calls, timeout=SLOW_TIMEOUT_S)
    layers = [[per_rank[r][0][k] for r in c.ranks] for k, c in enumerate(LAYER_CASES)]
    ep_dp = [[per_rank[r][2][k] for r in c.ranks] for k, c in enumerate(EP_DP_CASES)]
    return layers, [per_rank[r][1] for r in range(4)], ep_dp


def _equal_cases():
    return [(k, c) for k, c in enumerate(LAYER_CASES) if "refused" not in c.name]


def test_the_layer_on_ranks_equals_one_process(launched):
    layers, _, _ = launched
    table = []
    for k, case in _equal_cases():
        gaps = layer_differences(case, layers[k])
        tolerance = TOLERANCE[case.X.dtype]
        assert max(gaps.values()) < tolerance, (case.name, gaps)
        table.append(f"{case.name}: {max(gaps.values()):.1e}")
    print("\n".join(table))  # pytest -s shows the table


def test_the_cases_hold_every_hard_case_they_name(launched):
    layers, _, _ = launched
    seen = {"dropped": 0, "idle expert": 0, "all leave": 0, "no token": 0}
    for k, case in _equal_cases():
        routing = routing_of(k)
        seen["dropped"] += routing.dropped() > 0
        seen["idle expert"] += int((routing.kept_per_expert() == 0).any())
        local = EXPERTS // len(case.ranks)
        for position, result in enumerate(layers[k]):
            mine = range(position * local, (position + 1) * local)
            sent = result["sent_per_expert"]
            seen["all leave"] += sum(sent) > 0 and sum(sent[e] for e in mine) == 0
            seen["no token"] += case.sizes[position] == 0
    assert seen["dropped"] >= 8 and seen["idle expert"] >= 3, seen
    assert seen["all leave"] >= 3 and seen["no token"] >= 1, seen


def test_experts_not_divisible_by_the_ranks_are_refused_by_name(launched):
    layers, _, _ = launched
    k = next(k for k, c in enumerate(LAYER_CASES) if "refused" in c.name)
    messages = {result["refused"] for result in layers[k]}
    assert messages == {
        "4 experts cannot be split evenly over 3 expert-parallel ranks: each rank "
        "must hold the same number of experts. Use a number of experts divisible by "
        "3, or an expert-parallel size that divides 4."
    }


def _rows_crossing(k, position):
    """(rows sent to other ranks, rows received from them) by ``position``'s rank
    of layer case k, counted from one process's routing of the case."""
    case = LAYER_CASES[k]
    token, expert, _ = kept_choices(routing_of(k))
    starts = [sum(case.sizes[:i]) for i in range(len(case.sizes) + 1)]
    owner_of_token = torch.bucketize(token, torch.tensor(starts[1:-1]), right=True)
    local = EXPERTS // len(case.ranks)
    holder = expert // local
    sent = int(((owner_of_token == position) & (holder != position)).sum())
    received = int(((holder == position) & (owner_of_token != position)).sum())
    return sent, received


def test_the_bytes_sent_are_the_formulas(launched):
    layers, _, _ = launched
    for k, case in _equal_cases():
        size = case.X.element_size()
        for position, result in enumerate(layers[k]):
            counted = sum(record.bytes_to_others for record in result["log"])
            sent, received = _rows_crossing(k, position)
            ep = len(case.ranks)
            assert counted == all_to_all_bytes(sent, received, DIM, size, EXPERTS, ep)
            assert [r.what for r in result["log"]] == [
                "counts", "dispatch", "combine", "combine backward",
                "dispatch backward",
            ]  # fmt: skip
            factor, k_top = case.layer.capacity_factor, case.layer.top_k
            if factor is not None:  # every rank has at most max(sizes) tokens
                n = max(case.sizes)
                bound = capped_all_to_all_bytes(
                    n, k_top, DIM, size, EXPERTS, ep, factor
                )
                assert counted <= bound, case.name
            if "balanced" in case.name:
                n = case.sizes[position]
                formula = balanced_all_to_all_bytes(n, 1, DIM, size, EXPERTS, ep)
                assert counted == formula


def test_the_autograd_all_to_all_equals_pytorchs(launched):
    _, parity, _ = launched
    assert len(parity) == 4
    for result in parity:
        assert result["output"] == 0.0 and result["grad"] == 0.0


def test_ep_x_dp_training_equals_one_process(launched):
    _, _, ep_dp = launched
    for case, results in zip(EP_DP_CASES, ep_dp, strict=True):
        gap, reference = ep_dp_differences(case, results)
        assert gap < TOLERANCE[case.X.dtype], (case.name, gap)
        history = results[0]["history"]
        for ours, theirs in zip(history.losses, reference.losses, strict=True):
            assert abs(ours - theirs) < TOLERANCE[case.X.dtype], case.name
        assert history.chosen_per_expert == reference.chosen_per_expert, case.name
        assert history.kept_per_expert == reference.kept_per_expert, case.name
        start = assemble_start(case.models, case.ep_size).state_dict()
        for name in FROZEN:  # never moves, on every rank that holds it
            holders = [r for r in results if name in r["history"].parameters]
            assert holders, (case.name, name)
            for result in holders:
                tensor = result["history"].parameters[name]
                assert torch.equal(tensor, start[name]), (case.name, name)


def test_each_gradient_is_summed_over_its_own_group(launched):
    _, _, ep_dp = launched
    for case, results in zip(EP_DP_CASES, ep_dp, strict=True):
        for result in results:
            over = result["reduced_over"]
            assert not set(FROZEN) & set(over)  # a frozen parameter has no gradient
            dense = {g for n, g in over.items() if ".experts." not in f".{n}"}
            experts = {g for n, g in over.items() if ".experts." in f".{n}"}
            assert dense == {"world"}, case.name
            dp = len(case.ranks) // case.ep_size
            assert experts == ({"none"} if dp == 1 else {"expert_dp"}), case.name


def test_ranks_that_guess_their_sizes_are_aborted_by_gloo_and_ended():
    with pytest.raises(WorkerError) as error:
        run_guessed_sizes(LEAVING)  # rank 0 expects 2 rows from rank 1, gets 3
    text = str(error.value)
    assert "Rank 0 of 2 was killed by SIGABRT" in text
    assert "48 vs 32. Received data size doesn't match expected size" in text
    assert multiprocessing.active_children() == []
