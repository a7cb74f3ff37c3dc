"""The small problem the tests of multigpu.tensor_parallel share: a block of hidden
8, 4 heads, ffn 16 on a batch of 2 sequences of 8 tokens, a vocabulary of 16."""

import torch

from multigpu.tensor_parallel import TinyLM, make_block

TIMEOUT = 60.0  # generous: the test machine may be shared
EXACT = 1e-12  # float64: the ranks add in another order, ~1e-15
FLOAT32 = 1e-5  # float32: stated bound
SHAPE = dict(hidden=8, heads=4, ffn=16)
VOCAB = 16


def block_and_data(dtype=torch.float64, dropout=0.0):
    """A block, x (2, 8, 8) and the upstream gradient (2, 8, 8), in ``dtype``."""
    block = make_block(**SHAPE, dropout=dropout, dtype=dtype)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 8, 8, generator=generator, dtype=torch.float64).to(dtype)
    grad_out = torch.randn(2, 8, 8, generator=generator, dtype=torch.float64).to(dtype)
    return block, x, grad_out


def lm_and_data():
    """A float64 TinyLM and tokens and targets (2, 8) over the whole vocabulary."""
    torch.manual_seed(0)
    lm = TinyLM(VOCAB, SHAPE["hidden"], SHAPE["heads"], SHAPE["ffn"]).double()
    generator = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, VOCAB, (2, 8), generator=generator)
    target = torch.randint(0, VOCAB, (2, 8), generator=generator)
    return lm, tokens, target


def large_logits(tokens=12, vocab=VOCAB):
    """Logits (12, 16) around 1000, where exp overflows without the max shift, and
    targets spread over the vocabulary."""
    generator = torch.Generator().manual_seed(6)
    logits = 1000 + 3 * torch.randn(tokens, vocab, generator=generator).double()
    target = torch.arange(tokens) * 5 % vocab
    return logits, target
