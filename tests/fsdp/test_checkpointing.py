"""Activation checkpointing on a stack of blocks: gradients bit for bit those
without it, the bytes saved for backward (counted with saved-tensor hooks) equal to
the formula for none, every block, every k-th block and √n segments; with FSDP by
hand, the per-rank ledger against the formula."""

import pytest
import torch
from torch.nn import functional as F

from multigpu.costmodel.fsdp import (
    checkpointed_activation_bytes,
    fsdp_memory_ledger,
    sqrt_rule_segment,
)
from multigpu.fsdp import SavedActivations, make_block_stack, parameter_storages
from tests.fsdp.conftest import STACK_SETTINGS, STACK_SIZE, STEPS

BLOCKS, WIDTH, BATCH = 9, 8, 16
CASES = [(0, 1), (1, 1), (2, 1), (3, 1), (1, 3), (2, 3)]  # (every, segment)


def run(every, segment):
    """(bytes held from forward to backward, bytes alive after backward,
    gradients) of one step."""
    torch.manual_seed(0)
    stack = make_block_stack(BLOCKS, WIDTH, every, segment)
    X = torch.randn(BATCH, WIDTH)
    y = torch.randint(0, WIDTH, (BATCH,))
    with SavedActivations(parameter_storages(stack.parameters())) as saved:
        output = stack(X)
    held = saved.alive_bytes
    F.cross_entropy(output, y).backward()
    return held, saved.alive_bytes, [p.grad for p in stack.parameters()]


@pytest.mark.parametrize("every,segment", CASES)
def test_checkpointing_saves_what_the_formula_says_and_changes_no_gradient(
    every, segment
):
    held, after, grads = run(every, segment)
    _, _, plain = run(0, 1)
    numbers = BATCH * WIDTH  # one (B, width) tensor
    expected = checkpointed_activation_bytes(
        BLOCKS, 5 * numbers * 4, numbers * 4, every, segment
    )
    assert held == expected
    assert after == 0  # autograd let go of everything after backward
    assert all(torch.equal(a, b) for a, b in zip(grads, plain))


def test_the_sqrt_rule_and_the_savings_in_numbers():
    assert sqrt_rule_segment(9) == 3 and sqrt_rule_segment(16) == 4
    held = {case: run(*case)[0] for case in [(0, 1), (1, 1), (1, 3)]}
    numbers = BATCH * WIDTH * 4
    assert held == {(0, 1): 45 * numbers, (1, 1): 9 * numbers, (1, 3): 3 * numbers}


def test_fsdp_with_checkpointing_matches_the_ledger_formula(fsdp_runs):
    world_size, histories, _ = fsdp_runs
    blocks, width = STACK_SIZE
    batch = 12 // world_size
    numbers = batch * width * 4
    plain = histories[("stack", "none")]
    for name, (every, segment) in STACK_SETTINGS.items():
        ranks = histories[("stack", name)]
        numel = sum(ranks[0].unit_numels)
        activations = checkpointed_activation_bytes(
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
