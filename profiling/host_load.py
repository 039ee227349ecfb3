"""CPU time taken by other processes during a measurement: the sign that shared cores skewed it."""
import os
import resource
import time

from profiling.timing import reduce_over_ranks

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal in /proc/stat's cpu line


class HostCpuMeter:
    """Machine-wide busy CPU seconds (/proc/stat) against this process's own (getrusage) over
    an interval. Linux only; elsewhere it reports nothing."""

    def __init__(self):
        self._start = None

    def start(self):
        self._start = (machine_busy_cpu_s(), own_cpu_s(), time.perf_counter())

    def stop(self, strategy):
        """Seconds of CPU the other processes used, summed over this node's ranks; None off Linux."""
        if self._start is None or self._start[0] is None:
            return None
        now = (machine_busy_cpu_s(), own_cpu_s(), time.perf_counter())
        machine_s, own_s, wall_s = (later - then for later, then in zip(now, self._start, strict=True))
        # Every rank sees the same machine; their own times add up (single node assumed).
        merged = reduce_over_ranks(strategy, {"machine": machine_s, "own": own_s, "wall": wall_s},
                                   {"machine": "max", "own": "mean", "wall": "max"})
        ranks_own_s = merged["own"] * strategy.world_size
        return {"wall_s": merged["wall"], "cores": os.cpu_count(), "machine_busy_cpu_s": merged["machine"],
                "profiler_cpu_s": ranks_own_s, "other_processes_cpu_s": max(merged["machine"] - ranks_own_s, 0.0)}


def machine_busy_cpu_s():
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()[1:]
        return sum(int(fields[i]) for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def own_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
