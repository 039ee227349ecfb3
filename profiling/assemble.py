"""The profile: runs summarised as mean +- std, the link behind the predictions, predictions, advice, notes."""
import dataclasses
import math

import torch
import torch.distributed as dist

from profiling.cli import ASSUMED_LINKS
from profiling.comm_model import (
    BYTES_PER_GB,
    BYTES_PER_MB,
    STRATEGIES,
    Link,
    ddp_bucket_count,
    predict_strategy,
    predict_world,
)
from profiling.recommend import Figures, recommendations
from profiling.report import number
from profiling.run_time import pool_entry, run_time_entry
from profiling.timing import mean_std

OTHER_CPU_WORRY = 0.1  # other processes' CPU-seconds per wall second that make timings suspect
RUN_KEYS = ("step_time_s", "step_time_min_s", "step_time_max_s", "step_time_median_s", "samples_per_s",
            "data_wait_share", "compute_step_time_s", "comm_time_s")


def assemble_profile(args, work, runs, phases, memory, benchmark, trace_files, host_load, host_effects=None,
                     run_parts=None):
    strategy = work.strategy
    timing = {key: _summary([run[key] for run in runs]) for key in RUN_KEYS}
    timing["compute_to_comm_ratio"] = _ratio_summary(runs, timing)
    link = choose_link(args, benchmark, strategy.device.type)
    compute_s = timing["compute_step_time_s"]["mean"]
    buckets = ddp_bucket_count(work.gradient_bytes)
    predictions = [predict_world(compute_s, work.gradient_bytes, n, link, buckets, host_effects=host_effects)
                   for n in args.predict_gpus]
    # A Link for every collective of STRATEGIES: measured with 2+ processes (unless a flag assumes the
    # bandwidth or latency), else the all-reduce link stands for all of them.
    assumed = args.assumed_bandwidth_gbps is not None or args.assumed_latency_us is not None
    links = benchmark["links"] if benchmark and not assumed else \
        dict.fromkeys(("allreduce", "allreduce_fp16", "all_gather", "reduce_scatter"), link)
    units = work.unit_bytes
    reshard = args.run.parallel.reshard_after_forward
    strategies = {name: [predict_strategy(name, compute_s, work.gradient_bytes, n, links, len(units), max(units),
                                          host_effects, reshard) for n in args.predict_gpus] for name in STRATEGIES}
    figures = Figures(compute_s, work.gradient_bytes, link, work.batch_size, work.precision.enabled,
                      timing["data_wait_share"]["mean"], backward_s=phases["backward_s"] if phases else None,
                      reference_gpus=4 if 4 in args.predict_gpus else max(args.predict_gpus),
                      host_effects=host_effects, strategies=strategies,
                      device_memory_bytes=torch.cuda.get_device_properties(strategy.device).total_memory
                      if strategy.device.type == "cuda" else None)
    return {
        "config": _config(args, work),
        "model": {"name": args.model, "parameters": work.num_parameters, "gradient_bytes": work.gradient_bytes,
                  "gradient_mb": work.gradient_bytes / BYTES_PER_MB,
                  "ddp_buckets": buckets, "fsdp_unit_bytes": units},
        "timing": timing,
        "epoch_time_s": work.steps_per_epoch * timing["step_time_s"]["mean"],
        "runs": runs,
        "phases": phases,
        "memory": memory,
        "allreduce_benchmark": _benchmark_entry(benchmark),
        "link": {"bandwidth_gb_per_s": link.bandwidth_bytes_per_s / BYTES_PER_GB, "latency_us": link.latency_s * 1e6,
                 "source": link.source},
        "host_effects": host_effects,
        "predictions": predictions,
        "strategies": strategies,
        "collective_links": {kind: _link_entry(value) for kind, value in links.items()},
        "recommendations": recommendations(figures, args.predict_gpus),
        "host_load": host_load,
        "trace_files": trace_files,
        "feature_pool": pool_entry(work.pool, strategy.rank),
        "run_time": run_time_entry(run_parts, work, predictions, link, host_effects) if run_parts else None,
        "notes": _notes(strategy, work, host_load),
    }


def choose_link(args, benchmark, device_type):
    """Bandwidth and latency for the predictions: a flag wins, then the benchmark, then the
    documented assumption for the device type; the source says which for each."""
    measured = benchmark["link"] if benchmark else None
    defaults = ASSUMED_LINKS[device_type]
    if args.assumed_bandwidth_gbps is not None:
        bandwidth, bandwidth_from = args.assumed_bandwidth_gbps * BYTES_PER_GB, "assumed (--assumed-bandwidth-gbps)"
    elif measured:
        bandwidth, bandwidth_from = measured.bandwidth_bytes_per_s, measured.source
    else:
        bandwidth = defaults["bandwidth_gbps"] * BYTES_PER_GB
        bandwidth_from = f"assumed (default for {device_type}; one process cannot measure it)"
    if args.assumed_latency_us is not None:
        latency_s, latency_from = args.assumed_latency_us * 1e-6, "assumed (--assumed-latency-us)"
    elif measured:
        latency_s, latency_from = measured.latency_s, measured.source
    else:
        latency_s, latency_from = defaults["latency_us"] * 1e-6, f"assumed (default for {device_type})"
    source = (f"{number(bandwidth / BYTES_PER_GB)} GB/s {bandwidth_from}, {latency_s * 1e6:.3g} us per ring step "
              f"{latency_from}")
    return Link(bandwidth, latency_s, source)


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
        "predictions: weak scaling (per-GPU batch fixed), step = each rank's step + ring all-reduce time, "
        "no overlap with backward assumed; speedup = N x T_step(1) / T_step(N) in global samples/s",
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
        notes.append("one process: no all-reduce runs, T_compute = T_step, and the all-reduce time in the "
                     "predictions comes from the bandwidth and latency stated under 'link'")
        notes.append("predictions for N ranks: each rank's step = (the lone step + the strategy's own per-step "
                     "cost) x the slowdown measured with N-1 neighbour processes on this host (CPU, where they fit "
                     "on its cores; else 1) + the expected wait for the slowest of N ranks, then + the "
                     "collectives (see 'host_effects')")
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
