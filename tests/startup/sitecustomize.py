"""Python's garbage collector, tuned for the processes of `make test` and `make nbval`.

The Makefile puts this folder on PYTHONPATH for its test targets only, so every
Python they start (pytest, the notebooks' kernels, torchrun's agents and ranks, the
launcher's forkserver) imports this module as it starts (Python's ``site`` module
imports ``sitecustomize`` wherever it finds one). A new Python that imports torch and
torch._dynamo (which an optimizer's first call imports) creates about a million
objects, and with Python's default thresholds (700, 10, 10) the collector ran over
them again and again while they were being created: about a fifth of the import's
processor time, and most of what a torchrun rank does in the tests. Collecting less
often changes only when cyclic garbage is freed, never what a program computes; the
stored outputs come from kernels with the default thresholds (`make notebooks`,
JupyterLab), and nbval compares them with what these processes print. A learner's
Python is not touched: nothing outside the test targets puts this folder on its path.

torchrun's agents and the ranks they start (``TORCHRUN_PROCESS``) do not collect at
all: each lives for seconds, imports torch and trains a small model, and even at
these thresholds they spent most of the tests' collection time (a sample of the
torchrun-heavy tests and lessons: 7.4 of 10.3 processor-seconds). Whatever cyclic
garbage they make is freed when they exit, seconds later.
"""

import gc
import os
import sys

THRESHOLDS = (100_000, 20, 20)
gc.set_threshold(*THRESHOLDS)


def torchrun_process(argv: list[str], environ) -> bool:
    """Whether this Python is torchrun's agent (``torchrun ...``, ``python -m
    torch.distributed.run ...``) or a rank it started (which it gives
    TORCHELASTIC_RUN_ID)."""
    if "TORCHELASTIC_RUN_ID" in environ:
        return True
    for position, word in enumerate(argv[1:], 1):
        if word == "-m":  # python [options] -m torch.distributed.run
            return argv[position + 1 : position + 2] == ["torch.distributed.run"]
        if not word.startswith("-"):  # python [options] SCRIPT: the torchrun script?
            return os.path.basename(word) == "torchrun"
    return False


TORCHRUN_PROCESS = torchrun_process(getattr(sys, "orig_argv", []), os.environ)
if TORCHRUN_PROCESS:
    gc.disable()
