"""A learner's exception comes back as a FAIL that names it, never as a traceback.

Each checker below is given learner code that raises ``LearnerBug`` (in-process
or inside the ranks); the FAIL must name the error. The checkers whose own tests
already pass a raising implementation (check_step, check_checkpoint,
check_accumulation, check_wrapper, check_port, check_zero2_step, check_fsdp2_rank,
check_unit_hooks, check_2d_plan, check_wrap_within_budget) are not repeated here.
"""

import pytest

from multigpu.exercises.collectives import check_ring_all_reduce
from multigpu.exercises.dataparallel import check_scatter
from multigpu.exercises.ddp_evaluation import check_evaluation
from multigpu.exercises.devices import check_visible_gpus
from multigpu.exercises.fsdp2 import check_accumulation_step, check_build_sharded
from multigpu.exercises.pipeline import check_one_f_one_b
from multigpu.exercises.scaling import check_fit
from multigpu.exercises.snapshot import check_snapshot
from multigpu.exercises.syncbn import check_combine
from multigpu.exercises.tensor_parallel import (
    check_row_parallel,
    check_vocab_parallel_loss,
)
from tests.exercises.raising import RaisingFunction, raises

CALLS = {
    "check_visible_gpus (00)": lambda: check_visible_gpus(raises),
    "check_scatter (02)": lambda: check_scatter(raises),
    "check_ring_all_reduce (07)": lambda: check_ring_all_reduce(
        raises, world_sizes=(2,)
    ),
    "check_evaluation (09)": lambda: check_evaluation(raises),
    "check_combine (09b)": lambda: check_combine(raises),
    "check_snapshot (11)": lambda: check_snapshot(raises, raises),
    "check_fit (12)": lambda: check_fit(raises),
    "check_accumulation_step (14b)": lambda: check_accumulation_step(raises),
    "check_build_sharded (14b)": lambda: check_build_sharded(raises),
    "check_row_parallel (15)": lambda: check_row_parallel(
        RaisingFunction, RaisingFunction, raises
    ),
    "check_vocab_parallel_loss (15)": lambda: check_vocab_parallel_loss(raises),
    "check_one_f_one_b (16)": lambda: check_one_f_one_b(raises),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_learners_exception_is_a_fail_naming_it(name):
    passed, message = CALLS[name]()
    assert not passed
    assert message.startswith("FAIL")
    assert "LearnerBug" in message or "a learner's mistake" in message, message
