from tests.faults.leftovers import folder  # noqa: F401 (a fixture)
from tests.snapshot.problem import uninterrupted  # noqa: F401 (a fixture)
