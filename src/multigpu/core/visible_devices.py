"""Logical and physical GPU ids under ``CUDA_VISIBLE_DEVICES``, without torch (00, 03).

Plain Python, so that a child process that only needs these rules starts at once
instead of importing torch, about 1.5 CPU-seconds (notebook 00 starts three);
:mod:`multigpu.core.devices` exports them too.
"""

from __future__ import annotations

import os
import re


def parse_visible_devices(value: str | None) -> list[int] | list[str] | None:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value, in logical order (00, 03).

    None when the variable is unset: every GPU is visible, in physical order.
    The rules are PyTorch's (``torch.cuda._parse_visible_devices``), which follow
    the CUDA driver: each entry is read like C's ``strtoul`` ("1gpu" means 1); a
    negative or empty entry ends the list ("0,2,-1,3" shows physical 0 and 2); a
    repeated entry hides every GPU ("0,0" shows none); a list that starts with
    "GPU-" or "MIG-" holds UUIDs and ends at the first entry without that prefix.
    """
    if value is None:
        return None
    for prefix in ("GPU-", "MIG-"):
        if value.startswith(prefix):
            uuids: list[str] = []
            for entry in value.split(","):
                if entry in uuids:
                    return []
                if not entry.startswith(prefix):
                    break
                uuids.append(entry)
            return uuids
    ids: list[int] = []
    for entry in value.split(","):
        number = _strtoul(entry.strip())
        if number in ids:
            return []
        if number < 0:
            break
        ids.append(number)
    return ids


def _strtoul(text: str) -> int:
    """The integer a string starts with ("12ab" -> 12), or -1 if there is none."""
    match = re.match(r"[+-]?\d+", text)
    return int(match.group()) if match else -1


FROM_ENVIRONMENT = "<read CUDA_VISIBLE_DEVICES from the environment>"


def physical_id(logical_id: int, visible: str | None = FROM_ENVIRONMENT) -> int | str:
    """The physical GPU behind logical ``cuda:{logical_id}`` under a
    ``CUDA_VISIBLE_DEVICES`` value (00, 03).

    ``visible=None`` means the variable is unset (ids map to themselves); by
    default the value is read from this process's environment.
    """
    if visible == FROM_ENVIRONMENT:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = parse_visible_devices(visible)
    if entries is None:
        return logical_id
    if not 0 <= logical_id < len(entries):
        raise ValueError(
            f"Logical device {logical_id} does not exist when "
            f"CUDA_VISIBLE_DEVICES={visible!r}: that shows {len(entries)} "
            f"device(s), numbered 0..{len(entries) - 1}."
        )
    return entries[logical_id]


def visible_gpus(value: str | None, gpu_count: int) -> list[int] | list[str]:
    """The physical GPU behind ``cuda:0``, ``cuda:1``, ... under
    ``CUDA_VISIBLE_DEVICES=value`` on a machine with ``gpu_count`` GPUs (00).

    The entries of ``parse_visible_devices``, up to the first id the machine does not
    have: the driver shows no GPU listed after it ("5,0" on 2 GPUs shows none), and
    PyTorch counts the same way (``torch.cuda._device_count_nvml``). UUIDs are kept.
    """
    entries = parse_visible_devices(value)
    if entries is None:
        return list(range(gpu_count))
    visible = []
    for entry in entries:
        if isinstance(entry, int) and entry >= gpu_count:
            break
        visible.append(entry)
    return visible
