"""Learner code that raises: every checker must turn it into a FAIL naming it."""

import torch


class LearnerBug(RuntimeError):
    pass


def raises(*args, **kwargs):
    raise LearnerBug("a learner's mistake")


class RaisingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise LearnerBug("a learner's mistake")

    @staticmethod
    def backward(ctx, grad):
        raise LearnerBug("a learner's mistake")
