"""The reference solution of notebook 10's exercise and the mistakes learners make
in it, as classes the ranks can import (tests/exercises/test_miniddp.py)."""

import torch.distributed as dist

from multigpu.miniddp import BucketedDDP


def copy_back(bucket):
    for p, offset in zip(bucket.params, bucket.offsets):
        p.grad.copy_(bucket.buffer[offset : offset + p.numel()].view_as(p))


class RightDDP(BucketedDDP):
    """The solutions notebook's answer."""

    def gradient_ready(self, param):
        bucket, i = self._bucket_of[id(param)]
        view = bucket.buffer[bucket.offsets[i] : bucket.offsets[i] + param.numel()]
        view.copy_(param.grad.reshape(-1)).div_(self.world_size)
        bucket.waiting.discard(id(param))
        if not bucket.waiting:
            bucket.work = dist.all_reduce(bucket.buffer, async_op=True)

    def synchronize(self):
        for bucket in self.buckets:
            bucket.work.wait()
            copy_back(bucket)


class NoCopyBackDDP(RightDDP):
    """Waits for every bucket but leaves each rank's own gradient in .grad."""

    def synchronize(self):
        for bucket in self.buckets:
            bucket.work.wait()


class NoDivisionDDP(RightDDP):
    """Forgot to divide by the world size: the all-reduce's sum stays a sum."""

    def gradient_ready(self, param):
        bucket, i = self._bucket_of[id(param)]
        view = bucket.buffer[bucket.offsets[i] : bucket.offsets[i] + param.numel()]
        view.copy_(param.grad.reshape(-1))
        bucket.waiting.discard(id(param))
        if not bucket.waiting:
            bucket.work = dist.all_reduce(bucket.buffer, async_op=True)


class AtTheEndDDP(RightDDP):
    """Packs in gradient_ready but all-reduces only in synchronize: no overlap."""

    def gradient_ready(self, param):
        bucket, i = self._bucket_of[id(param)]
        view = bucket.buffer[bucket.offsets[i] : bucket.offsets[i] + param.numel()]
        view.copy_(param.grad.reshape(-1)).div_(self.world_size)

    def synchronize(self):
        for bucket in self.buckets:
            dist.all_reduce(bucket.buffer)
            copy_back(bucket)


class NeverSentDDP(RightDDP):
    """Copies into the bucket but never marks the gradient as arrived, so no
    bucket is ever full and none is sent; synchronize waits for a Work that is
    not there."""

    def gradient_ready(self, param):
        bucket, i = self._bucket_of[id(param)]
        view = bucket.buffer[bucket.offsets[i] : bucket.offsets[i] + param.numel()]
        view.copy_(param.grad.reshape(-1)).div_(self.world_size)
        if not bucket.waiting:
            bucket.work = dist.all_reduce(bucket.buffer, async_op=True)


class BlockingDDP(RightDDP):
    """All-reduces each full bucket in gradient_ready, but blocking: the call
    returns None, so synchronize has no Work to wait for."""

    def gradient_ready(self, param):
        bucket, i = self._bucket_of[id(param)]
        view = bucket.buffer[bucket.offsets[i] : bucket.offsets[i] + param.numel()]
        view.copy_(param.grad.reshape(-1)).div_(self.world_size)
        bucket.waiting.discard(id(param))
        if not bucket.waiting:
            bucket.work = dist.all_reduce(bucket.buffer)


class BlockingNoWaitDDP(BlockingDDP):
    """The blocking all-reduce in gradient_ready, and a synchronize that only
    copies back: right weights, but backward stood still during each sum."""

    def synchronize(self):
        for bucket in self.buckets:
            copy_back(bucket)


class NoReshapeDDP(RightDDP):
    """Copies a 4-d gradient into the flat bucket without reshape(-1)."""

    def gradient_ready(self, param):
        bucket, i = self._bucket_of[id(param)]
        view = bucket.buffer[bucket.offsets[i] : bucket.offsets[i] + param.numel()]
        view.copy_(param.grad).div_(self.world_size)
        bucket.waiting.discard(id(param))
        if not bucket.waiting:
            bucket.work = dist.all_reduce(bucket.buffer, async_op=True)


class EmptyDDP(BucketedDDP):
    """The exercise's class with nothing written: BucketedDDP's own methods run."""


class OnlySynchronizeDDP(BucketedDDP):
    """gradient_ready left out: BucketedDDP's own one sends the buckets."""

    def synchronize(self):
        for bucket in self.buckets:
            bucket.work.wait()
            copy_back(bucket)


class SuperDDP(BucketedDDP):
    """gradient_ready written as a call to BucketedDDP's own, through super()."""

    def gradient_ready(self, param):
        super().gradient_ready(param)

    synchronize = RightDDP.synchronize


class BaseCallDDP(BucketedDDP):
    """synchronize written as a call to BucketedDDP's own, by its class name."""

    gradient_ready = RightDDP.gradient_ready

    def synchronize(self):
        BucketedDDP.synchronize(self)
