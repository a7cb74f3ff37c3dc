"""Tests for multigpu.expert_parallel.routing and layer, in one process: top-k
gates, capacity and the order in which tokens are dropped, the Switch Transformer's
load-balancing loss worked out by hand, and the layer against a token-by-token
loop (its residual path, an expert with no token)."""

import math

import pytest
import torch

from multigpu.expert_parallel import (
    MoELayer,
    expert_capacity,
    load_balancing_loss,
    make_moe_classifier,
    route,
    steered_tokens,
)


def test_route_takes_the_top_k_softmax_probabilities_as_gates():
    logits = torch.randn(9, 5, dtype=torch.float64)
    routing = route(logits, top_k=2)
    probs = torch.softmax(logits, dim=-1)
    assert torch.allclose(routing.probs, probs)
    for token in range(9):
        best = sorted(range(5), key=lambda e: -probs[token, e].item())[:2]
        assert routing.experts[token].tolist() == best
        assert torch.equal(routing.gates[token], probs[token, best])
    assert routing.kept.all() and routing.capacity is None
    assert routing.chosen_per_expert().sum() == 18


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "factor", "expected"),
    [
        (10, 1, 4, 1.0, 3),  # ceil(2.5)
        (10, 1, 4, 1.25, 4),  # ceil(3.125)
        (8, 2, 4, 1.0, 4),  # exactly 4: no rounding up
        (7, 1, 3, 1.5, 4),  # 7/3 * 1.5 = 3.5
        (0, 1, 4, 1.0, 0),  # an empty group takes nothing
    ],
)
def test_expert_capacity(tokens, top_k, experts, factor, expected):
    assert expert_capacity(tokens, experts, top_k, factor) == expected


def test_first_choices_are_served_before_second_choices_in_token_order():
    logits = torch.tensor(
        [[3.0, 2, 0, 0], [3, 2, 0, 0], [3, 0, 2, 0], [2, 3, 0, 0]],
        dtype=torch.float64,
    )  # experts: [0, 1], [0, 1], [0, 2], [1, 0]
    routing = route(logits, top_k=2, capacity_factor=1.0)  # capacity 2
    assert routing.experts.tolist() == [[0, 1], [0, 1], [0, 2], [1, 0]]
    assert routing.capacity == [2]
    # expert 0: first choices of tokens 0, 1 (kept), 2 (third: dropped); token 3's
    # second choice comes after every first choice (dropped). Expert 1: token 3's
    # first choice, token 0's second (kept), token 1's second (third: dropped).
    assert routing.kept.tolist() == [
        [True, True], [True, False], [False, True], [True, False]
    ]  # fmt: skip
    assert routing.dropped() == 3
    assert routing.kept_per_expert().tolist() == [2, 2, 1, 0]


def test_capacity_is_counted_per_group():
    logits = torch.tensor([[1.0, 0]] * 6, dtype=torch.float64)  # all to expert 0
    one_group = route(logits, capacity_factor=1.0)  # capacity 3 of 6
    two_groups = route(logits, capacity_factor=1.0, group_sizes=[4, 2])  # 2 and 1
    assert one_group.kept[:, 0].tolist() == [True] * 3 + [False] * 3
    assert two_groups.capacity == [2, 1]
    assert two_groups.kept[:, 0].tolist() == [True, True, False, False, True, False]
    empty = route(logits, capacity_factor=1.0, group_sizes=[0, 6, 0])
    assert empty.capacity == [0, 3, 0] and empty.dropped() == 3


def test_routing_refuses_by_name():
    logits = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="top_k=4 is more experts than the layer"):
        route(logits, top_k=4)
    with pytest.raises(ValueError, match=r"group_sizes \[3\] do not cut 4 tokens"):
        route(logits, group_sizes=[3])
    with pytest.raises(ValueError, match="capacity_factor must be positive"):
        route(logits, capacity_factor=0.0)


def test_the_load_balancing_loss_is_the_switch_transformers_formula():
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(12, 4, generator=generator), -1).double()
    chosen = torch.tensor([5, 3, 0, 4])  # 12 tokens, top-1
    by_hand = 4 * sum(
        (chosen[e].item() / 12) * (probs[:, e].sum().item() / 12) for e in range(4)
    )
    assert math.isclose(load_balancing_loss(probs, chosen, 12), by_hand)
    even = torch.full((8, 4), 0.25, dtype=torch.float64)
    assert load_balancing_loss(even, torch.tensor([2, 2, 2, 2]), 8).item() == 1.0
    collapsed = torch.tensor([[1.0, 0, 0, 0]] * 8, dtype=torch.float64)
    assert load_balancing_loss(collapsed, torch.tensor([8, 0, 0, 0]), 8).item() == 4.0
    # the whole batch's counts with each piece's probabilities: the pieces add up
    pieces = sum(load_balancing_loss(p, chosen, 12) for p in probs.split([5, 0, 7]))
    assert math.isclose(pieces.item(), by_hand)
    assert load_balancing_loss(probs[:0], chosen * 0, 0).item() == 0.0


def _token_by_token(layer: MoELayer, x: torch.Tensor, routing) -> torch.Tensor:
    out = x.clone()
    for t in range(len(x)):
        for j in range(layer.top_k):
            if routing.kept[t, j]:
                expert = layer.experts[int(routing.experts[t, j])]
                out[t] = out[t] + routing.gates[t, j] * expert(x[t : t + 1])[0]
    return out


@pytest.mark.parametrize(("top_k", "factor"), [(1, None), (2, 1.0), (2, 0.5)])
def test_the_layer_is_its_tokens_one_by_one(top_k, factor):
    torch.manual_seed(0)
    layer = MoELayer(4, 6, 4, top_k=top_k, capacity_factor=factor).double()
    x = torch.randn(10, 4, dtype=torch.float64)
    out = layer(x, [6, 4])
    expected = _token_by_token(layer, x, out.routing)
    assert (out.output - expected).abs().max().item() < 1e-15
    chosen = out.routing.chosen_per_expert()
    aux = load_balancing_loss(out.routing.probs, chosen, 10, top_k)
    assert torch.equal(out.aux_loss, aux)


def test_a_token_every_expert_dropped_passes_unchanged_and_an_idle_expert_gets_zeros():
    torch.manual_seed(0)
    layer = MoELayer(4, 6, 4, top_k=1, capacity_factor=1.0).double()
    x = steered_tokens(layer, [0, 0, 0, 1, 1, 3, 0, 1])  # capacity 2; expert 2 idle
    x.requires_grad_(True)
    out = layer(x)
    assert out.routing.kept[:, 0].tolist() == [
        True, True, False, True, True, True, False, False
    ]  # fmt: skip
    dropped = ~out.routing.kept[:, 0]
    assert torch.equal(out.output[dropped], x[dropped])  # the residual path only
    (out.output.sum() + out.aux_loss).backward()
    idle = layer.experts[2]
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in idle.parameters())
    assert layer.experts[0].fc1.weight.grad.abs().sum() > 0


def test_steering_needs_a_feature_per_expert_and_freezing_names_a_parameter():
    with pytest.raises(ValueError, match="dim=3 < 4 experts"):
        steered_tokens(MoELayer(3, 4, 4), [0, 1])
    model = make_moe_classifier(frozen=("moe.experts.1.fc1.weight",))
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen == ["moe.experts.1.fc1.weight"]
    with pytest.raises(KeyError, match="no parameter 'moe.expert.1'"):
        make_moe_classifier(frozen=("moe.expert.1",))
