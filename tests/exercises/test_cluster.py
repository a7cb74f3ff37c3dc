"""Tests for multigpu.exercises.cluster: 20's checkers pass the references and
correct answers written otherwise, and name each mistake learners make (the
answers in wrong_cluster.py); a learner's exception is a FAIL naming it; an
answer that hands the work to the planner is refused by name."""

import pytest

from multigpu.cluster.planner import valid_grids
from multigpu.exercises.cluster import check_collectives_per_step, check_valid_grids
from tests.exercises import wrong_cluster as wrong
from tests.exercises.raising import raises


@pytest.mark.parametrize(
    ("checker", "answer"),
    [
        (check_collectives_per_step, wrong.reference_counts),
        (check_collectives_per_step, wrong.counts_with_zeros),
        (check_valid_grids, wrong.reference_grids),
        (check_valid_grids, wrong.grids_by_product),
    ],
)
def test_correct_answers_pass(checker, answer):
    passed, message = checker(answer)
    assert passed, message
    assert message.startswith("PASS:")


@pytest.mark.parametrize(
    ("answer", "names"),
    [
        (wrong.forward_gathers_only, "Forward is not the only time"),
        (wrong.root_as_a_unit, "root unit hold any parameters"),
        (wrong.fsdp_on_one_rank, "FSDP2 have to exchange with a group of one"),
        (wrong.first_block_input_gradient, "first block's input need a gradient"),
        (wrong.megatron_four_per_block, "Count forward (row-parallel outputs)"),
        (wrong.tp_on_one_rank, "TP have to exchange with a group of one"),
        (wrong.not_a_dict, "return a dict"),
        (raises, "raised LearnerBug: a learner's mistake"),
    ],
)
def test_wrong_counts_are_named(answer, names):
    passed, message = check_collectives_per_step(answer)
    assert not passed
    assert message.startswith("FAIL:") and names in message


@pytest.mark.parametrize(
    ("answer", "names"),
    [
        (wrong.tp_across_nodes, "tensor-parallel group leaves the node"),
        (wrong.heads_not_checked, "key/value heads cannot be split"),
        (wrong.layers_not_checked, "layers cannot be split"),
        (wrong.too_few_micro_batches, "fewer micro-batches than stages"),
        (wrong.product_not_checked, "do not add up to the GPUs"),
        (wrong.missing_one, "you leave out"),
        (wrong.borrows_the_planner, "planner's own valid_grids"),
        (valid_grids, "planner's own valid_grids"),
        (raises, "raised LearnerBug: a learner's mistake"),
    ],
)
def test_wrong_grids_are_named(answer, names):
    passed, message = check_valid_grids(answer)
    assert not passed
    assert message.startswith("FAIL:") and names in message
