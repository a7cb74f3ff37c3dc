"""The errors of loading a checkpoint, each saying what is wrong and how to fix it
(06, 11)."""

from pathlib import Path


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded as asked; the message says what is wrong
    and how to fix it (06, 11)."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint whose contents do not fit what it is loaded into: here a
    state_dict whose keys do not fit the model, even after fixing the prefix (06)."""


class OptimizerMismatchError(CheckpointMismatchError):
    """Optimizer state that does not fit the optimizer passed: saved from another
    optimizer type, or for another model (06, 11)."""


class InvalidCheckpointError(CheckpointError):
    """A file that is not a checkpoint at all: empty, cut short, corrupted, or not
    written by ``torch.save`` (11)."""


class UnsafeCheckpointError(CheckpointError):
    """A file that holds objects other than plain data, which weights-only loading
    refuses to unpickle because unpickling them could run code (06, 11)."""


def invalid_checkpoint(path: Path, problem: str) -> InvalidCheckpointError:
    """The one-line error for a file that is not a valid checkpoint: its name, what
    is wrong with it (``problem``), and how to get a good one back (11)."""
    return InvalidCheckpointError(
        f"{path.name} is not a valid checkpoint: {problem}. Restore {path.name} "
        "from a copy, or save the checkpoint again with save_checkpoint."
    )
