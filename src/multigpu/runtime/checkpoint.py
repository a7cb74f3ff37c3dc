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
loaded. A damaged file, an optimizer of another type, and a file holding objects
other than plain data each raise an error that says so and how to fix it.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
import pickle
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from multigpu.core.devices import SIMULATED_PREFIX, Device, resolve_device
from multigpu.dataparallel import DataParallel as ReferenceDataParallel

try:  # POSIX: a save locks its temporary file while it writes it
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

PREFIX = "module."  # what DataParallel / DistributedDataParallel put before each key
MODEL_KEY = "model"  # the checkpoint dict's entry for the model's state_dict
OPTIMIZER_KEY = "optimizer"  # ... for the optimizer's state_dict (or None)
EPOCH_KEY = "epoch"  # ... for the epoch number (or None)
# ... for the optimizer's class name ("SGD"); only there when an optimizer is saved
OPTIMIZER_TYPE_KEY = "optimizer_type"
RESERVED_KEYS = (MODEL_KEY, OPTIMIZER_KEY, EPOCH_KEY, OPTIMIZER_TYPE_KEY)
# A dataclass is stored as {DATACLASS_KEY: "module.QualName", FIELDS_KEY: {...}}.
DATACLASS_KEY = "__dataclass__"
FIELDS_KEY = "fields"
OWN_PACKAGE = __name__.partition(".")[0]  # "multigpu": its dataclasses are rebuilt
# A temporary file nobody holds the lock on is stale once it is this old, whether or
# not a process with its writer's id is running (that id may have been reused).
STALE_AFTER_SECONDS = 10.0
_SHOW_KEYS = 6  # how many keys an error message lists before "... and N more"


# The module classes that hold the real model as ``.module``: PyTorch's two wrappers
# and the reference DataParallel of notebooks 02-06 (its subclasses included).
WRAPPER_TYPES = (
    nn.DataParallel,
    nn.parallel.DistributedDataParallel,
    ReferenceDataParallel,
)


def is_wrapped(model: nn.Module) -> bool:
    """True if ``model`` is a DataParallel / DistributedDataParallel wrapper (06)."""
    return isinstance(model, WRAPPER_TYPES)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside any DataParallel / DDP wrappers, or ``model`` itself (06)."""
    while is_wrapped(model):
        model = model.module
    return model


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    """True if two models, wrapped or not, hold identical tensors under the same
    names, compared on the CPU (06)."""
    state_a, state_b = unwrap(a).state_dict(), unwrap(b).state_dict()
    return state_a.keys() == state_b.keys() and all(
        torch.equal(state_a[key].cpu(), state_b[key].cpu()) for key in state_a
    )


def strip_prefix(
    state_dict: Mapping[str, Any], prefix: str = PREFIX
) -> OrderedDict[str, Any]:
    """A copy of ``state_dict`` with ``prefix`` removed from every key that starts
    with it ("module.fc.weight" -> "fc.weight"); the input is not changed (06).

    PyTorch's ``consume_prefix_in_state_dict_if_present`` does the work, on a copy
    because it renames in place. It renames the ``_metadata`` too (the module
    versions that ``load_state_dict`` reads): the wrapper's own entry ``""`` is
    replaced by the model's (``"module"``). Each renamed key moves to the end, so
    the order is unchanged when every key carries the prefix, as in any state_dict
    of a DataParallel or DDP wrapper; keys without the prefix are left alone.
    """
    stripped = OrderedDict(state_dict)  # new dict, same tensors
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        stripped._metadata = OrderedDict(metadata)  # type: ignore[attr-defined]
    consume_prefix_in_state_dict_if_present(stripped, prefix)
    return stripped


def add_prefix(
    state_dict: Mapping[str, Any], prefix: str = PREFIX
) -> OrderedDict[str, Any]:
    """A copy of ``state_dict`` with ``prefix`` put before every key ("fc.weight" ->
    "module.fc.weight"), as a DataParallel/DDP wrapper would have saved it (06).

    The ``_metadata`` gets the same prefix, plus the entry ``""`` for the wrapper
    itself and ``"module"`` for the model (PyTorch has no helper for this way)."""
    added = OrderedDict((prefix + key, value) for key, value in state_dict.items())
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        new_metadata = OrderedDict()
        for key, value in metadata.items():
            if key == "":  # the model's own entry: the wrapper's, then the model's
                new_metadata[""] = value
                new_metadata[prefix.rstrip(".")] = value
            else:
                new_metadata[prefix + key] = value
        added._metadata = new_metadata  # type: ignore[attr-defined]
    return added


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


def _show(keys: list[str]) -> str:
    shown = ", ".join(repr(key) for key in keys[:_SHOW_KEYS])
    more = len(keys) - _SHOW_KEYS
    return f"[{shown}{f', ... and {more} more' if more > 0 else ''}]"


def match_keys(
    state_dict: Mapping[str, Any], model: nn.Module, prefix: str = PREFIX
) -> Mapping[str, Any]:
    """``state_dict`` with its keys made to fit ``unwrap(model)``: ``prefix`` is
    stripped once per wrapper it was saved from; unchanged if nothing fits (06)."""
    expected = set(unwrap(model).state_dict().keys())
    candidates = [state_dict]
    while set(candidates[-1]) != expected and any(
        key.startswith(prefix) for key in candidates[-1]
    ):
        candidates.append(strip_prefix(candidates[-1], prefix))
    # the candidate with most matching keys; on a tie the least stripped one
    return max(candidates, key=lambda candidate: len(set(candidate) & expected))


def load_model_state(
    model: nn.Module,
    state_dict: Mapping[str, Any],
    strict: bool = True,
    source: str = "the state_dict",
) -> tuple[list[str], list[str]]:
    """Load a plain or ``module.``-prefixed ``state_dict`` into ``model``, wrapped
    or not; returns (missing_keys, unexpected_keys) like ``load_state_dict``. A
    real mismatch raises :class:`CheckpointMismatchError` unless strict=False (06)."""
    target = unwrap(model)
    fitted = match_keys(state_dict, target)
    expected = list(target.state_dict().keys())
    missing = [key for key in expected if key not in fitted]
    expected_keys = set(expected)
    unexpected = [key for key in fitted if key not in expected_keys]
    if strict and (missing or unexpected):
        raise CheckpointMismatchError(
            f"{source} does not fit {type(target).__name__}: missing key(s) "
            f"{_show(missing)}, unexpected key(s) {_show(unexpected)} (after "
            f"removing any '{PREFIX}' prefix). Build the model with the same class "
            "and arguments as the one that was saved, or pass strict=False to load "
            "only the keys that match."
        )
    return target.load_state_dict(fitted, strict=strict)


# --- saving -------------------------------------------------------------------------


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    epoch: int | None = None,
    **extra: Any,
) -> Path:
    """Atomically save ``{"model": unwrap(model).state_dict(), "optimizer": ...,
    "epoch": epoch, **extra}`` to ``path`` (no ``module.`` prefix) (06, 11).

    With an optimizer, ``"optimizer_type"`` also records its class name ("SGD"), so
    that :func:`load_checkpoint` can say when it is loaded into another type.
    ``extra`` holds plain data: tensors, numbers, strings, lists, tuples and dicts of
    them, and dataclasses (``config=TrainConfig()``), which are stored as a dict of
    their fields with a note of their type (see :func:`to_plain_data`). Anything
    that weights-only loading would refuse (a ``Path``, a NumPy number, your own
    class) raises a ``TypeError`` here, before the file is touched, rather than
    when the checkpoint is loaded.
    """
    path = Path(path)
    clashing = sorted(set(extra) & set(RESERVED_KEYS))
    if clashing:
        raise ValueError(
            f"save_checkpoint keeps the key(s) {clashing} for itself, so they cannot "
            "be passed as extra values. Store the value under another name."
        )
    plain = {
        key: to_plain_data(value) for key, value in {EPOCH_KEY: epoch, **extra}.items()
    }
    for key, value in plain.items():
        _check_loadable(key, value)
    checkpoint = {
        MODEL_KEY: unwrap(model).state_dict(),
        OPTIMIZER_KEY: None if optimizer is None else optimizer.state_dict(),
        **plain,
    }
    if optimizer is not None:
        checkpoint[OPTIMIZER_TYPE_KEY] = type(optimizer).__name__
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, checkpoint)
    return path


def to_plain_data(value: Any) -> Any:
    """``value`` with every dataclass in it, also inside lists, tuples and dicts,
    replaced by ``{"__dataclass__": "module.QualName", "fields": {...}}`` (06, 11).

    That is plain data, which weights-only loading accepts and plain ``torch.load``
    shows as it is; :func:`from_plain_data` turns it back. Containers without a
    dataclass in them are returned as they are (the same object), so a state_dict's
    ``_metadata`` survives.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        return {
            DATACLASS_KEY: f"{cls.__module__}.{cls.__qualname__}",
            FIELDS_KEY: {
                field.name: to_plain_data(getattr(value, field.name))
                for field in dataclasses.fields(value)
                if field.init  # the others are computed by the class itself
            },
        }
    return _map_children(value, to_plain_data)


def from_plain_data(value: Any, source: str = "the checkpoint") -> Any:
    """Undo :func:`to_plain_data`: each stored dataclass of this package (such as
    ``TrainConfig``) is built again from its fields, which checks them; a dataclass
    of any other module comes back as the plain dict of its fields, since loading
    imports no code named by a file (06, 11)."""
    value = _map_children(value, lambda child: from_plain_data(child, source))
    if not _is_stored_dataclass(value):
        return value
    type_name, fields = value[DATACLASS_KEY], value[FIELDS_KEY]
    module_name, _, class_name = type_name.rpartition(".")
    if module_name.split(".")[0] != OWN_PACKAGE:
        return dict(fields)
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"{type_name} is not a dataclass")
        return cls(**fields)
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"{source} stores a {type_name} that this version of {OWN_PACKAGE} cannot "
            f"build again from its fields ({type(error).__name__}: {error}). Load it "
            f"with the version of {OWN_PACKAGE} that saved it, or read its fields "
            f"with torch.load and build the {class_name} yourself."
        ) from error


def _is_stored_dataclass(value: Any) -> bool:
    return (
        type(value) is dict
        and set(value) == {DATACLASS_KEY, FIELDS_KEY}
        and isinstance(value[DATACLASS_KEY], str)
        and isinstance(value[FIELDS_KEY], dict)
    )


def _map_children(value: Any, function: Any) -> Any:
    """``value`` with ``function`` applied to the items of a dict, OrderedDict, list
    or tuple; the same object when no item changes."""
    if type(value) in (dict, OrderedDict):
        mapped = {key: function(item) for key, item in value.items()}
        if all(mapped[key] is item for key, item in value.items()):
            return value
        return type(value)(mapped)
    if type(value) in (list, tuple):
        items = [function(item) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return type(value)(items)
    return value


def _check_loadable(key: str, value: Any) -> None:
    """Raise a TypeError if weights-only loading would refuse ``value``: torch's own
    unpickler decides, on the value saved to memory without its tensors' data."""
    buffer = io.BytesIO()
    try:
        torch.save(_without_tensor_data(value), buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception as error:
        refused = _refused_global(error) or type(value).__qualname__
        raise TypeError(
            f"save_checkpoint cannot store {key!r}: it holds a {refused}, and "
            "load_checkpoint unpickles only plain data, so that loading a file runs "
            "no code from it. Pass plain data instead: tensors, numbers, strings, "
            "lists, tuples, dicts and dataclasses of them (for a Path, str(path))."
        ) from None


def _without_tensor_data(value: Any) -> Any:
    """``value`` with each plain tensor in it replaced by an empty one of its dtype:
    the same types to unpickle, without copying a large tensor to check it."""
    if type(value) in (torch.Tensor, nn.Parameter) and value.layout == torch.strided:
        return torch.empty(0, dtype=value.dtype)
    return _map_children(value, _without_tensor_data)


def write_atomically(path: str | os.PathLike, obj: Any) -> None:
    """``torch.save(obj, path)`` through a temporary file and ``os.replace``, so
    ``path`` holds either the old file or the complete new one (06, 11).

    The temporary file is ``.{name}.{pid}.{random}.tmp`` next to ``path``, locked
    (POSIX ``flock``) from its creation until it has replaced ``path``. Before
    writing, the stale temporaries of earlier saves of ``path`` that were killed
    are removed (:func:`remove_stale_temporaries`).
    """
    path = Path(path)
    remove_stale_temporaries(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temporary, "xb") as file:
            locked = _lock(file)
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())  # the bytes are on disk before the rename
            if locked:  # rename while still locked: never unlocked before it is done
                os.replace(temporary, path)  # atomic on POSIX and Windows
        if not locked:  # Windows renames no open file
            os.replace(temporary, path)
    except BaseException:  # Ctrl-C included: leave no temporary file behind
        temporary.unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def _lock(file: Any) -> bool:
    """Lock an open file for as long as it is open; False where there are no locks."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX)
    except OSError:  # a file system without locks
        return False
    return True


def temporary_pattern(path: str | os.PathLike) -> re.Pattern[str]:
    """The names :func:`write_atomically` gives the temporary files of ``path``:
    ``.{name}.{pid}.{8 hex digits}.tmp``; group 1 is the writer's process id (11)."""
    return re.compile(rf"\.{re.escape(Path(path).name)}\.(\d+)\.[0-9a-f]{{8}}\.tmp")


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files left next to ``path`` by saves of ``path`` that
    were killed before they could clean up; returns the files removed (11).

    Only files named like this module's temporaries *of this target* are looked at
    (:func:`temporary_pattern`). A save holds a lock on its temporary file until the
    rename is done, and the operating system drops the lock when the writer dies,
    by any signal; so a locked file is a save in flight and is kept. An unlocked one
    is removed if its writer's process id is not running, or if it was last written
    more than ``STALE_AFTER_SECONDS`` ago (a process id can be reused); a fresh one
    whose writer is running may be a save between creating and locking its file,
    and is kept. On a file system without locks only the process id decides. On
    Windows, where these checks are not available, nothing is removed.
    """
    path = Path(path)
    if os.name != "posix":
        return []
    pattern = temporary_pattern(path)
    try:
        entries = list(os.scandir(path.parent))
    except OSError:  # no folder yet, or not readable: nothing to clean
        return []
    removed = []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match and _remove_if_stale(Path(entry.path), int(match.group(1))):
            removed.append(Path(entry.path))
    return removed


def _remove_if_stale(temporary: Path, pid: int) -> bool:
    try:
        file = open(temporary, "rb")
    except OSError:  # gone already, or not ours to read: leave it
        return False
    with file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its writer holds the lock: a save in flight
            return False
        except OSError:  # no locks on this file system: only the process id tells
            stale = not _process_running(pid)
        else:
            age = time.time() - os.fstat(file.fileno()).st_mtime
            stale = age > STALE_AFTER_SECONDS or not _process_running(pid)
        if not stale:
            return False
        try:
            temporary.unlink()
        except OSError:
            return False
    return True


def _process_running(pid: int) -> bool:
    """True if a process with this id exists (POSIX), ours included."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, run by another user
        return True
    except (OverflowError, ValueError):  # no process can have this id
        return False
    return True


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where it is not supported."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


# --- loading ------------------------------------------------------------------------


def load_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    map_location: str | torch.device | Device | None = "cpu",
    strict: bool = True,
    weights_only: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint into ``model`` (wrapped or not) and ``optimizer``; accepts
    :func:`save_checkpoint` files and bare state_dicts, prefixed or not. Returns
    the checkpoint dict (``"epoch"`` and any extras, dataclasses rebuilt) (06, 11).

    ``map_location`` is where the tensors go: "cpu" (the default), "cuda:N", a
    ``torch.device``, or a simulated device, as a :class:`Device` or its name
    ("gpu:1", whose tensors live on the CPU). ``weights_only=True`` unpickles only
    plain data, so loading runs no code from the file; turn it off only for a file
    you made yourself. Errors: :class:`InvalidCheckpointError` for a file that is
    empty, cut short or corrupted; :class:`UnsafeCheckpointError` for one holding
    other objects; :class:`CheckpointMismatchError` when the keys do not fit the
    model; :class:`OptimizerMismatchError` when the optimizer state does not fit
    ``optimizer`` (the model and the optimizer are then left as they were, except
    that for a file saved without ``"optimizer_type"`` the model is loaded already).
    """
    path = Path(path)
    loaded = _read(path, _torch_location(map_location), weights_only)
    if not isinstance(loaded, Mapping):
        raise TypeError(
            f"{path.name} holds a {type(loaded).__name__}, not a checkpoint dict or "
            "a state_dict. Save with save_checkpoint(path, model) or "
            "torch.save(model.state_dict(), path)."
        )
    if isinstance(loaded.get(MODEL_KEY), Mapping):
        checkpoint = {
            key: value if key in RESERVED_KEYS else from_plain_data(value, path.name)
            for key, value in loaded.items()
        }
    else:  # a bare state_dict, e.g. from torch.save(model.state_dict(), path)
        checkpoint = {MODEL_KEY: loaded, OPTIMIZER_KEY: None, EPOCH_KEY: None}
    if optimizer is not None:
        if checkpoint.get(OPTIMIZER_KEY) is None:
            raise ValueError(
                f"{path.name} holds no optimizer state, so the optimizer cannot be "
                "restored. Save with save_checkpoint(path, model, optimizer), or "
                "load with optimizer=None."
            )
        _check_optimizer_type(checkpoint.get(OPTIMIZER_TYPE_KEY), optimizer, path.name)
    load_model_state(model, checkpoint[MODEL_KEY], strict=strict, source=path.name)
    if optimizer is not None:
        _load_optimizer_state(optimizer, checkpoint[OPTIMIZER_KEY], path.name)
    return checkpoint


def _torch_location(map_location: Any) -> Any:
    """What torch.load takes for ``map_location``: a :class:`Device` or a simulated
    device's name ("gpu:1") becomes the device its tensors live on (the CPU)."""
    if isinstance(map_location, str):
        kind = map_location.strip().lower().partition(":")[0]
        if kind == SIMULATED_PREFIX:
            map_location = resolve_device(map_location)  # a clear error if malformed
        else:
            try:
                torch.device(map_location)
            except RuntimeError:
                raise ValueError(
                    f"Unknown map_location {map_location!r}. Use 'cpu', 'cuda:N', a "
                    f"simulated '{SIMULATED_PREFIX}:N', a torch.device or a Device."
                ) from None
    if isinstance(map_location, Device):
        return map_location.torch_device
    return map_location  # "cpu", "cuda:N", a torch.device, None, a dict or function


# Errors of torch.load that are about the path or this machine, not the file's bytes:
# their own messages say what is wrong.
_NOT_ABOUT_THE_BYTES = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    MemoryError,
    ImportError,
)

# torch.load's RuntimeErrors about devices: saved on a GPU this machine lacks, or
# mapped to a device type that cannot hold tensors here.
_DEVICE_ERRORS = ("deserialize object on", "restore data location")


def _read(path: Path, map_location: Any, weights_only: bool) -> Any:
    """``torch.load``, with one clear error for a file that is not a checkpoint."""
    try:
        return torch.load(path, map_location=map_location, weights_only=weights_only)
    except _NOT_ABOUT_THE_BYTES:
        raise
    except RuntimeError as error:
        if any(text in str(error) for text in _DEVICE_ERRORS):
            raise  # about the devices of this machine, not the file's bytes
        raise _invalid(path, error) from error
    except pickle.UnpicklingError as error:
        cause: BaseException | None = error
        if "weights_only" in str(error):
            # torch's error wraps the unpickler's own (its __context__) in advice to
            # load unsafely: chain the unpickler's error, never the advice
            cause = error.__context__
        refused = _refused_global(error)
        if refused is None:
            raise _invalid(path, error) from cause
        raise UnsafeCheckpointError(
            f"{path.name} holds a {refused}, which load_checkpoint does not unpickle "
            "because unpickling objects other than plain data can run code from the "
            "file. Save the checkpoint again with save_checkpoint, which stores "
            "plain data, or, only if you trust where the file came from, load it "
            f"inside `with torch.serialization.safe_globals([{refused}]):`."
        ) from cause
    except Exception as error:  # EOFError, OSError, KeyError, ...: damaged bytes
        if not weights_only and isinstance(error, AttributeError):
            raise  # full unpickling: a class the file names is missing here
        raise _invalid(path, error) from error


def _invalid(path: Path, error: BaseException) -> InvalidCheckpointError:
    try:
        empty = path.stat().st_size == 0
    except OSError:
        empty = False
    problem = (
        "the file is empty (0 bytes)"
        if empty
        else f"torch.load cannot read it ({type(error).__name__}), so it is cut "
        "short, corrupted, or not a file written by torch.save"
    )
    return InvalidCheckpointError(
        f"{path.name} is not a valid checkpoint: {problem}. Restore {path.name} "
        "from a copy, or save the checkpoint again with save_checkpoint."
    )


_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _refused_global(error: BaseException) -> str | None:
    """The type that weights-only loading refused ("pathlib.PosixPath"), if that is
    why ``error`` (or the error it wraps) was raised."""
    for candidate in (error, error.__context__):
        match = _REFUSED_GLOBAL.search(str(candidate)) if candidate else None
        if match:
            return match.group(1)
    return None


def _check_optimizer_type(
    saved: str | None, optimizer: torch.optim.Optimizer, source: str
) -> None:
    """Refuse to load the state of one optimizer type into another (06, 11)."""
    actual = type(optimizer).__name__
    if saved is not None and saved != actual:
        raise OptimizerMismatchError(
            f"{source} holds optimizer state saved from {saved}, but the optimizer "
            f"passed is {actual}: the optimizer types differ. Create the optimizer "
            f"as {saved}, as when the checkpoint was saved, or pass optimizer=None "
            f"to load only the weights and start {actual} afresh."
        )


def _load_optimizer_state(
    optimizer: torch.optim.Optimizer, state: Mapping[str, Any], source: str
) -> None:
    """``optimizer.load_state_dict(state)``; on failure the optimizer is put back as
    it was and the error says what to do (06, 11)."""
    previous = optimizer.state_dict()
    try:
        optimizer.load_state_dict(state)
    except (KeyError, ValueError, TypeError) as error:
        optimizer.load_state_dict(previous)  # torch may have half-loaded it
        actual = type(optimizer).__name__
        raise OptimizerMismatchError(
            f"{source} holds optimizer state that does not fit {actual} "
            f"({type(error).__name__}: {error}): it was saved from another optimizer "
            "type, or for another model. Create the same optimizer type for the same "
            "model as when the checkpoint was saved, or pass optimizer=None to load "
            "only the weights."
        ) from error
