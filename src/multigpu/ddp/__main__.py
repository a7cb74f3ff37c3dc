"""The DDP torchrun script (09)::

    torchrun --standalone --nproc-per-node=2 -m multigpu.ddp --epochs 2

Every rank trains ConvNet on the digits with DistributedDataParallel; rank 0 prints
one line per epoch (``--help``: the options). Notebook 11's script, which snapshots
and survives torchrun's restarts, is ``python -m multigpu.snapshot``; both share
their options, their checks and what they do around the loop (``cli``,
``configure``, ``script``).

Errors are one line: a wrong option stops every rank before the process group
starts (rank 0 prints ``...: error: <what to fix>``, exit status 2); a rank that
fails while it trains prints ``rank R: <its error>`` and exits with status 1, before
torchrun's summary. A checkpoint written with other settings (``--lr`` and
``--momentum`` included) is refused in one line too (status 2); a finished run
resumed again says so and trains nothing. Ranks that end with different weights, or
weights that are not finite, fail with one line naming the first tensor concerned
(status 1). Ctrl-C ends every rank with one line from rank 0, ``interrupted at step
N (epoch E of F); ...`` (status 130). ``--timeout SECONDS`` (default 60, from 1 to a
week) bounds every collective: a hung rank makes its peers fail after that long
instead of gloo's 30 minutes (11).
"""

from __future__ import annotations

import torch

from multigpu.core.train import History
from multigpu.ddp.accumulation import scaled_lr
from multigpu.ddp.configure import Run, configure
from multigpu.ddp.loop import train_ddp_loop
from multigpu.ddp.script import log_line, run_script, start_training
from multigpu.runtime.launch import exit_rank


def main(argv: list[str] | None = None) -> int:
    """The torchrun entry point: check the options
    (:func:`~multigpu.ddp.configure.configure`), train, print one line per epoch on
    rank 0; the exit status (:func:`~multigpu.ddp.script.run_script`) (09)."""
    return run_script(argv, configure, train)


def train(run: Run, device: torch.device) -> History:
    """This rank's training with :func:`~multigpu.ddp.train_ddp_loop`; its
    History (09)."""
    args, world_size = run.args, run.env.world_size
    lr = scaled_lr(args.lr, world_size, args.lr_scaling)
    config, model, (X, y, X_test, y_test) = start_training(run, device, lr)
    return train_ddp_loop(
        model,
        X,
        y,
        config,
        X_test=X_test,
        y_test=y_test,
        accumulation=args.accumulation,
        lr_scaling=args.lr_scaling,
        amp=args.amp,
        checkpoint=args.checkpoint,
        resume_from_checkpoint=args.resume,
        progress=args.progress,
        log=log_line,
    )


if __name__ == "__main__":
    exit_rank(main())  # not `raise SystemExit`: see exit_rank
