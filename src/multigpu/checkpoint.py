"""Checkpoints that survive wrappers and interruptions.

Taught in ``notebooks/06_dataparallel_checkpoints_and_speed.ipynb`` (the ``module.``
prefix) and used again by ``notebooks/11`` (fault tolerance: atomic saves).

``nn.DataParallel`` and ``DistributedDataParallel`` keep your model as their
attribute ``.module``, so every key of their ``state_dict()`` starts with
``"module."``. A checkpoint saved from a wrapper does not load into a plain model
(and the other way round) with PyTorch's strict ``load_state_dict``. The helpers
here always *save* the unwrapped model's state and *load* either form.

A save first writes a temporary file next to the target, then renames it over the
target with ``os.replace``: a crash or Ctrl-C during the save leaves the previous
checkpoint untouched, never half a file.
"""

from __future__ import annotations

import os
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from .dataparallel import DataParallel as ReferenceDataParallel
from .devices import Device

PREFIX = "module."  # what DataParallel / DistributedDataParallel put before each key
MODEL_KEY = "model"  # the checkpoint dict's entry for the model's state_dict
OPTIMIZER_KEY = "optimizer"  # ... for the optimizer's state_dict (or None)
EPOCH_KEY = "epoch"  # ... for the epoch number (or None)
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


class CheckpointMismatchError(RuntimeError):
    """A state_dict whose keys do not fit the model, even after fixing the prefix."""


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


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    epoch: int | None = None,
    **extra: Any,
) -> Path:
    """Atomically save ``{"model": unwrap(model).state_dict(), "optimizer": ...,
    "epoch": epoch, **extra}`` to ``path`` (no ``module.`` prefix) (06, 11)."""
    path = Path(path)
    checkpoint = {
        MODEL_KEY: unwrap(model).state_dict(),
        OPTIMIZER_KEY: None if optimizer is None else optimizer.state_dict(),
        EPOCH_KEY: epoch,
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, checkpoint)
    return path


def write_atomically(path: str | os.PathLike, obj: Any) -> None:
    """``torch.save(obj, path)`` through a temporary file and ``os.replace``, so
    ``path`` holds either the old file or the complete new one (06, 11)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temporary, "xb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())  # the bytes are on disk before the rename
        os.replace(temporary, path)  # atomic on POSIX and Windows
    except BaseException:  # Ctrl-C included: leave no temporary file behind
        temporary.unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


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
    the checkpoint dict (``"epoch"`` and any extras) (06, 11)."""
    path = Path(path)
    if isinstance(map_location, Device):
        map_location = map_location.torch_device
    loaded = torch.load(path, map_location=map_location, weights_only=weights_only)
    if not isinstance(loaded, Mapping):
        raise TypeError(
            f"{path.name} holds a {type(loaded).__name__}, not a checkpoint dict or "
            "a state_dict. Save with save_checkpoint(path, model) or "
            "torch.save(model.state_dict(), path)."
        )
    if isinstance(loaded.get(MODEL_KEY), Mapping):
        checkpoint = dict(loaded)
    else:  # a bare state_dict, e.g. from torch.save(model.state_dict(), path)
        checkpoint = {MODEL_KEY: loaded, OPTIMIZER_KEY: None, EPOCH_KEY: None}
    load_model_state(model, checkpoint[MODEL_KEY], strict=strict, source=path.name)
    if optimizer is not None:
        if checkpoint.get(OPTIMIZER_KEY) is None:
            raise ValueError(
                f"{path.name} holds no optimizer state, so the optimizer cannot be "
                "restored. Save with save_checkpoint(path, model, optimizer), or "
                "load with optimizer=None."
            )
        optimizer.load_state_dict(checkpoint[OPTIMIZER_KEY])
    return checkpoint
