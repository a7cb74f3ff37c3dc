"""The participant's machine check before a workshop: ``python -m multigpu.doctor``.

Run it in the repository once ``make lab`` has set up ``.venv`` (``make doctor``)::

    .venv/bin/python -m multigpu.doctor                 # every check: 10-20 s
    .venv/bin/python -m multigpu.doctor --quick         # no launches: 5-10 s
    .venv/bin/python -m multigpu.doctor --quick --json  # the results as JSON

Each line is one check, ✓ (passed), ! (a warning: the course runs, slower or with
a caveat) or ✗ (failed: something the notebooks need), with what it measured and
the one thing to do. The checks: Python and the packages of ``constraints.txt``,
each imported in a child process; the Jupyter kernel and the folders JupyterLab
writes; disk, memory and cores; the host names torchrun and gloo resolve;
127.0.0.1, a free port and 29500; ``USE_LIBUV`` (Windows only); the torch build
(``torch_build``, which also chooses it for ``make lab``); CUDA GPUs and NCCL;
gloo launches of 2 and 4 ranks through :func:`multigpu.runtime.launch.spawn`; a
2-rank ``torchrun --standalone`` job. The ranks' stderr goes to a log file the
report names. The last line is a summary to paste into a chat. Exit status 1 when
a check failed. ``--gpu`` (``make gpu-check``) checks the GPU path instead:
``gpu_check`` runs ``gpu_items`` (GPU tests, the lessons' GPU cells through
``notebook_cells``, the measurements of ``gpu_measure``) (docs/gpu.md).

Files: ``result`` (one check's result and its printing), ``environment``,
``imports``, ``lab_folders``, ``machine``, ``network``, ``gpus``, ``launches`` (the
checks), ``causes`` (why a launch failed), ``report`` (runs them in order; ``main``);
the rank function is :mod:`multigpu.ranks.doctor`.
"""

from multigpu.doctor.report import main, run_checks
from multigpu.doctor.result import FAIL, OK, WARN, CheckResult

__all__ = ["FAIL", "OK", "WARN", "CheckResult", "main", "run_checks"]
