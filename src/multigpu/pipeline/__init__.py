"""Pipeline parallelism: a model cut into stages over ranks, by hand and with
``torch.distributed.pipelining`` (16).

Taught in ``notebooks/16_pipeline_parallel.ipynb``. Each rank holds a run of
consecutive layers (a stage) and the batch flows through in micro-batches:
activations go forward with ``send``/``recv``, gradients come back the same way,
and the gradients accumulate over the micro-batches so that one step equals one
process on the whole batch. The order of the work is the *schedule*:

- :mod:`~multigpu.pipeline.stages`: cutting the model and the batch;
- :mod:`~multigpu.pipeline.schedules`: GPipe and 1F1B as lists of actions, and
  what is wrong with a list (:func:`schedule_problem`);
- :mod:`~multigpu.pipeline.simulate`: the schedule played in time slots with
  blocking messages: the bubble and the deadlocks, exactly;
- :mod:`~multigpu.pipeline.executor` and :mod:`~multigpu.pipeline.step`: the
  schedule run on ranks, with its timeline, activation bytes and bytes sent;
- :mod:`~multigpu.pipeline.timeline`: blocks and the bubble fraction;
- :mod:`~multigpu.pipeline.torch_api`: the same with PyTorch's PipelineStage,
  ScheduleGPipe and Schedule1F1B;
- :mod:`~multigpu.pipeline.model`: the lesson's small model.

The formulas (bubble, bytes, activations in flight, the 3-D combination) are in
:mod:`multigpu.costmodel.pipeline`; the ranks and launchers in
:mod:`multigpu.ranks.pipeline`; the figures in :mod:`multigpu.plots.pipeline`;
the exercise's checker is :func:`multigpu.exercises.pipeline.check_one_f_one_b`.
"""

from multigpu.pipeline.executor import (
    MessageTimeoutError,
    StageResult,
    activation_shapes,
    microbatch_loss,
    one_process_gradients,
    run_actions,
)
from multigpu.pipeline.model import Scale, make_pipeline_data, make_pipeline_mlp
from multigpu.pipeline.schedules import (
    COMPUTE_OPS,
    MESSAGE_OPS,
    SCHEDULES,
    Action,
    ScheduleFunction,
    as_messages,
    gpipe_actions,
    in_flight_peak,
    one_f_one_b_actions,
    schedule_actions,
    schedule_problem,
)
from multigpu.pipeline.simulate import Simulation, simulate_schedule
from multigpu.pipeline.stages import split_microbatches, split_sequential, stage_sizes
from multigpu.pipeline.step import (
    PipelineRun,
    max_gradient_difference,
    merge_stage_results,
    pipeline_step,
)
from multigpu.pipeline.timeline import (
    ScheduleBlock,
    bubble_fraction,
    busy_time,
    step_span,
)
from multigpu.pipeline.torch_api import TORCH_SCHEDULES, torch_pipeline_step

__all__ = [
    "COMPUTE_OPS",
    "MESSAGE_OPS",
    "SCHEDULES",
    "TORCH_SCHEDULES",
    "Action",
    "ScheduleBlock",
    "MessageTimeoutError",
    "PipelineRun",
    "Scale",
    "ScheduleFunction",
    "Simulation",
    "StageResult",
    "activation_shapes",
    "as_messages",
    "bubble_fraction",
    "busy_time",
    "gpipe_actions",
    "in_flight_peak",
    "make_pipeline_data",
    "make_pipeline_mlp",
    "max_gradient_difference",
    "merge_stage_results",
    "microbatch_loss",
    "one_f_one_b_actions",
    "one_process_gradients",
    "pipeline_step",
    "run_actions",
    "schedule_actions",
    "schedule_problem",
    "simulate_schedule",
    "split_microbatches",
    "split_sequential",
    "stage_sizes",
    "step_span",
    "torch_pipeline_step",
]
