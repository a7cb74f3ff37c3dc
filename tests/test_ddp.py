"""DistributedDataParallel trains exactly like one process on the global batch.

Each world size (1, 2, 4) starts its ranks once and runs every check's training in
that launch (``ddp.in_one_launch``): starting processes costs more than training.
Models and data are float64, so "equal" means equal to ~1e-15, not luck.
"""

import argparse
import copy
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from multigpu import ddp
from multigpu.allreduce_sgd import batch_indices, max_parameter_difference
from multigpu.allreduce_sgd import train_single_process as single_process
from multigpu.core.models import ConvNet
from multigpu.core.train import TrainConfig, evaluate
from multigpu.runtime.launch import WorkerError, run_torchrun, spawn
from multigpu.syncbn import convert_sync_batchnorm

NUM_SAMPLES = 48  # 3 global batches of 16 per epoch, divisible by 1, 2 and 4 ranks
CONFIG = TrainConfig(epochs=2, batch_size=16, lr=0.2, momentum=0.5, seed=3)
STEPS = 6  # 2 epochs x 3 steps
EVAL_SAMPLES = 10  # not a multiple of 4 (or of 3): the padded sampler repeats 0, 1
TIMEOUT = 30.0


def _problem(batch_norm=False):
    torch.manual_seed(0)
    model = ConvNet(in_channels=1, num_classes=3, width=4, batch_norm=batch_norm)
    X = torch.randn(NUM_SAMPLES, 1, 8, 8)
    y = torch.randint(0, 3, (NUM_SAMPLES,))
    return model.double(), X.double(), y


@pytest.fixture(scope="module")
def problem():
    return _problem()


@pytest.fixture(scope="module")
def bn_problem():
    return _problem(batch_norm=True)


@pytest.fixture(scope="module")
def eval_set(problem):
    """10 samples whose first 4 are predicted right and the rest wrong: accuracy 0.4,
    and samples 0 and 1, the ones the padded sampler repeats, are right."""
    model, X, _ = problem
    X = X[:EVAL_SAMPLES]
    with torch.no_grad():
        predicted = model(X).argmax(1)
    y = torch.where(torch.arange(EVAL_SAMPLES) < 4, predicted, (predicted + 1) % 3)
    return X, y


@pytest.fixture(scope="module")
def reference(problem):
    return single_process(*problem, CONFIG)


@pytest.fixture(scope="module")
def bn_reference(bn_problem):
    return single_process(*bn_problem, CONFIG)


def _calls(problem, bn_problem, eval_set, world_size, checkpoint_dir):
    model, X, y = problem
    bn_model, bn_X, bn_y = bn_problem
    path = os.path.join(checkpoint_dir, f"world{world_size}.pt")
    calls = {
        "compare": (ddp.compare_worker, (model, X, y, CONFIG, {})),
        "no_sync": (ddp.train_worker, (model, X, y, CONFIG, {"accumulation": 2})),
        "eval": (ddp.evaluation_worker, (model, *eval_set)),
        "syncbn": (
            ddp.train_worker,
            (convert_sync_batchnorm(bn_model), bn_X, bn_y, CONFIG, {}),
        ),
    }
    if world_size > 1:
        calls["plain bn"] = (ddp.train_worker, (bn_model, bn_X, bn_y, CONFIG, {}))
    if world_size == 2:
        calls["flag_before_forward"] = (
            ddp.train_worker,
            (model, X, y, CONFIG, {"accumulation": 2, "how": "flag_before_forward"}),
        )
        calls["flag_after_forward"] = (
            ddp.train_worker,
            (model, X, y, CONFIG, {"accumulation": 2, "how": "flag_after_forward"}),
        )
        calls["syncs"] = (
            ddp.in_one_launch,
            ([(ddp.accumulation_syncs, (model, X, how)) for how in ddp.ACCUMULATIONS],),
        )
        first = {"checkpoint": path, "stop_after_epochs": 1}
        calls["first epoch"] = (ddp.train_worker, (model, X, y, CONFIG, first))
        resumed = {"checkpoint": path, "resume_from_checkpoint": True}
        calls["resumed"] = (ddp.train_worker, (model, X, y, CONFIG, resumed))
        calls["broadcast"] = (ddp.broadcast_at_construction, (0,))
        calls["join"] = (ddp.uneven_inputs, (model, X, y, True))
    return calls


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"world{n}")
def runs(request, problem, bn_problem, eval_set, tmp_path_factory):
    """Every check's run in one launch of 1, 2 or 4 ranks: {name: results by rank}."""
    world_size = request.param
    folder = str(tmp_path_factory.mktemp("checkpoints"))
    calls = _calls(problem, bn_problem, eval_set, world_size, folder)
    per_rank = spawn(
        ddp.in_one_launch, world_size, list(calls.values()), timeout=TIMEOUT
    )
    return {name: [results[i] for results in per_rank] for i, name in enumerate(calls)}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for key, tensor in a.items():
        torch.testing.assert_close(b[key], tensor, rtol=1e-12, atol=1e-12)


def test_reference_training_moves_the_weights(problem, reference):
    model, _, _ = problem
    assert max_parameter_difference(reference.parameters, model.state_dict()) > 1e-2
    assert len(reference.step_loss) == STEPS


def test_ddp_equals_one_process_on_the_global_batch(runs, reference):
    for result in runs["compare"]:
        assert len(result["ddp"].step_loss) == STEPS
        _assert_same(reference.parameters, result["ddp"].parameters)


def test_ddp_equals_hand_written_allreduce_sgd(runs):
    for result in runs["compare"]:
        _assert_same(result["allreduce_sgd"].parameters, result["ddp"].parameters)
        torch.testing.assert_close(
            torch.tensor(result["ddp"].step_loss),
            torch.tensor(result["allreduce_sgd"].step_loss),
        )


def test_epoch_losses_are_averaged_over_the_ranks(runs, reference):
    for result in runs["compare"]:
        by_epoch = torch.tensor(reference.step_loss).view(CONFIG.epochs, -1).mean(1)
        torch.testing.assert_close(torch.tensor(result["ddp"].train_loss), by_epoch)


def test_no_sync_accumulation_equals_one_step_on_the_combined_batch(runs, reference):
    for result in runs["no_sync"]:
        _assert_same(reference.parameters, result.parameters)


def test_distributed_accuracy_equals_single_process_accuracy_exactly(
    runs, problem, eval_set
):
    model, _, _ = problem
    _, single = evaluate(model, [eval_set])
    assert single == 0.4
    world_size = len(runs["eval"])
    for result in runs["eval"]:
        assert result["every sample once"] == single
        if world_size in (3, 4):  # padded: samples 0 and 1 (both right) twice
            assert result["padded / len(dataset)"] == 0.6
            assert result["padded / total_size"] == 0.5


def test_reference_syncbn_equals_plain_batchnorm_on_the_global_batch(
    runs, bn_reference
):
    for result in runs["syncbn"]:
        _assert_same(bn_reference.parameters, result.parameters)


# With one rank, per-rank BatchNorm is the global batch: nothing to show.
@pytest.mark.parametrize("runs", [2, 4], indirect=True, ids=["world2", "world4"])
def test_per_rank_batchnorm_differs_from_the_global_batch(runs, bn_reference):
    difference = max_parameter_difference(
        runs["plain bn"][0].parameters, bn_reference.parameters
    )
    # Per-rank statistics change every step: far more than rounding (1e-15).
    assert difference > 1e-3
    print(f"per-rank BatchNorm vs global batch: max |weight difference| {difference}")


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_flag_before_forward_is_no_sync(runs, reference):
    for result in runs["flag_before_forward"]:
        _assert_same(reference.parameters, result.parameters)


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_flag_after_forward_diverges(runs):
    rank0, rank1 = runs["flag_after_forward"]
    assert max_parameter_difference(rank0.parameters, rank1.parameters) > 1e-3


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_flag_after_forward_syncs_the_wrong_micro_batch(runs):
    no_sync, before, after = runs["syncs"][0]
    assert no_sync == before == [0, 0, 1, 0, 0, 1]  # the last of each 3
    assert after == [1, 0, 0, 1, 0, 0]  # the first: it read the previous flag


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_resumed_run_equals_an_uninterrupted_one(runs, reference):
    for first, resumed in zip(runs["first epoch"], runs["resumed"]):
        assert len(first.train_loss) == 1 and len(resumed.train_loss) == 1
        _assert_same(reference.parameters, resumed.parameters)


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_ddp_broadcasts_rank_0_weights_at_construction(runs):
    for result in runs["broadcast"]:
        assert result["differed before"] and result["agree after"]
        assert result["equal rank 0's initial weights"]


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_join_lets_uneven_ranks_finish(runs):
    assert runs["join"] == [1, 2]


def test_uneven_inputs_without_join_time_out():
    model, X, y = _problem()
    with pytest.raises(WorkerError) as caught:
        spawn(ddp.uneven_inputs, 2, model.float(), X.float(), y, False, timeout=5.0)
    assert caught.value.rank == 1  # waited for an all-reduce rank 0 never joined
    assert "Timed out" in str(caught.value)


def test_sync_batchnorm_refuses_cpu_tensors():
    with pytest.raises(WorkerError, match="SyncBatchNorm expected input tensor"):
        spawn(ddp.sync_batchnorm_on_cpu, 2, timeout=TIMEOUT)


def test_distributed_sampler_deals_like_the_hand_written_partitioner():
    world_size, seed, global_batch = 2, 3, 16
    dataset = torch.utils.data.TensorDataset(torch.arange(NUM_SAMPLES))
    steps = NUM_SAMPLES // global_batch
    for epoch in range(2):
        for rank in range(world_size):
            loader = ddp.distributed_loader(
                dataset, global_batch, rank, world_size, seed
            )
            loader.sampler.set_epoch(epoch)
            got = [batch[0] for batch in loader]
            expected = batch_indices(
                NUM_SAMPLES, global_batch, 2 * steps, world_size, rank, seed
            )[epoch * steps : (epoch + 1) * steps]
            assert [t.tolist() for t in got] == [t.tolist() for t in expected]


def test_sampler_pads_by_repeating_the_first_indices():
    shards = ddp.sampler_shards(10, 4)
    assert shards == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    exact = [ddp.exact_shard(10, r, 4).tolist() for r in range(4)]
    assert sorted(sum(exact, [])) == list(range(10))


def test_forgetting_set_epoch_repeats_the_same_order():
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(8), num_replicas=2, rank=0, seed=0
    )
    forgotten = [list(sampler) for _ in range(3)]
    assert forgotten[0] == forgotten[1] == forgotten[2]
    remembered = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        remembered.append(list(sampler))
    assert remembered[0] != remembered[1]
    assert ddp.sampler_shards(8, 2, True, 0, epoch=1)[0] == remembered[1]


def test_loader_with_sampler_and_shuffle_raises():
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(8), num_replicas=2, rank=0
    )
    with pytest.raises(ValueError, match="sampler option is mutually exclusive"):
        torch.utils.data.DataLoader(range(8), sampler=sampler, shuffle=True)


def test_lr_scaling_is_explicit():
    assert ddp.scaled_lr(0.05, 4) == 0.05
    assert ddp.scaled_lr(0.05, 4, "linear") == 0.2
    with pytest.raises(ValueError):
        ddp.scaled_lr(0.05, 4, "sqrt")


def test_type_bool_trap_and_the_fix():
    trap = argparse.ArgumentParser()
    trap.add_argument("--syncBN", type=bool, default=True)
    assert trap.parse_args(["--syncBN", "False"]).syncBN is True  # bool("False")
    assert ddp.parse_args([]).sync_bn is False
    assert ddp.parse_args(["--sync-bn"]).sync_bn is True
    assert ddp.parse_args(["--no-sync-bn"]).sync_bn is False
    with pytest.raises(SystemExit):
        ddp.parse_args(["--sync-bn", "False"])  # a value is refused, not misread


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--snapshot", "d", "--snapshot-every", "0"],
            "--snapshot-every must be an integer of at least 1, got 0. Pass the "
            "number of steps between snapshots, e.g. 5.",
        ),
        (
            ["--samples", "-3"],
            "--samples must be an integer of at least 1, got -3. Pass how many "
            "training digits to use, or leave --samples out for all.",
        ),
    ],
)
def test_counts_below_one_stop_the_script_with_the_fix(capsys, argv, message):
    with pytest.raises(SystemExit) as caught:
        ddp.parse_args(argv)
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")
    assert ddp.parse_args(["--samples", "1"]).samples == 1


def test_read_rank_env_says_to_use_torchrun():
    env = ddp.read_rank_env({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    assert env == ddp.RankEnv(rank=1, local_rank=1, world_size=2)
    with pytest.raises(ddp.NotLaunchedByTorchrunError, match="torchrun --standalone"):
        ddp.read_rank_env({})


def test_plain_python_exits_with_code_2_and_says_to_use_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ddp.ENV_NAMES}
    done = subprocess.run(
        [sys.executable, "-m", "multigpu.ddp", "--epochs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: RANK, LOCAL_RANK, WORLD_SIZE not set")
    assert ddp.COMMAND in done.stderr


def test_nccl_with_more_local_ranks_than_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ddp.NotEnoughGPUsError) as raised:
        ddp.setup("nccl")
    assert str(raised.value) == (
        "nccl needs one GPU per rank, but this is local rank 1 on a machine with "
        "1 GPU(s) visible. Start at most 1 processes per node (torchrun "
        "--nproc-per-node=1), or pass --backend gloo."
    )
    assert not dist.is_initialized()


def test_bfloat16_autocast_on_cpu_trains(problem):
    model, X, y = problem
    model = copy.deepcopy(model).float()  # .float() would change the fixture
    histories = ddp.train_ddp(model, X.float(), y, CONFIG, 1, amp=True)
    assert len(histories[0].step_loss) == STEPS
    assert all(torch.isfinite(torch.tensor(histories[0].step_loss)))


def test_torchrun_runs_the_script(tmp_path):
    result = run_torchrun(
        "multigpu.ddp",
        2,
        "--epochs",
        "1",
        "--batch-size",
        "256",
        "--lr",
        "0.2",
        "--no-progress",
        "--checkpoint",
        tmp_path / "last.pt",
        timeout=120,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "2 ranks (gloo), global batch 256 = 2 x 128, lr 0.2"
    assert lines[1].startswith("epoch 1/1: train loss ")
    assert lines[-1] == "every rank holds the same weights: True"
    assert (tmp_path / "last.pt").exists()


def test_port_in_use_gives_eaddrinuse():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        output = ddp.torchrun_on_port(held.getsockname()[1], timeout=60)
    lines = ddp.eaddrinuse_lines(output)
    assert len(lines) == 1 and "port: PORT" in lines[0], output
    assert lines[0].startswith("torch.distributed.DistNetworkError: ")


@pytest.mark.gpu(2)
def test_nccl_ddp_equals_one_process(problem, reference):
    model, X, y = problem
    histories = ddp.train_ddp(model, X, y, CONFIG, 2, backend="nccl")
    for history in histories:
        for key, tensor in reference.parameters.items():
            torch.testing.assert_close(history.parameters[key], tensor)


@pytest.mark.gpu(1)
def test_float16_autocast_with_grad_scaler_on_gpu(problem):
    model, X, y = problem
    model = copy.deepcopy(model).float()
    histories = ddp.train_ddp(model, X.float(), y, CONFIG, 1, backend="nccl", amp=True)
    assert all(torch.isfinite(torch.tensor(histories[0].step_loss)))
