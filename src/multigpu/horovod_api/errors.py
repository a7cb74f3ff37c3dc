"""The errors of the Horovod-style API, ValueError and RuntimeError like Horovod's
(12)."""


class NotInitializedError(ValueError):
    """A function of this module was called before :func:`init` (a ValueError,
    like Horovod's) (12)."""


class BackwardPassesError(RuntimeError):
    """Backward ran more or fewer times than ``backward_passes_per_step`` before
    ``step()``, or ``zero_grad()`` came between backward and ``step()`` (12)."""
