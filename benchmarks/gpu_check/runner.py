"""Running the plan: each step in its time budget and its own process group, stopped with all it started;
then what each step left (its stdout or its JSON), reduced to the numbers the page shows."""
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks.gpu_check.plan import STEP_LIMIT_S
from profiling.entry_points import REPO, descendants, env_without_torchrun
from training.reporting.logger import INPUTS_LAP, SET_UP_LAP, START_UP, read_time_line

MIN_STEP_S = 5.0  # less than this left: the step is skipped, not started to be killed
GRACE_S = 10.0  # after SIGTERM, for torchrun to pass it on and a trainer to save, before SIGKILL
FIGURE_ERRORS = (OSError, ValueError, KeyError, TypeError, IndexError)
TAIL_CHARS = 3000
CONFIGURATION_KEYS = ("model", "batch_size", "precision", "status", "samples_per_s", "samples_per_s_std",
                      "step_time_ms", "data_wait_share", "peak_allocated_gib", "peak_reserved_gib",
                      "timed_peak_allocated_gib", "wall_s", "why", "graphs", "step_graphed")


class Budget:
    """The check's deadline and each group's share of it; a group's unused time passes on."""

    def __init__(self, shares, total_s, clock=time.monotonic):
        self.shares, self.clock = shares, clock
        self.deadline = clock() + total_s
        self.group, self.group_end = None, None

    def limit_for(self, group):
        """Seconds the next step of `group` may take."""
        now = self.clock()
        if group != self.group:
            spare = max(0.0, self.group_end - now) if self.group_end is not None else 0.0
            self.group, self.group_end = group, now + self.shares.get(group, 0.0) + spare
        return min(self.group_end, self.deadline) - now


def run_command(command, timeout_s, env=None):
    """(outcome, stdout) of one command from the repository root; a command over its time is
    stopped together with everything it started."""
    started = time.monotonic()
    try:
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=env, start_new_session=True)
    except OSError as exc:
        return {"status": "failed", "returncode": None, "wall_s": 0.0, "tail": str(exc)}, ""
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except BaseException as exc:  # a timeout, or Ctrl-C: stop the whole family first
        stop(process)
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        try:
            stdout, stderr = process.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:  # something we could not see still holds the pipes
            stdout, stderr = "", "(no output: a process it started still holds its pipes)"
        return {"status": "timeout", "returncode": None, "wall_s": time.monotonic() - started,
                "timeout_s": round(timeout_s, 1), "tail": tail(stderr or stdout)}, stdout
    outcome = {"status": "ok" if process.returncode == 0 else "failed", "returncode": process.returncode,
               "wall_s": time.monotonic() - started}
    if process.returncode != 0:
        outcome["tail"] = tail(stderr if stderr.strip() else stdout)
    return outcome, stdout


def stop(process):
    """SIGTERM to the command's process group, then after GRACE_S SIGKILL to it and to every process
    below it: torchrun starts its workers in sessions of their own, out of the group's reach."""
    family = descendants(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=GRACE_S)
    family += [pid for pid in descendants(process.pid) if pid not in family]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in family:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def step_record(step, **outcome):
    return {"name": step.name, "group": step.group, "params": step.params, "command": step.shell_command(),
            **outcome}


def run_step(step, budget, device):
    """One step's record: what ran, how it ended, and the figures it left."""
    record = step_record(step)
    if step.cuda_only and device != "cuda":
        return {**record, "status": "skipped", "why": "needs CUDA"}
    limit_s = min(budget.limit_for(step.group), STEP_LIMIT_S.get(step.group, float("inf")))
    if limit_s < MIN_STEP_S:
        return {**record, "status": "skipped", "why": "time budget spent"}
    outcome, stdout = run_command(step.command, limit_s, step_env(step))
    record.update(outcome)
    if outcome["status"] == "ok" or (step.group == "tests" and stdout):  # failed tests still have counts
        try:
            record["figures"] = read_figures(step, stdout)
        except FIGURE_ERRORS as exc:
            record.update(status="failed", tail=f"no figures: {type(exc).__name__}: {exc}")
    elif step.partial and step.output is not None and Path(step.output).exists():
        # What it measured before it failed or ran out of time; the step keeps its status.
        with contextlib.suppress(*FIGURE_ERRORS):
            record["figures"] = read_figures(step, stdout)
    return record


def step_env(step):
    """The check's environment without torchrun's variables, with the step's own set or removed."""
    env = env_without_torchrun()
    for name, value in step.env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def run_plan(plan, budget, device):
    records = []
    for index, step in enumerate(plan, start=1):
        try:
            record = run_step(step, budget, device)
        except KeyboardInterrupt:
            records += [step_record(s, status="skipped", why="interrupted") for s in plan[index - 1:]]
            break
        records.append(record)
        wall = f" in {record['wall_s']:.1f} s" if "wall_s" in record else f" ({record.get('why')})"
        print(f"[{index}/{len(plan)}] {step.name}: {record['status']}{wall}", flush=True)
    return records


def tail(text):
    return (text or "")[-TAIL_CHARS:]


def read_figures(step, stdout):
    if step.group == "tests":
        return parse_pytest(stdout)
    if step.group == "epoch":
        return parse_epoch(Path(step.output).read_text(), stdout)
    if step.group == "cold_start":
        return {"laps": read_time_line(stdout)}  # the process's wall seconds are the record's
    reader = {"profile": parse_throughput, "minirocket": parse_minirocket, "ddp_profile": parse_profile,
              "data_path": parse_data_path, "trace": parse_trace, "overhead": parse_overhead}[step.group]
    return reader(Path(step.output).read_text())


def parse_pytest(stdout):
    """Counts from pytest's last summary line, the FAILED / ERROR lines of -ra, and the output's tail."""
    counts = {}
    lines = [line for line in stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)", line)]
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)",
                                   lines[-1] if lines else ""):
        counts["errors" if word.startswith("error") else word] = int(number)
    failures = [line for line in stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return {"counts": counts, "failures": failures, "tail": tail(stdout) if failures else ""}


def parse_throughput(text):
    """benchmarks.gpu_check.throughput --json: one entry per configuration, measured or not."""
    matrix = json.loads(text)
    return {"finished": matrix["finished"],
            "configurations": [{key: entry.get(key) for key in CONFIGURATION_KEYS}
                               for entry in matrix["configurations"]]}


def parse_profile(text):
    """The headline figures of profiler.py's profile.json (inf and NaN are null there)."""
    profile = json.loads(text)
    timing, config, ranks = profile["timing"], profile["config"], profile["memory"]["per_rank"]
    peaks = [rank.get("peak_allocated_gib", rank.get("peak_rss_gib")) for rank in ranks]
    return {"samples_per_s": timing["samples_per_s"]["mean"], "samples_per_s_std": timing["samples_per_s"]["std"],
            "step_time_ms": timing["step_time_s"]["mean"] * 1e3, "data_wait_share": timing["data_wait_share"]["mean"],
            "peak_memory_gib": max(peaks), "memory_kind": "allocated" if "peak_allocated_gib" in ranks[0] else "rss",
            "peak_reserved_gib": max((rank.get("peak_reserved_gib") or 0.0) for rank in ranks),
            "model": config["model"], "batch_size": config["batch_size"], "precision": config["precision"],
            "world_size": config["world_size"], "backend": config["backend"]}


def parse_minirocket(text):
    """benchmarks.gpu_check.minirocket --json: windows/s per batch size and way, the fit's median seconds,
    each fused kernel's agreement with the reference, and the block shapes timed (--block-shapes)."""
    figures = json.loads(text)
    return {"windows_per_s": figures["windows_per_s"], "fit_s": statistics.median(figures["fit_s"]),
            "features": figures["features"], "fused_agreement": figures.get("fused_agreement"),
            "shared_sums_agreement": figures.get("shared_sums_agreement"),
            "block_shapes": figures.get("block_shapes") or []}


# Where a device's time goes in a torch.profiler trace: its kernels and copies, and the host's calls
# into the CUDA runtime and driver that start them.
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CALLS = ("cuda_runtime", "cuda_driver")


def parse_trace(text):
    """The trace that profiler.py --trace wrote beside its profile.json, per recorded step: its wall
    time, the device's busy time (kernels and copies, summed), kernels and runtime calls."""
    profile = json.loads(text)
    (path, *_) = profile["trace_files"]
    events = json.loads(Path(path).read_text())["traceEvents"]
    steps = [event["dur"] for event in events if str(event.get("name", "")).startswith("ProfilerStep#")]
    per_step = len(steps) or 1
    busy_us = sum(event.get("dur", 0) for event in events if event.get("cat") in DEVICE_WORK)
    return {"step_ms": statistics.mean(steps) / 1e3 if steps else None,
            "device_busy_ms": busy_us / per_step / 1e3,
            "kernels": sum(event.get("cat") == "kernel" for event in events) / per_step,
            "runtime_calls": sum(event.get("cat") in RUNTIME_CALLS for event in events) / per_step,
            "steps": len(steps), "trace_file": path}


def parse_overhead(text):
    """benchmarks.overhead --json: trainer against the minimal loop."""
    figures = json.loads(text)
    rates = figures["rates"]
    return {"ratio": figures["ratio"], "paired_ratio": figures["paired_ratio"], "rounds": len(rates["trainer"]),
            "trainer_samples_per_s": statistics.median(rates["trainer"]),
            "minimal_samples_per_s": statistics.median(rates["minimal"])}


def parse_data_path(text):
    """benchmarks.data_path --json: the device-resident path against the DataLoader."""
    figures = json.loads(text)
    training, iteration = figures["training"], figures["iteration"]
    return {"device_samples_per_s": statistics.median(training["rates"]["device"]),
            "dataloader_samples_per_s": statistics.median(training["rates"]["dataloader"]),
            "training_ratio": training["ratio"], "training_paired_ratio": training["paired_ratio"],
            "device_batches_per_s": statistics.median(iteration["rates"]["device"]),
            "dataloader_batches_per_s": statistics.median(iteration["rates"]["dataloader"]),
            "iteration_ratio": iteration["ratio"]}


def parse_epoch(text, stdout=""):
    """The epoch record main.py appended to metrics.jsonl, and from its output where the run's time
    went: its start-up (how far into the process the run started), inputs and set-up."""
    record = json.loads(text.splitlines()[-1])
    figures = {key: record[key] for key in ("samples_per_s", "train_time_s", "epoch_time_s", "val_macro_f1")}
    laps = read_time_line(stdout)
    figures.update(start_up_s=laps.get(START_UP), inputs_s=laps.get(INPUTS_LAP), set_up_s=laps.get(SET_UP_LAP))
    return figures
