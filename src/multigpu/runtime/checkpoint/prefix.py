"""The ``module.`` prefix of wrapped models: unwrap a model, and fit a state_dict's
keys to it (06)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

PREFIX = "module."  # what DataParallel / DistributedDataParallel put before each key


# PyTorch's two wrappers: each holds the real model as its attribute ``.module``.
WRAPPER_TYPES = (nn.DataParallel, nn.parallel.DistributedDataParallel)
# Any other wrapper says so with this class attribute set to True, e.g. the course's
# own ``multigpu.dataparallel.DataParallel`` (and so its subclasses), which this
# runtime module recognises without importing the lesson.
WRAPPER_FLAG = "_is_data_parallel_wrapper"


def is_wrapped(model: nn.Module) -> bool:
    """True if ``model`` is a DataParallel / DistributedDataParallel wrapper (06):
    one of ``WRAPPER_TYPES``, or a module whose class sets ``WRAPPER_FLAG`` to True
    and that holds a module as ``.module``."""
    if isinstance(model, WRAPPER_TYPES):
        return True
    return (
        isinstance(model, nn.Module)
        and getattr(type(model), WRAPPER_FLAG, False) is True
        and isinstance(getattr(model, "module", None), nn.Module)
    )


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
