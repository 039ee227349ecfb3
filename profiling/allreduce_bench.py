"""Microbenchmark of dist.all_reduce on the run's backend with a gradient-sized fp32 buffer."""
import statistics
import time

import torch
import torch.distributed as dist

from profiling.comm_model import BYTES_PER_GB, bus_bandwidth_bytes_per_s, fit_ring_link
from profiling.timing import barrier, reduce_over_ranks

UNTIMED_CALLS = 5  # connection set-up and first-call allocations stay out of the figures


def benchmark_allreduce(strategy, num_elements, iterations):
    """Time all-reduces of the gradient-sized buffer and of one element (the latency); None in
    one process, where there is no process group to measure."""
    if not (dist.is_available() and dist.is_initialized()) or strategy.world_size < 2:
        return None
    buffer = torch.zeros(num_elements, dtype=torch.float32, device=strategy.device)
    tiny = torch.zeros(1, dtype=torch.float32, device=strategy.device)
    buffer_s = _median_call_s(strategy, buffer, iterations)
    tiny_s = _median_call_s(strategy, tiny, iterations)
    world_size, buffer_bytes = strategy.world_size, buffer.numel() * buffer.element_size()
    source = f"measured: {dist.get_backend()}, {world_size} ranks"
    link = fit_ring_link(buffer_bytes, buffer_s, tiny_s, world_size, source)
    return {
        "backend": dist.get_backend(), "world_size": world_size, "buffer_bytes": buffer_bytes,
        "iterations": iterations, "time_s": buffer_s, "one_element_time_s": tiny_s,
        "algorithm_bandwidth_gb_per_s": buffer_bytes / buffer_s / BYTES_PER_GB,
        "bus_bandwidth_gb_per_s": bus_bandwidth_bytes_per_s(buffer_bytes, buffer_s, world_size) / BYTES_PER_GB,
        "link": link,
    }


def _median_call_s(strategy, tensor, iterations):
    """Median of single timed calls, slowest rank: a call delayed by another process on a shared
    machine moves a mean a lot and a median hardly."""
    for _ in range(UNTIMED_CALLS):
        dist.all_reduce(tensor)
    strategy.synchronize()
    barrier(strategy)
    calls_s = []
    for _ in range(iterations):
        start = time.perf_counter()
        dist.all_reduce(tensor)
        strategy.synchronize()
        calls_s.append(time.perf_counter() - start)
    return reduce_over_ranks(strategy, {"s": statistics.median(calls_s)}, {"s": "max"})["s"]
