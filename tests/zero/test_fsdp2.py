"""Tests for multigpu.zero.fsdp2 (and its ranks and launchers in
multigpu.ranks.zero): FSDP2 trains like one process, shards rows as torch.chunk
cuts them, and its sharded checkpoints load on any number of ranks."""

import pytest
import torch
from torch.testing import assert_close

from multigpu import zero
from multigpu.ranks import zero as zero_ranks
from tests.zero.problem import CONFIG, EXACT, STEPS, TIMEOUT, model_and_data


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"world{n}")
def fsdp2(request, tmp_path_factory):
    world_size = request.param
    model, X, y = model_and_data()
    folder = tmp_path_factory.mktemp(f"fsdp2_world{world_size}")
    results = zero_ranks.train_fsdp2(model, X, y, CONFIG, world_size, folder, TIMEOUT)
    reference = zero.train_one_process_adam(model, X, y, CONFIG)
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
    loaded = zero_ranks.load_fsdp2_checkpoint(fresh, folder, new_world, TIMEOUT)
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
        zero_ranks.load_fsdp2_checkpoint(zero.make_mlp(), tmp_path / "empty", 2)
    assert str(error.value) == message
