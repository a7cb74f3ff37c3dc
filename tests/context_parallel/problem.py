"""The cases the tests of multigpu.context_parallel share: every split of attention
notebook 17 teaches, on tiny tensors (2 heads of 4, or 4 heads for Ulysses), with
sequence lengths that divide by 2, 4 and 8 (16), divide by none of 2-4 (13), and
leave a rank without tokens (3 on 4 ranks), in float64 and float32."""

import torch

from multigpu.context_parallel import check_layout, check_ulysses, make_attention_case
from tests import hard_cases

TIMEOUT = 60.0  # generous: the test machine may be shared
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}
WORLD_SIZES = (1, 2, 4)
LENGTHS = (16, 13, 3)
DTYPES = hard_cases.DTYPES  # float32 and float64, as every hard-case suite
ALL_TO_ALL_TOKENS, ALL_TO_ALL_HEADS = 8, 4  # the labelled table, 10·token + head


def _splits(seq_len: int, world_size: int, scheme: str, layout: str) -> bool:
    heads = 4 if scheme == "ulysses" else 2
    try:
        check_layout(layout, seq_len, world_size)
        if scheme == "ulysses":
            check_ulysses(heads, world_size)
    except ValueError:
        return False
    return True


def attention_cases(world_size: int) -> dict[tuple, object]:
    """(scheme, layout, causal, seq_len, dtype) -> its AttentionCase, for every
    combination ``world_size`` ranks can split."""
    cases = {}
    splits = (("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous"))
    for scheme, layout in splits:
        for causal in (False, True):
            for seq_len in LENGTHS:
                for dtype in DTYPES:
                    if not _splits(seq_len, world_size, scheme, layout):
                        continue
                    heads = 4 if scheme == "ulysses" else 2
                    cases[(scheme, layout, causal, seq_len, dtype)] = (
                        make_attention_case(
                            seq_len, causal, layout, scheme, heads=heads,
                            dtype=dtype, seed=seq_len,
                        )
                    )  # fmt: skip
    return cases


def block_steps() -> dict[str, dict]:
    """name -> the keywords of one block step: each rank builds the block from its
    own seed (seed + rank) and takes rank 0's weights; frozen projections; uneven
    and empty shards; ring (both layouts) and Ulysses; float64 and float32."""
    generator = torch.Generator().manual_seed(7)
    settings = {
        "ring zigzag causal": (16, "ring", "zigzag", True, ("k.weight",)),
        "ring contiguous uneven": (13, "ring", "contiguous", True, ("q.bias",)),
        "ring empty shard": (3, "ring", "contiguous", False, ()),
        "ulysses uneven": (13, "ulysses", "contiguous", True, ("v.weight",)),
    }
    steps = {}
    for dtype in DTYPES:
        for name, (seq_len, scheme, layout, causal, frozen) in settings.items():
            x, target = (
                torch.randn(2, seq_len, 8, generator=generator, dtype=torch.float64)
                for _ in range(2)
            )
            steps[f"{name} {dtype}"] = dict(
                hidden=8, heads=4, seed=0, frozen=frozen, x=x.to(dtype),
                target=target.to(dtype), causal=causal, scheme=scheme, layout=layout,
            )  # fmt: skip
    return steps


def memory_steps() -> dict[int, dict]:
    """seq_len -> a block step whose saved bytes the memory tests compare."""
    generator = torch.Generator().manual_seed(8)
    steps = {}
    for seq_len in (16, 32, 64):
        x, target = (
            torch.randn(1, seq_len, 8, generator=generator, dtype=torch.float64)
            for _ in range(2)
        )
        steps[seq_len] = dict(
            hidden=8, heads=2, seed=1, x=x, target=target, causal=True,
            layout="contiguous",
        )  # fmt: skip
    return steps


def simple_ring_cases() -> list:
    """The short ring's cases: no mask, 16 tokens (which 1, 2 and 4 divide), float64
    and float32."""
    return [
        make_attention_case(16, False, dtype=dtype, seed=16 + i)
        for i, dtype in enumerate(DTYPES)
    ]
