"""No lesson prints the answer of its own exercise.

A learner who can copy a printed function into an exercise learns nothing, so a
lesson shows the reference code of an exercise only through its signature and
docstring. ANSWERS maps each lesson to the package functions that answer its
exercises; no code cell of the lesson may print their source.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# lesson notebook -> the functions whose source would answer one of its exercises
ANSWERS = {
    "00_devices": ["visible_gpus", "parse_visible_devices"],
    "02_dataparallel_under_the_hood": ["scatter", "scatter_sizes"],
    "07_collectives_from_scratch": ["ring_all_reduce", "pipelined_reduce_scatter"],
    "08_allreduce_sgd": ["sgd_step"],
    "09_ddp_torchrun": ["evaluate_distributed"],
    "09b_ddp_in_practice": [
        "save_on_main",
        "resume",
        "accumulate",
        "combine_statistics",
    ],
    "10_ddp_by_hand": ["BucketedDDP"],
    "11_fault_tolerance": ["save_snapshot", "load_snapshot"],
    "12_scaling_cost_model": ["fit_alpha_beta"],
    "13_sharding_zero_fsdp": [
        "zero2_step",
        "fully_shard_model",
        "fsdp2_rank",
        "fsdp2_load_rank",
    ],
    "14_fsdp_by_hand": [
        "UnitHooks",
        "pre_forward",
        "post_forward",
        "pre_backward",
        "post_backward",
    ],
    "14b_fsdp2_in_practice": ["train_steps", "build_on_meta", "shard_blocks"],
    "15_tensor_and_sequence_parallel": [
        "CopyToTensorParallel",
        "ReduceFromTensorParallel",
        "row_parallel_linear",
        "RowParallelLinear",
        "VocabParallelCrossEntropy",
        "vocab_parallel_token_losses",
        "vocab_parallel_cross_entropy",
        "block_plan",
        "parallelize_block",
        "parallelize_2d",
    ],
    "16_pipeline_parallel": ["one_f_one_b_actions"],
    "18_expert_parallel": ["dispatch", "combine"],
    "17_context_parallel": [
        "merge_partials",
        "layout_chunks",
        "layout_positions",
        "causal_block_kind",
    ],
}
GETSOURCE = re.compile(r"getsource\(\s*([\w.]+)")


def printed_sources(path: Path) -> list[str]:
    """Every name in the dotted paths whose source a code cell of ``path`` prints
    with inspect.getsource (``C.Ring.forward`` gives C, Ring and forward)."""
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    paths = [found for text in code for found in GETSOURCE.findall(text)]
    return [name for dotted in paths for name in dotted.split(".")]


def test_printed_sources_finds_qualified_and_bare_names(tmp_path):
    cell = (
        "print(inspect.getsource(C.ring_all_reduce))\n"
        "inspect.getsource( sgd_step )\n"
        "inspect.getsource(tp.Row.forward)"
    )
    notebook = {"cells": [{"cell_type": "code", "source": [cell]}]}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(notebook))
    assert printed_sources(path) == [
        "C",
        "ring_all_reduce",
        "sgd_step",
        "tp",
        "Row",
        "forward",
    ]


@pytest.mark.parametrize("stem", sorted(ANSWERS))
def test_no_lesson_prints_its_exercises_answers(stem):
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    shown = sorted(set(printed_sources(path)) & set(ANSWERS[stem]))
    assert not shown, f"{path.name} prints the source of {shown}, an exercise's answer"
