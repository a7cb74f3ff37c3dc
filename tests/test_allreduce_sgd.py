"""Hand-written data-parallel SGD equals single-process SGD on the global batch.

The launchers are :mod:`multigpu.ranks.allreduce_sgd`'s; the exercise's checker is
tested in ``tests/exercises/test_allreduce_sgd.py``."""

import functools
from dataclasses import replace

import pytest
import torch

from multigpu.allreduce_sgd import (
    DataPartitioner,
    allreduce_sum,
    batch_indices,
    compare_with_reference,
    per_rank_batch_size,
    sum_gradients,
    train_one_process,
    world_losses,
)
from multigpu.core.compare import max_parameter_difference
from multigpu.core.models import ConvNet
from multigpu.core.train import ALLREDUCE_METHODS, TrainConfig, evaluate
from multigpu.ranks.allreduce_sgd import (
    compare_data_parallel,
    train_data_parallel,
    train_rank,
)
from multigpu.runtime.launch import WorkerError, in_one_launch, spawn
from tests.hard_cases import (
    DTYPES,
    REPLICATED_WORLD_SIZES,
    assert_ranks_equal_one_process,
    cases_for,
    hard_case_data,
    hard_case_model,
)
from tests.ranks import train_loop_from_own_seed_rank

NUM_SAMPLES = 40  # 2 full global batches of 16 per epoch; 8 samples left over
# 3 epochs = 6 steps, so the per-epoch reshuffle is covered too. Momentum makes a
# step depend on every earlier gradient, so any mismatch would add up.
CONFIG = TrainConfig(epochs=3, batch_size=16, lr=0.2, momentum=0.5, seed=3)
STEPS = 6  # steps per rank: 3 epochs x 2 full global batches
RUNS = {method: replace(CONFIG, allreduce=method) for method in ALLREDUCE_METHODS}
RUNS["ring, scale_loss"] = replace(CONFIG, allreduce="ring", reduction="scale_loss")
TIMEOUT = 30.0  # seconds for the rendezvous and each collective (only a hang waits)


@pytest.fixture(scope="module")
def problem():
    """A tiny ConvNet and random 8x8 images: (model, X (40, 1, 8, 8), y (40,))."""
    torch.manual_seed(0)
    model = ConvNet(in_channels=1, num_classes=3, width=4)
    X = torch.randn(NUM_SAMPLES, 1, 8, 8)
    y = torch.randint(0, 3, (NUM_SAMPLES,))
    return model, X, y


@pytest.fixture(scope="module")
def reference(problem):
    return train_one_process(*problem, CONFIG)


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"world{n}")
def runs(request, problem):
    """Every run in RUNS in one launch of 1, 2 or 4 processes: {name: by rank}."""
    return compare_data_parallel(*problem, RUNS, request.param, timeout=TIMEOUT)


def test_reference_training_moves_the_weights(problem, reference):
    model, _, _ = problem
    # Otherwise "equal to the reference" below would prove little.
    assert max_parameter_difference(reference.parameters, model.state_dict()) > 1e-2


@pytest.mark.parametrize("name", list(RUNS))
def test_every_rank_ends_with_identical_parameters(runs, name):
    results = runs[name]
    assert [r.rank for r in results] == list(range(len(results)))
    for result in results[1:]:
        for key, tensor in results[0].parameters.items():
            assert torch.equal(result.parameters[key], tensor), (name, key)


@pytest.mark.parametrize("name", list(RUNS))
def test_parameters_equal_one_process_sgd_on_the_global_batch(runs, reference, name):
    for result in runs[name]:
        assert result.parameters.keys() == reference.parameters.keys()
        for key, tensor in reference.parameters.items():
            torch.testing.assert_close(result.parameters[key], tensor)


@pytest.mark.parametrize("name", list(RUNS))
def test_mean_of_rank_losses_is_the_global_batch_loss(runs, reference, name):
    results = runs[name]
    assert all(len(r.step_loss) == STEPS for r in results)
    torch.testing.assert_close(
        torch.tensor(world_losses(results)), torch.tensor(reference.step_loss)
    )


def test_histories_have_per_epoch_numbers_of_their_rank(runs, reference):
    world_size = len(runs["ring"])
    assert (reference.rank, reference.world_size) == (0, 1)
    assert [r.world_size for r in runs["ring"]] == [world_size] * world_size
    for history in [reference, *runs["ring"]]:
        assert len(history.train_loss) == len(history.seconds) == CONFIG.epochs
        assert history.test_loss == history.test_accuracy == []  # no test set given
        by_epoch = torch.tensor(history.step_loss).view(CONFIG.epochs, -1)  # (3, 2)
        torch.testing.assert_close(torch.tensor(history.train_loss), by_epoch.mean(1))


@pytest.mark.parametrize("name", list(RUNS))
def test_compare_with_reference_summarises_the_agreement(runs, reference, name):
    identical, weights, losses = compare_with_reference(runs[name], reference)
    assert identical is True
    assert 0 <= weights < 1e-5 and 0 <= losses < 1e-5


def test_scaling_the_loss_gives_the_same_update_as_averaging(runs):
    for averaged, scaled in zip(runs["ring"], runs["ring, scale_loss"], strict=True):
        for key, tensor in averaged.parameters.items():
            torch.testing.assert_close(scaled.parameters[key], tensor)


def test_the_original_model_is_not_changed(problem, runs):
    model, _, _ = problem
    torch.manual_seed(0)  # as in the `problem` fixture
    untouched = ConvNet(in_channels=1, num_classes=3, width=4)
    assert max_parameter_difference(model.state_dict(), untouched.state_dict()) == 0


@pytest.mark.parametrize("num_samples", [1, 10, 37, 40])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_partitioner_gives_disjoint_shards_that_cover_the_data(num_samples, world_size):
    partitioner = DataPartitioner(num_samples, world_size, seed=5)
    for epoch in (0, 1):
        shards = partitioner.shards(epoch)
        assert len(shards) == world_size
        everything = torch.cat(shards)
        assert len(everything) == num_samples  # disjoint: no index twice ...
        assert sorted(everything.tolist()) == list(range(num_samples))  # ... covering
        sizes = [len(shard) for shard in shards]
        assert max(sizes) - min(sizes) <= 1


def test_partitioner_is_seeded_and_reshuffles_each_epoch():
    a, b = DataPartitioner(100, 4, seed=1), DataPartitioner(100, 4, seed=1)
    assert torch.equal(a.shard(2, epoch=0), b.shard(2, epoch=0))
    assert not torch.equal(a.shard(2, epoch=0), a.shard(2, epoch=1))
    assert not torch.equal(a.order(0), DataPartitioner(100, 4, seed=2).order(0))
    with pytest.raises(ValueError, match="rank 4 is outside this world of 4 ranks"):
        a.shard(4)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ranks_batches_together_are_the_one_process_global_batches(world_size):
    num_samples, global_batch, steps = 50, 12, 9  # 4 steps per epoch, 2 left over
    single = batch_indices(num_samples, global_batch, steps, seed=7)
    per_rank = [
        batch_indices(num_samples, global_batch, steps, world_size, rank, seed=7)
        for rank in range(world_size)
    ]
    for step in range(steps):
        batches = [ranks_batches[step] for ranks_batches in per_rank]
        assert all(len(batch) == global_batch // world_size for batch in batches)
        union = torch.cat(batches).sort().values
        assert torch.equal(union, single[step].sort().values), step
    # Within an epoch the single process never repeats a sample.
    assert len(set(torch.cat(single[:4]).tolist())) == 4 * global_batch


def test_per_rank_batch_size_divides_the_global_batch():
    assert per_rank_batch_size(128, 4) == 32
    assert per_rank_batch_size(64, 1) == 64
    assert isinstance(per_rank_batch_size(128, 4), int)


def test_non_dividing_global_batch_is_a_clear_error():
    message = (
        r"A global batch of 64 does not split evenly over 3 ranks "
        r"\(64 / 3 = 21\.33 samples each\)\. Choose a global batch that is a "
        r"multiple of the world size, e.g\. 63 or 66\."
    )
    with pytest.raises(ValueError, match=message):
        per_rank_batch_size(64, 3)
    with pytest.raises(ValueError, match=r"e\.g\. 4\.$"):
        per_rank_batch_size(2, 4)


def test_float_batch_size_is_refused():
    # The old tutorial computed the batch as 128 / float(size): a float.
    with pytest.raises(ValueError, match=r"got 128\.0\. .* e\.g\. global_batch=128\."):
        per_rank_batch_size(128 / float(1), 4)


def test_launch_refuses_a_non_dividing_batch_before_starting_processes(problem):
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        train_data_parallel(*problem, CONFIG, world_size=3)


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match=r"Unknown all-reduce 'tree'\. Choose one of"):
        TrainConfig(allreduce="tree")
    with pytest.raises(ValueError, match=r"Unknown reduction 'sum'\. Choose one of"):
        TrainConfig(reduction="sum")
    with pytest.raises(ValueError, match=r"Unknown all-reduce 'tree'\. .*naive, ring"):
        allreduce_sum(torch.ones(2), "tree")


def test_global_batch_larger_than_the_data_is_a_clear_error():
    with pytest.raises(ValueError, match="larger than the 10 samples"):
        batch_indices(10, 16, steps=1)


def test_evaluate_with_parameters_matches_a_direct_forward_pass(problem, reference):
    model, X, y = problem
    loss, accuracy = evaluate(model, [(X, y)], parameters=reference.parameters)
    trained = ConvNet(in_channels=1, num_classes=3, width=4)
    trained.load_state_dict(reference.parameters)
    with torch.no_grad():
        logits = trained(X)
    expected = torch.nn.functional.cross_entropy(logits, y).item()
    assert loss == pytest.approx(expected, rel=1e-6)
    assert accuracy == pytest.approx((logits.argmax(1) == y).float().mean().item())


@pytest.mark.gpu(2)
def test_on_gpus_ranks_stay_identical_and_ring_matches_nccl(problem):
    configs = {name: RUNS[name] for name in ("ring", "torch")}
    runs = compare_data_parallel(*problem, configs, 2, TIMEOUT, backend="nccl")
    for results in runs.values():
        for key, tensor in results[0].parameters.items():
            assert tensor.device.type == "cpu"  # returned to the caller on the CPU
            assert torch.equal(results[1].parameters[key], tensor)
    for key, tensor in runs["torch"][0].parameters.items():
        torch.testing.assert_close(runs["ring"][0].parameters[key], tensor)


def test_partition_order_is_the_single_device_loaders_order():
    """Notebook 01's shuffled loader and this partitioner share one epoch order."""
    from multigpu.core.data import EpochSampler

    sampler = EpochSampler(50, seed=7)
    sampler.set_epoch(2)
    assert DataPartitioner(50, 1, seed=7).order(2).tolist() == list(sampler)


def test_comparing_empty_state_dicts_is_a_clear_error():
    with pytest.raises(ValueError) as raised:
        max_parameter_difference({}, {})
    assert str(raised.value) == (
        "The two state_dicts are empty: there are no parameters to compare. "
        "Pass the results' .parameters after training."
    )


# ----------------------------------------------------------------------------------
# The hard cases (tests/hard_cases.py, every case the registry says allreduce_sgd
# trains like one process): 41 samples (3 global batches of 12 per epoch, 5 left
# over), float32 and float64, on 2 and 4 ranks, with every all-reduce.

HARD_CONFIG = TrainConfig(epochs=2, batch_size=12, lr=0.2, momentum=0.5, seed=3)
HARD_RUNS = {m: replace(HARD_CONFIG, allreduce=m) for m in ALLREDUCE_METHODS}
HARD_RUNS["ring, scale_loss"] = replace(HARD_CONFIG, reduction="scale_loss")
HARD_CASES = cases_for("allreduce_sgd")
# Largest |difference| from one process allowed: float64 sums in another order
# differ by ~1e-16, float32 by ~1e-7 (measured: 5.6e-17 and 6.0e-8).
TOLERANCE = {torch.float64: 1e-14, torch.float32: 1e-6}


@pytest.fixture(
    scope="module", params=REPLICATED_WORLD_SIZES, ids=lambda n: f"world{n}"
)
def hard_runs(request):
    """Every case x dtype with every run of HARD_RUNS, in one launch of 2 or 4
    ranks: {(case name, dtype): {run name: Histories by rank}}."""
    cases = [(case, dtype) for case in HARD_CASES for dtype in DTYPES]
    calls = [
        (train_rank, (case.build(d), *hard_case_data(dtype=d), HARD_RUNS))
        for case, d in cases
    ]
    per_rank = spawn(in_one_launch, request.param, calls, timeout=TIMEOUT)
    return {
        (case.name, dtype): {
            run: [by_rank[i][run] for by_rank in per_rank] for run in HARD_RUNS
        }
        for i, (case, dtype) in enumerate(cases)
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", HARD_CASES, ids=lambda case: case.name)
def test_hard_cases_equal_one_process(hard_runs, case, dtype):
    model = case.build(dtype)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    reference = train_one_process(model, *hard_case_data(dtype=dtype), HARD_CONFIG)
    assert max_parameter_difference(reference.parameters, start) > 1e-2  # it trains
    for run, results in hard_runs[(case.name, dtype)].items():
        assert_ranks_equal_one_process(
            case, start, results, reference, TOLERANCE[dtype], run
        )


def test_ranks_built_from_their_own_seed_are_refused():
    X, y = hard_case_data()
    build = functools.partial(hard_case_model, torch.float64)
    with pytest.raises(WorkerError) as raised:
        spawn(
            train_loop_from_own_seed_rank,
            3,
            build,
            0,
            X,
            y,
            HARD_CONFIG,
            timeout=TIMEOUT,
        )
    assert (
        "ValueError: The ranks start from different weights: 2 of 3 ranks differ "
        "from rank 0 (a model built from seed + rank?). Build the model from the "
        "same seed on every rank, or copy rank 0's weights to the others with "
        "dist.broadcast first."
    ) in str(raised.value)


def test_a_model_without_trainable_parameters_is_refused():
    model = hard_case_model().requires_grad_(False)
    with pytest.raises(RuntimeError) as raised:
        sum_gradients(model)
    assert str(raised.value) == (
        "The model has no trainable parameters: every parameter is frozen "
        "(requires_grad=False), so there is nothing to train. Unfreeze at least one "
        "parameter."
    )
