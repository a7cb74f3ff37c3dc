"""Loading a checkpoint into a model, wrapped or not, and its optimizer, with one
clear error for each way a file can fail to fit (06, 11)."""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from multigpu.core.devices import SIMULATED_PREFIX, Device, resolve_device
from multigpu.runtime.checkpoint.checksum import verify_checksum
from multigpu.runtime.checkpoint.errors import (
    CheckpointMismatchError,
    InvalidCheckpointError,
    OptimizerMismatchError,
    UnsafeCheckpointError,
    invalid_checkpoint,
)
from multigpu.runtime.checkpoint.plain_data import (
    OWN_PACKAGE,
    _blocked_module,
    _refused_global,
    from_plain_data,
)
from multigpu.runtime.checkpoint.prefix import PREFIX, match_keys, unwrap
from multigpu.runtime.checkpoint.save import (
    EPOCH_KEY,
    MODEL_KEY,
    OPTIMIZER_KEY,
    OPTIMIZER_TYPE_KEY,
    RESERVED_KEYS,
)

_SHOW_KEYS = 6  # how many keys an error message lists before "... and N more"


def _show(keys: list[str]) -> str:
    shown = ", ".join(repr(key) for key in keys[:_SHOW_KEYS])
    more = len(keys) - _SHOW_KEYS
    return f"[{shown}{f', ... and {more} more' if more > 0 else ''}]"


def load_model_state(
    model: nn.Module,
    state_dict: Mapping[str, Any],
    strict: bool = True,
    source: str = "the state_dict",
) -> tuple[list[str], list[str]]:
    """Load a plain or ``module.``-prefixed ``state_dict`` into ``model``, wrapped
    or not; returns (missing_keys, unexpected_keys) like ``load_state_dict``. A
    real mismatch raises :class:`CheckpointMismatchError` unless strict=False; a
    tensor of another shape raises it always, before anything is loaded, so the
    model is left as it was (06)."""
    target = unwrap(model)
    fitted = match_keys(state_dict, target)
    current = target.state_dict()
    expected = list(current.keys())
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
    differing = _shape_mismatches(fitted, current)
    if differing:
        key, saved, wanted = differing[0]
        others = len(differing) - 1
        raise CheckpointMismatchError(
            f"{source} does not fit {type(target).__name__}: {key!r} {saved} in "
            f"{source} but {wanted} in the model"
            f"{f' (and {others} more tensor(s) differ)' if others else ''}; nothing "
            "was loaded. Build the model with the same class and arguments as the "
            "one that was saved."
        )
    return target.load_state_dict(fitted, strict=strict)


def _shape_mismatches(
    fitted: Mapping[str, Any], current: Mapping[str, Any]
) -> list[tuple[str, str, str]]:
    """(key, what the state_dict holds, what the model holds) for each tensor of
    the model, in its order, that ``load_state_dict`` would refuse (a value that is
    no tensor, or another shape) after loading the others."""
    differing = []
    for key, tensor in current.items():
        if key not in fitted or not isinstance(tensor, torch.Tensor):
            continue  # missing (strict=False), or a module's extra state
        if is_lazy(tensor):
            continue  # a lazy module takes any shape
        value = fitted[key]
        wanted = f"shape {list(tensor.shape)}"
        if not torch.overrides.is_tensor_like(value):
            saved = f"is a {type(value).__name__}"
            differing.append((key, saved, f"a tensor of {wanted}"))
            continue
        shape = value.shape
        if len(tensor.shape) == 0 and list(shape) == [1]:
            shape = torch.Size([])  # load_state_dict accepts [x] for a scalar
        if shape != tensor.shape:
            differing.append((key, f"has shape {list(value.shape)}", wanted))
    return differing


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
    you made yourself. The checksum a save stores is checked first; a file without
    one (``torch.save``'s, or one saved before checksums) loads unchecked, with a
    warning if it is a checkpoint dict. Errors: :class:`InvalidCheckpointError` for
    a file that is empty, cut short, corrupted or not matching its checksum;
    :class:`UnsafeCheckpointError` for one holding other objects;
    :class:`CheckpointMismatchError` when the keys or the tensors' shapes do not
    fit the model (which is then left as it was);
    :class:`OptimizerMismatchError` when the optimizer state does not fit
    ``optimizer`` (the model and the optimizer are then left as they were, except
    that for a file saved without ``"optimizer_type"`` the model is loaded already).
    """
    path = Path(path)
    location = _torch_location(map_location)
    checked = verify_checksum(path)  # a file that does not match it is refused
    loaded = _read(path, location, weights_only)
    if not isinstance(loaded, Mapping):
        raise TypeError(
            f"{path.name} holds a {type(loaded).__name__}, not a checkpoint dict or "
            "a state_dict. Save with save_checkpoint(path, model) or "
            "torch.save(model.state_dict(), path)."
        )
    if isinstance(loaded.get(MODEL_KEY), Mapping):
        if not checked:
            warnings.warn(
                f"{path.name} holds no checksum (saved by torch.save, or by "
                f"{OWN_PACKAGE} before checkpoints carried one), so damage to its "
                "bytes cannot be detected: it is loaded unchecked. Save it again "
                "with save_checkpoint to add a checksum.",
                stacklevel=2,
            )
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
        blocked = _blocked_module(error)
        if blocked is not None:
            raise UnsafeCheckpointError(
                f"{path.name} holds a {refused}, from the module {blocked}, which "
                "PyTorch never unpickles because it can run commands on this "
                "machine: the file was not written by save_checkpoint and may be "
                f"malicious. Do not load {path.name}; save the checkpoint again "
                "with save_checkpoint."
            ) from cause
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
    return invalid_checkpoint(
        path,
        "the file is empty (0 bytes)"
        if empty
        else f"torch.load cannot read it ({type(error).__name__}), so it is cut "
        "short, corrupted, or not a file written by torch.save",
    )


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
