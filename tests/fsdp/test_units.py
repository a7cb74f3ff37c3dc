"""plan_units groups the hard cases' modules into units (a tied weight in one
unit, a frozen layer in none) and refuses, by name, plans that split a parameter
over two units or leave one out; FlatUnit flattens a unit and keeps a chunk."""

import pytest
import torch

from multigpu.fsdp import FlatUnit, check_units, plan_units
from multigpu.zero import make_mlp
from tests.hard_cases import hard_case_model, tiny_model


def test_the_default_plan_groups_tied_modules_and_skips_frozen_ones():
    assert plan_units(hard_case_model()) == [
        ("embed",),
        ("encode", "decode"),
        ("head",),
        ("unused",),
    ]
    assert plan_units(tiny_model()) == [("",)]  # the root's own parameters
    assert plan_units(make_mlp((4, 3, 2))) == [("0",), ("2",)]


def test_a_tie_split_over_two_units_is_refused_by_name():
    with pytest.raises(ValueError) as error:
        plan_units(hard_case_model(), ["embed", "encode", "decode", "head", "unused"])
    assert str(error.value) == (
        "FSDP by hand cannot put one parameter in two units: encode.weight (unit "
        "encode) is decode.weight (unit decode), a weight tied or nested across "
        "units. Put the modules that share it into one unit, e.g. units=[..., "
        "('encode', 'decode')], or use the default plan, which groups them."
    )


def test_a_parameter_in_no_unit_and_an_unknown_module_are_refused():
    with pytest.raises(ValueError) as error:
        check_units(hard_case_model(), [("embed",), ("encode", "decode"), ("head",)])
    assert str(error.value) == (
        "The trainable parameter unused.weight is in no unit, so no rank would "
        "shard or update it. Add its module to a unit, or '' (the model itself) "
        "for parameters outside every unit."
    )
    with pytest.raises(ValueError) as error:
        plan_units(tiny_model(), ["body"])
    assert str(error.value) == (
        "Unit body names the module 'body', which TinyNet does not have. Use names "
        "from model.named_modules(), or '' for the model itself."
    )


def test_a_flat_unit_holds_a_tied_weight_once_and_keeps_a_chunk():
    model = hard_case_model(torch.float32)
    weight = model.encode.weight.detach().clone()
    unit = FlatUnit(
        1,
        ("encode", "decode"),
        model,
        rank=1,
        world_size=4,
        compute_dtype=torch.bfloat16,
    )
    assert unit.numel == 36  # one 6x6 weight, tied: once
    assert unit.name == "encode+decode"
    assert [slot[0] for slot in unit.slots] == ["encode.weight", "decode.weight"]
    assert torch.equal(unit.shard.detach(), weight.reshape(-1)[9:18])  # chunk 1 of 4
    assert unit.full.dtype == torch.bfloat16 and unit.nbytes() == 72
    assert unit.full.untyped_storage().nbytes() == 0  # nothing gathered yet
    assert "weight" not in model.encode._parameters  # the shard replaces it
