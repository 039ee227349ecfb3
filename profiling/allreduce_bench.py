"""Microbenchmarks of the collectives each strategy uses, on the run's backend, with gradient-sized buffers.

DDP all-reduces the gradients (in fp32, or in fp16 with --grad-compression fp16); FSDP all-gathers
parameters and reduce-scatters gradients. Each is timed for the gradient-sized buffer and for one
element (the latency), and fitted to a ring model (profiling/comm_model.py).

Timed as a step meets them: on CPU each call follows a stretch of busy host time as long as the
step computes between two of its collectives (`gap_s`). The ranks' compute threads share the cores
with the backend's own threads there: some calls wait milliseconds for those threads to be
scheduled, and more of them after busy time than back to back. A call's time is the time of the
rank that arrived last (the others also waited for it, which the straggler term already counts),
and the figure is the mean over calls: a step pays every slow call, not the median one.
"""
import time

import torch
import torch.distributed as dist

from profiling.comm_model import BYTES_PER_GB, bus_bandwidth_bytes_per_s, fit_ring_link
from profiling.timing import barrier, gather_per_rank

UNTIMED_CALLS = 5  # connection set-up and first-call allocations stay out of the figures


def benchmark_allreduce(strategy, num_elements, iterations, gap_s=0.0):
    """Time the collectives with the gradient-sized buffer and with one element, each call after
    `gap_s` of busy host time; None in one process, where there is no process group to measure.
    The all-reduce in fp32 is the headline (DDP's exchange); `links` holds a fitted Link for every
    collective measured."""
    if not (dist.is_available() and dist.is_initialized()) or strategy.world_size < 2:
        return None
    world_size = strategy.world_size

    def timed(call):
        calls_s = timed_calls_s(strategy, call, iterations, gap_s)
        return sum(calls_s) / len(calls_s)

    buffer_s = timed(all_reduce_call(num_elements, torch.float32, strategy))
    tiny_s = timed(all_reduce_call(1, torch.float32, strategy))
    buffer_bytes = num_elements * 4
    after = f", calls after {gap_s * 1e3:.3g} ms of host work" if gap_s > 0 else ""
    source = f"measured: {dist.get_backend()}, {world_size} ranks"
    links = {"allreduce": fit_ring_link(buffer_bytes, buffer_s, tiny_s, world_size, source + after)}
    half_s = timed(all_reduce_call(num_elements, torch.float16, strategy))
    links["allreduce_fp16"] = fit_ring_link(buffer_bytes // 2, half_s, tiny_s, world_size, f"{source}, fp16{after}")
    for kind in ("all_gather", "reduce_scatter"):
        full_s = timed(_ring_pass_call(kind, num_elements, strategy))
        one_s = timed(_ring_pass_call(kind, world_size, strategy))
        links[kind] = fit_ring_link(buffer_bytes, full_s, one_s, world_size, f"{source}, {kind}{after}", passes=1)
    return {
        "backend": dist.get_backend(), "world_size": world_size, "buffer_bytes": buffer_bytes,
        "iterations": iterations, "gap_s": gap_s, "time_s": buffer_s, "one_element_time_s": tiny_s,
        "algorithm_bandwidth_gb_per_s": buffer_bytes / buffer_s / BYTES_PER_GB,
        "bus_bandwidth_gb_per_s": bus_bandwidth_bytes_per_s(buffer_bytes, buffer_s, world_size) / BYTES_PER_GB,
        "link": links["allreduce"], "links": links,
    }


def all_reduce_call(num_elements, dtype, strategy):
    tensor = torch.zeros(num_elements, dtype=dtype, device=strategy.device)
    return lambda: dist.all_reduce(tensor)


def _ring_pass_call(kind, num_elements, strategy):
    """A buffer of `num_elements` split in N shards: all_gather gathers the shards, as FSDP a unit's
    parameters; reduce_scatter reduces the buffer and keeps one shard of the sum, as FSDP's gradients."""
    shard = torch.zeros(-(-num_elements // strategy.world_size), device=strategy.device)
    full = torch.zeros(shard.numel() * strategy.world_size, device=strategy.device)
    # torch 2.13 renamed the two (*_single); older torch has only the first names.
    if kind == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, shard)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda: scatter(shard, full)


def timed_calls_s(strategy, call, iterations, gap_s):
    """Seconds of each of `iterations` calls, each made after `gap_s` of busy host time, as the rank
    that arrived last saw it; the same list on every rank."""
    for _ in range(UNTIMED_CALLS):
        call()
    strategy.synchronize()
    barrier(strategy)
    calls_s = []
    for _ in range(iterations):
        deadline = time.perf_counter() + gap_s
        while time.perf_counter() < deadline:
            pass  # this thread keeps its core, as a step's compute does between two collectives
        start = time.perf_counter()
        call()
        strategy.synchronize()
        calls_s.append(time.perf_counter() - start)
    return last_arrival_s(gather_per_rank(strategy, calls_s))


def last_arrival_s(calls_s_per_rank):
    """Each call's shortest time over the ranks: the rank that arrived last waited for nobody, so its
    time is the call's own."""
    return [min(times) for times in zip(*calls_s_per_rank, strict=True)]
