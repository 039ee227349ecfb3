"""Rank-0 output (console lines, the tqdm bar, TensorBoard, metrics.jsonl; a no-op elsewhere), the
per-device memory figures it reports, and the closing line that says where a run's wall time went:
its inputs (the data, a checkpoint to resume), the set-up (the device, the model's fit, MiniRocket's
features), training, evaluation, the figures, and how far into its process the run started (the
interpreter, imports, checking the flags)."""
import json
import multiprocessing
import os
import re
import resource
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from outputs.safety import write_atomic
from training.entry_point import forked_by_torchrun

METRICS = "metrics.jsonl"  # one JSON line an epoch, in the run's folder


def _epoch_of(line):
    """The epoch a metrics.jsonl line records; 0 for one that is not a record (kept)."""
    try:
        record = json.loads(line)
    except ValueError:
        return 0
    return record.get("epoch", 0) if isinstance(record, dict) and isinstance(record.get("epoch"), int) else 0


class RunLogger:
    """Every write of a run goes through here, so `enabled=False` (ranks > 0) silences them all."""

    def __init__(self, save_dir, enabled):
        self.enabled = enabled
        self.save_dir = Path(save_dir)
        self._writer = None

    def info(self, message):
        if self.enabled:
            print(message, flush=True)

    def warn(self, message):
        if self.enabled:
            print(f"warning: {message}", file=sys.stderr, flush=True)

    def progress(self, total, description):
        # disable=None lets tqdm hide itself when stderr is not a terminal (CI logs, pipes).
        return tqdm(total=total, desc=description, leave=False, dynamic_ncols=True,
                    disable=None if self.enabled else True)

    def log_step(self, global_step, train_loss, lr):
        if self.enabled:
            self._tensorboard().add_scalar("train/loss_running", train_loss, global_step)
            self._tensorboard().add_scalar("train/lr", lr, global_step)

    def keep_epochs_up_to(self, epoch):
        """A resumed run goes on from its checkpoint's `epoch`: metrics.jsonl's lines of later epochs
        (a fallback to an older checkpoint, or --resume of an earlier step) are dropped, so that each
        epoch has one line. A line that is not JSON is kept as it is."""
        path = self.save_dir / METRICS
        if not self.enabled or not path.is_file():
            return
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _epoch_of(line) <= epoch]
        if len(kept) != len(lines):
            write_atomic(path, lambda partial: Path(partial).write_text("".join(kept)))

    def log_epoch(self, record, is_best):
        """Append one JSON line, write TensorBoard scalars and print the epoch summary."""
        if not self.enabled:
            return
        # A resumed run goes on with its lines; a fresh one's folder has none (an earlier run's moved aside).
        with open(self.save_dir / METRICS, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        writer, epoch = self._tensorboard(), record["epoch"]
        for key in ("train_loss", "val_loss", "val_acc", "val_macro_f1", "lr", "samples_per_s", "epoch_time_s"):
            if record[key] is not None:  # no validation figures under --val-fraction 0
                writer.add_scalar(f"epoch/{key}", record[key], epoch)
        for entry in record["memory"]:
            for key, value in entry.items():
                if key != "device":
                    writer.add_scalar(f"memory/{entry['device']}/{key}", value, epoch)
        writer.flush()
        validation = "no validation" if record["val_loss"] is None else (
            f"val loss {record['val_loss']:.4f} acc {record['val_acc']:.4f} F1 {record['val_macro_f1']:.4f}"
            f"{' *' if is_best else ''}")
        print(f"epoch {epoch}/{record['epochs']} | train loss {record['train_loss']:.4f} | {validation} | "
              f"lr {record['lr']:.2e} | {record['samples_per_s']:,.0f} samples/s | "
              f"{record['epoch_time_s']:.1f} s | {format_memory(record['memory'])}", flush=True)

    def write_json(self, name, payload):
        if self.enabled:
            with open(self.save_dir / name, "w") as handle:
                json.dump(payload, handle, indent=2)

    def close(self):
        if self._writer is not None:
            self._writer.close()

    def _tensorboard(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # slow import, only on rank 0
            self._writer = SummaryWriter(log_dir=str(self.save_dir / "logs"))
        return self._writer


# Memory figures of one device: CUDA allocator counters, or the process RSS on CPU.
GIB = 1024 ** 3
CUDA_FIELDS = ("allocated_gib", "peak_allocated_gib", "reserved_gib")
CPU_FIELDS = ("rss_gib", "peak_rss_gib")


def memory_fields(device):
    return CUDA_FIELDS if device.type == "cuda" else CPU_FIELDS


def read_memory(device):
    """Values in GiB, in the order of memory_fields(device). Peaks cover the process's life, or on
    CUDA the time since the last reset_peaks(device)."""
    if device.type == "cuda":
        return [torch.cuda.memory_allocated(device) / GIB, torch.cuda.max_memory_allocated(device) / GIB,
                torch.cuda.memory_reserved(device) / GIB]
    return [_current_rss_bytes() / GIB, _peak_rss_bytes() / GIB]


def reset_peaks(device):
    """Start a new peak window on a CUDA device (e.g. one per epoch), from the memory in use now.

    The CPU figure is getrusage's peak RSS, which no call can lower: it keeps covering the run."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def describe(label, fields, values):
    return {"device": label, **{name: round(value, 4) for name, value in zip(fields, values, strict=True)}}


# Up to this many devices the epoch line names each; beyond, it gives the largest and smallest (every
# device's figures stay in metrics.jsonl): sixteen GPUs listed one by one made a 600-character line.
LISTED_DEVICES = 4


def format_memory(entries):
    """One compact console fragment for all devices, e.g. 'cuda:0 0.10/0.31/0.50 GiB', or for many
    the extremes of the peak, e.g. 'peak RSS max 0.41 GiB (rank3:cpu), min 0.38 GiB (rank0:cpu) of 16'."""
    on_cuda = bool(entries) and "reserved_gib" in entries[0]
    if len(entries) > LISTED_DEVICES:
        peak = "peak_allocated_gib" if on_cuda else "peak_rss_gib"
        high, low = max(entries, key=lambda e: e[peak]), min(entries, key=lambda e: e[peak])
        name = "peak allocated" if on_cuda else "peak RSS"
        return (f"mem {name} max {high[peak]:.2f} GiB ({high['device']}), min {low[peak]:.2f} GiB "
                f"({low['device']}) of {len(entries)}")
    parts = []
    for entry in entries:
        if on_cuda:
            parts.append(f"{entry['device']} {entry['allocated_gib']:.2f}/{entry['peak_allocated_gib']:.2f}/"
                         f"{entry['reserved_gib']:.2f} GiB")
        else:
            parts.append(f"{entry['device']} peak RSS {entry['peak_rss_gib']:.2f} GiB")
    return "mem " + ", ".join(parts) + (" (alloc/peak/reserved)" if on_cuda else "")


def _peak_rss_bytes():
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _current_rss_bytes():
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()


# Where the run's time went

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
    Time the machine spent suspended counts too. A worker torchrun forked counts from its launcher's
    start, where the command's interpreter started and imported what the worker runs with."""
    process = multiprocessing.parent_process().pid if forked_by_torchrun() else "self"
    try:
        # Field 22 of /proc/<pid>/stat, counted after the command name's closing parenthesis (the name
        # may hold spaces): the 20th field from there.
        started_ticks = int(Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime_s - started_ticks / os.sysconf("SC_CLK_TCK"))
