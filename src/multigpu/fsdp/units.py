"""Which modules form an FSDP unit, and the flat buffer each unit shards (14).

A unit is a group of modules whose trainable parameters are flattened into one
buffer, all-gathered together and reduce-scattered together: FSDP2's
``fully_shard(module)`` makes one such group. :func:`plan_units` chooses them:
each direct child of the model that has trainable parameters, children that share
a parameter (a tied weight) merged into one unit, and the model's own parameters
(those outside every child) as the root unit. :class:`FlatUnit` holds one unit's
shard (this rank's chunk, as ``tensor_split`` cuts it, like 13's flat buffers) and
the buffer its parameters are gathered into, and ``pieces``: this rank's part of
each parameter, views of the shard that the optimizer updates, so that a parameter
no forward read keeps ``grad`` None (FSDP1's ``use_orig_params`` views; FSDP2
shards each parameter). Frozen parameters are not sharded: they stay whole on
every rank, outside the buffer and the optimizer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from multigpu.zero import shard_of, trainable_parameters

UnitPlan = list[tuple[str, ...]]  # each unit: the names of its modules ("" the root)


def _owned(model: nn.Module, name: str) -> list[tuple[str, nn.Parameter]]:
    """(qualified name, parameter) of the trainable parameters module ``name`` owns:
    the root owns only its direct ones, any other module all below it."""
    module = model.get_submodule(name)
    found = module.named_parameters(recurse=bool(name), remove_duplicate=False)
    prefix = f"{name}." if name else ""
    return [(prefix + attr, p) for attr, p in found if p.requires_grad]


def plan_units(model: nn.Module, units: Sequence[Sequence[str] | str] | None = None):
    """The units of ``model``: tuples of module names. By default each child with
    trainable parameters, children that share one merged, and ``""`` (the root) for
    the model's own parameters. Given ``units`` are checked: every trainable
    parameter in exactly one unit, else ValueError naming it (14)."""
    trainable_parameters(model)  # at least one, and one dtype
    if units is None:
        plan: UnitPlan = []
        owners: dict[int, int] = {}  # id(parameter) -> index in plan
        for name, _ in model.named_children():
            ids = {id(p) for _, p in _owned(model, name)}
            if not ids:
                continue
            shared = sorted({owners[i] for i in ids if i in owners})
            if shared:  # a tied weight: join the unit that has it
                index = shared[0]
                plan[index] = (*plan[index], name)
            else:
                index = len(plan)
                plan.append((name,))
            for i in ids:
                owners[i] = index
        if _owned(model, ""):
            plan.insert(0, ("",))
    else:
        plan = [(u,) if isinstance(u, str) else tuple(u) for u in units]
    check_units(model, plan)
    return plan


def check_units(model: nn.Module, plan: UnitPlan) -> None:
    """Raise ValueError, naming the case, unless every trainable parameter of
    ``model`` is in exactly one unit of ``plan`` (14)."""
    modules = dict(model.named_modules())
    unit_of: dict[int, tuple[int, str]] = {}
    for index, names in enumerate(plan):
        for name in names:
            if name not in modules:
                raise ValueError(
                    f"Unit {'+'.join(names)} names the module {name!r}, which "
                    f"{type(model).__name__} does not have. Use names from "
                    "model.named_modules(), or '' for the model itself."
                )
            for qualified, p in _owned(model, name):
                other = unit_of.setdefault(id(p), (index, qualified))
                if other[0] != index:
                    raise ValueError(
                        f"FSDP by hand cannot put one parameter in two units: "
                        f"{other[1]} (unit {'+'.join(plan[other[0]]) or 'root'}) is "
                        f"{qualified} (unit {'+'.join(names) or 'root'}), a weight "
                        "tied or nested across units. Put the modules that share it "
                        "into one unit, e.g. units=[..., ('encode', 'decode')], or "
                        "use the default plan, which groups them."
                    )
    for qualified, p in model.named_parameters():
        if p.requires_grad and id(p) not in unit_of:
            raise ValueError(
                f"The trainable parameter {qualified} is in no unit, so no rank "
                "would shard or update it. Add its module to a unit, or '' (the "
                "model itself) for parameters outside every unit."
            )


class FlatUnit:
    """One unit: its trainable parameters taken out of their modules into one flat
    buffer of ``numel`` numbers, of which this rank keeps ``shard`` (the master
    weights, an ``nn.Parameter`` in the model's dtype); ``full`` is the buffer the
    whole unit is gathered into, in the compute dtype, its memory freed while the
    unit is not in use. ``pieces``: for each parameter (by its offset in the
    buffer) its name, the slice of ``shard`` that holds this rank's part of it
    (maybe empty) and that part as an ``nn.Parameter`` on the same memory (14)."""

    def __init__(
        self,
        index: int,
        names: tuple[str, ...],
        model: nn.Module,
        rank: int,
        world_size: int,
        compute_dtype: torch.dtype | None,
    ) -> None:
        self.index = index
        self.names = names
        self.name = "+".join(n or "root" for n in names)
        self.modules = [model.get_submodule(n) for n in names]
        offsets: dict[int, int] = {}  # id(parameter) -> offset: a tied weight once
        tensors: list[torch.Tensor] = []
        self.slots: list[tuple[str, nn.Module, str, int, torch.Size]] = []
        self.numel = 0
        for name in names:
            for qualified, p in _owned(model, name):
                if id(p) not in offsets:
                    offsets[id(p)] = self.numel
                    tensors.append(p.detach().reshape(-1))
                    self.numel += p.numel()
                owner, _, attr = qualified.rpartition(".")
                module = model.get_submodule(owner)
                self.slots.append((qualified, module, attr, offsets[id(p)], p.shape))
        flat = torch.cat(tensors)  # (numel,) in the model's dtype
        self.shard = nn.Parameter(shard_of(flat, rank, world_size).clone())
        start = sum(len(chunk) for chunk in flat.tensor_split(world_size)[:rank])
        self.pieces: dict[int, tuple[str, slice, nn.Parameter]] = {}
        for qualified, _, _, offset, shape in self.slots:
            if offset not in self.pieces:  # a tied weight: one piece
                first, last = offset - start, offset + shape.numel() - start
                where = slice(*(min(max(i, 0), len(self.shard)) for i in (first, last)))
                piece = nn.Parameter(self.shard.detach()[where])  # the same memory
                self.pieces[offset] = (qualified, where, piece)
        self.read: set[int] = set()  # offsets of the parameters backward reached
        dtype = compute_dtype or flat.dtype
        self.full = torch.empty(self.numel, dtype=dtype).requires_grad_()
        # The collectives write through a second tensor on the same memory, so
        # autograd's version counter of `full` (saved for backward) stays put.
        self.writer = torch.empty(0, dtype=dtype).set_(
            self.full.untyped_storage(), 0, (self.numel,)
        )
        self.full.untyped_storage().resize_(0)  # nothing gathered yet
        for _, module, attr, _, _ in self.slots:
            if attr in module._parameters:
                del module._parameters[attr]  # the shard is the parameter now
        self.handle = None  # the pending or finished all-gather, None when freed
        self.gathered_at = 0.0  # when its memory last came back (timeline seconds)

    def install(self, watch: bool = False) -> None:
        """Point each module's attribute at its slice of the gathered buffer; with
        ``watch``, backward adds the offset of each slice it reaches to ``read``
        (a parameter that no forward read is never reached)."""
        for _, module, attr, offset, shape in self.slots:
            size = shape.numel()
            view = self.full[offset : offset + size].view(shape)
            if watch and view.requires_grad:
                view.register_hook(lambda grad, at=offset: self.read.add(at))
            setattr(module, attr, view)

    def nbytes(self) -> int:
        """Bytes of the gathered buffer (numel in the compute dtype)."""
        return self.numel * self.full.element_size()
