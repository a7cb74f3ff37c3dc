"""The lessons of the series and what each one adds to the repository: one row per
lesson notebook, in the series' order.

A row names the notebook, the package code it teaches (``code``: paths under
``src/multigpu/``), the modules of ``src/multigpu/ranks/`` its notebooks and checkers
start (``ranks``) and the modules of ``src/multigpu/exercises/`` its exercises call
(``checkers``). A lesson that has no rank module or no checker says so with
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

    @property
    def number(self) -> str:
        """The lesson's number as the docs write it: "09b"."""
        return self.notebook.split("_", 1)[0]


IN_PROCESS = Without("it computes in the notebook's own process and starts no rank")
BY_HAND = Without("its exercises are predictions checked by running the notebook")

LESSONS = (
    Lesson("00_devices", ("core/devices.py",), IN_PROCESS, ("devices",)),
    Lesson("01_single_device_baseline", ("core/",), IN_PROCESS, BY_HAND),
    Lesson(
        "02_dataparallel_under_the_hood",
        ("dataparallel/",),
        IN_PROCESS,
        ("dataparallel",),
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
    ),
    Lesson(
        "08_allreduce_sgd",
        ("allreduce_sgd.py",),
        ("allreduce_sgd",),
        ("allreduce_sgd",),
    ),
    Lesson("09_ddp_torchrun", ("ddp/",), ("ddp", "ddp_pitfalls"), ("ddp_evaluation",)),
    Lesson(
        "09b_ddp_in_practice",
        ("ddp/", "syncbn.py"),
        ("ddp", "ddp_exercises", "torchrun_example"),
        ("ddp", "syncbn"),
    ),
    Lesson("10_ddp_by_hand", ("miniddp/",), ("miniddp",), ("miniddp",)),
    Lesson(
        "11_fault_tolerance",
        ("snapshot/", "faults/"),
        ("snapshot", "snapshot_exercises", "faults"),
        ("snapshot",),
    ),
    Lesson(
        "12_scaling_cost_model",
        ("costmodel/", "horovod_api/"),
        ("scaling", "horovod_api"),
        ("scaling", "horovod_api"),
    ),
    Lesson("13_sharding_zero_fsdp", ("zero/",), ("zero", "dtensor"), ("zero",)),
    Lesson("14_fsdp_by_hand", ("fsdp/",), ("fsdp",), ("fsdp",)),
    Lesson(
        "14b_fsdp2_in_practice", ("fsdp2/",), ("fsdp2", "fsdp2_exercises"), ("fsdp2",)
    ),
    Lesson(
        "15_tensor_and_sequence_parallel",
        ("tensor_parallel/",),
        ("tensor_parallel",),
        ("tensor_parallel", "tensor_parallel_plan"),
    ),
    Lesson("16_pipeline_parallel", ("pipeline/",), ("pipeline",), ("pipeline",)),
    Lesson(
        "17_context_parallel",
        ("context_parallel/",),
        ("context_parallel",),
        ("context_parallel",),
    ),
    Lesson(
        "18_expert_parallel",
        ("expert_parallel/",),
        ("expert_parallel",),
        ("expert_parallel",),
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
RANKS_OF_NO_LESSON = {"doctor": "the real launches of python -m multigpu.doctor"}
