"""Exercise checkers: each runs the learner's code against the reference and names
the mistake it finds (08 on). Every ``check_*`` returns an :class:`ExerciseResult`,
a ``(passed, message)`` tuple: ``passed, message = check_...(...)``."""

from multigpu.exercises._result import ExerciseResult

__all__ = ["ExerciseResult"]
