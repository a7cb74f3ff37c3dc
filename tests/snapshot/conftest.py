from tests.snapshot.problem import uninterrupted  # noqa: F401 (a fixture)
