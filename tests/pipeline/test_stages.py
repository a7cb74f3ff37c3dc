"""Tests for multigpu.pipeline.stages: the cut of the model and of the batch, and
the models a pipeline refuses by name."""

import pytest
import torch
from torch import nn

from multigpu.pipeline import split_microbatches, split_sequential, stage_sizes
from tests.hard_cases import case_id, hard_case_model, refusals_for
from tests.pipeline.problem import PIPELINE_CASES, data, hard_sequential


def test_stage_sizes_cut_like_tensor_split():
    assert stage_sizes(10, 4) == [3, 3, 2, 2]
    assert stage_sizes(8, 4) == [2, 2, 2, 2]
    assert stage_sizes(8, 1) == [8]


def test_stage_sizes_refuse_more_stages_than_modules():
    with pytest.raises(ValueError, match="A model of 3 modules cannot be cut into 4"):
        stage_sizes(3, 4)


def test_split_sequential_shares_the_modules_in_order():
    model = hard_sequential()
    stages = split_sequential(model, 4)
    assert [len(s) for s in stages] == [2, 2, 2, 2]
    assert [m for s in stages for m in s] == list(model)  # the same objects


def test_split_sequential_refuses_a_weight_tied_across_stages():
    model = hard_sequential(tied_across=True)
    with pytest.raises(ValueError) as error:
        split_sequential(model, 2)
    assert str(error.value) == (
        "A weight is tied between stage 0 (3.weight) and stage 1 (5.weight): each "
        "stage would train its own copy. Cut the model so that tied modules fall in "
        "one stage, or untie them."
    )
    assert len(split_sequential(model, 1)) == 1  # one stage holds both


def test_split_sequential_refuses_batchnorm_in_training_mode():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="Module '1' is a BatchNorm in training mode"):
        split_sequential(model, 2)
    model.eval()
    assert len(split_sequential(model, 2)) == 2


def test_split_sequential_refuses_a_model_that_is_not_sequential():
    with pytest.raises(TypeError) as error:
        split_sequential(hard_case_model(), 2)
    assert str(error.value) == (
        "split_sequential needs an nn.Sequential, got TiedFrozenNet. Write the model "
        "as nn.Sequential(...) of its layers in order."
    )


@pytest.mark.parametrize(("case", "refusal"), refusals_for("pipeline"), ids=case_id)
def test_the_hard_cases_a_pipeline_cannot_take_are_refused_by_name(case, refusal):
    """The registry's cases without an nn.Sequential form, as they are."""
    assert case.sequential is None
    with pytest.raises((TypeError, ValueError)) as error:
        split_sequential(case.build(), 2)
    assert refusal.words in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("case", PIPELINE_CASES, ids=lambda case: case.name)
def test_the_sequential_form_of_each_case_cuts_into_2_and_4_stages(case):
    model = case.sequential()
    for stages in (2, 4):
        assert [m for s in split_sequential(model, stages) for m in s] == list(model)


def test_split_microbatches_handles_41_samples_in_4():
    X, y = data()
    pieces = split_microbatches(X, y, 4)
    assert [len(x) for x, _ in pieces] == [11, 10, 10, 10]
    assert torch.equal(torch.cat([x for x, _ in pieces]), X)
    assert torch.equal(torch.cat([t for _, t in pieces]), y)


def test_split_microbatches_refuses_empty_microbatches():
    X, y = data()
    with pytest.raises(ValueError) as error:
        split_microbatches(X, y, 42)
    assert str(error.value) == (
        "num_microbatches=42 is more micro-batches than the batch has samples (41): "
        "some would be empty. Use at most 41 micro-batches."
    )
