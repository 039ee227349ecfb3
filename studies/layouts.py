"""The default on layouts a user could bring, against aeon's MiniRocket + ridge, and each end to end.

Every layout of studies/layout_windows.py is cut from the development recordings and written as an
.npz of windows. Then, in turn (A B, then B A the next round), two processes on the same cores:
`main.py --dataset npz --data-dir L.npz` with no other flag than --save-dir (and --description L.json
for a layout that comes with a description file, as a user would write one; --seed S when given), and
`studies.minirocket_baseline --dataset npz` (aeon, --threads jobs: give the core count, since main.py
takes every core). Each one's wall clock, test accuracy and worst person. With --seeds, round i runs
both sides at the i-th seed (main.py's --seed, aeon's kernel seed), so the table's accuracy is the mean
over seeds, the worst person the lowest over them, the wall clock the median; its last lines give the
mean gap over every set and the worst set's. Then the last round's
best.pt goes end to end: one test person's whole recording, written in the layout's channels and
rate, through predict.py, and the checkpoint through export.py (TorchScript and ONNX). A step that
fails is recorded with its command and its one-line error; the study goes on. The public sets aeon
ships (studies/public_sets.py, --public) are compared the same way; they hold windows only, so
their end to end is the export.

  python -m studies.layouts --json layouts.json
  python -m studies.layouts --layouts 20hz,one-person --rounds 2 --keep ../layouts-npz
  python -m studies.layouts --layouts device-names,device-names-described --public none --seed 1
  python -m studies.layouts --seeds 42,1,2 --json layouts.json
"""
import argparse
import csv
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from outputs.safety import check_out_file
from profiling.entry_points import REPO, at_least, comma_choices, entry_parser, json_file, write_json
from profiling.interleave import interleave, per_side
from profiling.timing import HostCpuMeter
from studies.layout_windows import LAYOUTS, cut_layout, read_recordings, write_recording
from studies.public_sets import PUBLIC_SETS, write_public_set
from training.entry_point import run_entry_point
from training.errors import UsageError

DEFAULT_RECORDINGS = "../shared/data/hapt-dev/hapt_dev_recordings.npz"  # run from the repository root
SIDES = ("ours", "aeon")
EXPORT_FORMATS = {"torchscript": "model.pt", "onnx": "model.onnx"}


def main(argv=None):
    parser = entry_parser("studies.layouts", __doc__)
    parser.add_argument("--recordings", default=DEFAULT_RECORDINGS, help="the development recordings archive")
    parser.add_argument("--layouts", type=comma_choices(("none", *LAYOUTS)), default=list(LAYOUTS),
                        help=f"comma-separated, from {', '.join(LAYOUTS)}, or none")
    parser.add_argument("--public", type=comma_choices(("none", *PUBLIC_SETS)), default=list(PUBLIC_SETS),
                        help=f"comma-separated public sets (aeon's own copies), from {', '.join(PUBLIC_SETS)}, "
                             "or none")
    parser.add_argument("--rounds", type=at_least(1), default=1, help="A B, then B A, ...")
    parser.add_argument("--threads", type=at_least(1), default=len(os.sched_getaffinity(0)),
                        help="aeon's jobs: the cores main.py takes")
    parser.add_argument("--seed", type=at_least(0), default=None,
                        help="main.py's --seed and aeon's kernel seed (default: each one's own, 42 and 0)")
    parser.add_argument("--seeds", type=seed_list, default=None,
                        help="comma-separated seeds, one round each (in place of --seed and --rounds)")
    parser.add_argument("--keep", help="write the layouts' files into this new or empty folder and keep them")
    parser.add_argument("--json", type=json_file, help="write the figures here")
    opts = parser.parse_args(argv)
    if opts.seeds is not None:
        if opts.seed is not None:
            raise UsageError("--seeds runs a round at each seed: give it or --seed, not both")
        opts.rounds = len(opts.seeds)
    if opts.json:  # an earlier figures file may be replaced; the recordings it reads may not
        check_out_file(opts.json, overwrite=True, reads=(opts.recordings,), flag="--json")
    if not Path(opts.recordings).is_file():
        raise UsageError(f"--recordings {opts.recordings} does not exist; see ../shared/data/hapt-dev/README.md")
    if opts.keep and Path(opts.keep).exists() and (not Path(opts.keep).is_dir() or any(Path(opts.keep).iterdir())):
        raise UsageError(f"--keep {opts.keep} exists and is not an empty folder; give a new one")
    recordings = read_recordings(opts.recordings)
    rows = []
    with tempfile.TemporaryDirectory(prefix="har-layouts-") as scratch:
        files = Path(opts.keep) if opts.keep else Path(scratch) / "files"
        files.mkdir(parents=True, exist_ok=True)
        for name in (name for name in opts.layouts if name != "none"):
            rows.append(study_layout(name, recordings, files, Path(scratch) / name, opts))
        for name in (name for name in opts.public if name != "none"):
            rows.append(study_public_set(name, files, Path(scratch) / name, opts))
    print(format_table(rows))
    write_json(opts.json, {"recordings": opts.recordings, "rounds": opts.rounds, "threads": opts.threads,
                           "seed": opts.seed, "seeds": opts.seeds, "layouts": rows})
    return 0


def study_layout(name, recordings, files, scratch, opts):
    """One layout: its windows and recording written, both sides timed in turn, then end to end."""
    layout = LAYOUTS[name]
    windows = cut_layout(recordings, layout)
    data, recording_file = files / f"{name}.npz", files / f"{name}-recording.npz"
    windows.save(data)
    description = None
    if layout.described:
        description = files / f"{name}.json"
        description.write_text(json.dumps(windows.description(), indent=1))
    subject = int(windows.subjects[windows.split == "test"][0])
    recording_name = min(key for key in recordings if int(key[1:3]) == subject)
    write_recording(recordings[recording_name], layout, recording_file)
    split = windows.split
    row = {"layout": name, "about": layout.about, "train_windows": int((split == "train").sum()),
           "test_windows": int((split == "test").sum()), "channels": len(layout.channel_names),
           "steps": layout.window_steps, "rate_hz": layout.rate_hz,
           "classes": len(set(windows.labels.tolist())),
           "test_classes": len(set(windows.labels[split == "test"].tolist())),
           "recording": f"{recording_name} (person {subject})"}
    return compared(row, data, recording_file, scratch, opts, description)


def study_public_set(name, files, scratch, opts):
    """One public set: its windows written, both sides timed in turn, then its export."""
    data = files / f"{name}.npz"
    train, test, channels, steps, classes, padded = write_public_set(name, data)
    about = "aeon's copy, its train/test split" + (", unequal lengths padded with NaN (aeon's side: with each "
                                                   "series' last value)" if padded else "")
    row = {"layout": name, "about": about, "train_windows": train, "test_windows": test, "channels": channels,
           "steps": steps, "rate_hz": None, "classes": classes, "test_classes": classes,
           "recording": "none (windows only)"}
    return compared(row, data, None, scratch, opts)


def compared(row, data, recording_file, scratch, opts, description=None):
    """`row` with both sides' rounds on the windows file `data` (main.py given its `description` file
    where there is one), in turn, and the last round's model end to end (through predict.py too where
    there is a `recording_file`)."""
    print(f"\n{row['layout']}: {row['about']}; {row['train_windows']} / {row['test_windows']} windows", flush=True)
    scratch.mkdir(parents=True)
    runners = {side: side_runner(side, data, scratch, opts, description) for side in SIDES}
    runs = per_side(interleave(runners, opts.rounds))
    row.update(runs)
    best = scratch / f"ours-{opts.rounds - 1}" / "best.pt"
    row["end_to_end"] = end_to_end(best, recording_file, scratch) if best.is_file() else \
        {"trained": {"ok": False, "command": runs["ours"][-1]["command"], "error": f"no {best.name}: training failed"}}
    return row


def seed_list(text):
    """--seeds: comma-separated whole numbers, each at least 0."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds such as 42,1,2, got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds of 0 or more, got {text!r}")
    return seeds


def side_runner(side, data, scratch, opts, description=None):
    """run(round) -> that round's figures of one side, each side a fresh process, at that round's seed
    of --seeds (or --seed in every round)."""
    def one_round(round_index):
        seed = opts.seeds[round_index] if getattr(opts, "seeds", None) else opts.seed
        seeded = seed is not None
        if side == "ours":
            folder = scratch / f"ours-{round_index}"
            command = [sys.executable, "main.py", "--dataset", "npz", "--data-dir", str(data), "--save-dir",
                       str(folder), *(["--description", str(description)] if description else []),
                       *(["--seed", str(seed)] if seeded else [])]
            report = folder / "test_report.json"
        else:
            report = scratch / f"aeon-{round_index}.json"
            command = [sys.executable, "-m", "studies.minirocket_baseline", "--dataset", "npz", "--data-dir",
                       str(data), "--threads", str(opts.threads), "--json", str(report),
                       *(["--kernel-seeds", str(seed)] if seeded else [])]
        result = {**run_step(command), "seed": seed}
        if result["ok"]:
            figures = json.loads(report.read_text())
            figures = figures if side == "ours" else figures["runs"][-1]
            worst = figures["worst_subject"]
            result.update(accuracy=figures["accuracy"], worst_subject=worst,
                          worst_accuracy=figures["per_subject"][worst]["accuracy"])
            said = f"accuracy {result['accuracy']:.4f}, worst person {worst} ({result['worst_accuracy']:.4f})"
        else:
            said = f"failed: {result['error']}"
        print(f"  round {round_index + 1}, {side}: {result['wall_s']:.1f} s, {said}; other processes "
              f"{result['other_cores']} cores", flush=True)
        return result
    return one_round


def run_step(command):
    """{'ok', 'wall_s', 'command', 'error', 'other_cores'} of one process run from the repository root;
    error is the last line it wrote to stderr (the entry points' one `error:` line) when it failed;
    other_cores the cores that processes other than this one and the step kept busy meanwhile (None
    off Linux): on a shared machine, what the wall clock also measured."""
    meter, children_s, started = HostCpuMeter(), children_cpu_s(), time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    elapsed = meter.elapsed()  # (machine busy CPU s, this process's CPU s, wall s)
    other = None if elapsed is None else \
        round(max(elapsed[0] - elapsed[1] - (children_cpu_s() - children_s), 0.0) / elapsed[2], 2)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    error = None if result.returncode == 0 else f"exit {result.returncode}: " + (lines[-1] if lines else "(no stderr)")
    shown = shlex.join(["python", *map(str, command[1:])])
    return {"ok": result.returncode == 0, "wall_s": round(wall_s, 2), "command": shown, "error": error,
            "other_cores": other}


def children_cpu_s():
    """CPU seconds of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def end_to_end(checkpoint, recording_file, scratch):
    """The recording (when there is one) through predict.py and the checkpoint through export.py, each
    step's outcome."""
    steps = {}
    out = scratch / "timeline"
    if recording_file is not None:
        steps["predict"] = run_step([sys.executable, "predict.py", "--checkpoint", str(checkpoint), "--recording",
                                     str(recording_file), "--out", str(out)])
    if steps.get("predict", {}).get("ok"):
        with open(out / "windows.csv", newline="") as handle:
            steps["predict"]["windows"] = sum(1 for _ in csv.reader(handle)) - 1  # less the header
        with open(out / "timeline.csv", newline="") as handle:
            steps["predict"]["segments"] = sum(1 for _ in csv.reader(handle)) - 1
    for form, file_name in EXPORT_FORMATS.items():
        steps[f"export {form}"] = run_step([sys.executable, "export.py", "--checkpoint", str(checkpoint), "--format",
                                            form, "--out", str(scratch / file_name)])
    for name, step in steps.items():
        print(f"  {name}: " + ("ok" if step["ok"] else f"failed: {step['error']}") + f" ({step['wall_s']:.1f} s)",
              flush=True)
    return steps


def median_of(runs, key):
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def side_figures(runs):
    """(accuracy, worst person text, wall s) over the rounds: the mean accuracy (rounds at one seed
    differ in time only), the lowest worst person of any round, the median wall clock."""
    done = [run for run in runs if run.get("accuracy") is not None]
    wall_s = median_of(runs, "wall_s")
    if not done:
        return None, "failed", wall_s
    worst = min(done, key=lambda run: run["worst_accuracy"])
    return statistics.mean(run["accuracy"] for run in done), \
        f"{worst['worst_accuracy']:.3f} ({worst['worst_subject']})", wall_s


def format_table(rows):
    """One line per layout, then what failed, command and error."""
    header = ("| layout | windows train/test | channels | steps (Hz) | classes (in test) | ours acc / worst / wall s "
              "| aeon acc / worst / wall s | ours - aeon (pts) | time ratio | end to end |")
    lines = [header, "|" + " --- |" * (header.count("|") - 1)]
    failures = []
    for row in rows:
        ours, aeon = side_figures(row["ours"]), side_figures(row["aeon"])
        gap = f"{100 * (ours[0] - aeon[0]):+.2f}" if ours[0] is not None and aeon[0] is not None else "-"
        ratio = f"{ours[2] / aeon[2]:.2f}" if ours[0] is not None and aeon[0] is not None else "-"
        steps = row["end_to_end"]
        ok = [name for name, step in steps.items() if step["ok"]]
        windows = steps.get("predict", {}).get("windows")
        e2e = "yes" if len(ok) == len(steps) else ("no: " + ", ".join(name for name in steps if name not in ok))
        e2e += f" ({windows} windows)" if windows is not None else ""
        lines.append(f"| {row['layout']} | {row['train_windows']}/{row['test_windows']} | {row['channels']} | "
                     f"{row['steps']} ({_rate(row)}) | {row['classes']} ({row['test_classes']}) | "
                     f"{_side_text(ours)} | {_side_text(aeon)} | {gap} | {ratio} | {e2e} |")
        for side in SIDES:
            failures += [(row["layout"], side, run) for run in row[side] if not run["ok"]]
        failures += [(row["layout"], name, step) for name, step in steps.items() if not step["ok"]]
    lines.append("")
    lines.append(gap_summary(rows))
    lines += [f"{row['layout']}: {row['about']}; recording {row['recording']}; cores other processes kept busy, "
              + ", ".join(f"{side} {_cores(row[side])}" for side in SIDES) for row in rows]
    for layout, what, step in failures:
        lines.append(f"FAILED {layout}, {what}: {step['command']}\n  {step['error']}")
    return "\n".join(lines)


def gap_summary(rows):
    """One line: ours less aeon in points, the mean over the sets both sides finished and the worst set."""
    gaps = {}
    for row in rows:
        ours, aeon = side_figures(row["ours"])[0], side_figures(row["aeon"])[0]
        if ours is not None and aeon is not None:
            gaps[row["layout"]] = 100 * (ours - aeon)
    if not gaps:
        return "ours - aeon: no set finished on both sides"
    worst = min(gaps, key=gaps.get)
    return (f"ours - aeon over {len(gaps)} set(s): mean {statistics.mean(gaps.values()):+.2f} points, worst "
            f"{gaps[worst]:+.2f} ({worst})")


def _rate(row):
    return "-" if row["rate_hz"] is None else f"{row['rate_hz']:g}"


def _cores(runs):
    return "/".join("?" if run.get("other_cores") is None else f"{run['other_cores']:.2f}" for run in runs)


def _side_text(figures):
    accuracy, worst, wall_s = figures
    accuracy_text = f"{accuracy:.4f}" if accuracy is not None else "-"
    return f"{accuracy_text} / {worst} / {wall_s:.1f}"


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
