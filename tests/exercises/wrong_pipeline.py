"""1F1B orders that learners really write, each wrong in one way (16's exercise)."""


def _edges(stage, num_stages):
    return stage == 0, stage == num_stages - 1


def one_after_the_other(stage, num_stages, num_microbatches):
    """1F1B with the steady state's send and receive posted one after the other:
    neighbours both send first and wait for each other (deadlock on gloo)."""
    first, last = _edges(stage, num_stages)
    warmup = min(num_stages - stage - 1, num_microbatches)
    remaining = num_microbatches - warmup
    actions = []
    for i in range(warmup):
        actions += [] if first else [("recv_activation", i)]
        actions += [("forward", i), ("send_activation", i)]
    for k in range(remaining):
        f = warmup + k
        actions += [] if first else [("recv_activation", f)]
        actions += [("forward", f)]
        actions += [] if last else [("send_activation", f), ("recv_gradient", k)]
        actions += [("backward", k)]
        actions += [] if first else [("send_gradient", k)]
    for k in range(remaining, num_microbatches):
        actions += [("recv_gradient", k), ("backward", k)]
        actions += [] if first else [("send_gradient", k)]
    return actions


def gpipe_order(stage, num_stages, num_microbatches):
    """Every forward, then every backward: correct, but it holds m micro-batches."""
    first, last = _edges(stage, num_stages)
    actions = []
    for i in range(num_microbatches):
        actions += [] if first else [("recv_activation", i)]
        actions += [("forward", i)] + ([] if last else [("send_activation", i)])
    for i in range(num_microbatches):
        actions += [] if last else [("recv_gradient", i)]
        actions += [("backward", i)] + ([] if first else [("send_gradient", i)])
    return actions


def _paired_1f1b(stage, num_stages, num_microbatches, cooldown_order, last_send):
    first, last = _edges(stage, num_stages)
    warmup = min(num_stages - stage - 1, num_microbatches)
    remaining = num_microbatches - warmup
    actions = []
    for i in range(warmup):
        actions += [] if first else [("recv_activation", i)]
        actions += [("forward", i), ("send_activation", i)]
    if remaining and not first:
        actions += [("recv_activation", warmup)]
    for k in range(remaining):
        f = warmup + k
        actions += [("forward", f)]
        if not last:
            actions += [[("send_activation", f), ("recv_gradient", k)]]
        actions += [("backward", k)]
        if not first and k < remaining - 1:
            actions += [[("send_gradient", k), ("recv_activation", f + 1)]]
        elif not first and last_send:
            actions += [("send_gradient", k)]
    for k in cooldown_order(range(remaining, num_microbatches)):
        actions += [("recv_gradient", k), ("backward", k)]
        actions += [] if first else [("send_gradient", k)]
    return actions


def forgets_the_last_send(stage, num_stages, num_microbatches):
    """The steady state's last gradient is never sent (only pairs are written)."""
    return _paired_1f1b(stage, num_stages, num_microbatches, list, last_send=False)


def cooldown_in_reverse(stage, num_stages, num_microbatches):
    """The cool-down's backwards newest first ("backward goes in reverse")."""
    return _paired_1f1b(stage, num_stages, num_microbatches, reversed, last_send=True)


def no_warmup(stage, num_stages, num_microbatches):
    """Forward and backward of each micro-batch in turn on every stage: correct and
    deadlock-free, but one micro-batch at a time through the whole pipeline."""
    first, last = _edges(stage, num_stages)
    actions = []
    for i in range(num_microbatches):
        actions += [] if first else [("recv_activation", i)]
        actions += [("forward", i)] + ([] if last else [("send_activation", i)])
        actions += [] if last else [("recv_gradient", i)]
        actions += [("backward", i)] + ([] if first else [("send_gradient", i)])
    return actions


def last_stage_sends_activations(stage, num_stages, num_microbatches):
    """Every stage sends its activation on, the last one too."""
    actions = gpipe_order(stage, num_stages, num_microbatches)
    if stage == num_stages - 1:
        actions.insert(actions.index(("forward", 0)) + 1, ("send_activation", 0))
    return actions


def _paired_with_warmup(stage, num_stages, num_microbatches, warmup):
    """Megatron-LM's paired 1F1B with ``warmup`` forwards before the first backward."""
    first, last = _edges(stage, num_stages)
    warmup = min(warmup, num_microbatches)
    remaining = num_microbatches - warmup
    actions = []
    for i in range(warmup):
        actions += [] if first else [("recv_activation", i)]
        actions += [("forward", i)] + ([] if last else [("send_activation", i)])
    if remaining and not first:
        actions += [("recv_activation", warmup)]
    for k in range(remaining):
        f = warmup + k
        actions += [("forward", f)]
        if not last:
            actions += [[("send_activation", f), ("recv_gradient", k)]]
        actions += [("backward", k)]
        if not first and k < remaining - 1:
            actions += [[("send_gradient", k), ("recv_activation", f + 1)]]
        elif not first:
            actions += [("send_gradient", k)]
    for k in range(remaining, num_microbatches):
        actions += [] if last else [("recv_gradient", k)]
        actions += [("backward", k)] + ([] if first else [("send_gradient", k)])
    return actions


def one_warmup_forward_too_many(stage, num_stages, num_microbatches):
    """p - s warm-up forwards instead of p - s - 1: an off-by-one in the warm-up."""
    return _paired_with_warmup(
        stage, num_stages, num_microbatches, warmup=num_stages - stage
    )


def same_warmup_on_every_stage(stage, num_stages, num_microbatches):
    """Every stage warms up with p - 1 forwards, as if it were the first stage."""
    return _paired_with_warmup(
        stage, num_stages, num_microbatches, warmup=num_stages - 1
    )


# Correct 1F1B orders written another way: the checker must accept them.


def even_stages_send_first(stage, num_stages, num_microbatches):
    """Megatron-LM's other way to avoid the deadlock (``_p2p_ops``): no pairs
    posted together, but even stages send first and odd stages receive first, so
    one of two neighbours always receives while the other sends."""
    actions = []
    for action in _paired_with_warmup(
        stage, num_stages, num_microbatches, warmup=num_stages - stage - 1
    ):
        if isinstance(action, list):
            sends_first = stage % 2 == 0
            action = sorted(action, key=lambda pair: pair[0].startswith("send"))
            actions += action[::-1] if sends_first else action
        else:
            actions.append(action)
    return actions
