"""Where a profile goes: profile.json, two CSV summaries, and the console summary printed by rank 0."""
import csv
import json
import math
from pathlib import Path

from outputs.safety import check_output_folder, make_folder
from profiling.topology import plural, unit_of

PROFILE_JSON = "profile.json"
DEFAULT_ROOT = Path("profiles")


def default_output_dir(args, world_size, precision):
    """--output-dir, else profiles/<model>_bs<batch>_<N>x<device>[_<precision>][_accum<k>]."""
    if args.output_dir:
        return Path(args.output_dir)
    device = "cuda" if precision.device_type == "cuda" else "cpu"
    name = f"{args.model}_bs{args.batch_size}_{world_size}x{device}"
    if precision.enabled:
        name += f"_{precision.dtype_name}"
    if args.grad_accum_steps > 1:
        name += f"_accum{args.grad_accum_steps}"
    return DEFAULT_ROOT / name


PROFILE_FILES = (PROFILE_JSON, "profile_summary.csv", "profile_runs.csv")


def check_profile_folder(output_dir, trace):
    """Refuse, before the measurement, a profile folder that cannot be written, or where a profile's
    file (or --trace's folder) is held by something else: found only once it is written otherwise."""
    check_output_folder(output_dir, "--output-dir", files=PROFILE_FILES, folders=("trace",) if trace else (),
                        writer="the profile")


def write_profile(profile, output_dir):
    """Write profile.json (everything), profile_summary.csv (metric, mean, std, unit) and
    profile_runs.csv (one row per repeat); returns the paths."""
    output_dir = Path(output_dir)
    make_folder(output_dir, "--output-dir")
    paths = [output_dir / name for name in PROFILE_FILES]
    paths[0].write_text(json.dumps(json_ready(profile), indent=2, allow_nan=False) + "\n")
    runs = [[index, *map(csv_cell, run.values())] for index, run in enumerate(profile["runs"], start=1)]
    for path, rows in ((paths[1], [["metric", "mean", "std", "unit"], *summary_rows(profile)]),
                       (paths[2], [["run", *profile["runs"][0]], *runs])):
        with open(path, "w", newline="") as handle:
            csv.writer(handle).writerows(rows)
    return paths


def json_ready(value):
    """Infinite or NaN floats become null (strict JSON has no inf); paths become strings."""
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def summary_rows(profile):
    units = {"samples_per_s": "samples/s", "data_wait_share": "fraction", "compute_to_comm_ratio": "ratio"}
    rows = [[name, csv_cell(stat["mean"]), csv_cell(stat["std"]), units.get(name, "s")]
            for name, stat in profile["timing"].items()]
    single = [("epoch_time_s", profile["epoch_time_s"], "s")]  # (metric, value, unit) of the rows without a std
    single += [(f"phase_{name}", value, "s") for name, value in (profile["phases"] or {}).items() if name != "steps"]
    single += [(f"rank{entry['rank']}_{name}", value, "GiB") for entry in profile["memory"]["per_rank"]
               for name, value in entry.items() if name != "rank"]
    single += [("parameters", profile["model"]["parameters"], "count"),
               ("gradient_bytes", profile["model"]["gradient_bytes"], "bytes"),
               ("link_bandwidth_gb_per_s", profile["link"]["bandwidth_gb_per_s"], "GB/s"),
               ("link_latency_us", profile["link"]["latency_us"], "us per ring step")]
    benchmark = profile["allreduce_benchmark"]
    if benchmark["measured"]:
        single += [("allreduce_time_s", benchmark["time_s"], "s"),
                   ("allreduce_bus_bandwidth_gb_per_s", benchmark["bus_bandwidth_gb_per_s"], "GB/s")]
    if profile.get("feature_pool"):
        single += [("feature_pool_build_s", profile["feature_pool"]["seconds"], "s"),
                   ("feature_pool_windows_per_s", profile["feature_pool"]["windows_per_s"], "windows/s"),
                   ("feature_pool_bytes", profile["feature_pool"]["bytes"], "bytes")]
    ranks = "gpu" if _unit(profile) == "GPU" else "proc"  # what N counts: GPUs, or CPU processes
    for p in (profile.get("run_time") or {}).get("predictions", []):
        single.append((f"predicted_run_s_{p['world_size']}{ranks}", p["total_s"], "s"))
    for p in profile["predictions"]:
        n, basis = p["world_size"], p.get("basis", "predicted")
        single += [(f"{basis}_step_time_s_{n}{ranks}", p["step_s"], "s"),
                   (f"{basis}_speedup_{n}{ranks}", p["speedup"], "x"),
                   (f"{basis}_efficiency_{n}{ranks}", p["efficiency"], "fraction")]
    return rows + [[name, csv_cell(value), "", unit] for name, value, unit in single]


def format_summary(profile):
    """The readable summary: what ran, the headline figures, phases, memory, all-reduce, predictions, advice."""
    config, timing, model = profile["config"], profile["timing"], profile["model"]
    step, samples = timing["step_time_s"], timing["samples_per_s"]
    lines = [
        f"profile: {config['model']}, batch {config['batch_size']} per process x {config['world_size']} "
        f"process(es) on {config['device']}, {config['precision']}, {config['threads_per_rank']} thread(s) each",
        f"  parameters      {model['parameters']:,} | gradients {model['gradient_mb']:.3f} MB fp32 "
        f"({model['ddp_buckets']} DDP bucket(s))",
        f"  step time       {_ms(step['mean'])} +- {_ms(step['std'])} (min {_ms(timing['step_time_min_s']['mean'])}, "
        f"median {_ms(timing['step_time_median_s']['mean'])}, max {_ms(timing['step_time_max_s']['mean'])}) | "
        f"{config['repeats']} runs x {config['steps']} steps",
        f"  throughput      {samples['mean']:,.0f} +- {samples['std']:,.0f} samples/s (global)",
        f"  data wait       {timing['data_wait_share']['mean']:.1%} of the step",
        f"  T_compute       {_ms(timing['compute_step_time_s']['mean'])} | T_comm {_ms(timing['comm_time_s']['mean'])} "
        f"| R = {number(timing['compute_to_comm_ratio']['mean'])}",
        *_own_scaling(config, timing),
        f"  epoch time      {profile['epoch_time_s']:.2f} s ({config['steps_per_epoch']} steps x mean step time)",
    ]
    if profile["phases"]:
        phases = profile["phases"]
        lines.append(f"  phases          ({phases['steps']} steps, separate pass) " + " | ".join(
            f"{name[:-2]} {_ms(phases[name])}" for name in ("data_s", "forward_s", "backward_s", "optimizer_s",
                                                            "allreduce_s")))
    lines.append(f"  memory          {_memory(profile['memory'])}")
    if profile["host_load"]:
        load = profile["host_load"]
        lines.append(f"  host CPU        other processes used {load['other_processes_cpu_s']:.1f} CPU-s during the "
                     f"{load['wall_s']:.1f} s measured ({load['cores']} cores; this profiler "
                     f"{load['profiler_cpu_s']:.1f})")
    lines.append(f"  all-reduce      {_benchmark(profile['allreduce_benchmark'])}")
    unit = _unit(profile)
    lines += _prediction_lines(profile, unit)
    lines += _run_lines(profile)
    if profile.get("strategies"):
        lines.append("  strategies      predicted per strategy (communication / step / speedup / MB of model "
                     f"state per {unit})")
        for name, predictions in profile["strategies"].items():
            lines.append(f"      {name:<9} " + " | ".join(
                f"{p['world_size']}: {_ms(p['comm_s'])} / {_ms(p['step_s'])} / {p['speedup']:.2f}x / "
                f"{p['model_state_bytes_per_rank'] / 2**20:.1f}" for p in predictions))
    lines.append("  recommendations")
    lines += [f"    - {item['text']}" for item in profile["recommendations"]]
    lines.append("  notes")
    lines += [f"    - {note}" for note in profile["notes"]]
    return "\n".join(lines)


def _unit(profile):
    """What a rank of the profile is: its topology's unit, or for a profile written before it, the device's."""
    return (profile.get("topology") or {}).get("unit") or unit_of(profile["config"]["device"])


def _prediction_lines(profile, unit):
    """The cluster, its links (each measured or assumed) and the table of counts, headed with what a
    rank is, each row measured or predicted."""
    label = plural(unit)
    lines = _topology_lines(profile, unit)
    lines.append(f"      {label}  nodes  figure     all-reduce     step   speedup  efficiency        R")
    for p in profile["predictions"]:
        lines.append(f"      {p['world_size']:>{len(label)}}  {p.get('nodes', 1):>5}  {p.get('basis', 'predicted'):<9} "
                     f"{_ms(p['allreduce_s']):>10} {_ms(p['step_s']):>8} {p['speedup']:>8.2f}x "
                     f"{p['efficiency']:>10.0%} {number(p['compute_to_comm_ratio']):>8}")
    return lines


def _topology_lines(profile, unit):
    topology = profile.get("topology")
    if not topology:  # a profile written before the topology: one link
        return [f"  predictions     link: {profile['link']['source']}"]
    world_size = profile["config"]["world_size"]
    over = (f"one {unit} stepping at this run's T_compute, no lone one measured; row {world_size} is this run's own "
            "step" if world_size > 1 else f"this one {unit}'s measured step")
    return [f"  topology        {topology['why']}",
            f"      inside a node:  {topology['intra']['allreduce']['source']}",
            f"      between nodes:  {topology['inter']['source']}",
            f"  predictions     speedup in global samples/s over {over}; the other rows predicted"]


def _run_lines(profile):
    """The feature pool's build and the whole run predicted, where the profile has them (a profile
    written before they were measured has neither)."""
    lines, pool, run = [], profile.get("feature_pool"), profile.get("run_time")
    if pool:
        others = pool["windows"] - pool["views"] * pool["train_windows"]
        parts = [f"transform {pool['transform_windows_per_s']:,.0f}/s"] if pool["transform_windows_per_s"] else []
        if pool["augment_windows_per_s"]:
            parts.append(f"augmenting {pool['augmented_windows']:,} windows {pool['augment_windows_per_s']:,.0f}/s")
        lines.append(f"  feature pool    {pool['views']} view(s) of {pool['train_windows']:,} training windows + "
                     f"{others:,} others = {pool['windows']:,}, {pool['bytes'] / 2**20:,.0f} MiB "
                     f"({pool['bytes_per_window']:,} B a window); built in {pool['seconds']:.2f} s, "
                     f"{pool['windows_per_s']:,.0f} windows/s in all ({', '.join(parts) or 'none transformed'})")
    if run:
        parts = run["parts"]
        flags = ("these flags and --head-fit adamw (with auto it solves this head by ridge, in no step)"
                 if run.get("ridge_in_main") else "these flags")
        lines.append(f"  whole run       predicted for main.py with {flags} ({parts['epochs']} epochs; start-up "
                     f"{parts['start_up_s']:.2f} s, inputs {parts['inputs_s']:.2f} s, imports during the run "
                     f"{parts['imports_s']:.2f} s, a validation pass {_ms(parts['validation_s'])}, a checkpoint "
                     f"{_ms(parts['save_s'])}, the epoch loop {_ms(parts['loop_s'])} a step, exit "
                     f"{parts['exit_s']:.2f} s)")
        label = plural(_unit(profile))
        lines.append(f"      {label}  features  training  evaluation  other set-up     total  (seconds, predicted)")
        for p in run["predictions"]:
            lines.append(f"      {p['world_size']:>{len(label)}} {p['build_s']:>9.2f} {p['training_s']:>9.2f} "
                         f"{p['evaluation_s']:>11.2f} {p['fixed_s']:>13.2f} {p['total_s']:>9.2f}")
    return lines


def _own_scaling(config, timing):
    """With 2+ processes: how much of ideal scaling this run's exposed communication leaves."""
    if config["world_size"] < 2:
        return []
    kept = timing["compute_step_time_s"]["mean"] / timing["step_time_s"]["mean"]
    return [f"  T_compute/T_step {kept:.0%}: the efficiency this run would have against one process of the "
            "same per-process speed"]


def _memory(memory):
    parts = [f"rank{entry['rank']} peak RSS {entry['peak_rss_gib']:.2f} GiB" if "peak_rss_gib" in entry else
             f"rank{entry['rank']} peak {entry['peak_allocated_gib']:.2f} GiB allocated / "
             f"{entry['peak_reserved_gib']:.2f} GiB reserved" for entry in memory["per_rank"]]
    return ", ".join(parts) + f" ({memory['what']})"


def _benchmark(benchmark):
    if not benchmark["measured"]:
        return f"not measured: {benchmark['why']}"
    return (f"{benchmark['backend']}, {benchmark['world_size']} ranks: {benchmark['buffer_bytes'] / 1e6:.3f} MB in "
            f"{_ms(benchmark['time_s'])} (bus {benchmark['bus_bandwidth_gb_per_s']:.3g} GB/s), one element in "
            f"{_ms(benchmark['one_element_time_s'])}")


def _ms(seconds):
    if seconds is None:
        return "n/a"
    return "inf" if math.isinf(seconds) else f"{seconds * 1e3:.3g} ms"


def number(value):
    return "inf" if value is None or math.isinf(value) else f"{value:.3g}"


def csv_cell(value):
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"  # inf is written as inf
    return "" if value is None else value
