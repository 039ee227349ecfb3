"""Microbenchmarks of the collectives each strategy uses, on the run's backend, with gradient-sized buffers.

DDP all-reduces the gradients (in fp32, or in fp16 with --grad-compression fp16); FSDP all-gathers
parameters and reduce-scatters gradients. Each is timed for the gradient-sized buffer and for one
element (the latency), and fitted to a ring model (profiling/comm_model.py).
"""
import statistics
import time

import torch
import torch.distributed as dist

from profiling.comm_model import BYTES_PER_GB, bus_bandwidth_bytes_per_s, fit_ring_link, fit_ring_pass_link
from profiling.timing import barrier, reduce_over_ranks

UNTIMED_CALLS = 5  # connection set-up and first-call allocations stay out of the figures


def benchmark_allreduce(strategy, num_elements, iterations):
    """Time the collectives with the gradient-sized buffer and with one element; None in one
    process, where there is no process group to measure. The all-reduce in fp32 is the headline
    (DDP's exchange); `links` holds a fitted Link for every collective measured."""
    if not (dist.is_available() and dist.is_initialized()) or strategy.world_size < 2:
        return None
    world_size = strategy.world_size
    buffer_s = _median_call_s(strategy, _all_reduce(num_elements, torch.float32, strategy), iterations)
    tiny_s = _median_call_s(strategy, _all_reduce(1, torch.float32, strategy), iterations)
    buffer_bytes = num_elements * 4
    source = f"measured: {dist.get_backend()}, {world_size} ranks"
    links = {"allreduce": fit_ring_link(buffer_bytes, buffer_s, tiny_s, world_size, source)}
    half_s = _median_call_s(strategy, _all_reduce(num_elements, torch.float16, strategy), iterations)
    links["allreduce_fp16"] = fit_ring_link(buffer_bytes // 2, half_s, tiny_s, world_size, source + ", fp16")
    for kind, make in (("all_gather", _all_gather), ("reduce_scatter", _reduce_scatter)):
        full_s = _median_call_s(strategy, make(num_elements, strategy), iterations)
        one_s = _median_call_s(strategy, make(world_size, strategy), iterations)
        links[kind] = fit_ring_pass_link(buffer_bytes, full_s, one_s, world_size, f"{source}, {kind}")
    return {
        "backend": dist.get_backend(), "world_size": world_size, "buffer_bytes": buffer_bytes,
        "iterations": iterations, "time_s": buffer_s, "one_element_time_s": tiny_s,
        "algorithm_bandwidth_gb_per_s": buffer_bytes / buffer_s / BYTES_PER_GB,
        "bus_bandwidth_gb_per_s": bus_bandwidth_bytes_per_s(buffer_bytes, buffer_s, world_size) / BYTES_PER_GB,
        "link": links["allreduce"], "links": links,
    }


def _all_reduce(num_elements, dtype, strategy):
    tensor = torch.zeros(num_elements, dtype=dtype, device=strategy.device)
    return lambda: dist.all_reduce(tensor)


def _all_gather(num_elements, strategy):
    """Each rank contributes 1/N of a buffer of `num_elements`, as FSDP gathers a unit's parameters."""
    shard = torch.zeros(-(-num_elements // strategy.world_size), device=strategy.device)
    output = torch.zeros(shard.numel() * strategy.world_size, device=strategy.device)
    return lambda: dist.all_gather_into_tensor(output, shard)


def _reduce_scatter(num_elements, strategy):
    """Each rank reduces a buffer of `num_elements` and keeps 1/N of the sum, as FSDP's gradients."""
    shard = torch.zeros(-(-num_elements // strategy.world_size), device=strategy.device)
    full = torch.zeros(shard.numel() * strategy.world_size, device=strategy.device)
    return lambda: dist.reduce_scatter_tensor(shard, full)


def _median_call_s(strategy, call, iterations):
    """Median of single timed calls, slowest rank: a call delayed by another process on a shared
    machine moves a mean a lot and a median hardly."""
    for _ in range(UNTIMED_CALLS):
        call()
    strategy.synchronize()
    barrier(strategy)
    calls_s = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        strategy.synchronize()
        calls_s.append(time.perf_counter() - start)
    return reduce_over_ranks(strategy, {"s": statistics.median(calls_s)}, {"s": "max"})["s"]
