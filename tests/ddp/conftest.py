"""The launches the tests of multigpu.ddp share.

Each world size (1, 2, 4) starts its ranks once and runs every check's training in
that launch (``ddp.in_one_launch``): starting processes costs more than training.
The hard cases of tests/hard_cases.py (those the registry says DDP trains like one
process) get one launch per world size (2, 3, 4).
The ConvNet problem is float64, so "equal" means equal to ~1e-15, not luck. The
fixtures are session-wide, so the test files of tests/ddp share the launches.
"""

import os

import pytest
import torch

from multigpu import ddp
from multigpu.allreduce_sgd import train_one_process as one_process
from multigpu.core.train import TrainConfig
from multigpu.ranks import ddp as ddp_ranks
from multigpu.runtime.launch import spawn
from multigpu.syncbn import convert_sync_batchnorm
from tests.ddp.problems import (
    CONFIG,
    EVAL_SAMPLES,
    HARD_WORLD_SIZES,
    TIMEOUT,
    hard_config,
    make_problem,
)
from tests.ddp.ranks import agreement_rank
from tests.hard_cases import DTYPES, cases_for, hard_case_data, hard_case_model
from tests.ranks import ddp_from_seed_rank


@pytest.fixture(scope="session")
def problem():
    return make_problem()


@pytest.fixture(scope="session")
def bn_problem():
    return make_problem(batch_norm=True)


@pytest.fixture(scope="session")
def eval_set(problem):
    """10 samples whose first 4 are predicted right and the rest wrong: accuracy 0.4,
    and samples 0 and 1, the ones the padded sampler repeats, are right."""
    model, X, _ = problem
    X = X[:EVAL_SAMPLES]
    with torch.no_grad():
        predicted = model(X).argmax(1)
    y = torch.where(torch.arange(EVAL_SAMPLES) < 4, predicted, (predicted + 1) % 3)
    return X, y


@pytest.fixture(scope="session")
def reference(problem):
    return one_process(*problem, CONFIG)


@pytest.fixture(scope="session")
def bn_reference(bn_problem):
    return one_process(*bn_problem, CONFIG)


def _calls(problem, bn_problem, eval_set, world_size, checkpoint_dir):
    model, X, y = problem
    bn_model, bn_X, bn_y = bn_problem
    path = os.path.join(checkpoint_dir, f"world{world_size}.pt")
    calls = {
        "compare": (ddp_ranks.compare_rank, (model, X, y, CONFIG, {})),
        "no_sync": (ddp_ranks.train_rank, (model, X, y, CONFIG, {"accumulation": 2})),
        "eval": (ddp_ranks.evaluation_rank, (model, *eval_set)),
        "syncbn": (
            ddp_ranks.train_rank,
            (convert_sync_batchnorm(bn_model), bn_X, bn_y, CONFIG, {}),
        ),
    }
    if world_size > 1:
        calls["plain bn"] = (ddp_ranks.train_rank, (bn_model, bn_X, bn_y, CONFIG, {}))
        odd = set(range(1, world_size, 2))  # ranks 1 (and 3) hold other weights
        calls["agree"] = (agreement_rank, (model.state_dict(), set()))
        calls["disagree"] = (agreement_rank, (model.state_dict(), odd))
    if world_size == 2:
        calls["flag_before_forward"] = (
            ddp_ranks.train_rank,
            (model, X, y, CONFIG, {"accumulation": 2, "how": "flag_before_forward"}),
        )
        calls["flag_after_forward"] = (
            ddp_ranks.train_rank,
            (model, X, y, CONFIG, {"accumulation": 2, "how": "flag_after_forward"}),
        )
        calls["syncs"] = (
            ddp.in_one_launch,
            (
                [
                    (ddp_ranks.accumulation_syncs_rank, (model, X, how))
                    for how in ddp.ACCUMULATIONS
                ],
            ),
        )
        first = {"checkpoint": path, "stop_after_epochs": 1}
        calls["first epoch"] = (ddp_ranks.train_rank, (model, X, y, CONFIG, first))
        resumed = {"checkpoint": path, "resume_from_checkpoint": True}
        calls["resumed"] = (ddp_ranks.train_rank, (model, X, y, CONFIG, resumed))
        calls["broadcast"] = (ddp_ranks.broadcast_at_construction_rank, (0,))
        calls["join"] = (ddp_ranks.uneven_inputs_rank, (model, X, y, True))
    return calls


@pytest.fixture(scope="session", params=[1, 2, 4], ids=lambda n: f"world{n}")
def runs(request, problem, bn_problem, eval_set, tmp_path_factory):
    """Every check's run in one launch of 1, 2 or 4 ranks: {name: results by rank}."""
    world_size = request.param
    folder = str(tmp_path_factory.mktemp("checkpoints"))
    calls = _calls(problem, bn_problem, eval_set, world_size, folder)
    per_rank = spawn(
        ddp.in_one_launch, world_size, list(calls.values()), timeout=TIMEOUT
    )
    return {name: [results[i] for results in per_rank] for i, name in enumerate(calls)}


def _hard_calls(world_size):
    """The hard-case runs of one launch: {name: (rank function, arguments)}, with
    find_unused_parameters=True where the registry says a case needs it. The run
    that raises goes last, so a broken DDP state cannot affect the others."""
    config = hard_config(world_size)
    find_unused = {"wrap_options": {"find_unused_parameters": True}}
    calls = {}
    for dtype in DTYPES:
        X, y = hard_case_data(dtype=dtype)
        for case in cases_for("ddp"):
            options = find_unused if case.find_unused_parameters else {}
            arguments = (case.build, dtype, 0, X, y, config, options)
            calls[(case.name, dtype)] = (ddp_from_seed_rank, arguments)
    X, y = hard_case_data()
    padded = {**find_unused, "padded_sampler": True}
    arguments = (hard_case_model, torch.float64, 0, X, y, config, padded)
    calls["padded"] = (ddp_from_seed_rank, arguments)
    too_big = TrainConfig(epochs=1, batch_size=60, lr=0.2)  # 60 > 41 samples
    arguments = (hard_case_model, torch.float64, 0, X, y, too_big, find_unused)
    calls["batch too big"] = (ddp_from_seed_rank, arguments)
    arguments = (hard_case_model, torch.float64, 0, X, y, config, {})
    calls["no find_unused"] = (ddp_from_seed_rank, arguments)
    return calls


@pytest.fixture(scope="session", params=HARD_WORLD_SIZES, ids=lambda n: f"world{n}")
def hard_runs(request):
    """The hard cases trained by torch DDP on 2, 3 or 4 ranks in one launch, each
    rank building its model from ``seed + rank``: {name: results by rank}."""
    calls = _hard_calls(request.param)
    per_rank = spawn(
        ddp.in_one_launch, request.param, list(calls.values()), timeout=TIMEOUT
    )
    return {name: [results[i] for results in per_rank] for i, name in enumerate(calls)}
