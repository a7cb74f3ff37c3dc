"""Activation checkpointing on a stack of blocks: gradients bit for bit those
without it, the bytes saved for backward (counted with saved-tensor hooks) equal to
the formula for none, every block, every k-th block and √n segments, both what
forward keeps and the peak over forward and backward (recomputation included); for
a block that saves 5 times its input, checkpointing every block peaks lower than √n
segments; with FSDP by hand, the per-rank ledger against the formula."""

import pytest
import torch
from torch.nn import functional as F

from multigpu.costmodel.fsdp import (
    best_checkpoint_segment,
    checkpointed_activation_bytes,
    checkpointed_peak_bytes,
    fsdp_memory_ledger,
    sqrt_rule_segment,
)
from multigpu.fsdp import SavedActivations, make_block_stack, parameter_storages
from tests.fsdp.conftest import STACK_SETTINGS, STACK_SIZE, STEPS

BLOCKS, WIDTH, BATCH = 9, 8, 16
CASES = [(0, 1), (1, 1), (2, 1), (3, 1), (1, 3), (2, 3)]  # (every, segment)


def run(every, segment):
    """(bytes held from forward to backward, bytes alive after backward,
    gradients, peak bytes over the step) of one step."""
    torch.manual_seed(0)
    stack = make_block_stack(BLOCKS, WIDTH, every, segment)
    X = torch.randn(BATCH, WIDTH)
    y = torch.randint(0, WIDTH, (BATCH,))
    with SavedActivations(parameter_storages(stack.parameters())) as saved:
        output = stack(X)
    held = saved.alive_bytes
    F.cross_entropy(output, y).backward()  # the loss's own tensors: not counted
    grads = [p.grad for p in stack.parameters()]
    return held, saved.alive_bytes, grads, saved.peak_bytes


@pytest.mark.parametrize("every,segment", CASES)
def test_checkpointing_saves_what_the_formula_says_and_changes_no_gradient(
    every, segment
):
    held, after, grads, peak = run(every, segment)
    _, _, plain, _ = run(0, 1)
    numbers = BATCH * WIDTH  # one (B, width) tensor
    sizes = (BLOCKS, 5 * numbers * 4, numbers * 4, every, segment)
    assert held == checkpointed_activation_bytes(*sizes)
    assert peak == checkpointed_peak_bytes(*sizes)  # in backward, recomputed
    assert after == 0  # autograd let go of everything after backward
    assert all(torch.equal(a, b) for a, b in zip(grads, plain))


def test_the_sqrt_rule_keeps_least_but_peaks_higher_for_this_block():
    assert sqrt_rule_segment(9) == 3 and sqrt_rule_segment(16) == 4
    cases = [(0, 1), (1, 1), (1, 3)]
    held, peaks = {}, {}
    for case in cases:
        held[case], _, _, peaks[case] = run(*case)
    u = BATCH * WIDTH * 4  # bytes of one block's input
    assert held == {(0, 1): 45 * u, (1, 1): 9 * u, (1, 3): 3 * u}
    # backward of the last segment: the inputs before it, and it whole again
    assert peaks == {(0, 1): 45 * u, (1, 1): (8 + 5) * u, (1, 3): (2 + 15) * u}
    assert best_checkpoint_segment(BLOCKS, 5 * u, u) == 1  # a block: 5x its input
    # a block that saves as much as its input: √n segments reach the best peak
    best = best_checkpoint_segment(BLOCKS, u, u)
    sqrt_peak = checkpointed_peak_bytes(BLOCKS, u, u, 1, sqrt_rule_segment(BLOCKS))
    assert sqrt_peak == checkpointed_peak_bytes(BLOCKS, u, u, 1, best) == 5 * u


def test_the_peak_formula_worked_out_by_hand():
    # 9 blocks of 5 bytes saved, inputs of 1: (every, segment) -> peak
    expected = {(0, 1): 45, (1, 1): 13, (2, 1): 29, (3, 1): 33, (1, 3): 17}
    for (every, segment), peak in expected.items():
        assert checkpointed_peak_bytes(9, 5, 1, every, segment) == peak
    assert checkpointed_peak_bytes(1, 5, 1, 1, 1) == 5  # one block: recomputed whole


def test_fsdp_with_checkpointing_matches_the_ledger_formula(fsdp_runs):
    world_size, histories, _ = fsdp_runs
    blocks, width = STACK_SIZE
    batch = 12 // world_size
    numbers = batch * width * 4
    plain = histories[("stack", "none")]
    for name, (every, segment) in STACK_SETTINGS.items():
        ranks = histories[("stack", name)]
        numel = sum(ranks[0].unit_numels)
        activations = checkpointed_peak_bytes(  # the peak, in backward
            blocks, 5 * numbers, numbers, every, segment
        )
        formula = fsdp_memory_ledger(
            numel,
            world_size,
            ranks[0].unit_numels,
            depth=1,
            activation_bytes=activations,
        )
        for history in ranks:
            assert history.ledger["activations"] == formula["activations"], name
            assert history.ledger["gathered"] == formula["gathered"], name
            for other, mine in zip(plain, ranks):  # the same training, bit for bit
                assert all(
                    torch.equal(mine.parameters[n], other.parameters[n])
                    for n in other.parameters
                )
                assert mine.bytes_sent == other.bytes_sent  # no extra all-gather
        for category in ("parameters", "gradients", "optimizer"):
            held = sum(h.ledger[category] for h in ranks)
            assert held == world_size * formula[category], (name, category)
    assert len(plain[0].step_loss) == STEPS
