"""Hand-written data-parallel SGD equals single-process SGD on the global batch."""

import copy
import re
import types
from dataclasses import replace

import pytest
import torch

from multigpu import workers
from multigpu.allreduce_sgd import (
    DataPartitioner,
    allreduce_sum,
    batch_indices,
    check_step,
    compare_data_parallel,
    compare_with_reference,
    max_parameter_difference,
    per_rank_batch_size,
    sgd_step,
    train_data_parallel,
    train_single_process,
    world_losses,
)
from multigpu.core.models import ConvNet
from multigpu.core.train import ALLREDUCE_METHODS, TrainConfig, evaluate
from multigpu.runtime.launch import WorkerNotImportableError

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
    return train_single_process(*problem, CONFIG)


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
def test_parameters_equal_single_process_sgd_on_the_global_batch(runs, reference, name):
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
def test_ranks_batches_together_are_the_single_process_global_batches(world_size):
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
# check_step: the checker of notebook 08's exercise, where the learner writes the step


@pytest.fixture(scope="module")
def problem64(problem):
    """The same problem in float64, as notebook 08 trains."""
    model, X, y = problem
    return copy.deepcopy(model).double(), X.double(), y


def step_forward_only(model, optimizer, X, y, config, distributed=False):
    """The exercise's skeleton: a forward pass, nothing else."""
    optimizer.zero_grad()
    return torch.nn.functional.cross_entropy(model(X), y).item()


def step_without_zero_grad(model, optimizer, X, y, config, distributed=False):
    """Mistake: gradients add up over the steps."""
    loss = torch.nn.functional.cross_entropy(model(X), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def step_returning_the_batch_sum(model, optimizer, X, y, config, distributed=False):
    """Mistake: trains like sgd_step, returns the loss summed over the batch."""
    return sgd_step(model, optimizer, X, y, config, distributed) * len(y)


def step_all_reducing_always(model, optimizer, X, y, config, distributed=False):
    """Mistake: all-reduces even in one process, where there is no process group."""
    return workers.step_all_reducing_each_gradient(
        model, optimizer, X, y, config, distributed=True
    )


@pytest.mark.parametrize(
    "step",
    [sgd_step, workers.step_all_reducing_each_gradient],
    ids=lambda s: s.__name__,
)
def test_check_step_passes_a_correct_step(problem64, step):
    passed, message = check_step(step, *problem64, CONFIG, world_size=2)
    assert passed, message
    assert message == (
        "PASS: in one process and on 2 ranks your step trains like sgd_step: the "
        f"same weights, and the same loss at each of the {STEPS} steps (within 1e-9)."
    )


def test_check_step_defaults_to_a_looser_tolerance_in_float32(problem):
    passed, message = check_step(sgd_step, *problem, CONFIG, world_size=2)
    assert passed and message.endswith("(within 1e-3).")


@pytest.mark.parametrize(
    ("step", "words"),
    [
        (step_forward_only, "never changed the weights"),
        (step_without_zero_grad, r"in one process \(distributed=False\) your step "),
        (step_returning_the_batch_sum, "not the mean loss over its batch"),
        (workers.step_without_all_reduce, "the 2 ranks ended with different weights"),
        (workers.step_summing_without_dividing, "Divide the summed gradients"),
        (
            workers.step_returning_the_ranks_summed_loss,
            "on the ranks your step returns",
        ),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_check_step_names_the_mistake(problem64, step, words):
    passed, message = check_step(step, *problem64, CONFIG, world_size=2)
    assert not passed
    assert message.startswith("FAIL: ")
    assert re.search(words, message), message


def test_a_step_the_ranks_cannot_import_is_refused_before_any_process_starts(
    problem64,
):
    def nested(model, optimizer, X, y, config, distributed=False):
        return 0.0

    with pytest.raises(WorkerNotImportableError, match="inside a function"):
        check_step(nested, *problem64, CONFIG)
    with pytest.raises(WorkerNotImportableError, match="ranks cannot import it"):
        train_data_parallel(*problem64, CONFIG, world_size=2, step=nested)
    # The function as it was before its module was imported again: same names,
    # another object, so the ranks would run a different one.
    current = workers.step_without_all_reduce
    stale = types.FunctionType(current.__code__, current.__globals__, current.__name__)
    stale.__qualname__ = current.__qualname__
    with pytest.raises(WorkerNotImportableError, match="import it again"):
        compare_data_parallel(*problem64, {"run": CONFIG}, 2, step=stale)


def test_a_step_that_all_reduces_in_one_process_gets_a_clear_error(problem64):
    with pytest.raises(RuntimeError, match="All-reduce only when distributed is True"):
        check_step(step_all_reducing_always, *problem64, CONFIG)
