"""The checker of notebook 10's exercise (multigpu.exercises.miniddp.check_wrapper):
it passes a right bucketed DDP, names each mistake (the wrong classes are in
tests/exercises/wrong_miniddp.py), refuses a class that leaves the asked-for methods
to BucketedDDP, and refuses classes the ranks cannot import."""

import re

import pytest

from multigpu import miniddp
from multigpu.core.train import TrainConfig
from multigpu.exercises.miniddp import check_wrapper
from tests.exercises import wrong_miniddp as wrong

NUM_SAMPLES = 48  # 3 global batches of 16 per epoch
CONFIG = TrainConfig(epochs=2, batch_size=16, lr=0.2, momentum=0.5, seed=3)


@pytest.fixture
def problem(convnet_problem):
    return convnet_problem(NUM_SAMPLES)


def test_check_wrapper_passes_a_right_bucketed_ddp(problem):
    passed, message = check_wrapper(wrong.RightDDP, *problem, CONFIG)
    assert passed, message
    assert message.startswith("PASS: RightDDP trains like one process")


@pytest.mark.parametrize(
    "wrapper, expected",
    [
        (wrong.NoCopyBackDDP, "FAIL: the 2 ranks ended with different"),
        (wrong.NoDivisionDDP, "FAIL: the ranks agree, but end"),
        (wrong.AtTheEndDDP, "FAIL: the weights are right, but no all-reduce had"),
        (
            wrong.NeverSentDDP,
            "FAIL: synchronize found a bucket whose all-reduce was never started "
            "(bucket.work is None): the bucket never counted as full, because "
            "bucket.waiting never emptied, or its Work was not kept.",
        ),
        (
            wrong.BlockingDDP,
            "FAIL: gradient_ready ran its all-reduces synchronously, inside the "
            "hook: each call waited for the sum and returned no Work (bucket.work "
            "stayed None), so backward stood still while a bucket travelled and "
            "nothing overlapped.",
        ),
        (
            wrong.BlockingNoWaitDDP,
            "FAIL: gradient_ready ran its all-reduces synchronously, inside the "
            "hook: each call waited for the sum and returned no Work (bucket.work "
            "stayed None), so backward stood still while a bucket travelled and "
            "nothing overlapped.",
        ),
    ],
    ids=[
        "no copy back",
        "no division",
        "all-reduces at the end",
        "never sent",
        "blocking all-reduce",
        "blocking, no wait",
    ],
)
def test_check_wrapper_names_the_mistake(problem, wrapper, expected):
    passed, message = check_wrapper(wrapper, *problem, CONFIG)
    assert not passed
    assert message.startswith(expected)


def test_check_wrapper_reports_an_error_on_a_rank_as_a_fail(problem):
    passed, message = check_wrapper(wrong.NoReshapeDDP, *problem, CONFIG)
    assert not passed
    assert re.fullmatch(
        r"FAIL: your class raised on rank [01]: RuntimeError: The size of tensor a "
        r"\(\d+\) must match the size of tensor b \(\d+\) at non-singleton "
        r"dimension \d\.",
        message,
    ), message


@pytest.mark.parametrize(
    "wrapper, expected",
    [
        (
            wrong.EmptyDDP,
            "FAIL: EmptyDDP does not define gradient_ready and synchronize, so it "
            "runs BucketedDDP's own, the answer, and this check would test that "
            "instead of your code. Write gradient_ready and synchronize in "
            "EmptyDDP's class body.",
        ),
        (
            wrong.OnlySynchronizeDDP,
            "FAIL: OnlySynchronizeDDP does not define gradient_ready, so it runs "
            "BucketedDDP's own, the answer, and this check would test that instead "
            "of your code. Write gradient_ready in OnlySynchronizeDDP's class body.",
        ),
        (
            wrong.SuperDDP,
            "FAIL: SuperDDP.gradient_ready calls BucketedDDP's own gradient_ready "
            "(through super() or BucketedDDP.gradient_ready), the answer, instead "
            "of doing the work itself. Write its body with the bucket's fields.",
        ),
        (
            wrong.BaseCallDDP,
            "FAIL: BaseCallDDP.synchronize calls BucketedDDP's own synchronize "
            "(through super() or BucketedDDP.synchronize), the answer, instead of "
            "doing the work itself. Write its body with the bucket's fields.",
        ),
    ],
    ids=["empty subclass", "only synchronize", "super()", "BucketedDDP.synchronize"],
)
def test_check_wrapper_refuses_the_reference_s_own_methods(problem, wrapper, expected):
    assert check_wrapper(wrapper, *problem, CONFIG) == (False, expected)


def test_check_wrapper_refuses_classes_the_ranks_cannot_import(problem):
    class Local(miniddp.BucketedDDP):
        pass

    Local.__module__ = "__main__"
    with pytest.raises(TypeError, match="defined in the notebook"):
        check_wrapper(Local, *problem, CONFIG)
    with pytest.raises(TypeError, match="needs a subclass of BucketedDDP"):
        check_wrapper(miniddp.FlatDDP, *problem, CONFIG)
