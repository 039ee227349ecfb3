"""CPU time taken by other processes during a measurement: the sign that shared cores skewed it."""
import os
import resource
import time

from profiling.timing import reduce_over_ranks

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
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return machine_busy_cpu_s(), usage.ru_utime + usage.ru_stime, time.perf_counter()


def machine_busy_cpu_s():
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()[1:]
        return sum(int(fields[i]) for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
