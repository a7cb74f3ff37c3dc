"""The notebook's model with every case a sharded wrapper can get wrong (14).

:class:`TiedFrozenNet` has a weight tied between two layers, a frozen layer, a
layer never called in forward and a buffer read in forward, and a parameter count
that no world size from 2 to 4 divides. It is defined once, in
:mod:`multigpu.core.models`, and the tests' hard cases (``tests/hard_cases.py``)
use the same class; it is here under the name notebook 14 imports.
"""

from __future__ import annotations

from multigpu.core.models import TiedFrozenNet

__all__ = ["TiedFrozenNet"]
