"""The hard-case models really are hard: each property the equivalence tests rely on
is checked here, so a later edit cannot quietly make them friendly."""

import torch

from tests.hard_cases import (
    CLASSES,
    NUM_SAMPLES,
    hard_case_data,
    hard_case_model,
    tiny_model,
    trainable_numel,
)


def test_the_hard_case_model_ties_freezes_leaves_unused_and_has_a_buffer():
    model = hard_case_model()
    assert model.encode.weight is model.decode.weight
    names = dict(model.named_parameters())  # a tied weight is listed once
    assert "decode.weight" not in names and "encode.weight" in names
    assert {"decode.weight", "encode.weight"} <= set(model.state_dict())
    assert not model.frozen.weight.requires_grad and not model.frozen.bias.requires_grad
    assert [name for name, _ in model.named_buffers()] == ["scale"]
    X, y = hard_case_data(8)
    torch.nn.functional.cross_entropy(model(X), y).backward()
    assert model.unused.weight.grad is None and model.frozen.weight.grad is None
    assert model.encode.weight.grad is not None


def test_no_world_size_from_2_to_4_divides_the_counts():
    model = hard_case_model()
    total = sum(p.numel() for p in model.parameters())
    for world_size in (2, 3, 4):
        assert total % world_size != 0
        assert trainable_numel(model) % world_size != 0
        assert NUM_SAMPLES % world_size != 0
    assert trainable_numel(tiny_model()) < 3


def test_models_and_data_come_in_both_dtypes_and_seeds_change_the_weights():
    for dtype in (torch.float32, torch.float64):
        X, y = hard_case_data(dtype=dtype)
        assert X.dtype == dtype and int(y.max()) < CLASSES
        assert hard_case_model(dtype).head.weight.dtype == dtype
    assert not torch.equal(
        hard_case_model(seed=0).head.weight, hard_case_model(seed=1).head.weight
    )
