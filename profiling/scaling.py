"""Measured against predicted scaling, from profiles of the same configuration at several world sizes."""
import math
from collections import defaultdict

from profiling.comm_model import BYTES_PER_GB, COLLECTIVES, Link, ddp_bucket_count, predict_world, ring_allreduce_time_s
from profiling.report import number
from profiling.topology import Topology, ring_link, unit_of, with_intra


def group_key(profile):
    """Profiles that differ only in world size compare with each other."""
    return row_key(profile["config"])


def row_key(row):
    """A scaling row's (or a profile config's) configuration but for its world size."""
    return (row["model"], row["batch_size"], row["precision"], row["grad_accum_steps"])


def scaling_rows(profiles):
    """One row per profile with its measured figures and, where a 1-process profile of the same
    configuration exists, measured and predicted speedup and the split of the difference."""
    groups = defaultdict(list)
    for profile in profiles:
        groups[group_key(profile)].append(profile)
    rows = []
    for key in sorted(groups):
        members = sorted(groups[key], key=lambda p: p["config"]["world_size"])
        baseline = next((p for p in members if p["config"]["world_size"] == 1), None)
        rows += [_row(profile, baseline) for profile in members]
    return rows


def measured_link(profile):
    """The link fitted from a multi-process profile's all-reduce benchmark, or None."""
    benchmark = profile["allreduce_benchmark"]
    return link_from(benchmark["fitted_link"]) if benchmark["measured"] else None


def link_from(entry):
    """The Link of a profile's JSON entry (null bandwidth: infinite)."""
    bandwidth = entry["bandwidth_bytes_per_s"]
    return Link(math.inf if bandwidth is None else bandwidth, entry["latency_s"], entry["source"])


def topology_of(profile, intra_links=None):
    """The Topology a profile predicted with, its links inside a node replaced by `intra_links` (a
    measured {kind: Link}, or one Link) where given. A profile written before the topology had one
    link and no nodes: every rank on one node."""
    entry = profile.get("topology")
    if entry:
        topology = Topology(entry["ranks_per_node"], {kind: link_from(link) for kind, link in entry["intra"].items()},
                            link_from(entry["inter"]), entry["unit"])
    else:
        link = link_from(profile["link"] if "bandwidth_bytes_per_s" in profile["link"] else _old_link(profile["link"]))
        topology = Topology(10 ** 9, dict.fromkeys(COLLECTIVES, link), link, unit_of(profile["config"]["device"]))
    return topology if intra_links is None else with_intra(topology, intra_links)


def _old_link(entry):
    return {"bandwidth_bytes_per_s": None if entry["bandwidth_gb_per_s"] is None else
            entry["bandwidth_gb_per_s"] * BYTES_PER_GB, "latency_s": entry["latency_us"] * 1e-6,
            "source": entry["source"]}


def extrapolate(baseline, link, world_sizes, host_aware=True):
    """Predictions for more ranks from the 1-process profile (its step time, its topology and, when
    host_aware, the host effects it measured), with a measured link inside a node."""
    gradient_bytes = baseline["model"]["gradient_bytes"]
    step_1_s = baseline["timing"]["step_time_s"]["mean"]
    host_effects = baseline.get("host_effects") if host_aware else None
    topology = topology_of(baseline, link)
    return [predict_world(step_1_s, gradient_bytes, n, ring_link(topology, n), ddp_bucket_count(gradient_bytes),
                          host_effects=host_effects) for n in world_sizes]


def advised(baseline, world_size):
    """The 1-process profile's own prediction for `world_size` (its assumed links), or None where it
    predicted no such count: what the advisor told a user who had measured nothing else."""
    return next((p for p in baseline["predictions"] if p["world_size"] == world_size), None)


def _row(profile, baseline):
    config, timing = profile["config"], profile["timing"]
    world_size, ratio = config["world_size"], timing["compute_to_comm_ratio"]["mean"]
    row = {"model": config["model"], "batch_size": config["batch_size"], "precision": config["precision"],
           "grad_accum_steps": config["grad_accum_steps"], "world_size": world_size,
           "threads_per_rank": config["threads_per_rank"],
           "step_time_ms": timing["step_time_s"]["mean"] * 1e3, "step_time_std_ms": timing["step_time_s"]["std"] * 1e3,
           "samples_per_s": timing["samples_per_s"]["mean"], "samples_per_s_std": timing["samples_per_s"]["std"],
           "data_wait_share": timing["data_wait_share"]["mean"],
           "compute_ms": timing["compute_step_time_s"]["mean"] * 1e3, "comm_ms": timing["comm_time_s"]["mean"] * 1e3,
           "compute_to_comm_ratio": math.inf if ratio is None else ratio,  # null in JSON
           "epoch_time_s": profile["epoch_time_s"], "steps_per_epoch": config["steps_per_epoch"],
           "peak_mem_gib": max(value for entry in profile["memory"]["per_rank"] for key, value in entry.items()
                               if key in ("peak_allocated_gib", "peak_rss_gib")),
           "gradient_mb": profile["model"]["gradient_mb"], "other_cores": others_busy(profile, baseline),
           "bus_bandwidth_gb_per_s": profile["allreduce_benchmark"].get("bus_bandwidth_gb_per_s"),
           **dict.fromkeys(("measured_speedup", "measured_speedup_std", "measured_efficiency", "predicted_speedup",
                            "predicted_efficiency", "predicted_step_ms", "prediction_error", "allreduce_only_speedup",
                            "predicted_rank_step_ms", "allreduce_ms", "compute_growth_ms", "comm_excess_ms",
                            "advised_speedup", "advised_error"))}
    if baseline is None:
        return row
    base = baseline["timing"]
    gain = timing["samples_per_s"]["mean"] / base["samples_per_s"]["mean"]
    row.update(measured_speedup=gain, measured_efficiency=gain / world_size,
               measured_speedup_std=gain * math.hypot(_relative_std(timing["samples_per_s"]),
                                                      _relative_std(base["samples_per_s"])))
    own = advised(baseline, world_size) if world_size > 1 else None
    if own:
        row.update(advised_speedup=own["speedup"], advised_error=own["speedup"] / gain - 1)
    link = measured_link(profile) if world_size > 1 else Link(math.inf, 0.0, "one process")
    if link is None:
        return row
    predicted = extrapolate(baseline, link, [world_size])[0]
    allreduce_only = extrapolate(baseline, link, [world_size], host_aware=False)[0]
    gradient_bytes = profile["model"]["gradient_bytes"]
    paced = ring_link(topology_of(baseline, link), world_size)
    allreduce_s = ring_allreduce_time_s(gradient_bytes, world_size, paced.bandwidth_bytes_per_s, paced.latency_s,
                                        ddp_bucket_count(gradient_bytes))
    # Where the measured step differs from the prediction: slower compute on each rank, or more
    # exposed communication than the benchmarked all-reduce.
    row.update(predicted_speedup=predicted["speedup"], predicted_efficiency=predicted["efficiency"],
               predicted_step_ms=predicted["step_s"] * 1e3, predicted_rank_step_ms=predicted["rank_step_s"] * 1e3,
               prediction_error=predicted["speedup"] / gain - 1, allreduce_only_speedup=allreduce_only["speedup"],
               allreduce_ms=allreduce_s * 1e3,
               compute_growth_ms=(timing["compute_step_time_s"]["mean"] - base["step_time_s"]["mean"]) * 1e3,
               comm_excess_ms=(timing["comm_time_s"]["mean"] - allreduce_s) * 1e3)
    return row


def others_busy(*profiles):
    """The most cores other processes kept busy while any of these profiles measured (its timed runs,
    and a 1-process profile's runs beside neighbours); None where none could tell."""
    seen = []
    for profile in filter(None, profiles):
        load = profile.get("host_load")
        if load and load["wall_s"]:
            seen.append(load["other_processes_cpu_s"] / load["wall_s"])
        seen += [cores for cores in ((profile.get("host_effects") or {}).get("other_cores") or {}).values()
                 if cores is not None]
    return max(seen, default=None)


def link_summary(profile):
    link = measured_link(profile)
    if link is None:
        return None
    bandwidth = number(link.bandwidth_bytes_per_s / BYTES_PER_GB)
    return f"{bandwidth} GB/s and {link.latency_s * 1e6:.3g} us per ring step ({link.source})"


def _relative_std(stat):
    return (stat["std"] or 0.0) / stat["mean"] if stat["mean"] else 0.0
