"""The checkers of notebook 09b's exercises (multigpu.exercises.ddp): each passes
the reference answers and names each mistake learners make."""

import pytest
import torch

from multigpu.exercises.ddp import check_accumulation, check_checkpoint
from tests.exercises import wrong_ddp


@pytest.fixture
def problem():
    """A small float64 model (one DDP bucket) and 32 samples: 2 global batches of
    2 ranks x 4 micro-batches x 2 samples."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)
    ).double()
    return model, torch.randn(32, 6, dtype=torch.float64), torch.randint(0, 3, (32,))


@pytest.mark.parametrize(
    ("save", "load"), [("save", "load"), ("save_own_keys", "load_own_keys")]
)
def test_check_checkpoint_passes_right_answers(save, load):
    assert check_checkpoint(getattr(wrong_ddp, save), getattr(wrong_ddp, load)) == (
        True,
        "PASS: on 2 ranks only rank 0 saved, every rank waited for the file and "
        "loaded it with map_location, and got epoch 2's weights and momentum.",
    )


@pytest.mark.parametrize(
    ("save", "load", "start"),
    [
        ("save_on_every_rank", "load", "FAIL: rank 1 saved too"),
        ("save_without_barrier", "load", "FAIL: rank 1 loaded the previous checkpoint"),
        ("save", "load_without_map_location", "FAIL: torch.load ran without map_loc"),
        ("save_with_barrier_on_rank0", "load", "FAIL: the ranks did not call dist.b"),
        (
            "save",
            "load_without_optimizer",
            "FAIL: the optimizer's state did not come back: after load its momentum "
            "buffers are missing",
        ),
        (
            "save",
            "load_other_keys",
            "FAIL: load raised KeyError on rank 0: it looked up 'model_state_dict', "
            "but the checkpoint that save wrote holds 'epoch', 'model', 'optimizer'.",
        ),
    ],
)
def test_check_checkpoint_names_each_mistake(save, load, start):
    passed, message = check_checkpoint(
        getattr(wrong_ddp, save), getattr(wrong_ddp, load)
    )
    assert not passed
    assert message.startswith(start), message


@pytest.mark.parametrize("step", ["step", "step_flag_before_forward"])
def test_check_accumulation_passes_right_steps(problem, step):
    assert check_accumulation(getattr(wrong_ddp, step), *problem) == (
        True,
        "PASS: on 2 ranks each step all-reduced once, on the last of its 4 "
        "micro-batches, and the weights equal one process on the global batch.",
    )


@pytest.mark.parametrize(
    ("step", "start"),
    [
        ("step_todo", "FAIL: the weights never changed: no optimizer step"),
        (
            "step_flag_after_forward",
            "FAIL: the all-reduces ran on micro-batches [[0], [0]] of each step",
        ),
        (
            "step_no_sync_around_backward",
            "FAIL: every micro-batch all-reduced although you used no_sync()",
        ),
        ("step_sync_every_micro_batch", "FAIL: every micro-batch all-reduced (4 per"),
        ("step_all_in_no_sync", "FAIL: no micro-batch all-reduced"),
        (
            "step_not_divided",
            "FAIL: each step synced once, on the last micro-batch, but took 4 times "
            "the global batch's step",
        ),
        (
            "step_module_no_sync",
            "FAIL: step raised AttributeError: it asked the wrapped module "
            "(model.module) for no_sync, which only DDP has",
        ),
        (
            "step_zero_grad_before_step",
            "FAIL: the weights never changed: no optimizer step moved them",
        ),
    ],
)
def test_check_accumulation_names_each_mistake(problem, step, start):
    passed, message = check_accumulation(getattr(wrong_ddp, step), *problem)
    assert not passed
    assert message.startswith(start), message
