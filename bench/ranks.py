"""Rank functions only the benchmarks use."""
