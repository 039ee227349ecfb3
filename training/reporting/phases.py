"""Where a run's wall time went, said in one line at its end: a slow run then shows whether the
time went to its inputs (the data, a checkpoint to resume), the set-up (the device, the model's fit,
MiniRocket's features), training, evaluation, the figures, or what came before the run started
(the interpreter, imports, checking the flags)."""
import os
import re
import time
from pathlib import Path

LINE_START = "time: "
# A run's first two laps; the GPU check reads them by these names.
INPUTS_LAP = "inputs (data, checkpoint)"
SET_UP_LAP = "set-up (device, model, features)"
AGE_TEXT = "; the run started "
AGE_UNIT = " s into its process"
START_UP = "start-up"  # read_time_line's key for how far into its process the run started


class PhaseClock:
    """Laps of a run, each named when it ends, and how far into its process the run started (a
    cross-validation trains its folds one after another in one process)."""

    def __init__(self):
        self.laps = []  # (name, seconds)
        self.started_at_s = process_age_s()
        self._last = time.perf_counter()

    def lap(self, name):
        now = time.perf_counter()
        self.laps.append((name, now - self._last))
        self._last = now

    def line(self):
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.laps)
        tail = f"{AGE_TEXT}{self.started_at_s:.1f}{AGE_UNIT}" if self.started_at_s is not None else ""
        return f"{LINE_START}{parts}{tail}"


def read_time_line(output):
    """The laps of the last time line in a run's output, {name: seconds} in their order, with how far
    into its process the run started under "start-up" where the line gives it; {} when there is none."""
    lines = [line for line in output.splitlines() if line.startswith(LINE_START)]
    if not lines:
        return {}
    laps, _, age = lines[-1][len(LINE_START):].partition(AGE_TEXT)
    # A name may hold commas inside its parentheses: "set-up (device, model, features) 8.9 s".
    found = {name: float(value) for name, value in re.findall(r"([a-z-]+(?: \([^)]*\))?) (\d+\.\d+) s", laps)}
    if age:
        found[START_UP] = float(age.removesuffix(AGE_UNIT))
    return found


def process_age_s():
    """Seconds since this process started, from Linux's /proc (the kernel's start time of the process
    against the time since boot, both in clock ticks' resolution); None where there is no /proc.
    Time the machine spent suspended counts too."""
    try:
        # Field 22 of /proc/self/stat, counted after the command name's closing parenthesis (the name
        # may hold spaces): the 20th field from there.
        started_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime_s - started_ticks / os.sysconf("SC_CLK_TCK"))
