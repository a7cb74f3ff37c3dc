"""plan_units groups the hard cases' modules into units (a tied weight in one
unit, a frozen layer in none) and refuses, by name, plans that split a parameter
over two units or leave one out; FlatUnit flattens a unit, keeps a chunk, cuts it
into one piece per parameter and notes which parameters backward reaches."""

import pytest
import torch

from multigpu.fsdp import FlatUnit, check_units, plan_units
from multigpu.zero import make_mlp
from tests.hard_cases import hard_case_model, tiny_model, unread_parameter_model


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


def test_the_pieces_cut_each_ranks_chunk_at_the_parameters():
    whole = {
        n: p.detach().clone() for n, p in unread_parameter_model().named_parameters()
    }
    names = ["block.linear.weight", "block.linear.bias"]
    names += ["block.spare.weight", "block.spare.bias"]
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    for rank in range(4):  # 84 numbers: chunks of 21 cut through the parameters
        unit = FlatUnit(0, ("block",), unread_parameter_model(), rank, 4, None)
        assert [name for name, _, _ in unit.pieces.values()] == names
        address = unit.shard.untyped_storage().data_ptr()
        for name, where, piece in unit.pieces.values():
            assert torch.equal(piece.detach(), unit.shard.detach()[where])
            assert piece.untyped_storage().data_ptr() == address  # the same memory
            parts[name].append(piece.detach())
    for name in names:
        assert torch.equal(torch.cat(parts[name]), whole[name].reshape(-1))
    assert [len(piece) for piece in parts["block.linear.bias"]] == [0, 6, 0, 0]
    tied = FlatUnit(1, ("encode", "decode"), hard_case_model(), 0, 2, None)
    assert [name for name, _, _ in tied.pieces.values()] == ["encode.weight"]


def test_backward_reaches_only_the_parameters_forward_read():
    model = unread_parameter_model()
    flat = torch.cat([p.detach().reshape(-1) for p in model.block.parameters()])
    unit = FlatUnit(0, ("block",), model, 0, 1, None)
    unit.full.untyped_storage().resize_(unit.nbytes())
    unit.writer.copy_(flat)  # gathered: the whole unit on one rank
    unit.install(watch=True)
    model.block(torch.ones(2, 6, dtype=torch.float64)).sum().backward()
    assert unit.read == {0, 36}  # block.linear's weight and bias, not block.spare's
    assert [unit.pieces[offset][0] for offset in sorted(unit.read)] == [
        "block.linear.weight",
        "block.linear.bias",
    ]
