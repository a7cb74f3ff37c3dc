"""Renumberings of CUDA_VISIBLE_DEVICES that learners write in notebook 00's
exercise 3, each with one mistake (tests/exercises/test_devices.py)."""

import re


def as_shipped(value, gpu_count):
    """The exercise's TODOs left as they are."""
    if value is None:
        return list(range(gpu_count))
    visible = []
    for entry in value.split(","):
        # TODO: read the number the entry starts with; then keep it, end the
        # list here, or hide every GPU, as the driver does
        visible.append(entry)
    return visible


def int_of_each(value, gpu_count):
    """int() of every entry: no unset case, no driver rules."""
    return [int(entry) for entry in value.split(",")]


def int_of_each_when_set(value, gpu_count):
    """int() of every entry, with the unset case right."""
    if value is None:
        return list(range(gpu_count))
    return [int(entry) for entry in value.split(",") if entry]


def sorted_ids(value, gpu_count):
    """Sorts the GPUs: loses the order the user chose."""
    if value is None:
        return list(range(gpu_count))
    return sorted(int(entry) for entry in value.split(",") if entry)


def _leading(entry):
    match = re.match(r"[+-]?\d+", entry.strip())
    return int(match.group()) if match else None


def skips_bad_entries(value, gpu_count):
    """Reads leading numbers, but skips an entry without one instead of stopping."""
    if value is None:
        return list(range(gpu_count))
    visible = []
    for entry in value.split(","):
        number = _leading(entry)
        if number is None or number < 0:
            continue
        if number in visible:
            return []
        if number >= gpu_count:
            break
        visible.append(number)
    return visible


def drops_repeats(value, gpu_count):
    """Keeps the first of a repeated id instead of hiding every GPU."""
    if value is None:
        return list(range(gpu_count))
    visible = []
    for entry in value.split(","):
        number = _leading(entry)
        if number is None or number < 0 or number >= gpu_count:
            break
        if number not in visible:
            visible.append(number)
    return visible


def skips_missing_gpus(value, gpu_count):
    """Skips an id the machine does not have instead of stopping there."""
    if value is None:
        return list(range(gpu_count))
    visible = []
    for entry in value.split(","):
        number = _leading(entry)
        if number is None or number < 0:
            break
        if number in visible:
            return []
        if number < gpu_count:
            visible.append(number)
    return visible


def keeps_missing_gpus(value, gpu_count):
    """Never looks at how many GPUs the machine has."""
    if value is None:
        return list(range(gpu_count))
    visible = []
    for entry in value.split(","):
        number = _leading(entry)
        if number is None or number < 0:
            break
        if number in visible:
            return []
        visible.append(number)
    return visible


def a_string(value, gpu_count):
    """Returns the value itself, a string."""
    return value or ""
