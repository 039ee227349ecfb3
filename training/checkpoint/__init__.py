"""Checkpoint files: their format, writing and reading, the random streams they keep, the judge of whether
one is this run's, and an earlier run's files moved aside (the save folder's lock is training/run_inputs.py's)."""
