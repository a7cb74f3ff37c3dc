"""Tests for multigpu.core.reproducibility: seeding and stable rounding."""

import random

import numpy as np
import torch

from multigpu.core.reproducibility import round_sig, set_seed


def test_set_seed_makes_every_generator_repeat():
    set_seed(3)
    first = (random.random(), np.random.rand(), torch.rand(3))
    set_seed(3)
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[:2] == second[:2]
    assert torch.equal(first[2], second[2])
    set_seed(4)
    assert not torch.equal(torch.rand(3), first[2])  # another seed, other numbers


def test_round_sig_keeps_significant_digits():
    assert round_sig(1.234567) == 1.235
    assert round_sig(0.000123456) == 0.0001235
    assert round_sig(98765.4) == 98770.0
    assert round_sig(-2.0) == -2.0
    assert round_sig(1.234567, digits=2) == 1.2
