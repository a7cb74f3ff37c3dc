"""The tiny GPT: its parameter count from the formula, a head tied to the token
embedding (one tensor, two gradient sources), causal (a token's logits ignore later
tokens), and the summed loss over the global count equals the mean."""

import torch

from multigpu.gpt4d.model import (
    GPTConfig,
    TinyGPT,
    count_parameters,
    make_gpt,
    make_token_batches,
    token_loss_sum,
)


def test_the_parameter_count_matches_the_formula():
    for config in (GPTConfig(), GPTConfig(vocab=32, layers=4, dim=16, heads=4)):
        model = TinyGPT(config)
        assert sum(p.numel() for p in model.parameters()) == count_parameters(config)


def test_the_head_is_the_token_embedding_with_two_gradient_sources():
    config = GPTConfig()
    model = make_gpt(config)
    inputs, targets = make_token_batches(config, (3,))[0]
    token_loss_sum(model(inputs), targets).backward()
    both = model.embed.weight.grad.clone()
    model.zero_grad()
    x = model.embed_tokens(inputs)
    for block in model.blocks:
        x = block(x)
    head_only = model.ln_f(x) @ model.embed.weight.detach().T
    token_loss_sum(head_only, targets).backward()
    input_side = model.embed.weight.grad
    assert input_side.abs().sum() > 0
    assert (both - input_side).abs().max() > 1e-6  # the head adds its own share


def test_a_tokens_logits_do_not_see_later_tokens():
    config = GPTConfig()
    model = make_gpt(config)
    inputs, _ = make_token_batches(config, (2,))[0]
    changed = inputs.clone()
    changed[:, -1] = (changed[:, -1] + 1) % config.vocab
    assert torch.equal(model(inputs)[:, :-1], model(changed)[:, :-1])


def test_the_summed_loss_over_the_global_count_is_the_mean():
    config = GPTConfig()
    model = make_gpt(config)
    inputs, targets = make_token_batches(config, (5,))[0]
    logits = model(inputs)
    mean = torch.nn.functional.cross_entropy(
        logits.reshape(-1, config.vocab), targets.reshape(-1)
    )
    parts = sum(token_loss_sum(logits[i : i + 1], targets[i : i + 1]) for i in range(5))
    assert torch.allclose(parts / targets.numel(), mean, atol=1e-12)
