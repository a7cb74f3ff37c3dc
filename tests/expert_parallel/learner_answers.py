"""Dispatch and combine as learners write them for 18's exercise: one right answer
that differs from the package's, and answers wrong in one named way each. Module
functions, so that the checker's ranks can import them (without pytest)."""

import torch
import torch.distributed as dist

from multigpu.expert_parallel import all_to_all


def _counts(expert_of_row, num_experts, group):
    world_size = dist.get_world_size(group)
    local = num_experts // world_size
    counts = torch.bincount(expert_of_row, minlength=num_experts)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    return world_size, local, counts, received.reshape(world_size, local)


def _learner_dispatch(
    rows, expert_of_row, num_experts, group, *, view="right", sort=True, regroup=True
):
    """A learner's dispatch, right or wrong in one named way."""
    world_size, local, counts, received_counts = _counts(
        expert_of_row, num_experts, group
    )
    order = torch.argsort(expert_of_row, stable=True)
    if not sort:
        order = torch.arange(len(expert_of_row))
    send_sizes = counts.reshape(world_size, local).sum(1).tolist()
    receive_sizes = received_counts.sum(1).tolist()
    if view == "own":  # what it sends, taken for what it receives
        receive_sizes = send_sizes
    received = all_to_all(rows[order], receive_sizes, send_sizes, group)
    tags = torch.arange(local).repeat(world_size)  # the local expert of each block
    tag_of_row = tags.repeat_interleave(received_counts.reshape(-1))
    regroup_order = torch.argsort(tag_of_row, stable=True)
    if not regroup:
        regroup_order = torch.arange(len(received))
    plan = (order, send_sizes, receive_sizes, regroup_order)
    return received[regroup_order], received_counts.sum(0).tolist(), plan


def _learner_combine(expert_outputs, plan, group, *, swap=True, unsort=True):
    order, send_sizes, receive_sizes, regroup_order = plan
    by_source = torch.empty_like(expert_outputs)
    by_source[regroup_order] = expert_outputs
    if swap:
        back = all_to_all(by_source, send_sizes, receive_sizes, group)
    else:  # the forward's sizes again
        back = all_to_all(by_source, receive_sizes, send_sizes, group)
    if not unsort:
        return back
    rows = torch.empty_like(back)
    rows[order] = back
    return rows


def right_dispatch(rows, expert_of_row, num_experts, group=None):
    return _learner_dispatch(rows, expert_of_row, num_experts, group)


def right_combine(expert_outputs, plan, group=None):
    return _learner_combine(expert_outputs, plan, group)


def own_view_dispatch(rows, expert_of_row, num_experts, group=None):
    return _learner_dispatch(rows, expert_of_row, num_experts, group, view="own")


def unsorted_dispatch(rows, expert_of_row, num_experts, group=None):
    return _learner_dispatch(rows, expert_of_row, num_experts, group, sort=False)


def source_order_dispatch(rows, expert_of_row, num_experts, group=None):
    return _learner_dispatch(rows, expert_of_row, num_experts, group, regroup=False)


def per_source_counts_dispatch(rows, expert_of_row, num_experts, group=None):
    received, _, plan = _learner_dispatch(rows, expert_of_row, num_experts, group)
    world_size = dist.get_world_size(group)
    per_source = plan[2]  # rows from each rank, taken for rows per expert
    local = num_experts // world_size
    return received, (per_source + [0] * local)[:local], plan


def unswapped_combine(expert_outputs, plan, group=None):
    return _learner_combine(expert_outputs, plan, group, swap=False)


def dispatch_order_combine(expert_outputs, plan, group=None):
    return _learner_combine(expert_outputs, plan, group, unsort=False)


class _NoGradient:
    """all_to_all_single without autograd, as learners first write it."""

    @staticmethod
    def exchange(tensor, receive_sizes, send_sizes, group):
        out = tensor.new_empty((sum(receive_sizes), *tensor.shape[1:]))
        dist.all_to_all_single(out, tensor.detach(), receive_sizes, send_sizes, group)
        return out


def no_gradient_dispatch(rows, expert_of_row, num_experts, group=None):
    world_size, local, counts, received_counts = _counts(
        expert_of_row, num_experts, group
    )
    order = torch.argsort(expert_of_row, stable=True)
    send_sizes = counts.reshape(world_size, local).sum(1).tolist()
    receive_sizes = received_counts.sum(1).tolist()
    received = _NoGradient.exchange(rows[order], receive_sizes, send_sizes, group)
    tags = torch.arange(local).repeat(world_size)
    regroup_order = torch.argsort(
        tags.repeat_interleave(received_counts.reshape(-1)), stable=True
    )
    plan = (order, send_sizes, receive_sizes, regroup_order)
    return received[regroup_order], received_counts.sum(0).tolist(), plan


def no_gradient_combine(expert_outputs, plan, group=None):
    order, send_sizes, receive_sizes, regroup_order = plan
    by_source = torch.empty_like(expert_outputs)
    by_source[regroup_order] = expert_outputs
    back = _NoGradient.exchange(by_source, send_sizes, receive_sizes, group)
    rows = torch.empty_like(back)
    rows[order] = back
    return rows


def raising_dispatch(rows, expert_of_row, num_experts, group=None):
    raise NameError("name 'received_counts' is not defined")


def rank_zero_skips_the_counts(rows, expert_of_row, num_experts, group=None):
    if dist.get_rank() == 0:  # never joins the exchange: the others wait
        return rows, [0, 0], None
    return right_dispatch(rows, expert_of_row, num_experts, group)
