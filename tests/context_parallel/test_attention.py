"""Attention over blocks of keys, in one process: two partial results merge into the
attention over both, in any grouping, safe from overflow; the causal rule of a block;
the blocks' backward shares add up to autograd's gradients."""

import pytest
import torch

from multigpu.context_parallel import (
    block_attention,
    block_attention_backward,
    causal_block_kind,
    make_attention_case,
    merge_partials,
    reference_attention,
)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_two_blocks_merge_into_the_attention_over_both(dtype):
    case = make_attention_case(10, causal=False, dtype=dtype)
    q, k, v = case.q, case.k, case.v
    reference = reference_attention(q, k, v, causal=False)
    a = block_attention(q, k[..., :3, :], v[..., :3, :])
    b = block_attention(q, k[..., 3:, :], v[..., 3:, :])
    out, lse = merge_partials(*a, *b)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert (out - reference).abs().max() < tolerance
    scores = q @ k.transpose(-2, -1) / 2  # head_dim 4
    assert (lse - scores.logsumexp(-1)).abs().max() < tolerance


def test_merging_in_any_grouping_gives_the_same_result():
    case = make_attention_case(9, causal=False)
    blocks = [
        block_attention(case.q, case.k[..., s, :], case.v[..., s, :])
        for s in (slice(0, 3), slice(3, 5), slice(5, 9))
    ]
    left = merge_partials(*merge_partials(*blocks[0], *blocks[1]), *blocks[2])
    right = merge_partials(*blocks[0], *merge_partials(*blocks[1], *blocks[2]))
    assert (left[0] - right[0]).abs().max() < 1e-14
    reference = reference_attention(case.q, case.k, case.v, causal=False)
    assert (left[0] - reference).abs().max() < 1e-12


def test_the_merge_stays_finite_where_the_exponentials_overflow():
    case = make_attention_case(6, causal=False)
    a = block_attention(case.q * 300, case.k[..., :3, :], case.v[..., :3, :])
    b = block_attention(case.q * 300, case.k[..., 3:, :], case.v[..., 3:, :])
    assert torch.isinf(torch.exp(a[1])).any()  # exp of a log-sum-exp overflows
    out, lse = merge_partials(*a, *b)
    reference = reference_attention(case.q * 300, case.k, case.v, causal=False)
    assert torch.isfinite(lse).all() and (out - reference).abs().max() < 1e-12


def test_an_empty_partial_result_merges_as_nothing():
    case = make_attention_case(4, causal=False)
    a = block_attention(case.q, case.k, case.v)
    empty = (torch.zeros_like(a[0]), torch.full_like(a[1], float("-inf")))
    out, lse = merge_partials(*empty, *a)
    assert torch.equal(out, a[0]) and torch.equal(lse, a[1])
    out, lse = merge_partials(*empty, *empty)
    assert torch.equal(out, empty[0]) and torch.equal(lse, empty[1])


@pytest.mark.parametrize(
    ("queries", "keys", "kind"),
    [
        (range(4, 8), range(0, 4), "full"),
        (range(0, 4), range(4, 8), "skip"),
        (range(4, 8), range(4, 8), "causal"),
        (range(14, 16), range(2, 4), "full"),
        (range(0, 2), range(12, 14), "skip"),
        (range(5, 6), range(5, 6), "full"),  # one token sees itself: no mask
    ],
)
def test_the_causal_kind_of_a_block(queries, keys, kind):
    assert causal_block_kind(queries, keys) == kind


def test_a_causal_block_masks_the_future_only():
    case = make_attention_case(6, causal=True)
    out, _ = block_attention(case.q, case.k, case.v, "causal", range(6), range(6))
    assert (out - reference_attention(case.q, case.k, case.v, True)).abs().max() < 1e-12


@pytest.mark.parametrize("causal", [False, True])
def test_the_blocks_backward_shares_add_up_to_autograds_gradients(causal):
    case = make_attention_case(8, causal=causal)
    q, k, v = (t.clone().requires_grad_() for t in (case.q, case.k, case.v))
    out = reference_attention(q, k, v, causal)
    out.backward(case.grad_out)
    _, lse = block_attention(case.q, case.k, case.v, "causal" if causal else "full",
                             range(8), range(8))  # fmt: skip
    delta = (case.grad_out * out.detach()).sum(-1)
    grads = [torch.zeros_like(case.q) for _ in range(3)]
    for keys in (range(0, 3), range(3, 8)):
        kind = causal_block_kind(range(8), keys) if causal else "full"
        dq, dk, dv = block_attention_backward(
            case.q, case.k[..., keys.start : keys.stop, :],
            case.v[..., keys.start : keys.stop, :], kind, range(8), keys, lse,
            case.grad_out, delta,
        )  # fmt: skip
        grads[0] += dq
        grads[1][..., keys.start : keys.stop, :] = dk
        grads[2][..., keys.start : keys.stop, :] = dv
    for mine, autograd in zip(grads, (q.grad, k.grad, v.grad)):
        assert (mine - autograd).abs().max() < 1e-12
