"""The hard-case registry (tests/hard_cases.py) meets the 4-D step: its models map
(N, 6) samples to logits, with no embedding, blocks or tied head to cut, so both
versions refuse each by name before any rank talks; a frozen parameter is refused
by name. The traits that apply to a GPT are in the equalities: the tied head (two
copies on two stages, or one tensor when pp is 1), uneven data (5 and 7 sequences
on dp 2), float32 and float64; a TinyGPT has no buffer and no unused parameter."""

import pytest

from multigpu.gpt4d.hand import check_model
from multigpu.gpt4d.model import GPTConfig, make_gpt
from tests.hard_cases import CASES, case_id


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_registry_model_is_refused_by_name(case):
    with pytest.raises(TypeError) as error:
        check_model(case.build())
    message = str(error.value)
    assert f"got {type(case.build()).__name__}" in message
    assert "\n" not in message


def test_a_frozen_parameter_is_refused_by_name():
    model = make_gpt(GPTConfig())
    model.blocks[1].ln2.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="frozen parameter, blocks.1.ln2.weight"):
        check_model(model)


def test_a_tinygpt_has_a_tied_head_and_no_buffer():
    model = make_gpt(GPTConfig())
    assert not list(model.buffers())
    assert all(p.requires_grad for p in model.parameters())
