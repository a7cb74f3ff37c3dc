"""Entry point: ``python -m multigpu.doctor [--quick] [--json]`` (``make doctor``)."""

from multigpu.doctor.report import main

if __name__ == "__main__":
    raise SystemExit(main())
