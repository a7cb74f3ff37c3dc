"""The hard-case registry says true things: each case has exactly the traits it
declares (observed on the model, not read from the declaration), what it says never
moves does not move in one process and everything else trained does, every refusal
names a trait of its case, and every wrapper's suite iterates the registry. A later
edit cannot quietly make a case friendly, or forget a wrapper."""

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from multigpu.core.models import TiedFrozenNet
from multigpu.fsdp import TiedFrozenNet as LessonTiedFrozenNet
from tests import hard_cases
from tests.hard_cases import (
    CASES,
    CLASSES,
    NUM_SAMPLES,
    TRAITS,
    WRAPPERS,
    hard_case_data,
    registry_table,
    trainable_numel,
)

ROOT = Path(__file__).resolve().parent.parent
BLOCK_LAYERS = ("ln1", "attn", "ln2", "mlp")


def called_children(model: nn.Module, X: torch.Tensor) -> set[str]:
    """The names of the model's children (with parameters) that one forward ran."""
    called, hooks = set(), []
    for name, child in model.named_children():
        if any(True for _ in child.parameters()):
            hook = child.register_forward_hook(lambda m, i, o, n=name: called.add(n))
            hooks.append(hook)
    try:
        model(X)
    finally:
        for hook in hooks:
            hook.remove()
    return called


def observed_traits(case: hard_cases.HardCase) -> set[str]:
    """Each trait of TRAITS, decided by looking at the model and running it."""
    model = case.build()
    X, y = hard_case_data()
    seen: set[str] = set()
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    if len(names) > len(list(model.parameters())):
        seen.add(hard_cases.TIED)
    if any(not p.requires_grad for p in model.parameters()):
        seen.add(hard_cases.FROZEN)
    if list(model.buffers()):
        seen.add(hard_cases.BUFFER)
    counts = (sum(p.numel() for p in model.parameters()), trainable_numel(model))
    if all(count % n for count in counts for n in (2, 3, 4)):
        seen.add(hard_cases.INDIVISIBLE)
    if trainable_numel(model) < 3:
        seen.add(hard_cases.FEW)
    if any(
        any(True for _ in m.parameters(recurse=False))
        for m in model.modules()
        if not isinstance(m, nn.Linear)
    ):
        seen.add(hard_cases.OUTSIDE_LINEAR)
    if not all(hasattr(model, layer) for layer in BLOCK_LAYERS):
        seen.add(hard_cases.NOT_BLOCK)
    if case.sequential is None and not isinstance(model, nn.Sequential):
        seen.add(hard_cases.NOT_SEQUENTIAL)
    children = {n for n, c in model.named_children() if list(c.parameters())}
    ran, hooks = set(), []  # the children the first forward runs, and its backward
    for name, child in model.named_children():
        hooks.append(child.register_forward_hook(lambda *_, n=name: ran.add(n)))
    F.cross_entropy(model(X), y).backward()
    for hook in hooks:
        hook.remove()
    unread = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad and p.grad is None and n.partition(".")[0] in ran | {n}
    ]
    if unread:
        seen.add(hard_cases.UNREAD)
    later = called_children(model, X)
    if later - ran:
        seen.add(hard_cases.LATE)
    if children - ran - later:
        seen.add(hard_cases.UNUSED)
    for start in range(0, NUM_SAMPLES - 6, 6):  # batches of 6, after a first forward
        if later - called_children(model, X[start : start + 6]):
            seen.add(hard_cases.SOMETIMES)
    return seen


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_each_case_has_exactly_the_traits_it_declares(case):
    assert case.traits <= TRAITS.keys()
    assert observed_traits(case) == case.traits


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_what_never_moves_stays_and_everything_else_trains(case):
    """Three steps of plain gradient descent in one process, on the 41 samples
    (written out: torch.optim's first step costs seconds of imports)."""
    model = case.build()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    X, y = hard_case_data()
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(X), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:  # what SGD does: None means no step
                    p -= 0.5 * p.grad
    after = model.state_dict()
    hard_cases.assert_kept(case, start, after)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, start[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert moved == trainable - set(case.still)
    for first, second in case.tied:
        assert model.get_parameter(first) is model.get_parameter(second)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_every_refusal_names_a_trait_of_its_case(case):
    for wrapper, refusal in case.refused.items():
        assert wrapper in WRAPPERS and refusal.trait in case.traits, wrapper
        assert "\n" not in refusal.words and refusal.words
    for wrapper, trait in case.unsupported.items():
        assert wrapper in WRAPPERS and trait in case.traits, wrapper
        assert wrapper not in case.refused
    assert case.find_unused_parameters == bool(
        case.traits & hard_cases.NO_GRADIENT_SOMETIMES
    )


def test_the_table_has_a_verdict_for_every_model_and_wrapper():
    table = registry_table()
    print(table)  # pytest -s shows it
    rows = table.splitlines()
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header == ["model", "parameters (trainable)", *WRAPPERS]
    assert len(rows) == 2 + len(CASES)
    for case, row in zip(CASES, rows[2:], strict=True):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[0] == case.name
        assert len(cells) == 2 + len(WRAPPERS)
        model = case.build()
        total = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert cells[1] == f"{total} ({trainable})"
        for cell in cells[2:]:
            kind, _, trait = cell.partition(": ")
            assert cell == "equal" or (kind in ("refused", "unsupported") and trait)
    for wrapper in WRAPPERS:  # every wrapper meets every case
        assert len(hard_cases.cases_for(wrapper)) + sum(
            wrapper in case.refused or wrapper in case.unsupported for case in CASES
        ) == len(CASES)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_every_wrapper_suite_iterates_the_registry(wrapper):
    """The suite named in WRAPPERS (with the files of its folder) names the wrapper
    and asks the registry for the cases it must train and those it must refuse."""
    suite = ROOT / WRAPPERS[wrapper][1]
    files = [suite] if suite.parent.name == "tests" else suite.parent.glob("*.py")
    text = "".join(path.read_text() for path in files)
    assert f'"{wrapper}"' in text and "cases_for(" in text, wrapper
    if hard_cases.refusals_for(wrapper):
        assert "refusals_for(" in text, wrapper


def test_no_world_size_from_2_to_4_divides_the_data_and_the_lesson_model_is_one():
    for world_size in (2, 3, 4):
        assert NUM_SAMPLES % world_size != 0
    assert LessonTiedFrozenNet is TiedFrozenNet  # notebook 14's name, one class
    assert type(hard_cases.hard_case_model()) is TiedFrozenNet


def test_models_and_data_come_in_both_dtypes_and_seeds_change_the_weights():
    for dtype in (torch.float32, torch.float64):
        X, y = hard_case_data(dtype=dtype)
        assert X.dtype == dtype and int(y.max()) < CLASSES
        for case in CASES:
            model = case.build(dtype)
            assert all(p.dtype == dtype for p in model.parameters()), case.name
            assert model(X).shape == (NUM_SAMPLES, CLASSES)
    first, second = (
        hard_cases.hard_case_model(seed=0),
        hard_cases.hard_case_model(seed=1),
    )
    assert not torch.equal(first.head.weight, second.head.weight)
