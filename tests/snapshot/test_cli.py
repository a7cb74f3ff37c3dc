"""The options of notebook 11's script, ``python -m multigpu.snapshot``: what it
refuses before the process group starts, in one line naming the fix."""

import pytest

from multigpu.snapshot import cli
from tests.ddp.refusals import stopped

PROG = "torchrun --standalone --nproc-per-node=N -m multigpu.snapshot"


def _stopped(capsys, call, *args):
    return stopped(capsys, PROG, call, *args)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--kill-rank", "1", "--kill-at-step", "3"],
            "the following arguments are required: --snapshot",
        ),
        (
            ["--snapshot", "d", "--kill-rank", "1"],
            "--kill-rank and --kill-at-step go together: pass both (which rank dies, "
            "before which step) or neither.",
        ),
        (
            ["--snapshot", "d", "--snapshot-every", "0"],
            "--snapshot-every must be an integer of at least 1, got 0. Pass the "
            "number of steps between snapshots, e.g. 5.",
        ),
        (
            ["--snapshot", "d", "--kill-rank", "1", "--kill-at-step", "-4"],
            "--kill-at-step must be 0 or more, got -4. Pass the steps done before it "
            "dies, e.g. --kill-at-step 1.",
        ),
        (
            ["--snapshot", "d", "--step-delay", "1e300"],
            "--step-delay must be from 0 to 60 seconds, got 1e+300. Pass e.g. "
            "--step-delay 0.1.",
        ),
        (
            ["--snapshot", "d", "--epochs", "0"],
            "--epochs must be an integer of at least 1, got 0. Pass e.g. --epochs 5.",
        ),
    ],
)
def test_options_that_do_not_go_together_or_are_out_of_range_stop_it(
    capsys, argv, message
):
    assert _stopped(capsys, cli.parse_args, argv) == message


def test_the_ddp_script_s_own_options_are_refused_naming_that_script(capsys):
    """Its loop has no checkpoint file, accumulation, AMP, lr scaling or progress
    bar: those options of ``python -m multigpu.ddp`` are refused, not ignored."""
    for option in ("--checkpoint=last.pt", "--amp", "--no-progress", "--resume"):
        name = option.split("=")[0]
        assert _stopped(capsys, cli.parse_args, ["--snapshot", "d", option]) == (
            f"{name} is an option of notebook 09's script only: the snapshot loop "
            "keeps to plain SGD with momentum, saves in its folder and shows no "
            f"progress bar. Leave {name} out, or run -m multigpu.ddp, which does not "
            "snapshot."
        )


def test_a_snapshot_folder_that_takes_no_file_is_refused_at_start(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert _stopped(capsys, cli.parse_args, ["--snapshot", f"{afile}/d"]) == (
        f"--snapshot {afile}/d: {afile} is a file, not a folder. Pass a --snapshot "
        "path in a folder you can write to, with space left."
    )
    args = cli.parse_args(["--snapshot", str(tmp_path / "new"), "--step-delay", "60"])
    assert (args.step_delay, args.snapshot_every) == (60, 5)  # the default K
    assert not (tmp_path / "new").exists()  # checked where it will be made, not made


@pytest.mark.parametrize(
    "fault, message",
    [
        (
            ["--kill-rank", "2", "--kill-at-step", "0"],
            "--kill-rank 2 is not a rank of this run: torchrun started 2 (0 to 1). "
            "Pass a rank from 0 to 1, or start more ranks.",
        ),
        (
            ["--kill-rank", "0", "--kill-at-step", "110"],
            "--kill-at-step 110 never comes: this run trains 110 steps (5 epochs of "
            "22), so the fault would not fire. Pass a step from 0 to 109.",
        ),
    ],
)
def test_a_fault_that_would_never_fire_stops_the_script(capsys, fault, message):
    args = cli.parse_args(["--snapshot", "d", *fault])
    assert _stopped(capsys, cli.check_fault, args, 2, 22) == message


def test_a_fault_that_fires_passes():
    fault = ["--kill-rank", "1", "--kill-at-step", "0"]
    args = cli.parse_args(["--snapshot", "d", *fault])
    assert (args.snapshot, args.kill_rank, args.kill_at_step) == ("d", 1, 0)
    cli.check_fault(args, 2, 22)  # returns: the first step is 0, rank 1 exists
