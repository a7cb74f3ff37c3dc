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
"""

import gc

THRESHOLDS = (100_000, 20, 20)
gc.set_threshold(*THRESHOLDS)
