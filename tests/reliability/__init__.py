"""Reliability suite: crash safety (SIGKILL), concurrency, migrations under contention,
fuzzing of every input, corruption detection. Figures: ``tests/reliability/figures.py``."""
