"""The checkers of notebook 17's exercises: the log-sum-exp merge
(:func:`check_merge`), the zig-zag positions (:func:`check_zigzag_positions`) and
the causal block rule (:func:`check_block_kind`) (17).

Each runs the learner's function on probes chosen so that each mistake learners
make shows as its own symptom, then plays ring attention with it in one process,
rank by rank (:func:`multigpu.context_parallel.simulate_ring_attention`, the same
blocks and merges as on ranks), and compares with one process's attention. A
function that is, or calls, the package's own answer is refused by name.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable

import torch

from multigpu.context_parallel import (
    BLOCK_KINDS,
    causal_block_kind,
    chunks_of,
    layout_chunks,
    layout_positions,
    make_attention_case,
    merge_partials,
    reference_attention,
    shard_sequence,
    simulate_ring_attention,
    torch_head_tail_positions,
)
from multigpu.exercises._result import ExerciseResult, fail, ok

__all__ = ["check_block_kind", "check_merge", "check_zigzag_positions"]

SHAPE = (1, 2, 5, 4)  # batch, heads, queries, head_dim


def _error(exc: Exception) -> str:
    """The learner's error in one line: its type and message."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _refuse_borrowed(function, answers: tuple) -> ExerciseResult | None:
    """A FAIL naming the package function of ``answers`` that ``function`` is or
    calls (by its name, as an attribute such as cp.layout_positions, or an alias)."""
    top = getattr(function, "__code__", None)
    codes, used = [top] if top else [], set()
    while codes:  # the function's code and the code of what it defines inside
        code = codes.pop()
        used |= set(code.co_names) | set(code.co_freevars)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    scope = dict(getattr(function, "__globals__", {}))
    for name, cell in zip(top.co_freevars if top else (), function.__closure__ or ()):
        try:
            scope[name] = cell.cell_contents
        except ValueError:  # a variable not yet assigned
            pass
    for answer in answers:
        name = answer.__name__
        aliased = any(scope.get(u) is answer for u in used)
        if function is answer or aliased or (name in used and name not in scope):
            return fail(
                f"FAIL: your function hands the work to the package's own {name}, so "
                "this would check the package, not your code."
            )
    return None


def _close(a: torch.Tensor, b: torch.Tensor, tolerance: float = 1e-9) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=0, atol=tolerance))


def _call_merge(merge, out_a, lse_a, out_b, lse_b):
    """(output, lse) or a FAIL message."""
    inputs = [t.clone() for t in (out_a, lse_a, out_b, lse_b)]
    try:
        result = merge(*inputs)
    except Exception as exc:  # the learner's error, in one line
        return f"FAIL: your merge raised an error: {_error(exc)}"
    if any(not torch.equal(a, b) for a, b in zip(inputs, (out_a, lse_a, out_b, lse_b))):
        return (
            "FAIL: your merge changed its inputs in place: the ring keeps merging "
            "into its running result, and a changed partial result is used again."
        )
    if not (isinstance(result, tuple) and len(result) == 2) or not all(
        isinstance(t, torch.Tensor) for t in result
    ):
        return "FAIL: return two tensors, (output, log-sum-exp)."
    out, lse = result
    if out.shape != out_a.shape or lse.shape != lse_a.shape:
        return (
            f"FAIL: your merge returns shapes {tuple(out.shape)} and "
            f"{tuple(lse.shape)}; the output must keep the partial outputs' shape "
            f"{tuple(out_a.shape)} and the log-sum-exp theirs, {tuple(lse_a.shape)} "
            "(one number per query)."
        )
    return out, lse


def _equal_blocks_problem(out, lse, out_a, out_b, level) -> str | None:
    if _close(out, out_a) or _close(out, out_b):
        return (
            "FAIL: your merge returns one block's output unchanged: the other "
            "block's keys are missing from the result."
        )
    average = (out_a + out_b) / 2
    if not _close(out, average):
        ratio = out / average
        scaled = (ratio.max() - ratio.min()).abs().item() < 1e-6
        how = f"{ratio.median().item():.3g} times it" if scaled else "not"
        return (
            "FAIL: two blocks with the same log-sum-exp carry the same weight, so "
            f"their merge is the average of their outputs; yours is {how}: the "
            "partial outputs are each already normalised by their own block's sum, "
            "and your weights do not add up to 1."
        )
    if _close(lse, level):
        return (
            "FAIL: merging two blocks with the same log-sum-exp L must give L + log 2 "
            "(the softmax sum doubles); yours gives L: the smaller (here: equal) "
            "block's sum is dropped from the log-sum-exp."
        )
    if _close(lse, 2 * level):
        return (
            "FAIL: your log-sum-exp is the sum of the two: adding logarithms "
            "multiplies the blocks' softmax sums, which must be added."
        )
    if not _close(lse, level + math.log(2)):
        return (
            "FAIL: merging two blocks with the same log-sum-exp L must give L + log 2; "
            "yours does not."
        )
    return None


def check_merge(
    merge: Callable[..., tuple[torch.Tensor, torch.Tensor]], tolerance: float = 1e-12
) -> ExerciseResult:
    """Is ``merge(out_a, lse_a, out_b, lse_b) -> (out, lse)`` the exact merge of
    two partial attention results over disjoint key blocks, safe from overflow,
    and does ring attention with it equal one process? (passed, what to fix)
    (17)."""
    if refused := _refuse_borrowed(merge, (merge_partials,)):
        return refused
    generator = torch.Generator().manual_seed(17)
    out_a, out_b = (torch.randn(SHAPE, generator=generator, dtype=torch.float64)
                    for _ in range(2))  # fmt: skip
    level = torch.randn(SHAPE[:3], generator=generator, dtype=torch.float64)
    merged = _call_merge(merge, out_a, level, out_b, level.clone())
    if isinstance(merged, str):
        return fail(merged)
    if problem := _equal_blocks_problem(*merged, out_a, out_b, level):
        return fail(problem)
    merged = _call_merge(merge, out_a, level + 20, out_b, level)  # a dominates
    if isinstance(merged, str):
        return fail(merged)
    expected, _ = merge_partials(out_a, level + 20, out_b, level)
    if not _close(merged[0], expected):
        why = (
            "almost block b's: each output is weighted by the other block's sum."
            if _close(merged[0], out_b, 1e-6)
            else "not: merging normalised outputs without the weight of each block's "
            "sum gives every block the same say, however large its scores."
        )
        return fail(
            "FAIL: block a's scores are far larger (log-sum-exp 20 above b's), so the "
            f"merge must be almost block a's output; yours is {why}"
        )
    for extreme in (800.0, -800.0):
        lse_a = level + extreme
        merged = _call_merge(merge, out_a, lse_a, out_b, lse_a - 1.5)
        if isinstance(merged, str):
            return fail(merged)
        if not all(torch.isfinite(t).all() for t in merged):
            return fail(
                f"FAIL: with log-sum-exps near {extreme:+.0f} (scores that large "
                "occur) your merge returns inf or nan: it exponentiates numbers "
                "that large, and exp over- or underflows even in float64."
            )
        expected = merge_partials(out_a, lse_a, out_b, lse_a - 1.5)
        if not (_close(merged[0], expected[0]) and _close(merged[1], expected[1])):
            return fail(
                f"FAIL: with log-sum-exps near {extreme:+.0f} your merge is finite "
                "but wrong: it loses the blocks' relative weight."
            )
    return _ring_verdict(merge, tolerance)


def _ring_verdict(merge, tolerance: float) -> ExerciseResult:
    worst = 0.0
    for layout, world_size in (("contiguous", 4), ("zigzag", 2)):
        case = make_attention_case(16, causal=True, seed=3)
        reference = reference_attention(case.q, case.k, case.v, True)
        try:
            out, _ = simulate_ring_attention(
                case.q, case.k, case.v, world_size, layout, True, merge=merge
            )
        except Exception as exc:
            return fail(f"FAIL: ring attention with your merge raised: {_error(exc)}")
        worst = max(worst, (out - reference).abs().max().item())
    if not worst <= tolerance:
        return fail(
            f"FAIL: ring attention with your merge is {worst:.1e} away from one "
            "process's attention: your merge is right for two blocks but not when "
            "one side is itself a merged result."
        )
    return ok(
        "PASS: your merge is exact for equal and unequal blocks, finite for "
        "log-sum-exps of +-800, and ring attention with it equals one process "
        f"within {tolerance:.0e} (4 ranks contiguous, 2 ranks zig-zag, causal)."
    )


def _positions(function, seq_len: int, world_size: int, rank: int):
    """The learner's positions for ``rank`` as a list of ints, or a FAIL message."""
    try:
        result = function(seq_len, world_size, rank)
        return [int(p) for p in result]
    except Exception as exc:
        return (
            f"FAIL: your function raised an error for {seq_len} tokens on "
            f"{world_size} ranks, rank {rank}: {_error(exc)}"
        )


def _layout_problem(held: list[list[int]], seq_len: int, world_size: int):
    """What is wrong with the positions every rank holds, or None."""
    where = f"FAIL: with {seq_len} tokens on {world_size} ranks,"
    owners: dict[int, list[int]] = {}
    for rank, positions in enumerate(held):
        for p in positions:
            if not 0 <= p < seq_len:
                return (
                    f"{where} rank {rank} holds position {p}, outside "
                    f"0..{seq_len - 1}: an off-by-one in the tail chunk's index."
                )
            owners.setdefault(p, []).append(rank)
    twice = sorted(p for p, ranks in owners.items() if len(ranks) > 1)
    if twice:
        return (
            f"{where} position {twice[0]} is held by ranks {owners[twice[0]]}: every "
            "token must be on exactly one rank."
        )
    missing = sorted(set(range(seq_len)) - owners.keys())
    if missing:
        return (
            f"{where} no rank holds position {missing[0]}: every token must be on "
            "exactly one rank."
        )
    sizes = [len(p) for p in held]
    if len(set(sizes)) > 1:
        each = seq_len // world_size
        return f"FAIL: the ranks hold {sizes} tokens: each must hold {each}."
    return None


def check_zigzag_positions(
    zigzag_positions: Callable[[int, int, int], list[int]],
    tolerance: float = 1e-12,
) -> ExerciseResult:
    """Does ``zigzag_positions(seq_len, world_size, rank)`` give every rank its
    tokens so that under a causal mask all ranks compute the same number of
    query-key products, and ring attention on that layout equals one process?
    (passed, what to fix) (17)."""
    answers = layout_positions, layout_chunks, shard_sequence, torch_head_tail_positions
    if refused := _refuse_borrowed(zigzag_positions, answers):
        return refused
    for seq_len, world_size in ((16, 4), (8, 2), (12, 3), (4, 2)):
        held = []
        for rank in range(world_size):
            positions = _positions(zigzag_positions, seq_len, world_size, rank)
            if isinstance(positions, str):
                return fail(positions)
            held.append(positions)
        if problem := _layout_problem(held, seq_len, world_size):
            return fail(problem)
        case = make_attention_case(seq_len, causal=True, seed=4)
        chunks = [chunks_of(p) for p in held]
        out, _ = simulate_ring_attention(
            case.q, case.k, case.v, world_size, chunks, True
        )
        worst = (out - reference_attention(case.q, case.k, case.v, True)).abs().max()
        if not worst <= tolerance:
            return fail(
                f"FAIL: ring attention on your layout is {worst:.1e} away from one "
                "process: a rank's positions must be listed in the order of its "
                "tokens."
            )
        work = [sum(p + 1 for p in positions) for positions in held]  # k <= q pairs
        if len(set(work)) > 1:
            contiguous = [
                list(layout_chunks("contiguous", seq_len, world_size, r)[0])
                for r in range(world_size)
            ]
            what = "not balanced"
            if held == contiguous:
                what = "contiguous chunks, so the last rank does the most work"
            return fail(
                f"FAIL: with {seq_len} tokens on {world_size} ranks your layout is "
                f"{what}: under a causal mask the ranks need {work} query-key "
                "products. A query late in the sequence sees many keys, an early one "
                "few, and your ranks hold them unevenly."
            )
    return ok(
        "PASS: every token on one rank, the same causal work on every rank (16 tokens "
        "on 4 ranks: 34 query-key products needed each), and ring attention on your "
        f"layout equals one process within {tolerance:.0e}."
    )


PROBES = (  # (queries, keys, what the pair is)
    (range(4, 8), range(0, 4), "past"),
    (range(0, 4), range(4, 8), "future"),
    (range(4, 8), range(4, 8), "diagonal"),
    (range(14, 16), range(2, 4), "past"),
    (range(0, 2), range(12, 14), "future"),
    (range(6, 8), range(6, 8), "diagonal"),
)


def _span(r: range) -> str:
    return f"{r.start}-{r[-1]}"


def _probe_problem(kind: str, queries: range, keys: range, what: str) -> str | None:
    where = f"queries {_span(queries)} against keys {_span(keys)}"
    if what == "diagonal" and kind == "skip":
        return (
            f"FAIL: your rule skips {where}, the block on the diagonal: every query "
            "sees at least its own key, so these queries would lose the keys at and "
            "before them."
        )
    if what == "diagonal" and kind == "full":
        return (
            f"FAIL: your rule computes {where} whole: query {queries.start} would "
            f"then see keys {_span(range(queries.start + 1, keys.stop))}, its "
            "future."
        )
    if what == "past" and kind == "skip":
        return (
            f"FAIL: your rule skips {where}, keys that come before every query: "
            "the causal mask hides a query's future, not its past."
        )
    if what == "future" and kind != "skip":
        return (
            f"FAIL: your rule computes {where} ({kind!r}): every key there comes "
            "after every query, so the whole block is masked; computing it is "
            "wasted work, and the reason causal ring attention is imbalanced."
        )
    return None


def check_block_kind(
    block_kind: Callable[[range, range], str], tolerance: float = 1e-12
) -> ExerciseResult:
    """Does ``block_kind(queries, keys)`` skip exactly the blocks a causal mask
    hides entirely, mask the diagonal, and give one process's attention in ring
    attention with both layouts? (passed, what to fix) (17)."""
    if refused := _refuse_borrowed(block_kind, (causal_block_kind,)):
        return refused
    for queries, keys, what in PROBES:
        try:
            kind = block_kind(queries, keys)
        except Exception as exc:
            return fail(f"FAIL: your rule raised an error: {_error(exc)}")
        if kind not in BLOCK_KINDS:
            return fail(
                f"FAIL: your rule returned {kind!r} for queries {_span(queries)} and "
                f"keys {_span(keys)}; return one of {', '.join(BLOCK_KINDS)}."
            )
        if problem := _probe_problem(kind, queries, keys, what):
            return fail(problem)
    for layout, world_size in (("contiguous", 4), ("zigzag", 4)):
        case = make_attention_case(16, causal=True, seed=5)
        try:
            out, records = simulate_ring_attention(
                case.q, case.k, case.v, world_size, layout, True, block_kind=block_kind
            )
        except Exception as exc:
            return fail(f"FAIL: ring attention with your rule raised: {_error(exc)}")
        worst = (out - reference_attention(case.q, case.k, case.v, True)).abs().max()
        skipped = [r.counts()["skip"] for r in records]
        _, expected = simulate_ring_attention(
            case.q, case.k, case.v, world_size, layout, True
        )
        if not worst <= tolerance or skipped != [r.counts()["skip"] for r in expected]:
            name = "zig-zag" if layout == "zigzag" else layout
            return fail(
                f"FAIL: with {name} shards on {world_size} ranks your rule gives "
                f"attention {worst:.1e} away from one process and skips {skipped} "
                "blocks per rank: your rule fits the probes' blocks but not blocks "
                "of other sizes and places."
            )
    return ok(
        "PASS: your rule skips every block in the future, masks the diagonal, and "
        "ring attention with it equals one process within "
        f"{tolerance:.0e} (contiguous: ranks skip 3, 2, 1, 0 blocks; zig-zag: 7 each)."
    )
