"""Throughput benchmarks of the training code path, runnable as `python -m benchmarks.<name>`."""
