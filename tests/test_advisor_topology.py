"""The scaling advisor's cluster: topology arithmetic, one consistent model over every count, the counts
it predicts by default, and labels that say CPU processes or GPUs, measured or predicted."""
import copy
import json
from argparse import Namespace

import pytest

from profiling.cli import parse_profiler_args
from profiling.comm_model import (
    COLLECTIVES,
    Exchange,
    Link,
    accumulation_for_efficiency,
    predict_strategy,
    predict_world,
    ring_allreduce_time_s,
)
from profiling.host_sharing import quiet_pairs
from profiling.recommend import Figures, recommendations
from profiling.topology import (
    LINK_PRESETS,
    Topology,
    build_topology,
    counted,
    default_ranks_per_node,
    nodes_for,
    plan_flag,
    planned_counts,
    ranks_on_node,
    resolve_plan,
    ring_link,
)
from training.errors import UsageError

GB = 1e9
NVLINK = Link(370 * GB, 3e-6, "nvlink")
INFINIBAND = Link(50 * GB, 5e-6, "infiniband")


def cluster(ranks_per_node=8, intra=NVLINK, inter=INFINIBAND, unit="GPU"):
    return Topology(ranks_per_node, dict.fromkeys(COLLECTIVES, intra), inter, unit)


def test_nodes_fill_one_after_the_other():
    assert [nodes_for(n, 8) for n in (1, 8, 9, 16, 17)] == [1, 1, 2, 2, 3]
    assert [ranks_on_node(n, 8) for n in (1, 8, 16)] == [1, 8, 8]


def test_a_ring_is_paced_by_the_slowest_link_it_crosses():
    topology = cluster()
    assert ring_link(topology, 8) is NVLINK  # one node: NVLink only
    assert ring_link(cluster(ranks_per_node=1), 2) is INFINIBAND  # one GPU a node: every hop between nodes
    across = ring_link(topology, 16)  # two nodes of eight: NVLink hops and two InfiniBand hops
    assert across.bandwidth_bytes_per_s == 50 * GB and across.latency_s == 5e-6
    slow_inside = ring_link(cluster(intra=Link(20 * GB, 8e-6, "pcie")), 16)
    assert slow_inside.bandwidth_bytes_per_s == 20 * GB and slow_inside.latency_s == 8e-6
    # 16 GPUs over 2 nodes: 2 x 15/16 of 100 MB over 50 GB/s, and 30 ring steps of the slower latency.
    seconds = ring_allreduce_time_s(100e6, 16, across.bandwidth_bytes_per_s, across.latency_s)
    assert seconds == pytest.approx(2 * 15 / 16 * 100e6 / (50 * GB) + 30 * 5e-6)
    assert ring_allreduce_time_s(100e6, 8, NVLINK.bandwidth_bytes_per_s, NVLINK.latency_s) < seconds / 5


def test_presets_flags_and_measurements_make_the_links():
    args = Namespace(intra_node=None, inter_node=None, intra_node_gbps=None, inter_node_gbps=None,
                     intra_node_latency_us=None, inter_node_latency_us=None)
    gpu = build_topology(args, "cuda", 8)
    assert gpu.intra["allreduce"].bandwidth_bytes_per_s == LINK_PRESETS["pcie"].bandwidth_gbps * GB
    assert gpu.inter.bandwidth_bytes_per_s == LINK_PRESETS["infiniband"].bandwidth_gbps * GB
    assert gpu.unit == "GPU" and "assumed (pcie" in gpu.intra["allreduce"].source
    chosen = build_topology(Namespace(**{**vars(args), "intra_node": "nvlink", "inter_node_gbps": 400.0}), "cuda", 8)
    assert chosen.intra["allreduce_fp16"].bandwidth_bytes_per_s == 370 * GB
    assert chosen.inter.bandwidth_bytes_per_s == 400 * GB and "--inter-node-gbps" in chosen.inter.source
    measured = Link(0.3 * GB, 1e-3, "measured: gloo, 2 ranks")
    cpu = build_topology(args, "cpu", 2, measured=dict.fromkeys(COLLECTIVES, measured))
    assert cpu.unit == "CPU process" and cpu.intra["all_gather"].source.count("measured: gloo") == 2
    assert cpu.inter.bandwidth_bytes_per_s == LINK_PRESETS["ethernet"].bandwidth_gbps * GB  # not measured
    across = build_topology(args, "cpu", 2, dict.fromkeys(COLLECTIVES, measured), spans_nodes=True)
    assert across.inter.latency_s == 1e-3  # a run over several nodes measured the link between them too


def test_the_topology_flags_and_their_refusals():
    args = parse_profiler_args(["--device", "cpu", "--plan", "2x8", "--inter-node", "ethernet",
                                "--intra-node-gbps", "300", "--inter-node-latency-us", "20"])
    assert (args.plan, args.inter_node, args.intra_node_gbps, args.inter_node_latency_us) == ((2, 8), "ethernet",
                                                                                              300.0, 20.0)
    assert parse_profiler_args(["--device", "cpu", "--assumed-bandwidth-gbps", "3"]).intra_node_gbps == 3.0
    assert plan_flag("4X2") == (4, 2)
    for bad, says in ((["--plan", "2x0"], "at least 1"), (["--plan", "eight"], "NODESxGPUS"),
                      (["--plan", "2x8", "--gpus-per-node", "4"], "drop one of them"),
                      (["--gpus-per-node", "0"], "--gpus-per-node must be at least 1"),
                      (["--inter-node-gbps", "0"], "--inter-node-gbps must be a positive number"),
                      (["--intra-node", "ethernet"], "invalid choice")):
        with pytest.raises(UsageError, match=says):
            parse_profiler_args(["--device", "cpu", *bad])


def host_effects(slowdown_at_2):
    """What a 1-process profile measured on a 2-core host: one neighbour fits, so the slowdown is known at 2
    only (as a profile written before the topology stored it, without ranks_per_node)."""
    return {"slowdown": {"2": slowdown_at_2}, "shared": {"2": 0.0},
            "straggler_s": {"2": 0.001, "4": 0.002, "8": 0.0025}, "ddp_step_s": 0.0004}


@pytest.mark.parametrize("slowdown_at_2", [1.03, 1.83])
def test_one_model_for_every_count_more_ranks_never_cost_less(slowdown_at_2):
    # A lone step of 26.4 ms and a neighbour that slowed it 1.83x: before, 2 ranks were predicted at 0.86x
    # and 4 at 2.6x, as if the 4 had GPUs of their own and the 2 shared cores.
    link = Link(0.5 * GB, 800e-6, "assumed")
    effects = host_effects(slowdown_at_2)
    predicted = [predict_world(0.0264, 415_384, n, link, host_effects=effects) for n in (1, 2, 4, 8)]
    steps = [p["step_s"] for p in predicted]
    efficiencies = [p["efficiency"] for p in predicted]
    assert steps == sorted(steps) and efficiencies == sorted(efficiencies, reverse=True)
    two, four = predicted[1], predicted[2]
    assert four["speedup"] <= 2 * two["speedup"]  # 4 ranks are 2 nodes, each like the 2-rank one
    json_effects = json.loads(json.dumps({**host_effects(slowdown_at_2), "ranks_per_node": 2}))
    assert predict_world(0.0264, 415_384, 4, link, host_effects=json_effects) == four


def test_a_noisier_smaller_count_cannot_make_more_ranks_look_cheaper():
    effects = {"slowdown": {2: 1.4, 3: 1.2, 4: 1.3}, "straggler_s": {2: 0.003, 3: 0.001}, "ddp_step_s": 0.0,
               "ranks_per_node": 4}
    link = Link(1 * GB, 0.0, "assumed")
    steps = [predict_world(0.010, 1000, n, link, host_effects=effects)["rank_step_s"] for n in (2, 3, 4, 8)]
    assert steps == pytest.approx([0.010 * 1.4 + 0.003] * 4)


def test_the_slowdown_comes_from_the_rounds_other_work_left_quiet():
    quiet = ({"step_time_s": 0.010, "other_cores": 0.02}, {"step_time_s": 0.0105, "other_cores": 0.05})
    busy = ({"step_time_s": 0.010, "other_cores": 1.1}, {"step_time_s": 0.019, "other_cores": 1.2})
    assert quiet_pairs([busy, quiet, busy]) == [quiet]
    assert quiet_pairs([busy, busy]) == [busy, busy]  # none quiet: all of them, and the profile warns
    unknown = ({"step_time_s": 0.010, "other_cores": None}, {"step_time_s": 0.011, "other_cores": None})
    assert quiet_pairs([unknown]) == [unknown]  # no /proc/stat to read


def test_accumulation_says_when_no_k_can_reach_the_target():
    # The all-reduce is what accumulation spreads; a rank slowed by its node's neighbours stays slowed.
    assert accumulation_for_efficiency(0.010, 0.002, 0.9, rank_s=0.012) is None
    effects = {"slowdown": {2: 1.05}, "straggler_s": {}, "ddp_step_s": 0.0, "ranks_per_node": 2}
    link = Link(0.5 * GB, 800e-6, "assumed")
    plain = predict_world(0.010, 400_000, 2, link, host_effects=effects)
    k = accumulation_for_efficiency(0.010, plain["allreduce_s"], 0.9, plain["rank_step_s"])
    assert predict_world(0.010, 400_000, 2, link, accumulation=k, host_effects=effects)["efficiency"] >= 0.9
    assert predict_world(0.010, 400_000, 2, link, accumulation=k - 1, host_effects=effects)["efficiency"] < 0.9


def test_the_default_counts_follow_the_plan():
    assert default_ranks_per_node("cuda", 16, 1, 8, 64) == 8
    assert default_ranks_per_node("cpu", 1, 1, 0, 2) == 2 and default_ranks_per_node("cpu", 2, 1, 0, 2) == 1
    assert default_ranks_per_node("cpu", 2, 2, 0, 2) == 2  # this run already put 2 on the node
    assert planned_counts(None, (2, 8), 1, 8) == ((1, 16), 16)
    assert planned_counts(None, None, 1, 8) == ((1, 8), 8)  # one full node
    assert planned_counts(None, None, 4, 8) == ((1, 4), 4)  # this run's world size
    assert planned_counts([2, 32], None, 4, 8) == ((1, 2, 4, 32), 32)
    assert planned_counts(None, None, 1, 1) == ((1,), 1)
    plan = resolve_plan(parse_profiler_args(["--device", "cpu", "--plan", "2x8"]), "cpu", 1)
    assert (plan.ranks_per_node, plan.counts, plan.planned) == (8, (1, 16), 16)
    assert "16 CPU processes" in plan.why and "--plan 2x8" in plan.why
    plan = resolve_plan(parse_profiler_args(["--device", "cpu", "--gpus-per-node", "3"]), "cpu", 1)
    assert (plan.counts, plan.planned) == ((1, 3), 3)


def advice(unit, world_sizes, planned=None, fp16_source="assumed (loopback)"):
    link = Link(0.5 * GB, 800e-6, "assumed (loopback)")
    topology = Topology(2, {**dict.fromkeys(COLLECTIVES, link), "allreduce_fp16": Link(0.5 * GB, 800e-6, fp16_source)},
                        Link(12.5 * GB, 50e-6, "assumed (ethernet)"), unit)
    strategies = {name: [predict_strategy(name, 0.02, Exchange(400_000), n, {k: ring_link(topology, n, k)
                                                                           for k in COLLECTIVES})
                         for n in world_sizes] for name in ("ddp", "ddp_fp16", "fsdp")}
    figures = Figures(compute_s=0.02, gradient_bytes=400_000, topology=topology, batch_size=32, amp_enabled=False,
                      data_wait_share=0.0, planned=planned, strategies=strategies)
    return {item["topic"]: item["text"] for item in recommendations(figures, world_sizes)}


def test_the_advice_is_for_the_planned_count_never_a_fixed_four():
    texts = advice("GPU", [1, 2, 16])
    assert texts["strategy"].startswith("predicted on 16 GPUs:") and "4 GPUs" not in " ".join(texts.values())
    assert advice("GPU", [1, 2, 8, 16], planned=8)["strategy"].startswith("predicted on 8 GPUs:")
    nothing = advice("CPU process", [1])
    assert "planned on 1 CPU process" in nothing["gpu count"] and "--plan NODESxGPUS" in nothing["gpu count"]


def test_labels_say_cpu_processes_and_measured_only_for_what_was_measured():
    texts = advice("CPU process", [1, 2])
    assert "on 2 CPU processes" in texts["strategy"] and "GPU" not in texts["strategy"]
    assert "stay on one CPU process" in texts["gpu count"] or "CPU processes" in texts["gpu count"]
    assert "as measured" not in texts["precision"] and "no collective measured" in texts["precision"]
    measured = advice("CPU process", [1, 2], fp16_source="measured: gloo, 2 ranks")["precision"]
    assert "as this run measured it" in measured
    assert counted(1, "CPU process") == "1 CPU process" and counted(8, "GPU") == "8 GPUs"


def test_the_summary_heads_its_table_with_what_the_ranks_are(tmp_path):
    from profiling.report import format_summary
    profile = summary_profile()
    text = format_summary(profile)
    assert "      CPU processes  nodes  figure" in text and "\n      GPUs " not in text
    rows = [line.split() for line in text.splitlines() if line.startswith("                  ")][:2]
    assert [row[2] for row in rows] == ["measured", "predicted"]
    gpu = copy.deepcopy(profile)
    gpu["config"]["device"], gpu["topology"]["unit"] = "cuda", "GPU"
    assert "\n      GPUs  nodes  figure" in format_summary(gpu)


def summary_profile():
    """The smallest profile format_summary reads: one CPU process, predicted for 2."""
    link = {"bandwidth_bytes_per_s": 5e8, "latency_s": 8e-4, "source": "0.5 GB/s assumed (loopback)",
            "bandwidth_gb_per_s": 0.5, "latency_us": 800.0}
    stat = {"mean": 0.02, "std": 0.001}
    timing = dict.fromkeys(("step_time_s", "step_time_min_s", "step_time_median_s", "step_time_max_s",
                            "compute_step_time_s", "comm_time_s"), stat)
    timing.update(samples_per_s={"mean": 1600.0, "std": 80.0}, data_wait_share={"mean": 0.01},
                  compute_to_comm_ratio={"mean": None})
    row = {"world_size": 1, "nodes": 1, "basis": "measured", "allreduce_s": 0.0, "step_s": 0.02, "speedup": 1.0,
           "efficiency": 1.0, "compute_to_comm_ratio": None}
    return {"config": {"model": "cnn1d", "batch_size": 32, "world_size": 1, "device": "cpu", "precision": "fp32",
                       "threads_per_rank": 1, "repeats": 1, "steps": 5, "steps_per_epoch": 17},
            "model": {"parameters": 1, "gradient_mb": 0.4, "ddp_buckets": 1}, "timing": timing, "epoch_time_s": 0.3,
            "phases": None, "memory": {"per_rank": [{"rank": 0, "peak_rss_gib": 0.5}], "what": "RSS"},
            "host_load": None, "allreduce_benchmark": {"measured": False, "why": "one process"}, "link": link,
            "topology": {"why": "2 CPU processes per node", "intra": {"allreduce": link}, "inter": link,
                         "unit": "CPU process"},
            "predictions": [row, {**row, "world_size": 2, "basis": "predicted", "allreduce_s": 0.0024,
                                  "step_s": 0.023, "speedup": 1.74, "efficiency": 0.87}],
            "strategies": None, "recommendations": [], "notes": []}


def test_the_scaling_rows_carry_the_one_process_advice_beside_the_measurement():
    from benchmarks.scaling.tables import advisor_check
    from profiling.scaling import scaling_rows
    base = {"config": {"model": "cnn1d", "batch_size": 32, "precision": "fp32", "grad_accum_steps": 1,
                       "world_size": 1, "threads_per_rank": 1, "steps_per_epoch": 17, "device": "cpu"},
            "timing": {"step_time_s": {"mean": 0.02, "std": 0.0}, "samples_per_s": {"mean": 1600.0, "std": 0.0},
                       "data_wait_share": {"mean": 0.0}, "compute_step_time_s": {"mean": 0.02},
                       "comm_time_s": {"mean": 0.0}, "compute_to_comm_ratio": {"mean": None}},
            "epoch_time_s": 0.3, "memory": {"per_rank": [{"rank": 0, "peak_rss_gib": 0.5}]},
            "model": {"gradient_mb": 0.4, "gradient_bytes": 400_000}, "allreduce_benchmark": {"measured": False},
            "link": {"bandwidth_bytes_per_s": 5e8, "latency_s": 8e-4, "source": "assumed"},
            "predictions": [{"world_size": 1, "speedup": 1.0}, {"world_size": 2, "speedup": 1.6}]}
    two = copy.deepcopy(base)
    two["config"]["world_size"], two["timing"]["samples_per_s"]["mean"] = 2, 2 * 1600.0 * 0.8
    rows = scaling_rows([base, two])
    assert rows[1]["measured_speedup"] == pytest.approx(1.6)
    assert rows[1]["advised_speedup"] == 1.6 and rows[1]["advised_error"] == pytest.approx(0.0)
    assert "?" in advisor_check([rows]) and "no other process disturbed" not in advisor_check([rows])  # unknown
    for profile in (base, two):
        profile["host_load"] = {"wall_s": 2.0, "other_processes_cpu_s": 0.04}
    busy = copy.deepcopy(two)
    busy["timing"]["samples_per_s"]["mean"] = 1600.0  # a round another process slowed: measured 1.0x
    busy["host_load"] = {"wall_s": 2.0, "other_processes_cpu_s": 2.0}
    check = advisor_check([scaling_rows([base, two]), scaling_rows([base, busy])])
    assert "measured 1.60x, 1.00x (other processes kept 0.0, 1.0 cores busy)" in check
    assert "1.60x, 1.60x, error median +30.0% (+0.0% to +60.0%)" in check
    assert "in the 1 round(s) no other process disturbed, the 1-process error median +0.0%" in check
