"""Tests for multigpu.zero: every ZeRO stage and FSDP2 train like one process and
like DDP, each rank holds what the paper's formulas say, and sends what the
collectives count."""

import pytest
import torch
from torch.testing import assert_close

from multigpu import costmodel, zero
from multigpu.collectives import ring_chunk_sizes
from multigpu.core.train import History, TrainConfig
from multigpu.runtime import scratch
from multigpu.runtime.launch import WorkerNotImportableError, spawn

CONFIG = TrainConfig(epochs=1, batch_size=32, lr=0.01)  # 128 samples: 4 Adam steps
STEPS = 4
TIMEOUT = 60.0  # generous: the test machine may be shared
EXACT = dict(rtol=0, atol=1e-12)  # float64: the ranks add in another order, ~1e-16


def model_and_data(sizes=(10, 32, 32, 5)):
    torch.manual_seed(0)
    data = zero.make_data(128, in_features=sizes[0], num_classes=sizes[-1])
    return zero.make_mlp(sizes), *data


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"world{n}")
def trained(request):
    world_size = request.param
    model, X, y = model_and_data()  # 1,573 parameters: unequal shards from 2 on
    results = zero.compare_stages(model, X, y, CONFIG, world_size, timeout=TIMEOUT)
    ddp = spawn(zero.ddp_worker, world_size, model, X, y, CONFIG, timeout=TIMEOUT)
    reference = zero.train_single_process(model, X, y, CONFIG)
    return world_size, model, results, ddp, reference


def test_every_stage_trains_like_one_process_on_the_global_batch(trained):
    world_size, model, results, ddp, reference = trained
    assert isinstance(reference, History)
    assert len(reference.step_loss) == STEPS and len(reference.train_loss) == 1
    assert reference.step_loss[-1] < reference.step_loss[0]  # it does learn
    for stage in zero.STAGES:
        assert len(results[stage]) == world_size
        for rank, result in enumerate(results[stage]):
            assert isinstance(result, zero.ShardedHistory)
            assert (result.rank, result.world_size) == (rank, world_size)
            assert result.parameters.keys() == reference.parameters.keys()
            for name, value in reference.parameters.items():
                assert_close(result.parameters[name], value, **EXACT)
        # the mean of the ranks' losses is the loss on the global batch
        losses = torch.tensor([result.step_loss for result in results[stage]])
        assert_close(losses.mean(0), torch.tensor(reference.step_loss), **EXACT)
        epochs = torch.tensor([result.train_loss for result in results[stage]])
        assert_close(epochs.mean(0), torch.tensor(reference.train_loss), **EXACT)


def test_every_stage_trains_like_pytorch_ddp(trained):
    world_size, model, results, ddp, reference = trained
    for stage in zero.STAGES:
        for result, ddp_result in zip(results[stage], ddp, strict=True):
            for name, value in ddp_result.parameters.items():
                assert_close(result.parameters[name], value, **EXACT)


def test_the_weights_moved(trained):
    world_size, model, results, ddp, reference = trained
    start = model.state_dict()
    moved = max(
        (reference.parameters[name] - start[name]).abs().max().item() for name in start
    )
    assert moved > 0.5 * STEPS * CONFIG.lr  # Adam: up to about lr per step


def test_each_rank_holds_only_its_chunks(trained):
    world_size, model, results, ddp, reference = trained
    numels = zero.layer_numels(model)  # [352, 1056, 165]
    total, bytes_each = sum(numels), 8  # float64
    for rank in range(world_size):
        flat_chunk = ring_chunk_sizes(total, world_size)[rank] * bytes_each
        layer_chunks = sum(
            ring_chunk_sizes(numel, world_size)[rank] for numel in numels
        )
        whole = total * bytes_each
        ledgers = {stage: results[stage][rank].ledger for stage in zero.STAGES}
        assert ledgers["DDP"] == {
            "parameters": whole,
            "gradients": whole,
            "optimizer": 2 * whole,
            "gathered": 0,
        }
        assert ledgers["ZeRO-1"] == {
            "parameters": whole,
            "gradients": whole,
            "optimizer": 2 * flat_chunk,
            "gathered": 0,
        }
        assert ledgers["ZeRO-2"] == {
            "parameters": whole,
            "gradients": flat_chunk,
            "optimizer": 2 * flat_chunk,
            "gathered": 0,
        }
        chunks = layer_chunks * bytes_each
        assert ledgers["ZeRO-3"] == {
            "parameters": chunks,
            "gradients": chunks,
            "optimizer": 2 * chunks,
            "gathered": max(numels) * bytes_each,  # one layer at a time
        }


def test_sharded_memory_adds_up_to_one_copy(trained):
    # Over all ranks the shards of ZeRO-3 hold exactly one copy of everything.
    world_size, model, results, ddp, reference = trained
    ledgers = [result.ledger for result in results["ZeRO-3"]]
    one_copy = results["DDP"][0].ledger
    for category in ("parameters", "gradients", "optimizer"):
        assert sum(ledger[category] for ledger in ledgers) == one_copy[category]


def test_bytes_sent_equal_the_exact_counts(trained):
    world_size, model, results, ddp, reference = trained
    for stage in zero.STAGES:
        for rank, result in enumerate(results[stage]):
            expected = costmodel.zero_bytes_sent_per_rank(
                stage, zero.layer_numels(model), 8, world_size, rank
            )
            assert result.bytes_sent == [expected] * STEPS
            if world_size == 1:
                assert expected == 0


def test_ledger_and_traffic_equal_the_paper_when_shards_are_equal():
    # (4, 4, 4): two layers of 20 parameters, which 4 ranks split evenly.
    model, X, y = model_and_data(sizes=(4, 4, 4))
    model, X = model.float(), X.float()
    results = zero.compare_stages(model, X, y, CONFIG, 4, timeout=TIMEOUT)
    for stage in zero.STAGES:
        formula = costmodel.zero_memory_ledger(stage, 4, num_parameters=40)
        sent = costmodel.zero_bytes_sent_theory(stage, nbytes=40 * 4, world_size=4)
        for result in results[stage]:
            measured = dict(result.ledger, gathered=0)  # the paper ignores it
            assert measured == formula
            assert result.bytes_sent == [sent] * STEPS


def test_bad_arguments_say_how_to_fix_them():
    with pytest.raises(ValueError) as error:
        zero.make_mlp((10,))
    assert str(error.value) == (
        "make_mlp needs at least two sizes (inputs and outputs), got (10,). Pass "
        "e.g. sizes=(10, 32, 5)."
    )
    model, X, y = model_and_data()
    with pytest.raises(ValueError) as error:
        zero.compare_stages(model, X, y, CONFIG, 2, stages=["zero3"])
    assert str(error.value) == (
        "Unknown stage 'zero3'. Choose one of: DDP, ZeRO-1, ZeRO-2, ZeRO-3."
    )


def test_zero3_refuses_a_layer_it_cannot_shard():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    with pytest.raises(ValueError) as error:
        zero.shard_model(model, zero.Meter())
    assert str(error.value) == (
        "Layer 1 (LayerNorm) has parameters that ZeRO-3 by hand cannot shard: it "
        "shards nn.Linear layers with a bias only. Build the model from nn.Linear "
        "layers and activations, e.g. with make_mlp()."
    )


def test_flatten_parameters_makes_the_model_a_view_of_one_buffer():
    model, X, y = model_and_data(sizes=(3, 2))
    before = model(X)
    flat = zero.flatten_parameters(model)
    assert flat.shape == (8,)  # 3*2 weights + 2 biases
    assert torch.equal(model(X), before)
    flat.zero_()
    assert torch.equal(model(X), torch.zeros_like(before))


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"world{n}")
def fsdp2(request, tmp_path_factory):
    world_size = request.param
    model, X, y = model_and_data()
    folder = tmp_path_factory.mktemp(f"fsdp2_world{world_size}")
    results = zero.train_fsdp2(model, X, y, CONFIG, world_size, folder, TIMEOUT)
    reference = zero.train_single_process(model, X, y, CONFIG)
    return world_size, model, results, reference, folder


def test_fsdp2_trains_like_one_process(fsdp2):
    world_size, model, results, reference, folder = fsdp2
    for result in results:
        for name, value in reference.parameters.items():
            assert_close(result.parameters[name], value, **EXACT)
        assert len(result.step_loss) == STEPS


def test_fsdp2_shards_rows_as_torch_chunk_cuts_them(fsdp2):
    world_size, model, results, reference, folder = fsdp2
    for rank, result in enumerate(results):
        assert len(result.shards) == 6  # three weights, three biases
        for row in result.shards:
            assert row["rank"] == rank and row["placement"] == "S(0)"
            assert row["rows match"]
            chunks = torch.arange(row["global shape"][0]).chunk(world_size)
            held = len(chunks[rank]) if rank < len(chunks) else 0  # may be empty
            assert row["local shape"][0] == held
            assert row["local shape"][1:] == row["global shape"][1:]


def test_fsdp2_optimizer_state_is_sharded(fsdp2):
    world_size, model, results, reference, folder = fsdp2
    whole_moments = 2 * sum(p.numel() for p in model.parameters()) * 8
    assert sum(result.ledger["optimizer"] for result in results) == whole_moments


def test_sharded_checkpoint_loads_into_one_process(fsdp2):
    world_size, model, results, reference, folder = fsdp2
    files = sorted(path.name for path in folder.iterdir())
    assert files == [".metadata"] + [f"__{rank}_0.distcp" for rank in range(world_size)]
    fresh = zero.make_mlp()  # other random weights
    loaded = zero.load_sharded_checkpoint(fresh, folder)
    for name, value in loaded.state_dict().items():
        assert_close(value, reference.parameters[name], **EXACT)


# A checkpoint saved on 1, 2 and 4 ranks is loaded on another number of ranks.
LOAD_ON = {1: 2, 2: 4, 4: 3}


def test_sharded_checkpoint_loads_into_fsdp2_on_another_number_of_ranks(fsdp2):
    world_size, model, results, reference, folder = fsdp2
    new_world = LOAD_ON[world_size]
    fresh = zero.make_mlp()  # other random weights
    loaded = zero.load_fsdp2_checkpoint(fresh, folder, new_world, TIMEOUT)
    assert len(loaded) == new_world
    saved = results[0].parameters  # the full weights when the checkpoint was saved
    for rank, result in enumerate(loaded):
        assert result["parameters"].keys() == saved.keys()
        for name, value in saved.items():
            assert torch.equal(result["parameters"][name], value)  # bit for bit
        for row in result["shards"]:  # cut for the new world, as torch.chunk cuts
            assert row["rank"] == rank and row["rows match"]
            chunks = torch.arange(row["global shape"][0]).chunk(new_world)
            held = len(chunks[rank]) if rank < len(chunks) else 0
            assert row["local shape"][0] == held
    assert not torch.equal(fresh[0].weight, saved["0.weight"])  # fresh is unchanged


def test_loading_from_a_folder_without_checkpoint_says_so(tmp_path):
    message = (
        "empty holds no torch.distributed.checkpoint checkpoint (its .metadata file "
        "is missing). Pass the folder given to train_fsdp2(checkpoint_dir=...) after "
        "training finished."
    )
    with pytest.raises(FileNotFoundError) as error:
        zero.load_sharded_checkpoint(zero.make_mlp(), tmp_path / "empty")
    assert str(error.value) == message
    with pytest.raises(FileNotFoundError) as error:  # before starting any rank
        zero.load_fsdp2_checkpoint(zero.make_mlp(), tmp_path / "empty", 2)
    assert str(error.value) == message


@pytest.fixture
def learner_modules():
    yield scratch
    scratch.clean_up()


def test_check_step_passes_the_reference_step():
    model, X, y = model_and_data()
    passed, message = zero.check_step(zero.zero2_step, model, X, y, CONFIG)
    assert passed, message
    assert message.startswith("PASS: on 2 ranks your step trains like one process")


def test_check_step_names_the_missing_division(learner_modules):
    import inspect

    source = inspect.getsource(zero.zero2_step).replace(
        "    shard.grad /= dist.get_world_size()\n", ""
    )
    header = (
        "import torch\nimport torch.distributed as dist\n"
        "from torch.nn import functional as F\n"
        "from multigpu.collectives import all_gather, reduce_scatter\n"
        "from multigpu.zero import pop_flat_gradients\n\n"
    )
    module = learner_modules.write_module("undivided_zero2", header + source)
    model, X, y = model_and_data()
    passed, message = zero.check_step(module.zero2_step, model, X, y, CONFIG)
    assert not passed
    assert message.startswith("FAIL: after 4 steps the weights are ")
    assert "divide it by the world size" in message


def test_check_step_names_the_all_reduce_that_zero1_sends():
    model, X, y = model_and_data()
    passed, message = zero.check_step(zero.zero1_step, model, X, y, CONFIG)
    assert not passed
    assert message.startswith("FAIL: the weights are right, but rank 0 reported")
    assert "one reduce-scatter and one all-gather" in message


def test_check_step_refuses_a_step_the_ranks_cannot_import():
    def my_step(model, flat, shard, optimizer, X, y):
        return 0.0, 0

    model, X, y = model_and_data()
    with pytest.raises(WorkerNotImportableError) as error:
        zero.check_step(my_step, model, X, y, CONFIG)
    assert str(error.value) == (
        "The step 'test_check_step_refuses_a_step_the_ranks_cannot_import.<locals>."
        "my_step' cannot be imported by the ranks. Write it in a module (in a "
        "notebook, a %%module cell), import it from there and pass the imported "
        "function."
    )
