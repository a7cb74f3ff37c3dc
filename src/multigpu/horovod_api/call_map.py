"""Each Horovod call, what PyTorch writes instead, and what this stand-in does (12).

**How it maps** (:data:`CALL_MAP` holds the same as rows for a table):

- ``horovodrun -np 4 python train.py``: ``torchrun --nproc-per-node=4 train.py``;
- ``hvd.init()``: ``dist.init_process_group`` from torchrun's environment
  (:func:`multigpu.runtime.rank.setup`); a process group that exists already is used;
- ``hvd.rank()``, ``hvd.size()``: ``dist.get_rank()``, ``dist.get_world_size()``;
  ``hvd.local_rank()``, ``hvd.local_size()``: torchrun's ``LOCAL_RANK`` and
  ``LOCAL_WORLD_SIZE`` environment variables;
- ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)``: ``dist.broadcast``
  of every tensor, what DDP does when it is built;
- ``hvd.broadcast_optimizer_state(optimizer, root_rank=0)``: the root's
  ``optimizer.state_dict()`` sent with ``dist.broadcast_object_list``;
- ``hvd.DistributedOptimizer``: ``DistributedDataParallel``. Horovod hooks the
  optimizer's parameters, DDP wraps the model; both start all-reducing gradients
  while backward is still running;
- ``hvd.allreduce(t)``: ``dist.all_reduce(t)`` (a sum), then divide by the size;
- Horovod's *tensor fusion* (``HOROVOD_FUSION_THRESHOLD``: 128 MB by default, 64 MB
  before 0.21): DDP's buckets (``bucket_cap_mb``, 25 MB by default);
- ``backward_passes_per_step=k``: ``k - 1`` backward passes inside DDP's
  ``no_sync()``.
"""

# One row per Horovod call: Horovod's, what PyTorch writes instead, what this module
# does. For a table in the notebook.
CALL_MAP: list[dict[str, str]] = [
    {
        "horovod": "horovodrun -np 4 python train.py",
        "torch.distributed": "torchrun --nproc-per-node=4 train.py",
        "here": "torchrun, or launch.spawn in a notebook, starts the ranks",
    },
    {
        "horovod": "hvd.init()",
        "torch.distributed": "dist.init_process_group(backend)",
        "here": "init(): ddp.setup() under torchrun; an existing group is used",
    },
    {
        "horovod": "hvd.rank(), hvd.size()",
        "torch.distributed": "dist.get_rank(), dist.get_world_size()",
        "here": "rank(), size()",
    },
    {
        "horovod": "hvd.local_rank(), hvd.local_size()",
        "torch.distributed": "the LOCAL_RANK and LOCAL_WORLD_SIZE environment "
        "variables (set by torchrun)",
        "here": "local_rank(), local_size(): those, else rank() and size()",
    },
    {
        "horovod": "hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
        "torch.distributed": "dist.broadcast(t, src=0) for every tensor (what DDP "
        "does when it is built)",
        "here": "broadcast_parameters(): one async broadcast per tensor, then wait",
    },
    {
        "horovod": "hvd.broadcast_optimizer_state(optimizer, root_rank=0)",
        "torch.distributed": "dist.broadcast_object_list([optimizer.state_dict()], "
        "src=0), then load_state_dict",
        "here": "broadcast_optimizer_state(): the root's whole state_dict",
    },
    {
        "horovod": "hvd.DistributedOptimizer(optimizer, "
        "named_parameters=model.named_parameters())",
        "torch.distributed": "DistributedDataParallel(model): DDP wraps the model, "
        "Horovod hooks the optimizer's parameters",
        "here": "DistributedOptimizer: gradient hooks fill fusion buffers, each sent "
        "with dist.all_reduce(async_op=True)",
    },
    {
        "horovod": "hvd.allreduce(t, op=hvd.Average)",
        "torch.distributed": "dist.all_reduce(t) (a sum), then t / world_size",
        "here": "allreduce() (a new tensor), allreduce_() (in place)",
    },
    {
        "horovod": "tensor fusion: HOROVOD_FUSION_THRESHOLD (128 MB; 64 MB before "
        "0.21), HOROVOD_CYCLE_TIME (1 ms)",
        "torch.distributed": "DDP's buckets: bucket_cap_mb (25 MB)",
        "here": "DistributedOptimizer(fusion_threshold_mb=128): by size only, no cycle",
    },
    {
        "horovod": "hvd.DistributedOptimizer(..., backward_passes_per_step=k)",
        "torch.distributed": "k - 1 backward passes inside model.no_sync()",
        "here": "backward_passes_per_step=k: all-reduce after every k-th backward",
    },
    {
        "horovod": "hvd.shutdown()",
        "torch.distributed": "dist.destroy_process_group()",
        "here": "shutdown(): destroys the group only if init() created it",
    },
]
