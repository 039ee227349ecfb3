"""What one process cannot see of N ranks on one host, measured from that one process.

- Neighbours: the other CPU processes of a rank's node, training the same step on the same cores,
  slow every rank's compute (shared cores, caches, memory bandwidth), and make its step time vary
  more. This host stands for every node: N ranks over several nodes meet a full node's neighbours.
  The slowdown is a ratio of runs taken in turn, neighbours paused and running (A B, B A, ...), so
  a machine that drifts between two measurements does not enter it.
- Stragglers: a synchronous DDP step lasts as long as the slowest rank's compute, the expected
  maximum of N draws from the per-step times, not their mean.
- Each strategy's own per-step cost (DDP, DDP with fp16 gradients, FSDP): hooks, buckets, sharded
  parameters and the calls into the backend, measured on a one-rank process group (which sends
  nothing).

`python -m profiling.host_sharing <profiler flags>` runs one neighbour (neighbour_main).
"""
import copy
import dataclasses
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from profiling.cli import parse_profiler_args
from profiling.comm_model import STRATEGIES
from profiling.entry_points import env_without_torchrun
from profiling.interleave import interleave, per_side
from profiling.timing import OTHER_CPU_WORRY, HostCpuMeter
from profiling.workload import build_workload, optimizer_step
from training.distributed.ddp import compression_hook, ddp_module
from training.distributed.fsdp import clip_sharded_grad_norm_, shard_model
from training.distributed.strategy import make_strategy
from training.loop.recipe import WeightAverage
from training.loop.step import build_adamw, skipped_steps


def host_rank_counts(world_sizes, device, ranks_per_node):
    """How many CPU processes would share one node for each N of world_sizes (N up to a full node,
    then a full node on each of the nodes the ranks fill): the counts whose neighbours to measure,
    on this host standing for every node. On a GPU each rank has its own device, so none."""
    if device.type != "cpu":
        return []
    return sorted({min(n, ranks_per_node) for n in world_sizes} - {1})


class Neighbours:
    """`count` neighbour processes running the profiled step while the block runs."""

    def __init__(self, profiler_argv, count, threads_per_rank):
        self.argv, self.count, self.threads = list(profiler_argv), count, threads_per_rank
        self.processes = []

    def __enter__(self):
        env = env_without_torchrun(OMP_NUM_THREADS=str(self.threads))
        for _ in range(self.count):
            self.processes.append(subprocess.Popen([sys.executable, "-m", "profiling.host_sharing", *self.argv],
                                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                                   env=env))
        for process in self.processes:
            line = process.stdout.readline()  # blocks until the neighbour has warmed up, or has died
            if line.strip() != READY:
                self.__exit__(None, None, None)
                raise RuntimeError("a neighbour process of the host-sharing measurement did not start")
        return self

    def cpu_s(self):
        """CPU seconds the neighbours have used so far (/proc; 0 where it cannot be read)."""
        total = 0.0
        for process in self.processes:
            try:
                fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
            except (OSError, ValueError, IndexError):
                pass
        return total

    def pause(self):
        """Stop the neighbours where they are (SIGSTOP), so the next run has the cores alone."""
        for process in self.processes:
            process.send_signal(signal.SIGSTOP)

    def resume(self):
        for process in self.processes:
            process.send_signal(signal.SIGCONT)

    def __exit__(self, *exc):
        for process in self.processes:
            process.send_signal(signal.SIGCONT)  # a stopped process would not act on SIGTERM
            process.terminate()
        for process in self.processes:
            process.wait()
        self.processes = []


READY = "READY"


def neighbour_main(argv):
    """A stand-in for another rank on the same host: builds the workload the profiler measures, warms
    it up, prints READY and then takes optimizer steps until it is terminated. It joins no process
    group: it only occupies the cores (and memory bandwidth) another rank would."""
    # Neighbours are stopped by SIGTERM; leaving through Python removes the workload's scratch --save-dir.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args = parse_profiler_args(argv)
    work = build_workload(args, make_strategy(args.run))
    for _ in range(args.warmup_steps):
        optimizer_step(work, sync_gradients=True)
    print(READY, flush=True)
    while True:
        optimizer_step(work, sync_gradients=True)


def measure_host_effects(work, args, timed_steps, lone_step_samples_s, plan):
    """For a 1-process profile: {"slowdown": {k: step time with k-1 neighbours / alone}, "shared": {k:
    step time with them}, for k ranks on a node, "straggler_s": {N: expected wait for the slowest of N
    ranks}, "wrapper_step_s": {strategy: its own cost per step}, "ranks_per_node", "other_cores": {k:
    cores other work kept busy in the pairs kept}, "what": how}."""
    threads = torch.get_num_threads()
    slowdown, shared, samples_by_n, others = {}, {}, {}, {}
    for n in host_rank_counts(plan.counts, work.strategy.device, plan.ranks_per_node):
        with Neighbours(args.command_line, n - 1, threads) as neighbours:
            pairs = quiet_pairs(sharing_pairs(work, args, timed_steps, neighbours))
        shared_runs = [with_them for _, with_them in pairs]
        slowdown[n] = statistics.median(with_them["step_time_s"] / alone["step_time_s"] for alone, with_them in pairs)
        shared[n] = statistics.fmean(run["step_time_s"] for run in shared_runs)
        samples_by_n[n] = [value for run in shared_runs for value in run["step_samples_s"]]
        others[n] = max(_busy(alone, with_them) for alone, with_them in pairs)
    stragglers = {}
    for n in plan.counts:
        if n > 1:  # each rank's steps as it takes them beside its node's neighbours
            samples = samples_by_n.get(min(n, plan.ranks_per_node), lone_step_samples_s)
            stragglers[n] = max(expected_maximum(samples, n) - statistics.fmean(samples), 0.0)
    wrappers_s = wrapper_step_costs_s(work, timed_steps, args.steps, args.repeats) or {}
    return {"slowdown": slowdown, "shared": shared, "straggler_s": stragglers, "ranks_per_node": plan.ranks_per_node,
            "other_cores": others, "ddp_step_s": wrappers_s.get("ddp", 0.0), "wrapper_step_s": wrappers_s,
            "what": f"slowdown = median over rounds of the step with k-1 neighbour processes on this host's cores "
                    f"/ the step with them paused, in turn, for k in {sorted(shared) or 'none'} ranks on a node of "
                    f"{plan.ranks_per_node} (on GPUs: none, each rank on its own device), from the rounds in which "
                    f"other work kept at most {OTHER_CPU_WORRY} cores busy where there are any; N ranks on several "
                    "nodes take a full node's; straggler = E[max of N per-step times] - mean; each strategy's own "
                    "per-step cost (DDP, DDP with fp16 gradients, FSDP) on a one-rank gloo group"}


def sharing_pairs(work, args, timed_steps, neighbours):
    """[(the step alone, the step beside the neighbours)] of each round, taken in turn, each timed run
    with the cores other work kept busy meanwhile ("other_cores")."""
    def steps_after(switch):
        def switched_then_timed(_round_index):
            switch()
            meter, neighbours_s = HostCpuMeter(), neighbours.cpu_s()
            run = timed_steps(work, args.steps, sync_gradients=True)
            return {**run, "other_cores": other_cores(meter, neighbours.cpu_s() - neighbours_s)}
        return switched_then_timed
    runs = per_side(interleave({"alone": steps_after(neighbours.pause), "shared": steps_after(neighbours.resume)},
                               args.repeats))
    return list(zip(runs["alone"], runs["shared"], strict=True))


def quiet_pairs(pairs):
    """The pairs during which other work kept at most OTHER_CPU_WORRY cores busy, or all of them where
    none was that quiet. Other work on a machine of few cores slows the run beside neighbours more than
    the one alone (which leaves it a core), so a busy round overstates what ranks on an idle node see."""
    return [pair for pair in pairs if _busy(*pair) <= OTHER_CPU_WORRY] or pairs


def _busy(alone, with_them):
    return max(alone["other_cores"] or 0.0, with_them["other_cores"] or 0.0)  # None off Linux


def other_cores(meter, neighbours_cpu_s):
    """Cores that processes other than this one and its neighbours kept busy since the meter started;
    None off Linux."""
    elapsed = meter.elapsed()
    if elapsed is None:
        return None
    machine_s, own_s, wall_s = elapsed
    return max(machine_s - own_s - neighbours_cpu_s, 0.0) / wall_s


def expected_maximum(samples, count):
    """E[max of `count` independent draws] from the empirical distribution of `samples`."""
    ordered = sorted(samples)
    n = len(ordered)
    return sum(value * (((i + 1) / n) ** count - (i / n) ** count) for i, value in enumerate(ordered))


WRAPPER_STEPS = 10  # the wrappers' own costs are per step: a few steps each tell them


def wrapper_step_costs_s(work, timed_steps, steps, repeats):
    """{strategy: seconds it adds to one optimizer step of this workload} on a one-rank gloo group,
    with nothing to send: DDP's hooks and bucket, the fp16 hook's casts, FSDP's hooks and DTensor
    bookkeeping. The median difference of alternating timed runs against the plain step; None where
    a process group already exists (a multi-process profile measures its own strategy directly)."""
    if dist.is_initialized():
        return None
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain = _twin(work, None)
        twins = {kind: _twin(work, kind) for kind in STRATEGIES}  # each strategy the advisor compares
        differences = {kind: [] for kind in STRATEGIES}
        for _ in range(repeats):
            for kind, twin in twins.items():
                plain_s = timed_steps(plain, min(steps, WRAPPER_STEPS), sync_gradients=True)["step_time_s"]
                wrapped_s = timed_steps(twin, min(steps, WRAPPER_STEPS), sync_gradients=True)["step_time_s"]
                differences[kind].append(wrapped_s - plain_s)
        return {kind: max(sorted(values)[len(values) // 2], 0.0) for kind, values in differences.items()}
    finally:
        dist.destroy_process_group()


def _twin(work, wrapper):
    """The workload's step on a copy of the model with its own optimizer (and average), wrapped as
    training wraps it for `wrapper` (None: plain); a constant LR, which does not change what a step costs."""
    model = copy.deepcopy(work.model)
    device, step = work.strategy.device, work.step
    strategy, train_model = step.strategy, model
    if wrapper in ("ddp", "ddp_fp16"):
        train_model = ddp_module(model, device)
        if wrapper == "ddp_fp16":
            train_model.register_comm_hook(*compression_hook("fp16"))
    elif wrapper == "fsdp":
        train_model = shard_model(model)
        strategy = copy.copy(strategy)  # the profiled run's, clipping as FSDP does (sharded gradients are DTensors)
        strategy.clip_grad_norm_ = clip_sharded_grad_norm_
    optimizer = build_adamw(model, float(step.optimizer.defaults["lr"]), step.optimizer.param_groups[0]["weight_decay"],
                            device)
    average = WeightAverage(copy.deepcopy(work.model), step.ema.decay, step.ema.fixed_buffers) if step.ema else None
    if average is not None:
        average.source = model
        if wrapper == "fsdp":
            shard_model(average.module)
    twin_step = dataclasses.replace(
        step, model=train_model, strategy=strategy, parameters=list(model.parameters()), optimizer=optimizer,
        scheduler=LambdaLR(optimizer, lambda _: 1.0), ema=average, record_graph=False,
        skips=None if step.skips is None else skipped_steps(model, step.precision, step.grad_scaler))
    twin = dataclasses.replace(work, model=model, step=twin_step)
    for _ in range(3):  # the twin's first-call costs (DDP's set-up, allocator growth) stay out of its timing
        optimizer_step(twin, sync_gradients=True)
    twin.strategy.synchronize()
    return twin


if __name__ == "__main__":
    sys.exit(neighbour_main(sys.argv[1:]))
