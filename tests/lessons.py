"""The lessons of the series and what each one adds to the repository: one row per
lesson notebook, in the series' order.

A row names the notebook, the package code it teaches (``code``: paths under
``src/multigpu/``), the modules of ``src/multigpu/ranks/`` its notebooks and checkers
start (``ranks``), the modules of ``src/multigpu/exercises/`` its exercises call
(``checkers``) and the package's functions whose source would answer an exercise
(``answers``). A lesson that has no rank module or no checker says so with
``Without("why")``; the checklist then checks that its notebooks really use none.

``tests/test_lesson_checklist.py`` reads this table and fails, naming each missing
piece, when a lesson lacks one of the files docs/architecture.md lists under
"Adding a lesson". Adding a lesson starts here: add its row, run
``pytest tests/test_lesson_checklist.py`` and it lists what is left to write.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Without:
    """A piece a lesson does not have, on purpose, and why."""

    why: str


@dataclass(frozen=True)
class Lesson:
    notebook: str  # the stem of notebooks/<notebook>.ipynb
    code: tuple[str, ...]  # what it teaches, under src/multigpu/: "ddp/", "syncbn.py"
    ranks: tuple[str, ...] | Without  # modules of src/multigpu/ranks/ it starts
    checkers: tuple[str, ...] | Without  # modules of src/multigpu/exercises/
    # the functions and classes whose source would answer one of its exercises; no
    # code cell of the lesson may print it (tests/test_lessons_hide_answers.py)
    answers: tuple[str, ...] = ()

    @property
    def number(self) -> str:
        """The lesson's number as the docs write it: "09b"."""
        return self.notebook.split("_", 1)[0]


IN_PROCESS = Without("it computes in the notebook's own process and starts no rank")
BY_HAND = Without("its exercises are predictions checked by running the notebook")

LESSONS = (
    Lesson(
        "00_devices",
        ("core/devices.py",),
        IN_PROCESS,
        ("devices",),
        ("visible_gpus", "parse_visible_devices"),
    ),
    Lesson("01_single_device_baseline", ("core/",), IN_PROCESS, BY_HAND),
    Lesson(
        "02_dataparallel_under_the_hood",
        ("dataparallel/",),
        IN_PROCESS,
        ("dataparallel",),
        ("scatter", "scatter_sizes"),
    ),
    Lesson("03_pitfall_device_ids", ("dataparallel/",), IN_PROCESS, BY_HAND),
    Lesson("04_pitfall_uneven_last_batch", ("dataparallel/",), IN_PROCESS, BY_HAND),
    Lesson("05_pitfall_loss_averaging", ("dataparallel/",), IN_PROCESS, BY_HAND),
    Lesson(
        "06_dataparallel_checkpoints_and_speed",
        ("dataparallel/", "runtime/checkpoint/"),
        IN_PROCESS,
        BY_HAND,
    ),
    Lesson(
        "07_collectives_from_scratch",
        ("collectives.py",),
        ("collectives",),
        ("collectives",),
        ("ring_all_reduce", "pipelined_reduce_scatter"),
    ),
    Lesson(
        "08_allreduce_sgd",
        ("allreduce_sgd.py",),
        ("allreduce_sgd",),
        ("allreduce_sgd",),
        ("sgd_step",),
    ),
    Lesson(
        "09_ddp_torchrun",
        ("ddp/",),
        ("ddp", "ddp_pitfalls"),
        ("ddp_evaluation",),
        ("evaluate_distributed",),
    ),
    Lesson(
        "09b_ddp_in_practice",
        ("ddp/", "syncbn.py"),
        ("ddp", "ddp_exercises", "torchrun_example"),
        ("ddp", "syncbn"),
        ("save_on_main", "resume", "accumulate", "combine_statistics"),
    ),
    Lesson(
        "10_ddp_by_hand", ("miniddp/",), ("miniddp",), ("miniddp",), ("BucketedDDP",)
    ),
    Lesson(
        "11_fault_tolerance",
        ("snapshot/", "faults/"),
        ("snapshot", "snapshot_exercises", "faults"),
        ("snapshot",),
        ("save_snapshot", "load_snapshot"),
    ),
    Lesson(
        "12_scaling_cost_model",
        ("costmodel/", "horovod_api/"),
        ("scaling", "horovod_api"),
        ("scaling", "horovod_api"),
        ("fit_alpha_beta",),
    ),
    Lesson(
        "13_sharding_zero_fsdp",
        ("zero/",),
        ("zero", "dtensor"),
        ("zero",),
        ("zero2_step", "fully_shard_model", "fsdp2_rank", "fsdp2_load_rank"),
    ),
    Lesson(
        "14_fsdp_by_hand",
        ("fsdp/",),
        ("fsdp",),
        ("fsdp",),
        ("UnitHooks", "pre_forward", "post_forward", "pre_backward", "post_backward"),
    ),
    Lesson(
        "14b_fsdp2_in_practice",
        ("fsdp2/",),
        ("fsdp2", "fsdp2_exercises"),
        ("fsdp2",),
        ("train_steps", "build_on_meta", "shard_blocks"),
    ),
    Lesson(
        "15_tensor_and_sequence_parallel",
        ("tensor_parallel/",),
        ("tensor_parallel",),
        ("tensor_parallel", "tensor_parallel_plan"),
        (
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
        ),
    ),
    Lesson(
        "16_pipeline_parallel",
        ("pipeline/",),
        ("pipeline",),
        ("pipeline",),
        ("one_f_one_b_actions",),
    ),
    Lesson(
        "17_context_parallel",
        ("context_parallel/",),
        ("context_parallel",),
        ("context_parallel",),
        ("merge_partials", "layout_chunks", "layout_positions", "causal_block_kind"),
    ),
    Lesson(
        "18_expert_parallel",
        ("expert_parallel/",),
        ("expert_parallel",),
        ("expert_parallel",),
        ("dispatch", "combine"),
    ),
    Lesson(
        "19_four_d_parallel_gpt",
        ("gpt4d/",),
        ("gpt4d",),
        ("gpt4d",),
        ("groups", "grid_problem", "train_4d"),
    ),
    Lesson(
        "20_plan_a_cluster_job",
        ("cluster/",),
        ("cluster",),
        ("cluster",),
        (
            "valid_grids",
            "plan_configurations",
            "fsdp_tp_collectives_per_step",
            "fsdp2_collectives_per_step",
        ),
    ),
)

# What src/multigpu/ holds besides the lessons' code, and why it is no lesson's.
NOT_LESSONS = {
    "core/": "pure building blocks every lesson uses",
    "runtime/": "launching ranks and checkpoints, support a learner may skip",
    "ranks/": "the functions ranks run, one module per lesson (the rows above)",
    "exercises/": "the checkers, one module per lesson (the rows above)",
    "plots/": "the figures of every lesson",
    "doctor/": "python -m multigpu.doctor, the participant's machine check",
}
# Rank modules no lesson starts.
RANKS_OF_NO_LESSON = {
    "doctor": "the real launches of python -m multigpu.doctor",
    "gpu_check": "the GPU launches of make gpu-check (python -m multigpu.doctor --gpu)",
}
