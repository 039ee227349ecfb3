"""What each step left (its stdout or its JSON), reduced to the numbers the page shows."""
import json
import re
import statistics
from pathlib import Path

TAIL_CHARS = 3000
CONFIGURATION_KEYS = ("model", "batch_size", "precision", "status", "samples_per_s", "samples_per_s_std",
                      "step_time_ms", "data_wait_share", "peak_allocated_gib", "peak_reserved_gib", "wall_s", "why")


def tail(text):
    return (text or "")[-TAIL_CHARS:]


def read_figures(step, stdout):
    if step.group == "tests":
        return parse_pytest(stdout)
    reader = {"profile": parse_throughput, "ddp_profile": parse_profile, "data_path": parse_data_path,
              "overhead": parse_overhead, "epoch": parse_epoch}[step.group]
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


def parse_epoch(text):
    """The epoch record main.py appended to metrics.jsonl."""
    record = json.loads(text.splitlines()[-1])
    return {key: record[key] for key in ("samples_per_s", "train_time_s", "epoch_time_s", "val_macro_f1")}
