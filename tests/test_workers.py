"""Tests for multigpu.workers: the functions ranks run for notebook 07 and the tests
(the launch demos are tested in test_launch.py, the all-reduce comparisons in
test_collectives.py)."""

import pickle

import pytest
import torch

from multigpu import costmodel, workers
from multigpu.runtime.launch import spawn


def test_ping_pong_sends_and_receives():
    assert spawn(workers.ping_pong, 2, 1.5) == [[3.0], [3.0]]


def test_rank_tensor_is_deterministic_and_differs_between_ranks():
    first = workers.rank_tensor(0, (4, 5), torch.float32)
    assert torch.equal(first, workers.rank_tensor(0, (4, 5), torch.float32))
    assert not torch.equal(first, workers.rank_tensor(1, (4, 5), torch.float32))
    assert first.shape == (4, 5) and first.dtype == torch.float32
    integers = workers.rank_tensor(2, (50,), torch.int64)
    assert integers.dtype == torch.int64
    assert 2 <= integers.min() and integers.max() <= 101


def test_bytes_sent_are_counted_by_rank():
    rows = spawn(workers.bytes_sent, 4, 10)
    assert [row["rank"] for row in rows] == [0, 1, 2, 3]
    assert [row["naive"] for row in rows] == [120, 40, 40, 40]
    assert [row["ring"] for row in rows] == [
        costmodel.ring_bytes_per_rank(10, 4, 4, rank) for rank in range(4)
    ]


def test_timing_rows_have_the_expected_shape():
    rows = spawn(workers.time_all_reduces, 2, [4096], 1, timeout=10.0)[0]
    names = ["naive", "ring", "ring pipelined", "dist.all_reduce"]
    assert [row["algorithm"] for row in rows] == names
    assert [row["bytes sent"] for row in rows] == [4096, 4096, 4096, None]
    assert all(row["seconds"] > 0 and row["busbw GB/s"] > 0 for row in rows)
    assert {row["world_size"] for row in rows} == {2}


def test_timing_only_the_named_all_reduces():
    rows = spawn(workers.time_all_reduces, 2, [4096, 8192], 1, ["ring"])[1]
    assert [(row["algorithm"], row["bytes"]) for row in rows] == [
        ("ring", 4096),
        ("ring", 8192),
    ]


def test_the_misbehaving_workers_misbehave_only_on_their_rank():
    # Called in this process: the ranks that behave return at once.
    assert workers.stuck_outside_collectives(0, 2, 1) == 0
    assert workers.exit_without_returning(0, 2, 1) == 0
    assert workers.raise_unprintable(0, 2, 1) == 0
    assert workers.result_that_fails_to_unpickle(0, 2, 1) == 0


def test_the_faulty_objects_fail_where_they_should():
    with pytest.raises(RuntimeError, match="cannot be turned into text"):
        str(workers.UnprintableError())
    data = pickle.dumps(workers.RefusesToUnpickle())  # pickling works ...
    with pytest.raises(ValueError, match="cannot be rebuilt outside the rank"):
        pickle.loads(data)  # ... unpickling does not


def test_check_all_reduce_tells_a_ring_from_a_wrong_sum_and_from_other_traffic():
    from multigpu import collectives

    ring = spawn(workers.check_all_reduce, 3, collectives.ring_all_reduce)
    assert ring[0] == ring[1] == ring[2]  # every rank returns the verdict of all
    assert [row["case"] for row in ring[0]] == [
        "(1000,) float32",
        "(3,) float32",
        "(4, 5) float64",
        "(13,) int64",
    ]
    assert all(row["sum"] and row["ring bytes"] for row in ring[0])
    # Right sums, but rank 0 sends (n-1)·S: not a ring.
    naive = spawn(workers.check_all_reduce, 3, collectives.naive_all_reduce)[0]
    assert [(row["sum"], row["ring bytes"]) for row in naive] == [(True, False)] * 4
    # Zeros instead of the sum, and a tensor instead of a byte count.
    first_case = workers.CHECK_CASES[:1]
    wrong = spawn(workers.check_all_reduce, 3, torch.Tensor.zero_, first_case)[0]
    assert [(row["sum"], row["ring bytes"]) for row in wrong] == [(False, False)]


@pytest.mark.parametrize(
    "step",
    [
        workers.step_all_reducing_each_gradient,
        workers.step_without_all_reduce,
        workers.step_summing_without_dividing,
        workers.step_returning_the_ranks_summed_loss,
    ],
    ids=lambda step: step.__name__,
)
def test_the_training_steps_are_sgd_steps_in_one_process(step):
    # Their mistakes are in what the ranks exchange, so with distributed=False each
    # takes sgd_step's step (check_step's tests show each mistake on ranks).
    from multigpu.allreduce_sgd import sgd_step
    from multigpu.core.models import ConvNet
    from multigpu.core.train import TrainConfig

    torch.manual_seed(0)
    X, y = torch.randn(8, 1, 8, 8), torch.randint(0, 3, (8,))
    results = []
    for run in (sgd_step, step):
        torch.manual_seed(1)
        model = ConvNet(in_channels=1, num_classes=3, width=4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = [run(model, optimizer, X, y, TrainConfig()) for _ in range(2)]
        results.append((losses, model.state_dict()))
    (expected_losses, expected), (losses, weights) = results
    assert losses == expected_losses
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name
