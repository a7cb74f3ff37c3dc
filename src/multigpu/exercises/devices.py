"""The checker of notebook 00's exercise 3, where the learner writes the renumbering
of ``CUDA_VISIBLE_DEVICES``: ``visible_gpus(value, gpu_count)`` returns the physical
GPU behind ``cuda:0``, ``cuda:1``, ... (00)."""

from __future__ import annotations

from collections.abc import Callable

from multigpu.core.visible_devices import visible_gpus
from multigpu.exercises._result import ExerciseResult, fail, ok

# (CUDA_VISIBLE_DEVICES, GPUs in the machine, the rule a wrong answer breaks)
CASES: list[tuple[str | None, int, str]] = [
    (
        "2,3",
        4,
        "the process sees exactly the GPUs listed, and numbers them from 0",
    ),
    (
        "3,1",
        4,
        "the logical ids follow the order in which the GPUs are listed, not the "
        "physical order",
    ),
    (None, 2, "with the variable unset, the process sees every GPU, in physical order"),
    ("", 4, "an empty value hides every GPU"),
    (
        "1gpu,2",
        4,
        "the driver reads each entry by the number it starts with and ignores the "
        "rest of the entry",
    ),
    (
        "1,a,2",
        4,
        "an entry that does not start with a number ends the list: the entries after "
        "it are never read",
    ),
    ("0,2,-1,3", 4, "a negative id ends the list as well"),
    ("0,1,0", 4, "a repeated id hides every GPU, not only the repeat"),
    (
        "5,0",
        2,
        "an id the machine does not have ends the list: the GPUs listed after it are "
        "not seen either",
    ),
    ("1,3,0", 2, "an id the machine does not have ends the list"),
]


def _setting(value: str | None, gpu_count: int) -> str:
    shown = " unset" if value is None else f"={value!r}"
    return f"with CUDA_VISIBLE_DEVICES{shown} on a machine with {gpu_count} GPUs"


def check_visible_gpus(learner: Callable) -> ExerciseResult:
    """Does ``learner(value, gpu_count)`` give the physical GPU of each logical id,
    as the CUDA driver numbers them, on every value of ``CASES``? (passed, message)
    (00)."""
    for value, gpu_count, rule in CASES:
        expected = visible_gpus(value, gpu_count)
        try:
            got = learner(value, gpu_count)
        except Exception as error:  # the learner's code: any error is a FAIL
            return fail(
                f"FAIL: {_setting(value, gpu_count)}, your function raised "
                f"{type(error).__name__}: {error}. Remember: {rule}."
            )
        if not isinstance(got, (list, tuple, range)):
            return fail(
                f"FAIL: {_setting(value, gpu_count)}, your function returned "
                f"{got!r}, not a list: return one physical id per logical id, "
                "cuda:0 first."
            )
        if not all(isinstance(entry, int) for entry in got):
            return fail(
                f"FAIL: {_setting(value, gpu_count)}, you return {list(got)}: a "
                "physical id is an integer, the number an entry starts with."
            )
        if list(got) != expected:
            return fail(
                f"FAIL: {_setting(value, gpu_count)}, you return {list(got)}, but the "
                f"process sees {expected}: {rule}."
            )
    return ok(
        f"PASS: your renumbering agrees with the driver's on all {len(CASES)} values "
        "tried: the order kept, entries read by their leading number, a bad or "
        "negative entry or a missing GPU ending the list, a repeat hiding them all."
    )
