"""The check's JSON as one markdown page: a table per group that ran, then what did not finish."""
from benchmarks.gpu_check.minirocket import WAYS
from benchmarks.gpu_check.plan import PRECISIONS
from benchmarks.gpu_check.targets import target_rows


def markdown_report(result):
    groups, counts = {}, {}
    for step in result["steps"]:
        groups.setdefault(step["group"], []).append(step)
        counts[step["status"]] = counts.get(step["status"], 0) + 1
    machine = result["machine"]
    lines = [f"# GPU check: {machine.get('gpu') or result['device']}, {result['started'][:10]}", "",
             f"torch {machine.get('torch')}, CUDA {machine.get('cuda')}, cuDNN {machine.get('cudnn')}, NCCL "
             f"{machine.get('nccl')}; {machine.get('gpu_count', 0)} GPU(s) of {machine.get('gpu_memory_gib')} GiB; "
             f"{machine.get('cpu_cores')} CPU cores ({machine.get('cpu') or 'model unknown'}); "
             f"commit {machine.get('commit')}; "
             f"{'quick' if result['quick'] else 'full'} check in {result['wall_s']:.0f} s "
             f"({', '.join(f'{n} {status}' for status, n in counts.items())})", ""]
    lines += table("Targets (the GPU issue's)", ["what", "figure", "target", "met"], target_rows(result["steps"]))
    lines += tests_section(groups.get("tests", []))
    for group, title, columns, rows, notes in TABLES:
        found = rows(groups.get(group, []))
        if found:  # groups that did not run, or left no figures, leave no empty table
            lines += table(title, columns, found) + (notes(groups[group]) if notes else [])
    return "\n".join(lines + problems_section(result["steps"])) + "\n"


def table(title, columns, rows):
    return [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows), ""]


def cell(step, key, form):
    """A figure of a step for a table, or the step's status when it left none."""
    figures = (step or {}).get("figures") or {}
    if figures.get(key) is None:
        status = (step or {}).get("status", "not run")
        return "n/a" if status == "ok" else status  # a finished step without this figure: a run from before it
    return format(figures[key], form)


def tests_section(steps):
    lines = ["## CUDA tests (`pytest -m cuda`)", ""] if steps else []
    for step in steps:
        figures = step.get("figures") or {}
        counts = figures.get("counts") or {}
        lines.append(", ".join(f"{n} {word}" for word, n in counts.items()) or f"no counts ({step['status']})")
        lines += [f"- `{line}`" for line in figures.get("failures", [])] + [""]
    return lines


def configurations(steps):
    return [entry for step in steps for entry in ((step.get("figures") or {}).get("configurations") or [])]


def matrix_cell(entry):
    """samples/s (peak allocated GiB / the timed steps' own peak) of one configuration, or its status
    when it has none; n/a: no CUDA allocator peak to read (a CPU run)."""
    if entry is None or entry.get("status") != "ok" or entry.get("samples_per_s") is None:
        return (entry or {}).get("status") or "not run"
    peaks = [entry.get(key) for key in ("peak_allocated_gib", "timed_peak_allocated_gib")]
    shown = " / ".join(format(peak, ".3f") for peak in peaks if peak is not None)
    eager = " eager: recording failed" if entry.get("graphs") and entry.get("step_graphed") is False else ""
    return f"{entry['samples_per_s']:,.0f} ({shown or 'n/a'}){eager}"


# The matrix's columns: each precision, and bf16 with the whole step replayed as one CUDA graph.
MATRIX_COLUMNS = (*PRECISIONS, "bf16 graphs")


def matrix_column(entry):
    return entry["precision"] + (" graphs" if entry.get("graphs") else "")


def matrix_rows(steps):
    """One row per (model, batch): samples/s and peak GiB under each precision, and graphed."""
    found = {(e["model"], e["batch_size"], matrix_column(e)): e for e in configurations(steps)}
    return [[model, batch, *(matrix_cell(found.get((model, batch, column))) for column in MATRIX_COLUMNS)]
            for model, batch in dict.fromkeys((m, b) for m, b, _ in found)]


def matrix_notes(steps):
    """Why each configuration without figures has none."""
    lines = [f"- {e['model']} bs{e['batch_size']} {matrix_column(e)}: {e['status']}: {e['why']}"
             for e in configurations(steps) if e.get("status") != "ok" and e.get("why")]
    return lines + [""] if lines else []


def minirocket_rows(steps):
    rates = {batch: ways for step in steps for batch, ways in ((step.get("figures") or {}).get("windows_per_s")
                                                               or {}).items()}
    return [[batch, *(format(ways[way], ",.0f") if way in ways else "not run" for way in WAYS)]
            for batch, ways in rates.items()]


def minirocket_notes(steps):
    return [f"Fit: {step['figures']['fit_s']:.2f} s (median of 3) for {step['figures']['features']:,} features."
            for step in steps if (step.get("figures") or {}).get("fit_s") is not None] + [
        f"{way} against the reference on 1,024 windows: {agreement['windows_equal_share']:.2%} of windows with "
        f"every feature equal, {agreement['features_differing_share']:.4%} of features differing."
        for step in steps for way, key in (("Fused kernel", "fused_agreement"),
                                           ("Fused kernel, shared sums", "shared_sums_agreement"))
        if (agreement := (step.get("figures") or {}).get(key))] + block_shape_notes(steps) + [""]


def block_shape_notes(steps):
    """A line per fused kernel: its windows/s alone in each block shape --block-shapes tried, fastest first."""
    rows = [row for step in steps for row in (step.get("figures") or {}).get("block_shapes") or []]
    lines = []
    for way in dict.fromkeys(row["way"] for row in rows):
        tried = sorted((row for row in rows if row["way"] == way), key=lambda row: -row["windows_per_s"])
        lines.append(f"{way} alone, by block shape (outputs a program x warps): " + ", ".join(
            f"{row['outputs_per_program']} x {row['warps']}: {row['windows_per_s']:,.0f}"
            f"{'' if row['same_counts'] else ' (counts differ)'}" for row in tried) + ".")
    return lines


def epoch_notes(steps):
    if not any((step.get("figures") or {}).get("set_up_s") is not None for step in steps):
        return []
    return ["From main.py's closing time line: start-up is the interpreter, the imports and the flags' checks; "
            "inputs the data and a checkpoint to resume; set-up the device, the model and its fit, and MiniRocket's "
            "features.", ""]


def per_step(*cells):
    """Rows of one step each: (figure key, format) pairs, or a function of the step for other cells."""
    return lambda steps: [[part(s) if callable(part) else cell(s, *part) for part in cells] for s in steps]


# (group, title, columns, rows of the group's steps, lines under the table), in the order of the page
TABLES = (
    ("profile", "Training-step throughput (benchmarks.gpu_check.throughput, one process, one GPU): "
                "samples/s (peak allocated GiB / of the timed steps alone)",
     ["model", "batch", *MATRIX_COLUMNS], matrix_rows, matrix_notes),
    ("minirocket", "MiniRocket's transform (benchmarks.gpu_check.minirocket): windows/s",
     ["batch", *WAYS], minirocket_rows, minirocket_notes),
    ("data_path", "Data path (benchmarks.data_path): device-resident against DataLoader",
     ["device samples/s", "DataLoader samples/s", "ratio (per round)", "bare iteration ratio"],
     per_step(("device_samples_per_s", ",.0f"), ("dataloader_samples_per_s", ",.0f"),
              lambda s: f"{cell(s, 'training_ratio', '.3f')} ({cell(s, 'training_paired_ratio', '.3f')})",
              ("iteration_ratio", ".3f")), None),
    ("ddp_profile", "DDP on the one GPU (profiler.py --multi-gpu ddp): one NCCL rank, two gloo ranks sharing it",
     ["model", "backend", "ranks", "samples/s", "step ms", "peak allocated GiB"],
     per_step(("model", "s"), ("backend", "s"), ("world_size", "d"), ("samples_per_s", ",.0f"),
              ("step_time_ms", ".2f"), ("peak_memory_gib", ".3f")), None),
    ("epoch", "One epoch end to end (main.py --epochs 1; UCI HAR's size, smaller with --quick)",
     ["process wall s", "start-up s", "inputs s", "set-up s", "epoch s", "training samples/s", "val macro-F1"],
     per_step(lambda s: f"{s['wall_s']:.1f}" if "wall_s" in s else s["status"], ("start_up_s", ".1f"),
              ("inputs_s", ".1f"), ("set_up_s", ".1f"), ("epoch_time_s", ".1f"), ("samples_per_s", ",.0f"),
              ("val_macro_f1", ".3f")), epoch_notes),
    ("trace", "One eager cnn1d step at batch 32 under torch.profiler (profiler.py --trace), per step",
     ["step ms", "device busy ms", "kernels", "CUDA runtime calls", "trace file"],
     per_step(("step_ms", ".2f"), ("device_busy_ms", ".2f"), ("kernels", ".0f"), ("runtime_calls", ".0f"),
              ("trace_file", "s")), None),
    ("overhead", "Trainer against a minimal loop (benchmarks.overhead)",
     ["batch", "compile", "trainer samples/s", "minimal samples/s", "ratio", "per-round ratio"],
     per_step(lambda s: s["params"]["batch_size"], lambda s: s["params"]["compile"],
              ("trainer_samples_per_s", ",.0f"), ("minimal_samples_per_s", ",.0f"), ("ratio", ".3f"),
              ("paired_ratio", ".3f")), None),
)


def problems_section(steps):
    unfinished = [step for step in steps if step["status"] != "ok"]
    if not unfinished:
        return ["Every step finished."]
    lines = table("Steps that did not finish", ["step", "status", "exit code", "why"],
                  [[s["name"], s["status"], s.get("returncode"), s.get("why", "")] for s in unfinished])
    for step in unfinished:
        if step.get("tail"):
            lines += [f"### {step['name']}", "", "```", step["tail"].rstrip(), "```", ""]
    return lines
