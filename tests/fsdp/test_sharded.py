"""FSDPByHand trains like one process on the hard cases (tests/hard_cases.py) at 2
and 3 ranks: float64 to 1e-12, float32 to 1e-6 (the ranks add their gradients in
another order; at 2 ranks the same additions in one process match bit for bit, and
on one rank it is bit for bit the plain model); bf16 within a bound of one process
and of FSDP2 under the same policy. Bytes sent and gathered bytes equal the
formulas of multigpu.costmodel.fsdp. A unit first used after the first forward
trains; a parameter no forward reads keeps grad None, as in one process and FSDP2."""

import copy

import pytest
import torch
from torch.nn import functional as F

from multigpu import fsdp, zero
from multigpu.costmodel.fsdp import (
    fsdp_bytes_per_parameter,
    fsdp_bytes_sent_per_rank,
    fsdp_peak_gathered_bytes,
    fsdp_prefetch_overhead_bytes,
)
from multigpu.ranks import fsdp as fsdp_ranks
from multigpu.runtime.launch import spawn
from tests.fsdp import ranks
from tests.fsdp.conftest import (
    CONFIG,
    HARD_CASES,
    REFUSAL_OPTIONS,
    SETTINGS,
    STEP_REFUSALS,
    STEPS,
    TIMEOUT,
    UNREAD_SAMPLES,
    mlp,
)
from tests.hard_cases import (
    DTYPES,
    assert_kept,
    hard_case_data,
    hard_case_model,
    never_gradient_numel,
    unread_parameter_model,
)

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}  # measured: ~1e-16, ~2e-7
BF16_FROM_ONE_PROCESS = 0.02  # measured: 0.0067 (2 ranks), 0.0070 (3 ranks)
BF16_FROM_FSDP2 = 1e-6  # measured: 0.0 at 2 and 3 ranks


def difference(result, reference, names):
    return max((result[n] - reference[n]).abs().max().item() for n in names)


def last_forward_order(case, dtype):
    """The units of plan_units in the order a second forward in one process runs
    them: one the first forward skips runs there."""
    model = case.build(dtype)
    X, _ = hard_case_data(dtype=dtype)
    model(X)
    order = []
    for index, names in enumerate(fsdp.plan_units(model)):
        first = model.get_submodule(names[0])
        first.register_forward_pre_hook(lambda *_, i=index: order.append(i))
    model(X)
    return order


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fsdp_by_hand_trains_like_one_process_on_the_hard_cases(fsdp_runs, dtype):
    world_size, histories, _ = fsdp_runs
    X, y = hard_case_data(dtype=dtype)
    for case in HARD_CASES:
        start = case.build(dtype, seed=0)
        reference = zero.train_one_process_adam(start, X, y, CONFIG)
        names = list(start.state_dict())
        moved = difference(reference.parameters, start.state_dict(), names)
        assert moved > 100 * TOLERANCE[dtype]  # training did move the weights
        assert len(histories[(case.name, dtype)]) == world_size
        order = last_forward_order(case, dtype)
        for history in histories[(case.name, dtype)]:
            assert len(history.step_loss) == STEPS
            gap = difference(history.parameters, reference.parameters, names)
            assert gap <= TOLERANCE[dtype], (case.name, gap)
            assert_kept(case, start.state_dict(), history.parameters)
            assert history.forward_order == order, case.name  # the last forward's
        losses = torch.tensor(
            [h.step_loss for h in histories[(case.name, dtype)]], dtype=torch.float64
        )
        assert torch.allclose(
            losses.mean(0).to(dtype),
            torch.tensor(reference.step_loss, dtype=dtype),
            rtol=0,
            atol=100 * TOLERANCE[dtype],
        )


def test_the_float32_difference_is_the_order_of_additions(fsdp_runs):
    world_size, histories, _ = fsdp_runs
    if world_size != 2:
        pytest.skip("with 3 ranks the ring adds in another order than rank order")
    X, y = hard_case_data(dtype=torch.float32)
    start = hard_case_model(torch.float32)
    reference = fsdp.train_ranks_arithmetic_adam(start, X, y, CONFIG, world_size)
    plain = zero.train_one_process_adam(start, X, y, CONFIG).parameters
    for history in histories[("TiedFrozenNet", torch.float32)]:
        for name in reference:
            assert torch.equal(history.parameters[name], reference[name]), name
        assert not all(torch.equal(history.parameters[n], plain[n]) for n in plain)


def test_on_one_rank_fsdp_by_hand_is_the_plain_model_bit_for_bit():
    X, y = hard_case_data(dtype=torch.float32)
    start = hard_case_model(torch.float32)
    runs = [(start, X, y, CONFIG, {"depth": 1})]
    (history,) = spawn(fsdp_ranks.fsdp_runs_rank, 1, runs, timeout=TIMEOUT)[0]
    reference = zero.train_one_process_adam(start, X, y, CONFIG)
    for name, value in reference.parameters.items():
        assert torch.equal(history.parameters[name], value), name


def test_bytes_sent_and_gathered_equal_the_formulas(fsdp_runs):
    world_size, histories, _ = fsdp_runs
    for setting, options in SETTINGS.items():
        param_bytes = 2 if "param_dtype" in options else 4
        reshard = options.get("reshard_after_forward", True)
        for history in histories[(setting, torch.float32)]:
            order = [history.unit_numels[i] for i in history.forward_order]
            assert order == [112, 272, 272, 272, 51]
            sent = fsdp_bytes_sent_per_rank(
                order, world_size, history.rank, param_bytes, 4, reshard
            )
            assert history.bytes_sent == [sent] * STEPS, setting
            peak = fsdp_peak_gathered_bytes(
                order, options["depth"], param_bytes, reshard
            )
            assert history.peak_gathered_bytes == peak, setting
            assert history.ledger["gathered"] == peak
    peaks = [
        histories[(f"depth {d}", torch.float32)][0].peak_gathered_bytes
        for d in range(3)
    ]
    assert peaks == [272 * 4, 544 * 4, 816 * 4]  # grows with depth
    units = [112, 272, 272, 272, 51]
    for depth in (1, 2):
        overhead = fsdp_prefetch_overhead_bytes(units, depth, 4)
        assert peaks[depth] - peaks[0] == overhead
    bf16 = histories[("bf16 depth 1", torch.float32)][0]
    assert bf16.peak_gathered_bytes * 2 == peaks[1]  # half the bytes in flight
    fp32_sent = histories[("depth 1", torch.float32)][0].bytes_sent[0]
    gathered = fsdp_bytes_sent_per_rank([112, 272, 272, 272, 51], world_size, 0, 4, 0)
    assert bf16.bytes_sent[0] == fp32_sent - gathered // 2  # all-gathers halved


def test_each_rank_keeps_its_share_of_master_weights_gradients_and_adam(fsdp_runs):
    world_size, histories, _ = fsdp_runs
    numel = sum(p.numel() for p in mlp().parameters())
    per_parameter = fsdp_bytes_per_parameter(world_size)
    for setting in SETTINGS:
        ranks = histories[(setting, torch.float32)]
        for category in ("parameters", "gradients", "optimizer"):
            held = sum(h.ledger[category] for h in ranks)
            assert held == world_size * per_parameter[category] * numel, category


def test_frozen_and_unused_parameters_get_no_optimizer_state(fsdp_runs):
    """As Adam in one process: no state for a frozen parameter, nor for one that
    never gets a gradient (never used, never read)."""
    _, histories, _ = fsdp_runs
    for dtype in DTYPES:
        for case in HARD_CASES:
            held = sum(h.ledger["optimizer"] for h in histories[(case.name, dtype)])
            model = case.build(dtype)
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            element = torch.finfo(dtype).bits // 8
            expected = 2 * element * (trainable - never_gradient_numel(case, model))
            assert held == expected, case.name  # 2 moments


def test_a_parameter_no_forward_reads_keeps_grad_none(fsdp_runs):
    """As in one process and FSDP2, so weight decay leaves it where it was."""
    _, histories, _ = fsdp_runs
    X, y = hard_case_data(UNREAD_SAMPLES, dtype=torch.float64)
    start = unread_parameter_model()
    model = copy.deepcopy(start)  # one process, on the whole batch
    optimizer = torch.optim.Adam(
        model.parameters(), lr=CONFIG.lr, weight_decay=ranks.WEIGHT_DECAY
    )
    for step in range(ranks.STEPS):
        optimizer.zero_grad()
        F.cross_entropy(model(X), y).backward()
        if step == 0:
            none = {name: p.grad is None for name, p in model.named_parameters()}
        optimizer.step()
    assert [name for name, is_none in none.items() if is_none] == [
        "block.spare.weight",
        "block.spare.bias",
    ]
    reference = model.state_dict()
    for by_hand, weights, fsdp2 in histories["unread parameter"]:
        assert by_hand == none
        assert fsdp2 == none
        assert difference(weights, reference, list(reference)) <= 1e-12
        assert torch.equal(weights["block.spare.weight"], start.block.spare.weight)


def test_a_unit_some_ranks_skip_is_refused_by_name_on_every_rank(fsdp_runs):
    """The ranks compare which unit they move before each collective, on the
    collective stream: with or without prefetching, the unit is named on every
    rank at once and no rank is left waiting (the launch returned)."""
    _, histories, _ = fsdp_runs
    assert STEP_REFUSALS, "the registry has a case FSDP by hand refuses in a step"
    for case, refusal in STEP_REFUSALS:
        for options in REFUSAL_OPTIONS:
            results = histories[("refused", case.name, options["depth"])]
            messages = [r.get("refused", "") for r in results]
            assert all(
                m.startswith("ValueError: FSDP by hand: the ranks are")
                for m in messages
            ), messages
            assert all(refusal.words in m and "\n" not in m for m in messages)
            assert len(set(messages)) == 1  # the same words on every rank


def test_bf16_is_bounded_from_one_process_and_matches_fsdp2(fsdp_runs):
    world_size, histories, _ = fsdp_runs
    X, y = hard_case_data(dtype=torch.float32)
    start = hard_case_model(torch.float32)
    reference = zero.train_one_process_adam(start, X, y, CONFIG).parameters
    names = [n for n, _ in start.named_parameters()]
    for mine, theirs in zip(
        histories[("TiedFrozenNet bf16", torch.float32)], histories["FSDP2 bf16"]
    ):
        assert mine.parameters["encode.weight"].dtype == torch.float32  # fp32 master
        ours = difference(mine.parameters, reference, names)
        assert 1e-4 < ours <= BF16_FROM_ONE_PROCESS  # bf16 does show
        assert difference(theirs.parameters, reference, names) <= BF16_FROM_ONE_PROCESS
        assert difference(mine.parameters, theirs.parameters, names) <= BF16_FROM_FSDP2
        assert torch.equal(mine.parameters["frozen.weight"], start.frozen.weight)


def test_a_forgotten_wait_and_a_negative_depth_are_refused(fsdp_runs):
    _, _, reports = fsdp_runs
    assert reports[0][0] == [
        "Unit 0 is about to compute its forward, but its all-gather was not waited "
        "for, so its parameters may not have arrived. The prefetch function must "
        "call .wait() on the handle of the unit that computes now (order[position]).",
        "depth must be an integer of at least 0, got -1. Pass how many units ahead "
        "to all-gather, e.g. depth=0 (none) or depth=1.",
    ]
