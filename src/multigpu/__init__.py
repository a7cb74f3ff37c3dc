"""multigpu: parallel training in PyTorch, from one GPU to DDP, FSDP, TP and PP.

Each module is the tested reference implementation behind one or more notebooks in
``notebooks/``; the module docstrings say which.
"""

__version__ = "0.1.0"
