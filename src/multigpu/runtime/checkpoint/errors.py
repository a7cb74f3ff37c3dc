"""The errors of loading a checkpoint, each saying what is wrong and how to fix it
(06, 11)."""


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
