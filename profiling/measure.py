"""PerformanceProfiler: warm-up, repeated timed runs, a phase breakdown, memory, the all-reduce benchmark, and a
short torch.profiler trace of the optimizer step, written for TensorBoard's profiler plugin."""
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from profiling.allreduce_bench import benchmark_allreduce
from profiling.assemble import Measurements, assemble_profile
from profiling.comm_model import collectives_per_step, comm_split
from profiling.host_sharing import measure_host_effects
from profiling.report import check_profile_folder, default_output_dir
from profiling.run_time import measure_run_parts
from profiling.timing import HostCpuMeter, LapTimer, StepClock, barrier, gather_per_rank, reduce_over_ranks
from profiling.topology import resolve_plan
from profiling.workload import build_workload, optimizer_step
from training.assembly import replicates_the_head
from training.distributed.strategy import make_strategy
from training.loop.epochs import threads_for_the_step
from training.reporting.logger import GIB, read_memory, reset_peaks


class PerformanceProfiler:
    """Measures one configuration; args come from profiling.cli.parse_profiler_args(argv). run() returns the
    profile, the same dict on every rank; is_main and output_dir then say who writes it (report.write_profile)
    and where."""

    def __init__(self, args):
        self.args = args
        self.is_main = True
        self.output_dir = None

    def run(self):
        started, loaded = time.perf_counter(), list(sys.modules)
        args, strategy = self.args, make_strategy(self.args.run)
        self.is_main = strategy.is_main
        try:
            work = build_workload(args, strategy)
            # The strategy's start (a process group) belongs to the set-up, as in main.py's time line.
            work.set_up_s = time.perf_counter() - started - work.inputs_s
            self.output_dir = default_output_dir(args, strategy.world_size, work.precision)
            check_profile_folder(self.output_dir, args.trace)
            with threads_for_the_step(work.trainer):  # the step as main.py's epochs take it
                # What to predict, on how many ranks a node: CPU processes of the step's threads.
                plan = resolve_plan(args, strategy.device.type, strategy.world_size)
                reset_peaks(strategy.device)
                for _ in range(args.warmup_steps):
                    # Both variants warm up, so neither pays first-call costs (compilation, DDP set-up).
                    optimizer_step(work, sync_gradients=True)
                    if strategy.world_size > 1:
                        optimizer_step(work, sync_gradients=False)
                meter = HostCpuMeter()
                runs = [measured_run(work, args.steps) for _ in range(args.repeats)]
                host_load = meter.stop(strategy)
                memory = peak_memory(work)  # before the host-effects pass copies the model
                lone_samples_s = [value for run in runs for value in run.pop("step_samples_s")]
                # After the headline runs, so neighbours never disturb them.
                host_effects = measure_host_effects(work, args, timed_steps, lone_samples_s, plan) \
                    if strategy.world_size == 1 else None
                phases = phase_breakdown(work, args.phase_steps) if args.phase_steps else None
                run_parts = measure_run_parts(work, statistics.fmean(run["step_time_s"] for run in runs), loaded,
                                              replica_steps_s(work, plan.counts, args.steps),
                                              predicts_ranks=max(plan.counts) > 1)
            gradient_elements = work.gradient_bytes // 4  # all-reduced as fp32, like DDP's gradients
            compute_s = statistics.fmean(run["compute_step_time_s"] for run in runs)
            benchmark = benchmark_allreduce(strategy, gradient_elements, args.allreduce_iters,
                                            collective_gap_s(work, compute_s))
            trace_files = write_trace(work, self.output_dir / "trace") if args.trace else []
            return assemble_profile(args, work, Measurements(
                runs=runs, phases=phases, memory=memory, benchmark=benchmark, trace_files=trace_files,
                host_load=host_load, plan=plan, host_effects=host_effects, run_parts=run_parts))
        finally:
            work = None  # the wrapped model goes before its process group (strategy.close)
            strategy.close()


LONGEST_GAP_S = 0.02  # on the 2-core development machine slow calls grew no further past 15 ms of busy time


def collective_gap_s(work, compute_s):
    """Busy host time before each benchmarked collective: on CPU, the step's compute between two of the
    profiled strategy's collectives (capped); none on a GPU, whose host only queues the work."""
    strategy = work.strategy
    if strategy.device.type != "cpu" or strategy.world_size < 2:
        return 0.0
    calls = collectives_per_step(strategy.name, work.gradient_bytes, len(work.unit_bytes),
                                 getattr(strategy, "reshard_after_forward", True))
    return min(compute_s / calls, LONGEST_GAP_S)


def measured_run(work, steps):
    """One repeat: `steps` normal steps (T_step) and, with 2+ ranks, as many under no_sync (T_compute)."""
    with_comm = timed_steps(work, steps, sync_gradients=True)
    # One process has no all-reduce to skip.
    compute = timed_steps(work, steps, sync_gradients=False) if work.strategy.world_size > 1 else with_comm
    compute_s = compute_only_step_s(with_comm, compute)
    comm_s, ratio = comm_split(with_comm["step_time_s"], compute_s)
    return {**with_comm, "compute_step_time_s": compute_s, "comm_time_s": comm_s, "compute_to_comm_ratio": ratio}


def replica_steps_s(work, world_sizes, steps):
    """{N: seconds of one optimizer step on N batches at once} for each N > 1 of world_sizes, where a
    DDP run of these flags would train replicas of its head, each rank stepping the whole global
    batch (training.assembly.replicates_the_head); None elsewhere, or when the profile has 2+ ranks
    (its step is already theirs)."""
    if work.strategy.world_size > 1 or work.pool is None or not replicates_the_head(work.trainer.config, "adamw"):
        return None
    lone_batches, seconds = work.batches, {}
    try:
        for world_size in sorted({n for n in world_sizes if n > 1}):
            work.batches = _joined_batches(lone_batches, world_size)
            optimizer_step(work, sync_gradients=True)  # a new batch shape's first-call costs, untimed
            seconds[world_size] = timed_steps(work, steps, sync_gradients=True)["step_time_s"]
    finally:
        work.batches = lone_batches
    return seconds


def _joined_batches(batches, count):
    """Endless (signals, labels) of `count` consecutive batches joined: the global batch of `count` ranks."""
    while True:
        parts = [next(batches) for _ in range(count)]
        yield torch.cat([signals for signals, _ in parts]), torch.cat([labels for _, labels in parts])


def compute_only_step_s(with_comm, without_comm):
    """T_compute: the no_sync step with a normal step's optimizer update in place of its own. Under
    FSDP no_sync leaves the parameter shards without gradients, so the optimizer (and clipping) skip
    them: the raw no_sync step would count their work as communication. Under DDP the two updates
    are the same work and the swap changes nothing."""
    return without_comm["step_time_s"] + max(with_comm["optimizer_s"] - without_comm["optimizer_s"], 0.0)


def timed_steps(work, steps, sync_gradients):
    """The headline timing: no device synchronisation inside the loop, only the host's time
    waiting for the next batch is taken apart from the step."""
    strategy = work.strategy
    timer = LapTimer()
    clock = StepClock(strategy.device, strategy.synchronize)
    barrier(strategy)
    clock.start()
    timer.start()
    for _ in range(steps):
        optimizer_step(work, sync_gradients, timer)
        clock.tick()
    total_s, step_times_s = clock.finish()
    local = {"total_s": total_s, "min_s": min(step_times_s), "max_s": max(step_times_s),
             "median_s": statistics.median(step_times_s), "data_s": timer.totals_s.get("data", 0.0),
             "optimizer_s": timer.totals_s.get("optimizer", 0.0)}
    merged = reduce_over_ranks(strategy, local, {**dict.fromkeys(local, "max"), "min_s": "min"})
    step_s = merged["total_s"] / steps  # the slowest rank sets the pace of synchronous DDP
    return {"steps": steps, "step_time_s": step_s, "step_time_min_s": merged["min_s"],
            "step_time_max_s": merged["max_s"], "step_time_median_s": merged["median_s"],
            "samples_per_s": work.global_samples_per_step / step_s,
            "data_wait_share": merged["data_s"] / merged["total_s"],
            "optimizer_s": merged["optimizer_s"] / steps,  # host time of the update phase, per step
            "step_samples_s": step_times_s}  # this rank's own, for the straggler estimate


def phase_breakdown(work, steps):
    """Mean seconds per step of data, forward, backward, optimizer and all-reduce, in a pass of its own with a
    device synchronize at every phase boundary. With 2+ ranks, steps alternate between normal and no_sync:
    backward is taken from the no_sync steps (compute only), all-reduce is the extra backward time of the others."""
    strategy = work.strategy
    kinds = (True, False) if strategy.world_size > 1 else (True,)  # with the all-reduce; under no_sync
    steps = max(steps, len(kinds))  # at least one step of each kind
    timers = {kind: LapTimer(strategy.synchronize) for kind in kinds}
    barrier(strategy)
    for index in range(steps):
        with_comm = kinds[index % len(kinds)]
        timers[with_comm].start()
        optimizer_step(work, with_comm, timers[with_comm])
    per_step = [{phase: total / len(range(i, steps, len(kinds))) for phase, total in timers[kind].totals_s.items()}
                for i, kind in enumerate(kinds)]
    normal, local = per_step[0], per_step[-1]

    def mean(phase):  # over all the pass's steps, whichever kind they were
        return statistics.fmean(kind[phase] for kind in per_step)
    phases = {"data_s": mean("data"), "forward_s": mean("forward"), "backward_s": local["backward"],
              "optimizer_s": mean("optimizer"), "allreduce_s": max(normal["backward"] - local["backward"], 0.0)}
    merged = reduce_over_ranks(strategy, phases, dict.fromkeys(phases, "max"))
    return {"steps": steps, **merged}


def peak_memory(work):
    """Every rank's peak memory: CUDA allocator peaks since warm-up began, or on CPU
    the process's peak resident set size since it started (RSS, not a device figure)."""
    device = work.strategy.device
    if device.type == "cuda":
        fields = ("peak_allocated_gib", "peak_reserved_gib")
        values = [torch.cuda.max_memory_allocated(device) / GIB, torch.cuda.max_memory_reserved(device) / GIB]
        what = "CUDA allocator peaks per GPU since warm-up began"
    else:
        fields = ("peak_rss_gib",)
        values = [read_memory(device)[1]]
        what = "process peak RSS (resident set size, host memory) per rank since start, data included"
    rows = gather_per_rank(work.strategy, values)
    return {"what": what, "per_rank": [{"rank": rank, **dict(zip(fields, row, strict=True))}
                                       for rank, row in enumerate(rows)]}


# Skip one step, warm the profiler up for two, record three: enough to see a steady step
# while keeping the trace file small.
TRACE_SCHEDULE = {"wait": 1, "warmup": 2, "active": 3, "repeat": 1}


def write_trace(work, trace_dir):
    """Run the schedule's steps under torch.profiler; one *.pt.trace.json per rank in trace_dir.
    Returns the files this call wrote (all ranks' where they share trace_dir)."""
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if work.strategy.device.type == "cuda" else [])]
    handler = tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{work.strategy.rank}")
    steps = TRACE_SCHEDULE["wait"] + TRACE_SCHEDULE["warmup"] + TRACE_SCHEDULE["active"]
    pattern = "rank*.pt.trace.json*"
    before = set(trace_dir.glob(pattern))
    with profile(activities=activities, schedule=schedule(**TRACE_SCHEDULE), on_trace_ready=handler,
                 record_shapes=True, profile_memory=True) as profiler:
        for _ in range(steps):
            optimizer_step(work, sync_gradients=True)
            profiler.step()
    work.strategy.synchronize()
    barrier(work.strategy)  # every rank's file is written before any rank lists them
    return sorted(str(path) for path in set(trace_dir.glob(pattern)) - before)
