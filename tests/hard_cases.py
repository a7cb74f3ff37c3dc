"""The hard cases: one registry that every "equal to one process" suite iterates.

Each :class:`HardCase` is a model (in (N, 6) -> logits (N, 3)) with its traits
(:data:`TRAITS`: a tied weight, a frozen parameter, a layer forward never calls, a
buffer, counts no world size from 2 to 4 divides, fewer parameters than ranks, a
layer the first forward skips, a parameter no forward reads, a layer some ranks'
batches skip, ...), and for each wrapper of :data:`WRAPPERS` whether it must train
like one process (``equal``), must refuse the case with a one-line error that names
one of its traits (``refused``), or can neither take it nor tell in time
(``unsupported``: it hangs or differs; PyTorch's FSDP2 hangs the same way). A
suite takes ``cases_for(wrapper)`` and ``refusals_for(wrapper)``; nothing is
special-cased by name; :func:`registry_table` writes the table. The data: 41
samples (a prime: no global batch of 2-4 ranks divides it), float32 and float64.
Ranks may build the model from their own seed (``seed + rank``): a wrapper must
then make them agree, or refuse."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch import nn

from multigpu.core.compare import max_parameter_difference
from multigpu.core.models import TiedFrozenNet
from multigpu.pipeline import Scale

IN_FEATURES = 6
CLASSES = 3
NUM_SAMPLES = 41  # prime: no global batch of 2-4 ranks divides it
DTYPES = (torch.float32, torch.float64)
# World sizes for the wrappers that keep every weight whole on every rank (08's
# all-reduce SGD, Horovod's API, DDP by hand): a parameter count cannot be
# indivisible for them, 41 samples share unevenly on 2 ranks, and 4 ranks get an
# empty share of a global batch of 3. The sharding wrappers take 2, 3 and 4.
REPLICATED_WORLD_SIZES = (2, 4)

TIED = "tied"
FROZEN = "frozen"
UNUSED = "unused"
BUFFER = "buffer"
INDIVISIBLE = "indivisible"
FEW = "few"
OUTSIDE_LINEAR = "outside linear"
LATE = "late"
UNREAD = "unread"
SOMETIMES = "sometimes"
NOT_BLOCK = "not a block"
NOT_SEQUENTIAL = "not sequential"
TRAITS = {
    TIED: "one weight tensor shared by two modules",
    FROZEN: "a parameter with requires_grad=False",
    UNUSED: "a module that no forward calls",
    BUFFER: "a buffer the forward reads",
    INDIVISIBLE: "parameter counts that no world size from 2 to 4 divides",
    FEW: "fewer parameters than 3 or 4 ranks",
    OUTSIDE_LINEAR: "parameters held by the model itself, outside any nn.Linear",
    LATE: "a module the first forward skips and every later one runs (the "
    "forward counts its calls: a step split into micro-batches differs)",
    UNREAD: "a parameter no forward reads, inside a module that runs",
    SOMETIMES: "a module only the samples with x[:, 0] > 1.5 run: some ranks' "
    "batches skip it (and, in the configurations of tests/zero, a whole step's)",
    NOT_BLOCK: "not a transformer block (ln1, attn, ln2, mlp)",
    NOT_SEQUENTIAL: "no nn.Sequential form (the forward is not a chain of modules)",
}
# Traits that leave a parameter without a gradient in some step: DDP needs
# find_unused_parameters=True for them.
NO_GRADIENT_SOMETIMES = frozenset({UNUSED, LATE, UNREAD, SOMETIMES})

# wrapper: (what it is, the suite that iterates the registry for it)
WRAPPERS = {
    "allreduce_sgd": ("08: SGD by hand", "tests/test_allreduce_sgd.py"),
    "horovod_api": (
        "12: hvd.DistributedOptimizer",
        "tests/horovod_api/test_optimizer.py",
    ),
    "ddp": ("09: torch DDP", "tests/ddp/conftest.py"),
    "miniddp": ("10: the ladder and torch DDP", "tests/miniddp/test_loop.py"),
    "zero": ("13: DDP, ZeRO-1, ZeRO-2 by hand", "tests/zero/test_hard_cases.py"),
    "zero-3": ("13: ZeRO-3 by hand", "tests/zero/test_hard_cases.py"),
    "fsdp": ("14: FSDP by hand", "tests/fsdp/conftest.py"),
    "fsdp2": ("13, 14b: torch fully_shard", "tests/fsdp2/conftest.py"),
    "tensor_parallel": (
        "15: TensorParallelBlock",
        "tests/tensor_parallel/test_hard_cases.py",
    ),
    "pipeline": ("16: GPipe and 1F1B by hand", "tests/pipeline/test_step.py"),
    "expert_parallel": (
        "18: EP x DP by hand",
        "tests/expert_parallel/test_hard_cases.py",
    ),
    "syncbn": ("09b: convert_sync_batchnorm", "tests/test_syncbn.py"),
}


@dataclass(frozen=True)
class Refusal:
    """A wrapper's refusal of a case: the trait it names, the words of its one-line
    error that a test looks for, and when it refuses: ``"start"`` before anything
    is sent, ``"step"`` in the step where the ranks first differ (every rank
    alike, so that none is left waiting)."""

    trait: str
    words: str
    when: str = "start"


@dataclass(frozen=True, eq=False)  # one object per case: hashable, by identity
class HardCase:
    """A model of the registry. ``build(dtype, seed)`` makes it; ``still``: the
    parameters training never moves (frozen, never used, never read); ``constant``:
    the buffers it never changes; ``tied``: pairs of state_dict keys that are one
    tensor; ``sequential(dtype, seed)``: its layers as an nn.Sequential, for the
    pipeline; ``refused`` and ``unsupported``, by wrapper: what it cannot take
    (every other wrapper: equal)."""

    name: str
    build: Callable[..., nn.Module]
    traits: frozenset[str]
    still: tuple[str, ...] = ()
    constant: tuple[str, ...] = ()
    tied: tuple[tuple[str, str], ...] = ()
    sequential: Callable[..., nn.Sequential] | None = None
    refused: Mapping[str, Refusal] = field(default_factory=dict)
    unsupported: Mapping[str, str] = field(default_factory=dict)

    def verdict(self, wrapper: str) -> str:
        """ "equal", "refused: <trait>" or "unsupported: <trait>"."""
        if wrapper not in WRAPPERS:
            raise KeyError(f"{wrapper!r} is not a wrapper of the registry")
        if wrapper in self.refused:
            return f"refused: {self.refused[wrapper].trait}"
        if wrapper in self.unsupported:
            return f"unsupported: {self.unsupported[wrapper]}"
        return "equal"

    @property
    def find_unused_parameters(self) -> bool:
        """Whether DDP needs find_unused_parameters=True: some step leaves a
        parameter without a gradient."""
        return bool(self.traits & NO_GRADIENT_SOMETIMES)

    @property
    def one_forward_per_step(self) -> bool:
        """False when the forward counts its calls: a step split into k
        micro-batches (accumulation) then differs from one process by design."""
        return LATE not in self.traits


class TinyNet(nn.Module):
    """A weight and a bias of one number each: fewer parameters than 3 or 4 ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([0.3]))
        self.bias = nn.Parameter(torch.tensor([-0.1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logit = x[:, :1] * self.weight + self.bias  # (N, 1)
        return torch.cat([logit, -logit, torch.zeros_like(logit)], dim=1)  # (N, 3)


class LateUnitNet(nn.Module):
    """in (N, 6) -> logits (N, 3); ``late`` runs from the second forward on: a
    module (so an FSDP unit) that the first forward does not use and every later
    one does. The buffer ``calls`` counts the forwards."""

    def __init__(self, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(IN_FEATURES, hidden)
        self.late = nn.Linear(hidden, hidden)  # not used by the first forward
        self.head = nn.Linear(hidden, CLASSES)
        self.register_buffer("calls", torch.tensor(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        if self.calls > 0:
            h = h + torch.tanh(self.late(h))
        self.calls += 1
        return self.head(h)


class SpareBlock(nn.Module):
    """(N, h) -> (N, h) through ``linear``; ``spare`` is never read."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.spare = nn.Linear(hidden, hidden)  # no forward reads it

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(h))


class UnreadParameterNet(nn.Module):
    """in (N, 6) -> logits (N, 3) through embed, block, head: ``block`` (one module,
    so one FSDP unit, that every forward uses) holds ``block.spare``, which no
    forward reads, so its gradient stays None."""

    def __init__(self, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(IN_FEATURES, hidden)
        self.block = SpareBlock(hidden)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(torch.tanh(self.embed(x))))


class SometimesUnusedNet(nn.Module):
    """in (N, 6) -> logits (N, 3); ``extra`` is used only by samples whose first
    feature exceeds 1.5, so on some ranks' batches it gets no gradient (None) and
    on others it does: per sample the same function as on one process."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(IN_FEATURES, CLASSES)
        self.extra = nn.Linear(IN_FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(x)
        chosen = x[:, :1] > 1.5
        if chosen.any():  # the branch decides whether `extra` is in the graph
            logits = logits + self.extra(x) * chosen
        return logits


class WithUnused(nn.Module):
    """tanh, plus a parameter that forward never reads."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


def hard_case_model(dtype: torch.dtype = torch.float64, seed: int = 0) -> TiedFrozenNet:
    """A fresh TiedFrozenNet (multigpu.core.models, notebook 14's) from ``seed``."""
    torch.manual_seed(seed)
    return TiedFrozenNet().to(dtype)


def tiny_model(dtype: torch.dtype = torch.float64, seed: int = 0) -> TinyNet:
    """A fresh TinyNet in ``dtype`` (its weights do not depend on ``seed``)."""
    torch.manual_seed(seed)
    return TinyNet().to(dtype)


def late_unit_model(dtype: torch.dtype = torch.float64, seed: int = 0) -> LateUnitNet:
    """A fresh LateUnitNet from ``seed``, in ``dtype`` (``calls`` at 0)."""
    torch.manual_seed(seed)
    return LateUnitNet().to(dtype)


def unread_parameter_model(
    dtype: torch.dtype = torch.float64, seed: int = 0
) -> UnreadParameterNet:
    """A fresh UnreadParameterNet from ``seed``, in ``dtype``."""
    torch.manual_seed(seed)
    return UnreadParameterNet().to(dtype)


def sometimes_unused_model(
    dtype: torch.dtype = torch.float64, seed: int = 0
) -> SometimesUnusedNet:
    """A fresh SometimesUnusedNet from ``seed``, in ``dtype``."""
    torch.manual_seed(seed)
    return SometimesUnusedNet().to(dtype)


def hard_case_sequential(
    dtype: torch.dtype = torch.float64, seed: int = 0, tied_across: bool = False
) -> nn.Sequential:
    """TiedFrozenNet's layers as a pipeline takes them: embed, tanh | frozen, tanh
    (+ an unused parameter) | encode, decode (tied) | scale (a buffer), head: 2 + 2
    + 2 + 2 modules, so that on 2 or 4 stages the tied pair falls in one stage;
    ``tied_across`` moves encode to stage 0 of 2."""
    net = hard_case_model(dtype, seed)
    middle = [net.frozen, WithUnused().to(dtype), net.encode, net.decode]
    if tied_across:
        middle = [net.frozen, net.encode, WithUnused().to(dtype), net.decode]
    return nn.Sequential(net.embed, nn.Tanh(), *middle, Scale().to(dtype), net.head)


def unread_parameter_sequential(
    dtype: torch.dtype = torch.float64, seed: int = 0
) -> nn.Sequential:
    """UnreadParameterNet as embed, tanh, block, head: the same function."""
    net = unread_parameter_model(dtype, seed)
    return nn.Sequential(net.embed, nn.Tanh(), net.block, net.head)


NOT_A_BLOCK = "TensorParallelBlock splits a transformer block"
NOT_A_SEQUENTIAL = "split_sequential needs an nn.Sequential, got {name}"
ZERO_SKIPS = "got a gradient in some steps and none in others"
ZERO3_DIFFERS = "a layer that some ranks' batches run and others' skip cannot be"
FSDP_DIFFERS = "a unit that some ranks' batches run and others' skip cannot be"
CASES = (
    HardCase(
        "TiedFrozenNet",
        hard_case_model,
        frozenset({TIED, FROZEN, UNUSED, BUFFER, INDIVISIBLE, NOT_BLOCK}),
        still=("frozen.weight", "frozen.bias", "unused.weight", "unused.bias"),
        constant=("scale",),
        tied=(("encode.weight", "decode.weight"),),
        sequential=hard_case_sequential,
        refused={
            "zero-3": Refusal(TIED, "cannot shard a weight tied between two layers"),
            "tensor_parallel": Refusal(FROZEN, "has a frozen parameter, frozen.weight"),
        },
    ),
    HardCase(
        "TinyNet",
        tiny_model,
        frozenset({FEW, OUTSIDE_LINEAR, NOT_BLOCK, NOT_SEQUENTIAL}),
        refused={
            "zero-3": Refusal(OUTSIDE_LINEAR, "it shards nn.Linear layers only"),
            "tensor_parallel": Refusal(NOT_BLOCK, NOT_A_BLOCK),
            "pipeline": Refusal(
                NOT_SEQUENTIAL, NOT_A_SEQUENTIAL.format(name="TinyNet")
            ),
        },
    ),
    HardCase(
        "LateUnitNet",
        late_unit_model,
        frozenset({LATE, BUFFER, NOT_BLOCK, NOT_SEQUENTIAL}),
        refused={
            "zero": Refusal(LATE, ZERO_SKIPS),
            "tensor_parallel": Refusal(NOT_BLOCK, NOT_A_BLOCK),
            "pipeline": Refusal(
                NOT_SEQUENTIAL, NOT_A_SEQUENTIAL.format(name="LateUnitNet")
            ),
        },
    ),
    HardCase(
        "UnreadParameterNet",
        unread_parameter_model,
        frozenset({UNREAD, NOT_BLOCK}),
        still=("block.spare.weight", "block.spare.bias"),
        sequential=unread_parameter_sequential,
        refused={"tensor_parallel": Refusal(NOT_BLOCK, NOT_A_BLOCK)},
    ),
    HardCase(
        "SometimesUnusedNet",
        sometimes_unused_model,
        frozenset({SOMETIMES, NOT_BLOCK, NOT_SEQUENTIAL}),
        refused={
            "zero": Refusal(SOMETIMES, ZERO_SKIPS),
            "zero-3": Refusal(SOMETIMES, ZERO3_DIFFERS, when="step"),
            "fsdp": Refusal(SOMETIMES, FSDP_DIFFERS, when="step"),
            "tensor_parallel": Refusal(NOT_BLOCK, NOT_A_BLOCK),
            "pipeline": Refusal(
                NOT_SEQUENTIAL, NOT_A_SEQUENTIAL.format(name="SometimesUnusedNet")
            ),
        },
        unsupported={  # a unit gathered on some ranks only: PyTorch's waits forever
            "fsdp2": SOMETIMES,
        },
    ),
)
BY_NAME = MappingProxyType({case.name: case for case in CASES})


def case_id(value: object) -> str:
    """A pytest id: a case by its name, a refusal by its trait."""
    if isinstance(value, HardCase):
        return value.name
    return value.trait if isinstance(value, Refusal) else str(value)


def cases_for(wrapper: str) -> list[HardCase]:
    """The cases ``wrapper`` must train like one process, in registry order."""
    return [case for case in CASES if case.verdict(wrapper) == "equal"]


def refusals_for(wrapper: str) -> list[tuple[HardCase, Refusal]]:
    """The cases ``wrapper`` must refuse, each with its :class:`Refusal`."""
    return [(case, case.refused[wrapper]) for case in CASES if wrapper in case.refused]


def registry_table() -> str:
    """The registry as a Markdown table: model (its parameter counts, a tied weight
    once) x wrapper -> verdict."""
    rows = ["| model | parameters (trainable) | " + " | ".join(WRAPPERS) + " |"]
    rows.append("|---" * (len(WRAPPERS) + 2) + "|")
    for case in CASES:
        model = case.build()
        total = sum(p.numel() for p in model.parameters())
        cells = [f"{total} ({trainable_numel(model)})"]
        cells += [case.verdict(wrapper) for wrapper in WRAPPERS]
        rows.append(f"| {case.name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def hard_case_data(
    num_samples: int = NUM_SAMPLES, dtype: torch.dtype = torch.float64, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """X (num_samples, 6) of ``dtype`` and labels y (num_samples,) in 0..2."""
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(num_samples, IN_FEATURES, generator=generator).to(dtype)
    y = torch.randint(0, CLASSES, (num_samples,), generator=generator)
    return X, y


def trainable_numel(model: nn.Module) -> int:
    """Numbers the optimizer updates (a tied weight counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def assert_kept(
    case: HardCase,
    start: Mapping[str, torch.Tensor],
    parameters: Mapping[str, torch.Tensor],
    where: object = "",
) -> None:
    """``parameters`` (a state_dict after training) kept, bit for bit, what ``case``
    says never moves, and its tied pairs equal. A result that names each parameter
    once (FSDP2's) has no buffers and no second key of a tied pair: those are
    checked where present."""
    for key in case.still:
        assert torch.equal(parameters[key], start[key]), (case.name, key, where)
    for key in case.constant:
        if key in parameters:
            assert torch.equal(parameters[key], start[key]), (case.name, key, where)
    for first, second in case.tied:
        if second in parameters:
            assert torch.equal(parameters[first], parameters[second]), (case, where)


def assert_ranks_equal_one_process(
    case: HardCase,
    start: Mapping[str, torch.Tensor],
    results: list,
    reference,
    tolerance: float,
    where: object = "",
) -> None:
    """Every rank's result (a History) is within ``tolerance`` of one process's,
    the ranks are identical bit for bit, and each kept what ``case`` says never
    moves (:func:`assert_kept`)."""
    for result in results:
        difference = max_parameter_difference(result.parameters, reference.parameters)
        assert difference < tolerance, (where, difference)
        for key, tensor in results[0].parameters.items():  # ranks identical
            assert torch.equal(result.parameters[key], tensor), (where, key)
        assert_kept(case, start, result.parameters, where)  # frozen, tied, ...


def never_gradient_numel(case: HardCase, model: nn.Module) -> int:
    """The trainable numbers of ``model`` that never get a gradient (unused, never
    read): Adam keeps no state for them in one process."""
    return sum(
        p.numel()
        for name, p in model.named_parameters()
        if p.requires_grad and name in case.still
    )


def refused_rank(rank: int, world_size: int, function, *arguments):
    """``function(rank, world_size, *arguments)``; an error it raises comes back as
    {"refused": its type and message} instead (every rank must refuse alike, so
    that the launch goes on)."""
    try:
        return {"result": function(rank, world_size, *arguments)}
    except (RuntimeError, TypeError, ValueError) as error:
        return {"refused": f"{type(error).__name__}: {error}"}
