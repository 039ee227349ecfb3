"""The profile: runs summarised as mean +- std, the cluster behind the predictions, predictions, advice, notes."""
import dataclasses
import math
import os

import torch
import torch.distributed as dist

from profiling.comm_model import (
    BYTES_PER_GB,
    BYTES_PER_MB,
    STRATEGIES,
    Exchange,
    comm_split,
    ddp_bucket_count,
    predict_strategy,
    predict_world,
    share,
)
from profiling.recommend import Figures, recommendations
from profiling.run_time import pool_entry, run_time_entry
from profiling.timing import OTHER_CPU_WORRY, mean_std
from profiling.topology import build_topology, links_at, nodes_for, ring_link

RUN_KEYS = ("step_time_s", "step_time_min_s", "step_time_max_s", "step_time_median_s", "samples_per_s",
            "data_wait_share", "compute_step_time_s", "comm_time_s")


@dataclasses.dataclass
class Measurements:
    """What PerformanceProfiler.run measured, for assemble_profile."""
    runs: list
    phases: dict
    memory: dict
    benchmark: dict  # None in one process
    trace_files: list
    host_load: dict
    plan: object  # profiling.topology.Plan
    host_effects: dict = None  # a 1-process profile's (profiling/host_sharing.py)
    run_parts: object = None  # profiling.run_time.RunParts


def assemble_profile(args, work, measured):
    strategy, runs, benchmark, plan = work.strategy, measured.runs, measured.benchmark, measured.plan
    host_effects = measured.host_effects
    timing = {key: _summary([run[key] for run in runs]) for key in RUN_KEYS}
    timing["compute_to_comm_ratio"] = _ratio_summary(runs, timing)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", strategy.world_size))
    topology = build_topology(args, strategy.device.type, plan.ranks_per_node, benchmark and benchmark["links"],
                              spans_nodes=strategy.world_size > local)
    compute_s = timing["compute_step_time_s"]["mean"]
    buckets = ddp_bucket_count(work.gradient_bytes)
    predictions = [{**_count_row(timing, work, topology, n, host_effects), "nodes": nodes_for(n, plan.ranks_per_node)}
                   for n in plan.counts]
    exchange = Exchange(work.gradient_bytes, tuple(work.unit_bytes), args.run.parallel.reshard_after_forward)
    strategies = {name: [predict_strategy(name, compute_s, exchange, n, links_at(topology, n), host_effects)
                         for n in plan.counts] for name in STRATEGIES}
    figures = Figures(compute_s, work.gradient_bytes, topology, work.batch_size, work.precision.enabled,
                      timing["data_wait_share"]["mean"],
                      backward_s=measured.phases["backward_s"] if measured.phases else None,
                      planned=plan.planned, host_effects=host_effects, strategies=strategies,
                      device_memory_bytes=torch.cuda.get_device_properties(strategy.device).total_memory
                      if strategy.device.type == "cuda" else None)
    return {
        "config": _config(args, work),
        "model": {"name": args.model, "parameters": work.num_parameters, "gradient_bytes": work.gradient_bytes,
                  "gradient_mb": work.gradient_bytes / BYTES_PER_MB,
                  "ddp_buckets": buckets, "fsdp_unit_bytes": work.unit_bytes},
        "timing": timing,
        "epoch_time_s": work.steps_per_epoch * timing["step_time_s"]["mean"],
        "runs": runs,
        "phases": measured.phases,
        "memory": measured.memory,
        "allreduce_benchmark": _benchmark_entry(benchmark),
        "link": {**_link_entry(topology.intra["allreduce"]),  # inside a node
                 "latency_us": topology.intra["allreduce"].latency_s * 1e6},
        "topology": {"ranks_per_node": plan.ranks_per_node, "unit": topology.unit, "planned": plan.planned,
                     "why": plan.why, "intra": {kind: _link_entry(link) for kind, link in topology.intra.items()},
                     "inter": _link_entry(topology.inter)},
        "host_effects": host_effects,
        "predictions": predictions,
        "strategies": strategies,
        "collective_links": {kind: _link_entry(value) for kind, value in topology.intra.items()},
        "recommendations": recommendations(figures, plan.counts),
        "host_load": measured.host_load,
        "trace_files": measured.trace_files,
        "feature_pool": pool_entry(work.pool, strategy.rank),
        "run_time": run_time_entry(measured.run_parts, work, predictions, topology, host_effects)
        if measured.run_parts else None,
        "notes": _notes(strategy, work, measured.host_load) + _sharing_notes(host_effects),
    }


def _count_row(timing, work, topology, world_size, host_effects):
    """The DDP step on `world_size` ranks: measured for this run's own world size, else predicted."""
    if world_size == work.strategy.world_size > 1:
        return measured_row(timing, world_size)
    compute_s, gradient_bytes = timing["compute_step_time_s"]["mean"], work.gradient_bytes
    predicted = predict_world(compute_s, gradient_bytes, world_size, ring_link(topology, world_size),
                              ddp_bucket_count(gradient_bytes), host_effects=host_effects)
    return {**predicted, "basis": "measured" if world_size == 1 == work.strategy.world_size else "predicted"}


def measured_row(timing, world_size):
    """The row of a profile's own world size (2+ ranks): its measured step, exposed communication and
    efficiency against a rank of its own T_compute, as the prediction rows have them."""
    step_s, compute_s = timing["step_time_s"]["mean"], timing["compute_step_time_s"]["mean"]
    comm_s, ratio = comm_split(step_s, compute_s)
    return {"world_size": world_size, "allreduce_s": comm_s, "rank_step_s": compute_s, "step_s": step_s,
            "speedup": world_size * compute_s / step_s, "efficiency": compute_s / step_s,
            "allreduce_share": share(comm_s, step_s), "compute_to_comm_ratio": ratio, "basis": "measured"}


def _config(args, work):
    strategy = work.strategy
    return {"model": args.model, "norm": args.norm, "batch_size": work.batch_size, "width": args.width,
            "depth": args.depth, "heads": args.heads, "ffn": args.ffn, "multi_gpu": args.multi_gpu,
            "grad_compression": args.grad_compression,
            "grad_accum_steps": work.grad_accum_steps, "world_size": strategy.world_size,
            "global_samples_per_step": work.global_samples_per_step, "device": str(strategy.device.type),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "precision": work.precision.dtype_name, "compile": bool(args.compile), "num_workers": args.num_workers,
            "threads_per_rank": torch.get_num_threads(), "data": work.data_source,
            "train_windows": work.train_windows, "steps_per_epoch": work.steps_per_epoch,
            "warmup_steps": args.warmup_steps, "steps": args.steps, "repeats": args.repeats,
            "phase_steps": args.phase_steps, "torch": torch.__version__}


def _notes(strategy, work, host_load):
    notes = [
        "step time: wall time of one optimizer step, data wait included, on the slowest rank; "
        "samples/s = global samples per step / step time; mean +- sample std over the repeats; "
        "warm-up steps ran once, before the first repeat",
        "data-wait share: host time spent in next(loader) and the copy to the device / step time",
        "T_compute: the same steps under DDP no_sync() (no gradient all-reduce; DDP is built without "
        "its per-forward buffer broadcast, as training builds it); T_comm = max(T_step - T_compute, 0) is the "
        "communication not hidden behind compute; R = mean T_compute / mean T_comm",
        "predictions: weak scaling (per-rank batch fixed), step = each rank's step + ring all-reduce time, "
        "no overlap with backward assumed; speedup = N x T_step(1) / T_step(N) in global samples/s; 'measured' "
        "marks the row of this run's own world size, every other row is predicted",
        "epoch time = optimizer steps in one epoch of the whole training split x mean step time",
    ]
    if strategy.device.type == "cuda":
        notes.append("phase breakdown: a separate pass with torch.cuda.synchronize at every phase "
                     "boundary, so the headline timing (CUDA events, no synchronize) is not perturbed; "
                     "its phases need not add up to the headline step time")
    else:
        notes.append("phase breakdown: a separate pass; CPU operations finish before they return, so "
                     "phase boundaries need no synchronize")
    if strategy.world_size == 1:
        notes.append("one process: no all-reduce runs, T_compute = T_step, and every collective in the "
                     "predictions is assumed: the links under 'topology' (a flag's, else a preset's)")
        notes.append("predictions for N ranks: each rank's step = (the lone step + the strategy's own per-step "
                     "cost) x the slowdown measured with the neighbour processes of a rank's node on this host "
                     "(CPU; a full node's once N fills more than one; on GPUs 1) + the expected wait for the "
                     "slowest of N ranks, then + the collectives over the slowest link their ring crosses "
                     "(see 'host_effects' and 'topology')")
    if work.ridge_in_main:
        notes.append(f"main.py with these flags solves the head by ridge regression (--head-fit auto, "
                     f"{work.train_windows:,} training windows) and takes no optimizer step: the steps, epochs and "
                     "whole run profiled here are those of --head-fit adamw")
    if strategy.device.type == "cpu":
        notes.append(f"CPU: {torch.get_num_threads()} thread(s) per process (torchrun sets OMP_NUM_THREADS=1 "
                     "for 2+ processes unless it is set); memory is process RSS, not a device figure")
    if host_load and host_load["other_processes_cpu_s"] > OTHER_CPU_WORRY * host_load["wall_s"]:
        notes.append(f"other processes used {host_load['other_processes_cpu_s']:.1f} CPU-s during the "
                     f"{host_load['wall_s']:.1f} s of measured runs on {host_load['cores']} cores: the "
                     "timings are slower and noisier than on an idle machine")
    return notes


def _sharing_notes(host_effects):
    """A warning where other work on this machine ran beside the neighbours in every round the slowdown
    was measured in."""
    busy = {n: cores for n, cores in ((host_effects or {}).get("other_cores") or {}).items()
            if cores > OTHER_CPU_WORRY}
    if not busy:
        return []
    return ["in every round of the slowdown beside neighbours, other processes kept up to " + ", ".join(
        f"{cores:.1f} cores busy (with {n} ranks a node)" for n, cores in busy.items()) + ": the slowdown, and the "
        "predictions of ranks sharing a node, are larger than on an idle machine; rerun when it is idle"]


def _summary(values):
    if not all(math.isfinite(value) for value in values):
        return {"mean": math.inf, "std": None}
    mean, std = mean_std(values)
    return {"mean": mean, "std": std}


def _ratio_summary(runs, timing):
    """R of the mean times (a single run with no exposed communication would make a mean of
    ratios infinite); std over the runs when every run's R is finite."""
    comm_s = timing["comm_time_s"]["mean"]
    ratio = timing["compute_step_time_s"]["mean"] / comm_s if comm_s > 0 else math.inf
    per_run = [run["compute_to_comm_ratio"] for run in runs]
    std = mean_std(per_run)[1] if all(math.isfinite(r) for r in per_run) else None
    return {"mean": ratio, "std": std}


def _benchmark_entry(benchmark):
    if benchmark is None:
        return {"measured": False, "why": "one process: there is no process group to all-reduce over"}
    entry = {key: value for key, value in benchmark.items() if key not in ("link", "links")}
    return {"measured": True, **entry, "fitted_link": _link_entry(benchmark["link"])}


def _link_entry(link):
    return {**dataclasses.asdict(link), "bandwidth_gb_per_s": link.bandwidth_bytes_per_s / BYTES_PER_GB}
