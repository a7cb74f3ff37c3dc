"""Tests for multigpu.fsdp2.memory and the ranks that measure memory (14b): a
step's peak by kind, each knob moving the kind it should; the unsharded gradients
that accumulation keeps whole on every rank, in reduce_dtype; parameters kept
between micro-batches; explicit True resharding the root; DDP's bucket copy; the
HSDP mesh's groups; activation checkpointing seen by SavedInsideBlocks."""

import pytest
import torch
from torch import nn
from torch.distributed._composable import checkpoint

from multigpu import fsdp2, zero
from multigpu.costmodel.fsdp2 import fsdp2_collectives_per_step, shard_numel
from multigpu.ranks import fsdp2 as fsdp2_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.fsdp2.problem import LR, TIMEOUT, counted_mlp, global_steps

SETTINGS = [
    {},
    {"mixed": True},
    {"checkpoint_blocks": True},
    {"reshard_after_forward": False},
]


def _model_with_a_root_norm():
    torch.manual_seed(0)
    norm = nn.LayerNorm(3, dtype=torch.float64)  # like a transformer's final norm
    return nn.Sequential(*zero.make_mlp((6, 8, 8, 3)), norm)


@pytest.fixture(scope="module")
def memory4():
    """{name: each rank's result} of one launch on 4 ranks."""
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(64, 32, generator=generator), torch.randint(0, 10, (64,)))
    steps = global_steps(micro_batches=2, steps=2)
    steps32 = [[(x.float(), y) for x, y in step] for step in steps]
    model32 = counted_mlp().float()
    first = global_steps()[0][0]
    calls = {
        "peaks": (fsdp2_ranks.peak_memory_rank, ((32, 64, 3, 10), batch, SETTINGS)),
        "accumulate": (fsdp2_ranks.train_rank, (counted_mlp(), steps, LR)),
        "accumulate bf16": (
            fsdp2_ranks.train_rank,
            (model32, steps32, LR, {"mixed": True, "optimizer": "sgd"}),
        ),
        "kept": (
            fsdp2_ranks.train_rank,
            (counted_mlp(), steps, LR, {"reshard_after_backward": False}),
        ),
        "root": (
            fsdp2_ranks.reshard_rank,
            (_model_with_a_root_norm(), first, [(None, False), (True, False)]),
        ),
        "ddp": (fsdp2_ranks.ddp_gradient_copies_rank, (counted_mlp(), first)),
        "hsdp": (
            fsdp2_ranks.train_rank,
            (counted_mlp(), steps[:1], LR, {"mesh": (2, 2)}),
        ),
    }
    per_rank = spawn(in_one_launch, 4, list(calls.values()), timeout=TIMEOUT)
    return {name: [r[i] for r in per_rank] for i, name in enumerate(calls)}


def test_each_knob_moves_the_kind_of_memory_it_should(memory4):
    plain, mixed, checkpointed, kept = memory4["peaks"][0]
    assert mixed["total"] < plain["total"] and checkpointed["total"] < plain["total"]
    assert kept["total"] > plain["total"]
    assert mixed["parameters all-gathered"] < plain["parameters all-gathered"]
    assert checkpointed["activations"] < plain["activations"] / 2
    assert kept["parameters all-gathered"] > 1.5 * plain["parameters all-gathered"]
    assert all(peaks == memory4["peaks"][0] for peaks in memory4["peaks"])


def test_the_tracked_shards_equal_the_formula(memory4):
    model = fsdp2.budget_model((32, 64, 3, 10))
    shards = sum(shard_numel(p.shape, 4) for p in model.parameters())
    for peak in memory4["peaks"][0]:
        assert peak["parameter shards"] == 4 * shards


@pytest.mark.parametrize(
    ("name", "dtype"), [("accumulate", "float64"), ("accumulate bf16", "float32")]
)
def test_accumulation_keeps_the_whole_models_gradients_on_every_rank(
    memory4, name, dtype
):
    whole = sum(p.numel() for p in counted_mlp().parameters())
    for result in memory4[name]:
        for held in result["between micro-batches"]:  # 2 steps, 1 each
            assert held["dtypes"] == [dtype]  # reduce_dtype under bf16
            assert held["bytes"] == whole * torch.finfo(getattr(torch, dtype)).bits // 8
            assert held["parameter bytes"] == 0


def test_parameters_kept_between_micro_batches_save_all_gathers(memory4):
    reference = fsdp2.train_one_process(
        counted_mlp(), global_steps(micro_batches=2, steps=2), LR
    )
    padded = sum(
        4 * shard_numel(p.shape, 4) * 8 for p in counted_mlp().parameters()
    )  # every rank's shard, float64
    formula = fsdp2_collectives_per_step(
        3, micro_batches=2, reshard_after_backward=False
    )
    for result in memory4["kept"]:
        assert result["counts"]["all-gather"] == 2 * formula["all-gather"]
        assert all(
            h["parameter bytes"] == padded for h in result["between micro-batches"]
        )
        for name, value in reference.parameters.items():
            assert (result["parameters"][name] - value).abs().max() < 1e-12
    assert memory4["accumulate"][0]["counts"]["all-gather"] == 2 * 2 * (3 + 3)


def test_explicit_true_reshards_the_root_and_none_does_not(memory4):
    default, explicit = memory4["root"][0]
    assert default["unit shapes"][-1] == [(3,), (3,)]  # the norm stays in the root

    def gathers(row):
        return len(row["forward"]), sum(
            c["kind"] == "all-gather" for c in row["backward"]
        )

    assert gathers(default) == (4, 3) and gathers(explicit) == (4, 4)
    root_keeps = fsdp2_collectives_per_step(4, root_keeps_parameters=True)
    assert sum(gathers(default)) == root_keeps["all-gather"]
    assert sum(gathers(explicit)) == fsdp2_collectives_per_step(4)["all-gather"]


def test_ddp_buckets_are_a_second_copy_unless_gradients_are_views(memory4):
    for copy, view in memory4["ddp"]:
        assert (copy["gradient_as_bucket_view"], view["gradient_as_bucket_view"]) == (
            False,
            True,
        )
        assert copy["buckets"] == copy["gradients"] == copy["parameters"]
        assert copy["holding gradients"] == 2 * copy["parameters"]
        assert view["holding gradients"] == view["parameters"]


def test_hsdp_groups_are_the_rows_and_columns_of_the_mesh(memory4):
    for rank, result in enumerate(memory4["hsdp"]):
        assert result["mesh"] == [[0, 1], [2, 3]]
        row, column = divmod(rank, 2)
        assert result["groups"] == {
            "replicate": [column, column + 2],
            "shard": [2 * row, 2 * row + 1],
        }


def test_saved_inside_blocks_sees_what_checkpointing_does_not_keep():
    model = fsdp2.budget_model((8, 16, 3, 4))
    inputs = torch.randn(5, 8)
    with fsdp2.SavedInsideBlocks(model) as saved:
        model(inputs).sum().backward()
    per_block = 5 * 16 * 4  # the input and the tanh, (5, 16) and (5, 64) float32
    assert all(nbytes >= per_block for nbytes in saved.blocks.values())
    for block in list(model)[1:-1]:
        checkpoint(block)
    with fsdp2.SavedInsideBlocks(model) as saved:
        model(inputs).sum().backward()
    assert saved.blocks == {0: 0, 1: 0, 2: 0}


def test_budget_model_is_seeded_and_sized():
    first, second = fsdp2.budget_model(), fsdp2.budget_model()
    assert all(
        torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters())
    )
    blocks = [m for m in first.modules() if m.__class__.__name__ == "ResidualBlock"]
    assert len(blocks) == 6
    assert sum(p.numel() for p in first.parameters()) == 201290
