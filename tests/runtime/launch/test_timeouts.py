"""Tests for multigpu.runtime.launch.timeouts: timeout=None, what counts as
torch.distributed giving up on its peers, and one meaning per word: ``timeout`` each
collective, ``deadline`` the whole run, their defaults named once."""

import ast
from datetime import timedelta
from pathlib import Path

import pytest

from multigpu.runtime import launch
from multigpu.runtime.launch import (
    WorkerError,
    spawn,
)
from tests import ranks as test_ranks
from tests.runtime.launch.processes import TIMEOUT


def test_timeout_none_means_no_timeout(no_leftovers):
    # Rank 1 joins the all_reduce 1.5 s late; with timeout=1 that fails.
    assert spawn(test_ranks.join_late_rank, 2, 1, 1.5, timeout=None) == [3, 3]
    assert launch.as_timedelta(None) >= timedelta(days=365)
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.join_late_rank, 2, 1, 3.0, timeout=1.0)
    assert caught.value.timed_out


def test_ranks_that_all_wait_for_each_other_time_out(no_leftovers):
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.wait_for_each_other_rank, 2, timeout=2.0)
    error = caught.value
    assert error.timed_out
    assert error.missing_ranks == []  # both reported: torch's own error said so


def test_a_timeout_is_recognised_by_kind_and_only_after_the_timeout():
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with pytest.raises(dist.DistStoreError) as caught:  # a rendezvous that never ends
        store.wait(["a key no rank sets"], timedelta(seconds=0.1))
    store_timeout = caught.value
    assert launch.is_timeout(store_timeout, waited_s=2.0, timeout=1.0)
    assert launch.is_timeout(TimeoutError(), waited_s=2.0, timeout=1.0)
    assert not launch.is_timeout(store_timeout, waited_s=0.5, timeout=1.0)
    assert not launch.is_timeout(ValueError("timed out"), waited_s=2.0, timeout=1.0)


def test_a_peers_closed_connection_in_work_wait_does_not_hide_the_cause(no_leftovers):
    # gloo raises it from the caller's line (irecv(...).wait()), not from inside
    # torch.distributed: its text marks it as a peer's symptom all the same.
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.fail_while_peer_waits_on_a_receive_rank, 2, timeout=30.0)
    assert str(caught.value).startswith(
        "Rank 1 of 2 failed with ValueError: rank 1's own mistake"
    )


def test_a_closed_connection_waits_for_the_cause_to_report(no_leftovers):
    # Rank 0's "Connection closed by peer" arrives 1.5 s before rank 1's own error:
    # a peer's symptom alone does not end the wait for the cause.
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.close_then_fail_slowly_rank, 2, timeout=30.0)
    assert str(caught.value).startswith(
        "Rank 1 of 2 failed with ValueError: rank 1's own mistake, reported late"
    )


def test_the_rank_that_timed_out_is_named_not_the_peer_it_left(no_leftovers):
    # Rank 1 times out and ends; rank 0 then sees "Connection closed by peer". Both
    # are torch.distributed's errors; the closed connection is the symptom. Rank 0's
    # 30 s wait outlasts rank 1's timeout.
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.time_out_while_peer_waits_longer_rank, 2, timeout=TIMEOUT)
    assert caught.value.rank == 1
    assert caught.value.timed_out


SRC = Path(__file__).resolve().parents[3] / "src" / "multigpu"
LIMITS = ("timeout", "deadline")


def _functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def _defaults(function: ast.FunctionDef) -> list[tuple[str, ast.expr]]:
    args = function.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d]
    return [(arg.arg, default) for arg, default in pairs]


def _parameters(function: ast.FunctionDef) -> set[str]:
    args = function.args
    return {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}


def _number(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _callee(call: ast.Call) -> str:
    function = call.func
    return getattr(function, "id", None) or getattr(function, "attr", "")


def _public(path: str, function: ast.FunctionDef) -> bool:
    parts = Path(path).with_suffix("").parts
    modules = [part for part in parts if part != "__init__"]
    return not any(name.startswith("_") for name in [*modules, function.name])


def limit_problems(sources: dict[str, str]) -> list[str]:
    """Where ``sources`` (path -> Python source) restate a number for a timeout or
    a deadline (a default, or an argument to one of their own functions that takes
    one), or a public function takes ``deadline`` without refusing ``timeout=``."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    taking = {  # the functions defined here that take a timeout or a deadline
        f.name for tree in trees.values() for f in _functions(tree)
    } & {
        f.name
        for tree in trees.values()
        for f in _functions(tree)
        if _parameters(f) & set(LIMITS)
    }
    found = []
    for path, tree in trees.items():
        for function in _functions(tree):
            for name, default in _defaults(function):
                if name in LIMITS and _number(default):
                    found.append(f"{path}:{default.lineno}: {name}={default.value}")
            decorators = {getattr(d, "id", "") for d in function.decorator_list}
            takes = _parameters(function)
            if (
                _public(path, function)
                and "deadline" in takes
                and "timeout" not in takes
                and "deadline_not_timeout" not in decorators
            ):
                found.append(
                    f"{path}:{function.lineno}: {function.name} takes a "
                    "deadline but not @deadline_not_timeout"
                )
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            for keyword in call.keywords:
                if (
                    keyword.arg in LIMITS
                    and _number(keyword.value)
                    and _callee(call) in taking
                ):
                    found.append(
                        f"{path}:{keyword.lineno}: {_callee(call)}("
                        f"{keyword.arg}={keyword.value.value})"
                    )
    return found


def test_the_finder_finds_restated_limits_and_a_deadline_that_takes_a_timeout():
    sources = {
        "a.py": "def spawn(w, timeout=30.0, deadline=None): ...\n"
        "def run(m, deadline=120): ...\n"
        "spawn(f, timeout=10)\n"
        "spawn(f, timeout=QUICK_TIMEOUT_S)\n"
        "process.wait(timeout=5.0)\n",
        "b.py": "@deadline_not_timeout\ndef run2(m, deadline=DEADLINE): ...\n",
        "_c.py": "def error(deadline): ...\n",  # a private module's helper
    }
    assert limit_problems(sources) == [
        "a.py:1: timeout=30.0",
        "a.py:2: deadline=120",
        "a.py:2: run takes a deadline but not @deadline_not_timeout",
        "a.py:3: spawn(timeout=10)",
    ]


def test_every_limit_is_a_named_default_and_means_one_thing():
    sources = {
        str(path.relative_to(SRC.parents[1])): path.read_text(encoding="utf-8")
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "runtime" / "launch" / "timeouts.py"
    }
    assert limit_problems(sources) == [], (
        "name each default in multigpu/runtime/launch/timeouts.py and use the name; "
        "a function whose limit bounds the whole run takes deadline= and is "
        "decorated with @deadline_not_timeout"
    )
