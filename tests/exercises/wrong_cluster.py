"""Answers to notebook 20's exercises: the references, correct ones written
otherwise, and the mistakes learners make."""

# --- collectives_per_step(blocks, dp, tp) of the MLP blocks under FSDP2 x TP


def reference_counts(blocks, dp, tp):
    counts = {}
    if dp > 1:
        counts["all-gather (FSDP)"] = 2 * blocks
        counts["reduce-scatter (FSDP)"] = blocks
    if tp > 1:
        counts["all-reduce (TP)"] = 2 * blocks - 1
    return counts


def counts_with_zeros(blocks, dp, tp):  # correct: zero entries are ignored
    return {
        "all-gather (FSDP)": 2 * blocks * (dp > 1),
        "reduce-scatter (FSDP)": blocks * (dp > 1),
        "all-reduce (TP)": (2 * blocks - 1) * (tp > 1),
        "all-gather (TP)": 0,
    }


def forward_gathers_only(blocks, dp, tp):
    counts = reference_counts(blocks, dp, tp)
    if dp > 1:
        counts["all-gather (FSDP)"] = blocks
    return counts


def root_as_a_unit(blocks, dp, tp):
    counts = reference_counts(blocks, dp, tp)
    if dp > 1:
        counts["all-gather (FSDP)"] += 1
        counts["reduce-scatter (FSDP)"] += 1
    return counts


def fsdp_on_one_rank(blocks, dp, tp):
    counts = reference_counts(blocks, 2, tp)
    return counts


def first_block_input_gradient(blocks, dp, tp):
    counts = reference_counts(blocks, dp, tp)
    if tp > 1:
        counts["all-reduce (TP)"] = 2 * blocks
    return counts


def megatron_four_per_block(blocks, dp, tp):
    counts = reference_counts(blocks, dp, tp)
    if tp > 1:
        counts["all-reduce (TP)"] = 4 * blocks
    return counts


def tp_on_one_rank(blocks, dp, tp):
    return reference_counts(blocks, dp, 2)


def not_a_dict(blocks, dp, tp):
    return [2 * blocks, blocks]


# --- valid_grids(shape, gpus, global_batch, seq_len, devices_per_node)


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def reference_grids(shape, gpus, global_batch, seq_len, devices_per_node, **rules):
    grids = []
    for tp in _divisors(gpus):
        for pp in _divisors(gpus // tp):
            for cp in _divisors(gpus // (tp * pp)):
                dp = gpus // (tp * pp * cp)
                ok = (
                    (rules.get("node", True) and tp <= devices_per_node or
                     not rules.get("node", True))
                    and (not rules.get("heads", True) or shape.kv_heads % tp == 0)
                    and (not rules.get("layers", True) or shape.layers % pp == 0)
                    and cp <= 8
                    and seq_len % cp == 0
                    and global_batch % dp == 0
                    and (not rules.get("micro", True) or pp == 1
                         or global_batch // dp >= pp)
                )  # fmt: skip
                if ok:
                    grids.append((dp, tp, pp, cp))
    return grids


def grids_by_product(shape, gpus, global_batch, seq_len, devices_per_node):
    import itertools

    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    found = []
    for cp, pp, tp, dp in itertools.product(divisors, repeat=4):
        if dp * tp * pp * cp != gpus or tp > devices_per_node or cp > 8:
            continue
        if shape.kv_heads % tp or shape.layers % pp or global_batch % dp:
            continue
        if seq_len % cp or (pp > 1 and global_batch // dp < pp):
            continue
        found.append([dp, tp, pp, cp])
    return found  # lists, in another order: still correct


def tp_across_nodes(shape, gpus, global_batch, seq_len, devices_per_node):
    return reference_grids(
        shape, gpus, global_batch, seq_len, devices_per_node, node=False
    )


def heads_not_checked(shape, gpus, global_batch, seq_len, devices_per_node):
    return reference_grids(
        shape, gpus, global_batch, seq_len, devices_per_node, heads=False
    )


def layers_not_checked(shape, gpus, global_batch, seq_len, devices_per_node):
    return reference_grids(
        shape, gpus, global_batch, seq_len, devices_per_node, layers=False
    )


def too_few_micro_batches(shape, gpus, global_batch, seq_len, devices_per_node):
    return reference_grids(
        shape, gpus, global_batch, seq_len, devices_per_node, micro=False
    )


def product_not_checked(shape, gpus, global_batch, seq_len, devices_per_node):
    return reference_grids(shape, gpus, global_batch, seq_len, devices_per_node) + [
        (1, 1, 1, 1)
    ]


def missing_one(shape, gpus, global_batch, seq_len, devices_per_node):
    return reference_grids(shape, gpus, global_batch, seq_len, devices_per_node)[1:]


def borrows_the_planner(shape, gpus, global_batch, seq_len, devices_per_node):
    from multigpu.cluster.planner import valid_grids

    return valid_grids(shape, gpus, global_batch, seq_len, devices_per_node)
