"""The checker of notebook 10's exercise (multigpu.exercises.miniddp.check_wrapper):
it passes a right bucketed DDP, names each mistake, and refuses classes the ranks
cannot import."""

import pytest

from multigpu import miniddp
from multigpu.core.train import TrainConfig
from multigpu.exercises.miniddp import check_wrapper

NUM_SAMPLES = 48  # 3 global batches of 16 per epoch
CONFIG = TrainConfig(epochs=2, batch_size=16, lr=0.2, momentum=0.5, seed=3)


@pytest.fixture
def problem(convnet_problem):
    return convnet_problem(NUM_SAMPLES)


SOLUTION = """
import torch.distributed as dist
from multigpu.miniddp import BucketedDDP


class MyDDP(BucketedDDP):
    def gradient_ready(self, param):
        bucket, i = self._bucket_of[id(param)]
        view = bucket.buffer[bucket.offsets[i] : bucket.offsets[i] + param.numel()]
        view.copy_(param.grad.reshape(-1)){divide}
        bucket.waiting.discard(id(param))
        if not bucket.waiting:
            {launch}

    def synchronize(self):
        for bucket in self.buckets:
            {finish}
"""


DIVIDE = ".div_(self.world_size)"


LAUNCH = "bucket.work = dist.all_reduce(bucket.buffer, async_op=True)"


COPY_BACK = """
            for p, offset in zip(bucket.params, bucket.offsets):
                p.grad.copy_(bucket.buffer[offset : offset + p.numel()].view_as(p))"""


RIGHT = {"divide": DIVIDE, "launch": LAUNCH, "finish": "bucket.work.wait()" + COPY_BACK}


@pytest.fixture
def learner_module():
    from multigpu.runtime import scratch

    yield lambda source: scratch.write_module("learner_ddp", source).MyDDP
    scratch.clean_up()


def test_check_wrapper_passes_a_right_bucketed_ddp(problem, learner_module):
    MyDDP = learner_module(SOLUTION.format(**RIGHT))
    passed, message = check_wrapper(MyDDP, *problem, CONFIG)
    assert passed, message
    assert message.startswith("PASS: MyDDP trains like one process")


@pytest.mark.parametrize(
    "mistake, expected",
    [
        ({"finish": "bucket.work.wait()"}, "FAIL: the 2 ranks ended with different"),
        ({"divide": ""}, "FAIL: the ranks agree, but end"),
        (
            {"launch": "pass", "finish": "dist.all_reduce(bucket.buffer)" + COPY_BACK},
            "FAIL: the weights are right, but no all-reduce had started",
        ),
    ],
    ids=["no copy back", "no division", "all-reduces at the end"],
)
def test_check_wrapper_names_the_mistake(problem, learner_module, mistake, expected):
    MyDDP = learner_module(SOLUTION.format(**{**RIGHT, **mistake}))
    passed, message = check_wrapper(MyDDP, *problem, CONFIG)
    assert not passed
    assert message.startswith(expected)


def test_check_wrapper_refuses_classes_the_ranks_cannot_import(problem):
    class Local(miniddp.BucketedDDP):
        pass

    Local.__module__ = "__main__"
    with pytest.raises(TypeError, match="defined in the notebook"):
        check_wrapper(Local, *problem, CONFIG)
    with pytest.raises(TypeError, match="needs a subclass of BucketedDDP"):
        check_wrapper(miniddp.FlatDDP, *problem, CONFIG)
