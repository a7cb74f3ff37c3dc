"""TiedFrozenNet has the hard cases: a tied weight, a frozen layer, an unused
layer and a buffer, and a trainable count no world size from 2 to 4 divides."""

import torch

from multigpu.fsdp import TiedFrozenNet, plan_units


def test_tied_frozen_net_has_every_hard_case():
    model = TiedFrozenNet()
    assert model.encode.weight is model.decode.weight
    assert not any(p.requires_grad for p in model.frozen.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == 113 and all(trainable % n for n in (2, 3, 4))
    assert plan_units(model) == [
        ("embed",),
        ("encode", "decode"),
        ("head",),
        ("unused",),
    ]
    assert model(torch.ones(5, 6)).shape == (5, 3)
    assert "scale" in model.state_dict()
