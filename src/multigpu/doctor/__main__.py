"""Entry point: ``python -m multigpu.doctor [--quick] [--json]`` (``make doctor``),
``python -m multigpu.doctor --gpu`` (``make gpu-check``)."""

from multigpu.doctor.report import main

if __name__ == "__main__":
    raise SystemExit(main())
