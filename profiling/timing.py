"""Clocks and statistics: per-step times without stalling the device, rank reductions, mean and std, and the
CPU time taken by other processes during a measurement: the sign that shared cores skewed it."""
import os
import resource
import statistics
import time

import torch


class StepClock:
    """Per-step wall times of a loop. On CUDA they come from events recorded on the stream, so
    the host never waits inside the loop (waiting would hide the overlap of host and device);
    on CPU they come from perf_counter."""

    def __init__(self, device, synchronize):
        self.use_events = device.type == "cuda"
        self.synchronize = synchronize

    def start(self):
        self.synchronize()
        self._start_s = time.perf_counter()
        self._marks = [self._mark()]

    def tick(self):
        self._marks.append(self._mark())

    def finish(self):
        """(total seconds, [seconds of each step]); waits for the device once, here."""
        self.synchronize()
        total_s = time.perf_counter() - self._start_s
        pairs = zip(self._marks, self._marks[1:], strict=False)
        if self.use_events:
            return total_s, [begin.elapsed_time(end) / 1e3 for begin, end in pairs]
        return total_s, [end - begin for begin, end in pairs]

    def _mark(self):
        if not self.use_events:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event


class LapTimer:
    """Host time between consecutive lap() calls, summed per phase name. With a synchronize
    function it first waits for the device, so each lap covers the device work of its phase."""

    def __init__(self, synchronize=None):
        self.synchronize = synchronize
        self.totals_s = {}
        self._last = None

    def start(self):
        if self.synchronize:
            self.synchronize()
        self._last = time.perf_counter()

    def lap(self, phase):
        if self.synchronize:
            self.synchronize()
        now = time.perf_counter()
        self.totals_s[phase] = self.totals_s.get(phase, 0.0) + now - self._last
        self._last = now




def reduce_over_ranks(strategy, values, how):
    """{name: value} combined over ranks by how[name] in ("max", "min", "mean"); one process
    returns its own values."""
    rows = gather_per_rank(strategy, [float(value) for value in values.values()])
    combine = {"max": max, "min": min, "mean": statistics.fmean}
    return {name: combine[how[name]](row[i] for row in rows) for i, name in enumerate(values)}


def gather_per_rank(strategy, values):
    """Every rank's list of floats, in rank order, on every rank (a sum of one-hot slots)."""
    slots = torch.zeros(strategy.world_size, len(values), dtype=torch.float64, device=strategy.device)
    slots[strategy.rank] = torch.tensor(values, dtype=torch.float64)
    return strategy.sum_over_ranks(slots).tolist()


def barrier(strategy):
    """Line the ranks up before a timed section (any collective waits for every rank)."""
    strategy.max_over_ranks(torch.zeros(1, device=strategy.device))


def mean_std(values):
    """Mean and sample standard deviation (n-1); std is 0 for a single value."""
    values = list(values)
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


OTHER_CPU_WORRY = 0.1  # other processes' busy cores (CPU-seconds per wall second) that make timings suspect
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal in /proc/stat's cpu line


class HostCpuMeter:
    """Machine-wide busy CPU seconds (/proc/stat) against this process's own (getrusage) since the
    meter was made. Linux only; elsewhere it reports nothing."""

    def __init__(self):
        self.start = _readings()

    def elapsed(self):
        """(machine busy CPU-s, own CPU-s, wall s) since the start; None off Linux."""
        now = _readings()
        if now[0] is None or self.start[0] is None:
            return None
        return tuple(later - then for later, then in zip(now, self.start, strict=True))

    def other_cores(self):
        """Cores other processes kept busy, on average since the start; None off Linux."""
        elapsed = self.elapsed()
        return None if elapsed is None else max(elapsed[0] - elapsed[1], 0.0) / elapsed[2]

    def stop(self, strategy):
        """Seconds of CPU the other processes used, summed over this node's ranks; None off Linux."""
        elapsed = self.elapsed()
        if elapsed is None:
            return None
        machine_s, own_s, wall_s = elapsed
        # Every rank sees the same machine; their own times add up (single node assumed).
        merged = reduce_over_ranks(strategy, {"machine": machine_s, "own": own_s, "wall": wall_s},
                                   {"machine": "max", "own": "mean", "wall": "max"})
        ranks_own_s = merged["own"] * strategy.world_size
        return {"wall_s": merged["wall"], "cores": os.cpu_count(), "machine_busy_cpu_s": merged["machine"],
                "profiler_cpu_s": ranks_own_s, "other_processes_cpu_s": max(merged["machine"] - ranks_own_s, 0.0)}


def _readings():
    """(machine busy CPU-s, None off Linux; this process's CPU-s; wall s)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()[1:]
        machine_s = sum(int(fields[i]) for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        machine_s = None
    return machine_s, usage.ru_utime + usage.ru_stime, time.perf_counter()
