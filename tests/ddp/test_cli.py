"""The script's options: switches, and counts below one stop it."""

import argparse

import pytest

from multigpu import ddp


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
