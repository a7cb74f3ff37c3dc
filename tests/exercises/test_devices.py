"""The checker of notebook 00's exercise 3 (multigpu.exercises.devices): it passes
correct renumberings of CUDA_VISIBLE_DEVICES and names each mistake."""

import re

import pytest

from multigpu.core.visible_devices import parse_visible_devices
from multigpu.exercises.devices import check_visible_gpus
from tests.exercises import wrong_devices


def by_parsing(value, gpu_count):
    """Right: the package's parser, cut at the first GPU the machine lacks."""
    entries = parse_visible_devices(value)
    if entries is None:
        return list(range(gpu_count))
    for index, entry in enumerate(entries):
        if entry >= gpu_count:
            return entries[:index]
    return entries


def by_hand(value, gpu_count):
    """Right, written out: digits read one character at a time."""
    if value is None:
        return list(range(gpu_count))
    visible = []
    for entry in value.split(","):
        digits = ""
        for character in entry.strip():
            if not character.isdigit():
                break
            digits += character
        if not digits:
            break  # no number (a negative one starts with "-"): the list ends
        number = int(digits)
        if number in visible:
            return []
        if number >= gpu_count:
            break
        visible.append(number)
    return visible


def by_regex(value, gpu_count):
    """Right, with a regular expression and a tuple."""
    if value is None:
        return tuple(range(gpu_count))
    visible = []
    for entry in value.split(","):
        match = re.match(r"\s*(\d+)", entry)
        if match is None or int(match.group(1)) >= gpu_count:
            break
        if int(match.group(1)) in visible:
            return ()
        visible.append(int(match.group(1)))
    return tuple(visible)


@pytest.mark.parametrize("right", [by_parsing, by_hand, by_regex])
def test_correct_renumberings_pass(right):
    passed, message = check_visible_gpus(right)
    assert passed, message
    assert message.startswith("PASS: your renumbering agrees with the driver's")


def test_a_list_that_misses_a_gpu_names_the_first_rule():
    passed, message = check_visible_gpus(lambda value, gpu_count: [])
    assert not passed
    assert message == (
        "FAIL: with CUDA_VISIBLE_DEVICES='2,3' on a machine with 4 GPUs, you return "
        "[], but the process sees [2, 3]: the process sees exactly the GPUs listed, "
        "and numbers them from 0."
    )


@pytest.mark.parametrize(
    ("wrong", "expected"),
    [
        (
            wrong_devices.as_shipped,
            "FAIL: with CUDA_VISIBLE_DEVICES='2,3' on a machine with 4 GPUs, you "
            "return ['2', '3']: a physical id is an integer, the number an entry "
            "starts with.",
        ),
        (
            wrong_devices.int_of_each,
            "FAIL: with CUDA_VISIBLE_DEVICES unset on a machine with 2 GPUs, your "
            "function raised AttributeError",
        ),
        (
            wrong_devices.int_of_each_when_set,
            "FAIL: with CUDA_VISIBLE_DEVICES='1gpu,2' on a machine with 4 GPUs, your "
            "function raised ValueError",
        ),
        (
            wrong_devices.sorted_ids,
            "FAIL: with CUDA_VISIBLE_DEVICES='3,1' on a machine with 4 GPUs, you "
            "return [1, 3], but the process sees [3, 1]: the logical ids follow the "
            "order",
        ),
        (
            wrong_devices.skips_bad_entries,
            "FAIL: with CUDA_VISIBLE_DEVICES='1,a,2' on a machine with 4 GPUs, you "
            "return [1, 2], but the process sees [1]: an entry that does not start "
            "with a number ends the list",
        ),
        (
            wrong_devices.drops_repeats,
            "FAIL: with CUDA_VISIBLE_DEVICES='0,1,0' on a machine with 4 GPUs, you "
            "return [0, 1], but the process sees []: a repeated id hides every GPU",
        ),
        (
            wrong_devices.skips_missing_gpus,
            "FAIL: with CUDA_VISIBLE_DEVICES='5,0' on a machine with 2 GPUs, you "
            "return [0], but the process sees []: an id the machine does not have "
            "ends the list",
        ),
        (
            wrong_devices.keeps_missing_gpus,
            "FAIL: with CUDA_VISIBLE_DEVICES='5,0' on a machine with 2 GPUs, you "
            "return [5, 0], but the process sees []",
        ),
        (
            wrong_devices.a_string,
            "FAIL: with CUDA_VISIBLE_DEVICES='2,3' on a machine with 4 GPUs, your "
            "function returned '2,3', not a list",
        ),
    ],
)
def test_each_mistake_is_named(wrong, expected):
    passed, message = check_visible_gpus(wrong)
    assert not passed
    assert message.startswith(expected), message
