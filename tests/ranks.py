"""Rank functions only the tests use: ranks that fail, hang, are killed, or take a
wrong training step (the mistakes the exercise checkers must catch)."""
