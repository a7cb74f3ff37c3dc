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
