"""Checkpoint files, the random streams they keep, and the lock on a save folder."""
