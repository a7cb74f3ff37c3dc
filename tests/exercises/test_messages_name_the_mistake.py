"""The rule of conftest.py, tested: a FAIL that quotes the reference's code is
caught, one that names the mistake passes, and every checker is wrapped."""

import inspect

import multigpu.exercises.collectives as collectives_checkers
from tests.exercises.conftest import code_in, reference_code_in


def test_a_message_quoting_the_reference_is_caught():
    source_line = "torch.arange(rank, len(y), world_size)"  # 09's solution
    assert code_in(f"FAIL: take `{source_line}`.") == [source_line]
    assert reference_code_in(f"FAIL: take {source_line}.") == [source_line]
    assert code_in("FAIL: call optimizer.step() once") == []
    quoted = inspect.getsource(collectives_checkers).splitlines()  # not a reference
    assert not reference_code_in(quoted[0])


def test_a_message_naming_the_mistake_passes():
    message = (
        "FAIL: every rank's loss uses only its own slice of the vocabulary: the "
        "normaliser must cover all ranks (look at `set_epoch`)."
    )
    assert reference_code_in(message) == []


def test_every_checker_is_wrapped():
    assert hasattr(collectives_checkers.check_ring_all_reduce, "__wrapped__")
