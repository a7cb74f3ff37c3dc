"""Answers learners write to 17's exercises, each wrong in one way; correct answers
written another way than the reference; the references of the solutions notebook;
and answers that hand the work to the package."""

import torch
from torch.nn import functional as F

from multigpu import context_parallel as cp
from multigpu.context_parallel import layout_positions as positions_of

# The log-sum-exp merge: merge(out_a, lse_a, out_b, lse_b) -> (out, lse)


def no_running_max(out_a, lse_a, out_b, lse_b):
    """Exponentiates the log-sum-exps themselves: exact until they are large."""
    sum_a, sum_b = torch.exp(lse_a), torch.exp(lse_b)
    total = sum_a + sum_b
    out = (sum_a[..., None] * out_a + sum_b[..., None] * out_b) / total[..., None]
    return out, torch.log(total)


def averages_outputs(out_a, lse_a, out_b, lse_b):
    """Merges the normalised outputs as if the blocks weighed the same."""
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def adds_outputs(out_a, lse_a, out_b, lse_b):
    """Adds the normalised outputs."""
    return out_a + out_b, torch.logaddexp(lse_a, lse_b)


def unnormalised(out_a, lse_a, out_b, lse_b):
    """Weighs each output by its block's sum but never divides by the total."""
    top = torch.maximum(lse_a, lse_b)
    weight_a, weight_b = torch.exp(lse_a - top), torch.exp(lse_b - top)
    out = weight_a[..., None] * out_a + weight_b[..., None] * out_b
    return out, top + torch.log(weight_a + weight_b)


def swapped_weights(out_a, lse_a, out_b, lse_b):
    """Each output weighted by the other block's sum."""
    lse = torch.logaddexp(lse_a, lse_b)
    weight_a, weight_b = torch.exp(lse_a - lse), torch.exp(lse_b - lse)
    return weight_b[..., None] * out_a + weight_a[..., None] * out_b, lse


def max_as_lse(out_a, lse_a, out_b, lse_b):
    """The right output, but the larger log-sum-exp kept as the merged one."""
    lse = torch.logaddexp(lse_a, lse_b)
    weight_a, weight_b = torch.exp(lse_a - lse), torch.exp(lse_b - lse)
    return weight_a[..., None] * out_a + weight_b[..., None] * out_b, torch.maximum(
        lse_a, lse_b
    )


def added_lse(out_a, lse_a, out_b, lse_b):
    """The right output, but the log-sum-exps added."""
    lse = torch.logaddexp(lse_a, lse_b)
    weight_a, weight_b = torch.exp(lse_a - lse), torch.exp(lse_b - lse)
    return weight_a[..., None] * out_a + weight_b[..., None] * out_b, lse_a + lse_b


def in_place(out_a, lse_a, out_b, lse_b):
    """Right numbers, but written into out_a and lse_a."""
    lse = torch.logaddexp(lse_a, lse_b)
    out_a.mul_(torch.exp(lse_a - lse)[..., None])
    out_a.add_(torch.exp(lse_b - lse)[..., None] * out_b)
    lse_a.copy_(lse)
    return out_a, lse_a


def keeps_a_trailing_dim(out_a, lse_a, out_b, lse_b):
    """Right numbers, but the log-sum-exp returned as (..., queries, 1)."""
    lse = torch.logaddexp(lse_a, lse_b)[..., None]
    return torch.exp(lse_a[..., None] - lse) * out_a + torch.exp(
        lse_b[..., None] - lse
    ) * out_b, lse


def sigmoid_form(out_a, lse_a, out_b, lse_b):
    """Correct: PyTorch's own form (torch/distributed/tensor/experimental/
    _context_parallel/_attention.py, _SDPAMerger)."""
    out = out_a - torch.sigmoid(lse_b - lse_a)[..., None] * (out_a - out_b)
    return out, lse_a - F.logsigmoid(lse_a - lse_b)


def logaddexp_form(out_a, lse_a, out_b, lse_b):
    """Correct: torch.logaddexp for the log-sum-exp."""
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.exp(lse_a - lse)[..., None] * out_a
    return out + torch.exp(lse_b - lse)[..., None] * out_b, lse


# The zig-zag positions: zigzag_positions(seq_len, world_size, rank) -> positions


def contiguous_positions(seq_len, world_size, rank):
    """Rank r's contiguous run: correct, but no load balancing."""
    size = seq_len // world_size
    return list(range(rank * size, (rank + 1) * size))


def tail_off_by_one(seq_len, world_size, rank):
    """The tail chunk counted from 2n instead of 2n - 1."""
    size = seq_len // (2 * world_size)
    tail = 2 * world_size - rank
    return list(range(rank * size, (rank + 1) * size)) + list(
        range(tail * size, (tail + 1) * size)
    )


def halves(seq_len, world_size, rank):
    """Chunk r and chunk r + n: both halves cut the same way, still imbalanced."""
    size = seq_len // (2 * world_size)
    other = rank + world_size
    return list(range(rank * size, (rank + 1) * size)) + list(
        range(other * size, (other + 1) * size)
    )


def striped(seq_len, world_size, rank):
    """Round-robin tokens (striped attention's layout): nearly balanced, not equal."""
    return list(range(rank, seq_len, world_size))


def tail_from_the_rank(seq_len, world_size, rank):
    """The tail chunk from the end of the rank's own half: chunk n - 1 - r."""
    size = seq_len // (2 * world_size)
    tail = world_size - 1 - rank
    return list(range(rank * size, (rank + 1) * size)) + list(
        range(tail * size, (tail + 1) * size)
    )


def tail_first(seq_len, world_size, rank):
    """Correct: the same two chunks, the tail listed first."""
    size = seq_len // (2 * world_size)
    tail = 2 * world_size - 1 - rank
    return list(range(tail * size, (tail + 1) * size)) + list(
        range(rank * size, (rank + 1) * size)
    )


def as_a_tensor(seq_len, world_size, rank):
    """Correct: a tensor, with torch.cat of two aranges."""
    size = seq_len // (2 * world_size)
    head = torch.arange(rank * size, (rank + 1) * size)
    return torch.cat([head, seq_len - 1 - head.flip(0)])


# The causal block rule: block_kind(queries, keys) -> "skip", "full" or "causal"


def skips_the_diagonal(queries, keys):
    """Skips a block unless every key is strictly before every query."""
    return "full" if keys[-1] < queries.start else "skip"


def diagonal_unmasked(queries, keys):
    """Skips the future, computes everything else whole."""
    return "skip" if keys.start > queries[-1] else "full"


def never_skips(queries, keys):
    """Masks every block: right numbers, every masked block computed."""
    return "causal"


def reversed_direction(queries, keys):
    """Skips the past instead of the future."""
    if keys[-1] < queries.start:
        return "skip"
    return "full" if keys.start > queries[-1] else "causal"


def misspelt(queries, keys):
    """Returns a kind the ring does not know."""
    return "masked" if keys.start == queries.start else causal_rule(queries, keys)


def chunks_of_four(queries, keys):
    """Tuned to the example's chunks of 4 tokens: a key chunk is in the future when
    it starts 4 positions after the queries."""
    if keys.start >= queries.start + 4:
        return "skip"
    return "causal" if keys.start == queries.start else "full"


def causal_rule(queries, keys):
    """Correct, written with the first positions (the chunks never overlap)."""
    if keys.start > queries.start:
        return "skip"
    return "causal" if keys.start == queries.start else "full"


def masks_the_past_too(queries, keys):
    """Correct: masks every block it computes (the mask hides nothing in the past)."""
    return "skip" if keys.start > queries[-1] else "causal"


# The references, as the solutions notebook writes them


def reference_merge(out_a, lse_a, out_b, lse_b):
    """Correct: the running maximum taken out first."""
    top = torch.maximum(lse_a, lse_b)
    weight_a, weight_b = torch.exp(lse_a - top), torch.exp(lse_b - top)
    total = weight_a + weight_b
    out = (weight_a[..., None] * out_a + weight_b[..., None] * out_b) / total[..., None]
    return out, top + torch.log(total)


def reference_zigzag(seq_len, world_size, rank):
    """Correct: chunk rank and chunk 2n - 1 - rank."""
    size = seq_len // (2 * world_size)
    tail = 2 * world_size - 1 - rank
    head_chunk = range(rank * size, (rank + 1) * size)
    return list(head_chunk) + list(range(tail * size, (tail + 1) * size))


def reference_block_kind(queries, keys):
    """Correct: from both ends of both ranges."""
    if keys.start > queries[-1]:
        return "skip"
    return "full" if keys[-1] <= queries.start else "causal"


# Answers that call the package's own function instead of writing the rule


def calls_the_package_merge(out_a, lse_a, out_b, lse_b):
    return cp.merge_partials(out_a, lse_a, out_b, lse_b)


def calls_the_package_layout(seq_len, world_size, rank):
    return cp.layout_positions("zigzag", seq_len, world_size, rank)


def calls_an_alias_of_the_package_layout(seq_len, world_size, rank):
    return positions_of("zigzag", seq_len, world_size, rank)


def imports_the_package_chunks(seq_len, world_size, rank):
    from multigpu.context_parallel import layout_chunks

    return [
        p for chunk in layout_chunks("zigzag", seq_len, world_size, rank) for p in chunk
    ]


def calls_the_package_rule(queries, keys):
    return cp.causal_block_kind(queries, keys)
