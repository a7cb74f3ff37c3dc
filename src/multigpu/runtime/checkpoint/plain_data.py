"""Plain data: what weights-only loading accepts, and dataclasses stored as dicts of
their fields (06, 11)."""

from __future__ import annotations

import dataclasses
import importlib
import io
import re
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from multigpu.runtime.checkpoint.errors import CheckpointError

# A dataclass is stored as {DATACLASS_KEY: "module.QualName", FIELDS_KEY: {...}}.
DATACLASS_KEY = "__dataclass__"
FIELDS_KEY = "fields"
OWN_PACKAGE = __name__.partition(".")[0]  # "multigpu": its dataclasses are rebuilt


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


# torch's two ways of refusing a global: not allowed ("Unsupported global: GLOBAL
# pathlib.PosixPath ..."), or from a module it never allows, whatever the allowlist
# ("Trying to load unsupported GLOBAL posix.system whose module posix is blocked")
_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_BLOCKED_GLOBAL = re.compile(
    r"unsupported GLOBAL ([\w.]+) whose module ([\w.]+) is blocked"
)


def _refused_global(error: BaseException) -> str | None:
    """The type that weights-only loading refused ("pathlib.PosixPath"), if that is
    why ``error`` (or the error it wraps) was raised."""
    for pattern in (_REFUSED_GLOBAL, _BLOCKED_GLOBAL):
        for candidate in (error, error.__context__):
            match = pattern.search(str(candidate)) if candidate else None
            if match:
                return match.group(1)
    return None


def _blocked_module(error: BaseException) -> str | None:
    """The module ("posix") whose globals weights-only loading refuses whatever is
    allowed (it could run code), if that is why ``error`` was raised."""
    for candidate in (error, error.__context__):
        match = _BLOCKED_GLOBAL.search(str(candidate)) if candidate else None
        if match:
            return match.group(2)
    return None
