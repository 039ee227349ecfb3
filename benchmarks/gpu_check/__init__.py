"""The GPU check: python -m benchmarks.gpu_check (the command line and its description are in __main__.py)."""
