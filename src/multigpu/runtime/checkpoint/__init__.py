"""Checkpoints that survive wrappers and interruptions, and say what is wrong.

Taught in ``notebooks/06_dataparallel_checkpoints_and_speed.ipynb`` (the ``module.``
prefix) and used again by ``notebooks/11`` (fault tolerance: atomic saves).

``nn.DataParallel`` and ``DistributedDataParallel`` keep your model as their
attribute ``.module``, so every key of their ``state_dict()`` starts with
``"module."``. A checkpoint saved from a wrapper does not load into a plain model
(and the other way round) with PyTorch's strict ``load_state_dict``. The helpers
here always *save* the unwrapped model's state and *load* either form.

A save first writes a temporary file next to the target, then renames it over the
target with ``os.replace``: a crash or Ctrl-C during the save leaves the previous
checkpoint untouched, never half a file. A save killed outright (SIGKILL, SIGTERM,
the out-of-memory killer) cannot remove its temporary file; the next save of the
same target does (see :func:`remove_stale_temporaries`).

A checkpoint holds plain data only (tensors, numbers, strings, lists, dicts), so
:func:`load_checkpoint` reads it with ``torch.load(..., weights_only=True)``, which
runs no code from the file. A dataclass such as ``multigpu.core.train.TrainConfig`` is
stored as a dict of its fields with a note of its type, and the package's own
dataclasses are rebuilt on loading; :func:`save_checkpoint` refuses anything else
that weights-only loading would refuse, when it is saved rather than when it is
loaded. Every save stores a checksum of the file's bytes, which loading checks
(``checksum.py``). A damaged file, an optimizer of another type, and a file holding
objects other than plain data each raise an error that says so and how to fix it.
One file per concept: ``prefix.py``, ``save.py``, ``load.py``, ``atomic.py``,
``checksum.py``, ``plain_data.py``, ``errors.py``; this package gives all their
public names.
"""

from multigpu.runtime.checkpoint.atomic import (
    STALE_AFTER_SECONDS,
    check_folders,
    disk_error,
    remove_stale_temporaries,
    temporary_pattern,
    write_atomically,
)
from multigpu.runtime.checkpoint.checksum import (
    CHECKSUM_RECORD,
    add_checksum,
    verify_checksum,
)
from multigpu.runtime.checkpoint.errors import (
    CheckpointError,
    CheckpointMismatchError,
    InvalidCheckpointError,
    OptimizerMismatchError,
    UnsafeCheckpointError,
)
from multigpu.runtime.checkpoint.load import (
    load_checkpoint,
    load_model_state,
)
from multigpu.runtime.checkpoint.plain_data import (
    DATACLASS_KEY,
    FIELDS_KEY,
    OWN_PACKAGE,
    from_plain_data,
    to_plain_data,
)
from multigpu.runtime.checkpoint.prefix import (
    PREFIX,
    WRAPPER_FLAG,
    WRAPPER_TYPES,
    add_prefix,
    is_wrapped,
    match_keys,
    same_weights,
    strip_prefix,
    unwrap,
)
from multigpu.runtime.checkpoint.save import (
    EPOCH_KEY,
    MODEL_KEY,
    OPTIMIZER_KEY,
    OPTIMIZER_TYPE_KEY,
    RESERVED_KEYS,
    save_checkpoint,
)

__all__ = [
    "CHECKSUM_RECORD",
    "CheckpointError",
    "CheckpointMismatchError",
    "DATACLASS_KEY",
    "EPOCH_KEY",
    "FIELDS_KEY",
    "InvalidCheckpointError",
    "MODEL_KEY",
    "OPTIMIZER_KEY",
    "OPTIMIZER_TYPE_KEY",
    "OWN_PACKAGE",
    "OptimizerMismatchError",
    "PREFIX",
    "RESERVED_KEYS",
    "STALE_AFTER_SECONDS",
    "UnsafeCheckpointError",
    "WRAPPER_FLAG",
    "WRAPPER_TYPES",
    "add_checksum",
    "add_prefix",
    "check_folders",
    "from_plain_data",
    "disk_error",
    "is_wrapped",
    "load_checkpoint",
    "load_model_state",
    "match_keys",
    "remove_stale_temporaries",
    "same_weights",
    "save_checkpoint",
    "strip_prefix",
    "temporary_pattern",
    "to_plain_data",
    "unwrap",
    "verify_checksum",
    "write_atomically",
]
