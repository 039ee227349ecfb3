"""Timing benchmarks, the GPU check and the scaling report and map (their shared command-line parts:
profiling/entry_points.py)."""
