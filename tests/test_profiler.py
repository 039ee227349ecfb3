"""The profiler: its scaling arithmetic, one real run through profiler.py, bad input, and the report writers."""
import copy
import csv
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from conftest import REPO, TINY_DATA, run_subprocess
from outputs.safety import OutputRefused
from profiling.allreduce_bench import last_arrival_s
from profiling.comm_model import (
    COLLECTIVES,
    Exchange,
    Link,
    accumulation_for_efficiency,
    bus_bandwidth_bytes_per_s,
    collectives_per_step,
    comm_split,
    ddp_bucket_count,
    fit_ring_link,
    predict_strategy,
    predict_world,
    rank_step_s,
    ring_allreduce_time_s,
    speedup,
)
from profiling.measure import LONGEST_GAP_S, collective_gap_s, compute_only_step_s
from profiling.recommend import Figures, larger_batch_shares, recommendations
from profiling.run_time import RunParts, epoch_steps, gather_pool_s, pool_entry, predict_run, share_build_s
from profiling.scaling import scaling_rows
from profiling.topology import Topology

MB = 1e6
GB_PER_S = 1e9


def one_node(link, ranks_per_node=8, unit="GPU"):
    """A topology whose every collective, inside a node and between nodes, runs over `link`."""
    return Topology(ranks_per_node, dict.fromkeys(COLLECTIVES, link), link, unit)


@pytest.mark.parametrize("world_size, expected_s", [(1, 0.0), (2, 1.0e-3), (4, 1.5e-3), (8, 1.75e-3)])
def test_ring_allreduce_moves_2_n_minus_1_over_n_of_the_buffer(world_size, expected_s):
    assert ring_allreduce_time_s(1 * MB, world_size, 1 * GB_PER_S) == pytest.approx(expected_s)


def test_ring_allreduce_latency_is_paid_per_ring_step_and_per_bucket():
    no_latency = ring_allreduce_time_s(1 * MB, 4, 1 * GB_PER_S)
    assert ring_allreduce_time_s(1 * MB, 4, 1 * GB_PER_S, latency_s=10e-6) == pytest.approx(no_latency + 6 * 10e-6)
    assert ring_allreduce_time_s(1 * MB, 4, 1 * GB_PER_S, latency_s=10e-6, messages=3) == pytest.approx(
        no_latency + 18 * 10e-6)
    assert ring_allreduce_time_s(1 * MB, 1, 1 * GB_PER_S, latency_s=1.0) == 0.0  # nothing to exchange


def test_bus_bandwidth_and_fitted_link_reproduce_the_measurement():
    assert bus_bandwidth_bytes_per_s(1 * MB, 1e-3, 2) == pytest.approx(1 * GB_PER_S)
    link = fit_ring_link(4 * MB, buffer_s=5e-3, tiny_s=1e-3, world_size=4, source="test")
    assert link.latency_s == pytest.approx(1e-3 / 6)
    assert ring_allreduce_time_s(4 * MB, 4, link.bandwidth_bytes_per_s, link.latency_s) == pytest.approx(5e-3)
    assert math.isinf(fit_ring_link(4 * MB, 1e-3, 1e-3, 2, "latency only").bandwidth_bytes_per_s)


def test_comm_split_and_ratio_including_no_exposed_communication():
    comm_s, ratio = comm_split(step_s=0.012, compute_s=0.010)
    assert comm_s == pytest.approx(0.002) and ratio == pytest.approx(5.0)
    # A noisy no_sync pass slower than the normal one must not give negative communication.
    assert comm_split(step_s=0.010, compute_s=0.011) == (0.0, math.inf)
    assert comm_split(step_s=0.010, compute_s=0.010) == (0.0, math.inf)


def test_compute_only_step_takes_a_normal_steps_optimizer_update():
    # FSDP: under no_sync the shards get no gradients and the update does nothing; its time is
    # computation all the same, not communication.
    with_comm = {"step_time_s": 0.050, "optimizer_s": 0.012}
    sharded_no_sync = {"step_time_s": 0.030, "optimizer_s": 0.001}
    assert compute_only_step_s(with_comm, sharded_no_sync) == pytest.approx(0.041)
    # DDP: the same update either way, the no_sync step stands.
    assert compute_only_step_s(with_comm, {"step_time_s": 0.030, "optimizer_s": 0.012}) == pytest.approx(0.030)


def test_predicted_step_speedup_and_efficiency():
    link = Link(1 * GB_PER_S, 0.0, "test")
    predicted = predict_world(0.010, 1 * MB, 4, link)
    assert predicted["allreduce_s"] == pytest.approx(1.5e-3)
    assert predicted["step_s"] == pytest.approx(0.0115)
    assert predicted["speedup"] == pytest.approx(4 * 0.010 / 0.0115)
    assert predicted["efficiency"] == pytest.approx(0.010 / 0.0115)
    assert predicted["compute_to_comm_ratio"] == pytest.approx(0.010 / 1.5e-3)
    assert predict_world(0.010, 1 * MB, 1, link)["speedup"] == 1.0
    assert speedup(2, 0.010, 0.020) == 1.0
    # Accumulating k micro-batches pays the all-reduce once per k.
    assert predict_world(0.010, 1 * MB, 4, link, accumulation=3)["allreduce_s"] == pytest.approx(0.5e-3)


def test_accumulation_needed_for_a_target_efficiency_is_the_smallest_that_reaches_it():
    link = Link(1 * GB_PER_S, 0.0, "test")
    allreduce_s = predict_world(0.002, 1 * MB, 4, link)["allreduce_s"]  # 1.5 ms against 2 ms of compute
    k = accumulation_for_efficiency(0.002, allreduce_s, 0.9)
    assert k == 7  # 1.5 / k <= 2 x (1/0.9 - 1) = 0.222 ms
    assert predict_world(0.002, 1 * MB, 4, link, accumulation=k)["efficiency"] >= 0.9
    assert predict_world(0.002, 1 * MB, 4, link, accumulation=k - 1)["efficiency"] < 0.9
    assert accumulation_for_efficiency(0.002, 0.0, 0.9) == 1


def test_ddp_bucket_count():
    assert ddp_bucket_count(400_000) == 1  # fits DDP's 1 MiB first bucket
    assert ddp_bucket_count(30 * 1024 ** 2) == 3  # 1 MiB, then 25 MiB, then the last 4 MiB


def test_collectives_per_step_of_each_strategy():
    assert collectives_per_step("ddp", 400_000) == 1
    assert collectives_per_step("ddp", 30 * 1024 ** 2) == 3  # one per bucket
    assert collectives_per_step("fsdp", 400_000, units=3) == 9  # gather, gather again, reduce-scatter
    assert collectives_per_step("fsdp", 400_000, units=3, reshard_after_forward=False) == 6


def test_fp16_compression_halves_the_bytes_but_not_the_buckets():
    from profiling.comm_model import strategy_comm
    # Infinite bandwidth leaves only latency: 30 MiB of fp32 gradients fill three buckets, and DDP calls
    # the hook once per bucket, so fp16 pays three messages too, although its 15 MiB would fit two.
    link = Link(math.inf, 1e-3, "made up")
    links = {"allreduce": link, "allreduce_fp16": link}
    full_s, full_bytes = strategy_comm("ddp", Exchange(30 * 1024 ** 2), 2, links)
    half_s, half_bytes = strategy_comm("ddp_fp16", Exchange(30 * 1024 ** 2), 2, links)
    assert half_bytes == pytest.approx(full_bytes / 2)
    assert half_s == pytest.approx(full_s) == pytest.approx(3 * 2 * 1e-3)


def test_a_collective_takes_the_time_of_the_rank_that_arrived_last():
    # Rank 0 waited for rank 1 in the first call, rank 1 for rank 0 in the second; the third was slow for both.
    assert last_arrival_s([[0.005, 0.001, 0.004], [0.001, 0.002, 0.003]]) == [0.001, 0.001, 0.003]


def test_the_busy_time_before_each_benchmarked_collective():
    def work(device, world_size, name, reshard=True):
        strategy = Namespace(device=torch.device(device), world_size=world_size, name=name,
                             reshard_after_forward=reshard)
        return Namespace(strategy=strategy, gradient_bytes=400_000, unit_bytes=[1, 1, 1])
    assert collective_gap_s(work("cpu", 2, "ddp"), 0.012) == pytest.approx(0.012)  # one bucket, after backward
    assert collective_gap_s(work("cpu", 2, "fsdp"), 0.018) == pytest.approx(0.002)  # nine calls a step
    assert collective_gap_s(work("cpu", 2, "fsdp", reshard=False), 0.018) == pytest.approx(0.003)
    assert collective_gap_s(work("cpu", 2, "ddp"), 1.0) == LONGEST_GAP_S
    assert collective_gap_s(work("cpu", 1, "single"), 0.012) == 0.0
    assert collective_gap_s(work("cuda", 2, "ddp"), 0.012) == 0.0  # a GPU's host only queues the work


BENCHMARK_SCRIPT = """
import json, time
from profiling.allreduce_bench import benchmark_allreduce
from training.distributed.ddp import DistributedStrategy, RankPlacement
from training.distributed.strategy import distributed_env
strategy = DistributedStrategy(placement=RankPlacement(device_type="cpu", backend="gloo", gpu_ids=None, timeout_s=60,
                                                       ranks=distributed_env()), sync_bn=False)
started = time.perf_counter()
result = benchmark_allreduce(strategy, 1000, 4, gap_s=0.05)
took_s = time.perf_counter() - started
if strategy.is_main:
    print(json.dumps({"took_s": took_s, "gap_s": result["gap_s"], "time_s": result["time_s"],
                      "sources": {kind: link.source for kind, link in result["links"].items()}}))
strategy.close()
"""


def test_two_ranks_benchmark_every_collective_after_busy_host_time(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(BENCHMARK_SCRIPT)
    result = run_subprocess([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             script], timeout=120, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["gap_s"] == 0.05 and figures["time_s"] > 0
    assert set(figures["sources"]) == {"allreduce", "allreduce_fp16", "all_gather", "reduce_scatter"}
    assert all("gloo, 2 ranks" in source and "after 50 ms of host work" in source
               for source in figures["sources"].values())
    assert figures["took_s"] >= 7 * 4 * 0.05  # seven timed collectives, four calls each, each after the gap


def test_recommendation_numbers():
    before, after = larger_batch_shares(compute_s=0.010, allreduce_s=0.0025, batch_size=32, new_batch_size=256)
    assert before == pytest.approx(0.2) and after == pytest.approx(0.0025 / 0.0825)
    # 4 MB of gradients over 0.1 GB/s against 1 ms of compute: more GPUs only slow the run down.
    slow = Figures(compute_s=0.001, gradient_bytes=4_000_000, topology=one_node(Link(0.1 * GB_PER_S, 0.0, "assumed")),
                   batch_size=32, amp_enabled=False, data_wait_share=0.02, backward_s=0.0005)
    advice = {item["topic"]: item for item in recommendations(slow, [1, 2, 4])}
    expected = 2 * 0.001 / (0.001 + 0.04)
    assert advice["gpu count"]["figures"]["speedup_2"] == pytest.approx(expected)
    assert advice["gpu count"]["text"].startswith(f"stay on one GPU: predicted speedup on 2 GPUs {expected:.2f}x < 1")
    assert "--cv-folds" in advice["gpu count"]["text"]  # says what several GPUs are good for instead
    assert "2.00 MB" in advice["precision"]["text"] and "4.00 MB" in advice["precision"]["text"]
    assert advice["batch size"]["figures"]["new_batch_size"] == 256
    assert advice["gradient accumulation"]["figures"]["speedup_with"] > advice["gradient accumulation"]["figures"][
        "speedup_without"]


def test_half_precision_advice_agrees_with_the_strategy_table():
    # A backend that sums fp16 slowly (gloo on CPU): the table and the advice must tell the same story.
    fast, slow = Link(1.0 * GB_PER_S, 1e-4, "fp32"), Link(0.3 * GB_PER_S, 1e-4, "fp16")
    links = {"allreduce": fast, "allreduce_fp16": slow, "all_gather": fast, "reduce_scatter": fast}
    table = {name: [predict_strategy(name, 0.001, Exchange(4_000_000), n, links) for n in (1, 2, 4)]
             for name in ("ddp", "ddp_fp16")}
    figures = Figures(compute_s=0.001, gradient_bytes=4_000_000, topology=one_node(fast), batch_size=32,
                      amp_enabled=False, data_wait_share=0.0, strategies=table)
    advice = next(item for item in recommendations(figures, [1, 2, 4]) if item["topic"] == "precision")
    assert advice["figures"]["speedup_fp32_grads"] == table["ddp"][2]["speedup"]
    assert advice["figures"]["speedup_half_grads"] == table["ddp_fp16"][2]["speedup"]
    assert advice["figures"]["speedup_half_grads"] < advice["figures"]["speedup_fp32_grads"]
    assert "does not pay" in advice["text"]


def test_expected_maximum_of_several_draws_from_the_measured_step_times():
    from profiling.host_sharing import expected_maximum
    samples = [4.0, 1.0, 3.0, 2.0]
    assert expected_maximum(samples, 1) == pytest.approx(2.5)  # one rank: the mean
    assert expected_maximum(samples, 2) == pytest.approx((1 * 1 + 2 * 3 + 3 * 5 + 4 * 7) / 16)
    assert 3.9 < expected_maximum(samples, 64) <= 4.0  # many ranks: nearly always the slowest step


def test_host_effects_enter_each_ranks_step_and_survive_a_json_round_trip():
    from profiling.comm_model import rank_step_s
    effects = {"slowdown": {2: 1.2}, "shared": {2: 0.012}, "straggler_s": {2: 0.001, 4: 0.002}, "ddp_step_s": 0.0005}
    link = Link(1e9, 1e-4, "test")
    assert rank_step_s(0.010, 1, effects) == 0.010  # one process pays none of it
    # The neighbours slow DDP's own work as much as the step's; the wait for the slower rank comes on top.
    assert rank_step_s(0.010, 2, effects) == pytest.approx(1.2 * (0.010 + 0.0005) + 0.001)
    # 4 ranks fill two nodes of the 2 the neighbours were measured with: a full node's slowdown each.
    assert rank_step_s(0.010, 4, effects) == pytest.approx(1.2 * (0.010 + 0.0005) + 0.002)
    assert rank_step_s(0.010, 4, {**effects, "ranks_per_node": 1}) == pytest.approx(0.010 + 0.0005 + 0.002)
    plain = predict_world(0.010, 4_000_000, 2, link)
    hosted = predict_world(0.010, 4_000_000, 2, link, host_effects=effects)
    assert hosted["step_s"] == pytest.approx(plain["step_s"] + 0.0036)
    assert hosted["speedup"] == pytest.approx(2 * 0.010 / hosted["step_s"])
    read_back = json.loads(json.dumps(effects))  # integer keys come back as strings
    assert predict_world(0.010, 4_000_000, 2, link, host_effects=read_back) == hosted


def test_neighbours_only_where_ranks_would_share_this_hosts_cores():
    import torch

    from profiling.host_sharing import host_rank_counts
    assert host_rank_counts([1, 2, 4, 8], torch.device("cpu"), 4) == [2, 4]  # 8 ranks: two full nodes of 4
    assert host_rank_counts([1, 3, 8], torch.device("cpu"), 2) == [2]
    assert host_rank_counts([1, 2, 4, 8], torch.device("cpu"), 1) == []  # a node of one has no neighbours
    assert host_rank_counts([1, 2], torch.device("cuda", 0), 8) == []  # each rank has its own GPU


def run_parts(**changes):
    parts = RunParts(start_up_s=1.0, imports_s=0.2, exit_s=0.3, inputs_s=0.5, set_up_s=7.0, build_s=6.0, loop_s=0.0005,
                     validation_s=0.04, save_s=0.01, final_eval_s=0.12, epochs=20, train_windows=100, batch_size=32,
                     grad_accum_steps=1)
    return dataclasses.replace(parts, **changes)


def test_steps_per_epoch_share_the_windows_over_the_ranks_with_a_partial_last_batch():
    assert epoch_steps(100, 1, 32, 1) == 4  # 32 + 32 + 32 + 4
    assert epoch_steps(100, 2, 32, 1) == 2  # 50 a rank: 32 + 18
    assert epoch_steps(100, 3, 32, 1) == 2  # 34 a rank, the sampler padding the shares to equal
    assert epoch_steps(100, 1, 32, 3) == 2  # 4 micro-batches, the last window of accumulation partial


def test_the_whole_run_is_its_set_up_the_pool_the_epochs_and_the_evaluation():
    one = predict_run(run_parts(), 1, 0.002, 6.0)
    assert one["steps_per_epoch"] == 4
    assert one["fixed_s"] == pytest.approx(1.0 + 0.2 + 0.5 + 7.0 - 6.0 + 0.3)  # the set-up without the pool, the exit
    assert one["stepping_s"] == pytest.approx(20 * 4 * 0.0025)  # each step and the loop's own part of it
    assert one["training_s"] == pytest.approx(20 * (4 * 0.0025 + 0.04 + 0.01))
    assert one["total_s"] == pytest.approx(3.0 + 6.0 + 20 * (4 * 0.0025 + 0.05) + 0.12)
    assert one["build_share"] == pytest.approx(6.0 / one["total_s"])
    two = predict_run(run_parts(), 2, 0.003, 3.5)
    assert two["steps_per_epoch"] == 2 and two["build_s"] == 3.5
    # The evaluation passes split their windows over the ranks; every rank saves as long as one.
    assert two["training_s"] == pytest.approx(20 * (2 * 0.0035 + 0.02 + 0.01))
    assert two["evaluation_s"] == pytest.approx(0.06)
    assert two["total_s"] == pytest.approx(3.0 + 1.0 + 3.5 + two["training_s"] + 0.06)  # the launcher's start too
    # Without a pool the set-up is all fixed.
    bare = predict_run(run_parts(build_s=0.0), 1, 0.002, 0.0)
    assert bare["fixed_s"] == pytest.approx(9.0) and bare["build_share"] == 0.0


def test_the_heads_passes_after_the_epochs_step_and_validate_as_the_epochs_do():
    # The plain candidate (20 epochs, each validated) and a final model on 1.25 times the windows.
    after = predict_run(run_parts(after_epochs=20 + 25.0, after_validations=20), 1, 0.002, 6.0)
    before = predict_run(run_parts(), 1, 0.002, 6.0)
    assert after["stepping_s"] == pytest.approx(before["stepping_s"] * (20 + 45) / 20)
    assert after["training_s"] - before["training_s"] == pytest.approx(45 * 4 * 0.0025 + 20 * 0.04)


def test_a_measured_launcher_replaces_the_start_up_that_stands_for_it_with_2_ranks_or_more():
    measured, assumed = run_parts(launcher_s=1.7), run_parts()
    assert predict_run(measured, 2, 0.003, 3.5)["total_s"] - predict_run(assumed, 2, 0.003, 3.5)["total_s"] == \
        pytest.approx(1.7 - 1.0)
    assert predict_run(measured, 1, 0.002, 6.0) == predict_run(assumed, 1, 0.002, 6.0)  # one process: no launcher


def test_the_pool_is_built_in_shares_that_the_hosts_cores_bound_on_cpu():
    assert share_build_s(6.0, 1, 1, "cpu", 2, 2) == 6.0
    assert share_build_s(6.0, 4, 4, "cuda", 8, 16) == pytest.approx(1.5)  # a device per rank
    assert share_build_s(6.0, 2, 2, "cpu", 2, 2) == pytest.approx(6.0)  # one process already had both cores
    assert share_build_s(6.0, 2, 2, "cpu", 1, 4) == pytest.approx(3.0)
    assert share_build_s(6.0, 8, 8, "cpu", 1, 4) == pytest.approx(1.5)  # no more than the 4 cores
    assert share_build_s(6.0, 2, 2, "cpu", 8, 4) == pytest.approx(6.0)  # threads beyond the cores gain nothing back
    # Each further node brings its own cores: 2 nodes of 4 ranks on 4 cores each, 2 processes on 2 hosts.
    assert share_build_s(6.0, 8, 4, "cpu", 1, 4) == pytest.approx(0.75)
    assert share_build_s(6.0, 2, 1, "cpu", 2, 2) == pytest.approx(3.0)


def test_the_gathered_pool_costs_one_ring_pass_of_its_bytes():
    link = Link(1e9, 1e-3, "assumed")
    assert gather_pool_s(4e8, 1, link) == 0.0
    assert gather_pool_s(4e8, 2, link) == pytest.approx(0.2 + 1e-3)
    assert gather_pool_s(4e8, 4, link) == pytest.approx(0.3 + 3e-3)


def test_the_pools_entry_splits_the_transform_from_the_augmentation():
    pool = {"per_rank": [{"windows": 1000, "seconds": 3.0}, {"windows": 900, "seconds": 2.5}],
            "augment_s": 0.5, "augmented_windows": 600}
    entry = pool_entry(pool, rank=0)
    assert entry["transform_windows_per_s"] == pytest.approx(1000 / 2.5)
    assert entry["augment_windows_per_s"] == pytest.approx(600 / 0.5)
    assert pool_entry(pool, rank=1)["transform_windows_per_s"] == pytest.approx(900 / 2.0)
    assert pool_entry({**pool, "augment_s": 0.0, "augmented_windows": 0})["augment_windows_per_s"] is None
    assert pool_entry(None) is None


# The profiler's figures are per step and per pass: 8 windows a person (136 training windows: 4 full
# batches of 32 and a part) and a quarter-width cnn1d time every part of a run as 32 a person and the
# full width do, with fewer and smaller steps.
SMALL_RUN = [*TINY_DATA, "--synthetic-windows-per-subject", "8", "--width", "32"]


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    """One real profiler.py run on CPU with tiny settings, shared by the tests below."""
    out = tmp_path_factory.mktemp("profile")
    result = run_subprocess([sys.executable, "profiler.py", *SMALL_RUN, "--device", "cpu", "--warmup-steps", "1",
                             "--steps", "3", "--repeats", "2", "--phase-steps", "2", "--predict-gpus", "2,4,8",
                             "--output-dir", out], timeout=120)
    return result, out


def test_profiler_py_writes_sane_json_and_csv(tiny_profile):
    result, out = tiny_profile
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "samples/s" in result.stdout
    profile = json.loads((out / "profile.json").read_text())
    timing = profile["timing"]
    assert timing["samples_per_s"]["mean"] > 0 and timing["step_time_s"]["mean"] > 0
    assert timing["step_time_min_s"]["mean"] <= timing["step_time_s"]["mean"] <= timing["step_time_max_s"]["mean"]
    assert all(run["samples_per_s"] == pytest.approx(32 / run["step_time_s"]) for run in profile["runs"])
    assert 0 <= timing["data_wait_share"]["mean"] < 1
    assert timing["comm_time_s"]["mean"] == 0 and timing["compute_to_comm_ratio"]["mean"] is None  # inf -> null
    assert len(profile["runs"]) == 2 and all(run["steps"] == 3 for run in profile["runs"])
    parameters = profile["model"]["parameters"]
    assert parameters > 0 and profile["model"]["gradient_bytes"] == 4 * parameters  # fp32 gradients
    assert all(profile["phases"][name] > 0 for name in ("forward_s", "backward_s", "optimizer_s"))
    assert profile["memory"]["per_rank"][0]["peak_rss_gib"] > 0
    assert not profile["allreduce_benchmark"]["measured"] and "assumed" in profile["link"]["source"]
    assert [p["world_size"] for p in profile["predictions"]] == [1, 2, 4, 8]
    assert all(0 < p["speedup"] <= p["world_size"] for p in profile["predictions"])
    # Honest labels: the ranks are CPU processes, only this run's own row is measured, every link assumed.
    assert [p["basis"] for p in profile["predictions"]] == ["measured", "predicted", "predicted", "predicted"]
    assert "CPU processes  nodes  figure" in result.stdout and not re.search(r"^ *GPUs ", result.stdout, re.M)
    assert profile["topology"]["unit"] == "CPU process"
    assert all("assumed" in link["source"] for link in [*profile["topology"]["intra"].values(),
                                                         profile["topology"]["inter"]])
    assert "as measured" not in result.stdout and "as this run measured" not in result.stdout
    effects = profile["host_effects"]  # default threads fill the cores, so no neighbours fit
    assert effects["shared"] == {} and set(effects["straggler_s"]) == {"2", "4", "8"}
    assert effects["ddp_step_s"] >= 0 and all(value >= 0 for value in effects["straggler_s"].values())
    for prediction in profile["predictions"][1:]:
        assert prediction["rank_step_s"] >= timing["step_time_s"]["mean"] + effects["ddp_step_s"] - 1e-12
    assert profile["feature_pool"] is None  # cnn1d learns its features
    run = profile["run_time"]
    assert run["parts"]["build_s"] == 0 and run["parts"]["set_up_s"] > 0 and run["parts"]["validation_s"] > 0
    assert run["parts"]["start_up_s"] > 0 and run["parts"]["loop_s"] >= 0 and run["parts"]["final_eval_s"] > 0
    # A fresh interpreter imported main.py, then TensorBoard at least, then exited.
    assert run["parts"]["imports_s"] > 0 and run["parts"]["exit_s"] > 0
    assert run["parts"]["launcher_s"] > 0  # a fresh launcher over 2 workers that did nothing, timed
    assert run["ridge_in_main"] is False  # cnn1d's head is trained by steps, as profiled
    assert [p["world_size"] for p in run["predictions"]] == [1, 2, 4, 8]
    assert run["predictions"][0]["step_s"] == pytest.approx(timing["step_time_s"]["mean"])
    with open(out / "profile_summary.csv") as handle:
        summary = {row["metric"]: row for row in csv.DictReader(handle)}
    assert float(summary["samples_per_s"]["mean"]) > 0 and float(summary["step_time_s"]["std"]) >= 0
    assert float(summary["predicted_run_s_1proc"]["mean"]) == pytest.approx(run["predictions"][0]["total_s"], rel=1e-5)
    assert "measured_speedup_1proc" in summary and "predicted_speedup_2proc" in summary  # CPU processes, not GPUs
    with open(out / "profile_runs.csv") as handle:
        assert [float(row["step_time_s"]) > 0 for row in csv.DictReader(handle)] == [True, True]


def test_a_pool_models_profile_times_the_build_and_predicts_the_whole_run(tmp_path):
    result = run_subprocess([sys.executable, "profiler.py", *TINY_DATA, "--model", "minirocket", "--width", "840",
                             "--synthetic-windows-per-subject", "8", "--batch-size", "16", "--epochs", "3",
                             "--device", "cpu", "--warmup-steps", "2", "--steps", "5", "--repeats", "1",
                             "--phase-steps", "0", "--predict-gpus", "1,2", "--output-dir", tmp_path], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "feature pool    3 view(s) of " in result.stdout and "whole run       predicted" in result.stdout
    profile = json.loads((tmp_path / "profile.json").read_text())
    pool, run = profile["feature_pool"], profile["run_time"]
    # A split this small main.py solves by ridge: the profile says its steps are --head-fit adamw's.
    assert run["ridge_in_main"] and "with these flags and --head-fit adamw (with auto it solves" in result.stdout
    assert any("solves the head by ridge regression" in note for note in profile["notes"])
    train = profile["config"]["train_windows"]
    assert pool["views"] == 3 and pool["train_windows"] == train  # 3 epochs reach 3 of the 4 views
    assert pool["windows"] > 3 * train and pool["transformed"] == pool["windows"]
    assert pool["bytes"] == pool["windows"] * pool["bytes_per_window"]
    # Views 1 and 2 of the training windows and of the 4 validation people's 8 windows each (the
    # final model trains on every person's views: training/loop/refit.py).
    assert pool["augmented_windows"] == 2 * (train + 4 * 8) and pool["augment_windows_per_s"] > 0
    # The final model's epochs at most (32 validation windows are too few to choose the recipe on).
    assert run["parts"]["after_epochs"] == pytest.approx(3 * (1 + 32 / train))
    assert 0 < run["parts"]["build_s"] == pool["seconds"] < run["parts"]["set_up_s"]
    one, two = run["predictions"]
    assert one["build_s"] == pool["seconds"] and one["steps_per_epoch"] == profile["config"]["steps_per_epoch"]
    # Two ranks would each step the whole global batch on a replica of the head (--pool-head
    # replicated): the step on two batches at once, measured, slowed as a neighbour slows a rank.
    replica_s = run["parts"]["replica_step_s"]["2"]
    assert replica_s > 0 and two["step_s"] != pytest.approx(profile["predictions"][1]["step_s"])
    assert two["step_s"] == pytest.approx(rank_step_s(replica_s, 2, profile["host_effects"], "replicated"))
    assert two["build_s"] > 0 and two["steps_per_epoch"] == math.ceil(math.ceil(train / 2) / 16)
    assert one["total_s"] == pytest.approx(one["fixed_s"] + one["build_s"] + one["training_s"] + one["evaluation_s"])


def two_rank_copy(single, speedup):
    """A made-up 2-rank profile: the real 1-process one, `speedup` times its samples/s."""
    double = copy.deepcopy(single)
    double["config"]["world_size"] = 2
    double["timing"]["samples_per_s"]["mean"] *= speedup
    return double


def test_scaling_report_writers_on_a_two_process_profile_made_from_the_real_one(tiny_profile, tmp_path):
    from benchmarks.scaling.figures import write_figures
    from benchmarks.scaling.tables import write_csv, write_latex, write_text_report
    _, out = tiny_profile
    single = json.loads((out / "profile.json").read_text())
    double = two_rank_copy(single, 1.8)
    double["allreduce_benchmark"] = {"measured": True, "bus_bandwidth_gb_per_s": 1.0, "fitted_link": {
        "bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4, "source": "made up"}}
    rows = scaling_rows([double, single])
    assert [row["world_size"] for row in rows] == [1, 2]
    assert rows[1]["measured_speedup"] == pytest.approx(1.8) and rows[1]["measured_efficiency"] == pytest.approx(0.9)
    assert 1 < rows[1]["predicted_speedup"] < 2
    args = Namespace(warmup_steps=2, steps=5, repeats=2, threads_per_rank=1, predict_gpus=[1, 2, 4])
    paths = [write_csv(rows, tmp_path / "s.csv"), write_latex(rows, tmp_path / "t.tex"),
             write_text_report(rows, [single, double], args, tmp_path / "r.txt"),
             *write_figures(rows, [single, double], [1, 2, 4], tmp_path)]
    assert all(path.stat().st_size > 0 for path in paths) and len(paths) == 7
    assert "measured 1.80x" in (tmp_path / "r.txt").read_text()
    assert "\\begin{tabular}" in (tmp_path / "t.tex").read_text()


def test_the_profile_compares_ddp_compressed_ddp_and_fsdp(tiny_profile):
    _, out = tiny_profile
    profile = json.loads((out / "profile.json").read_text())
    at_4 = {name: next(p for p in predictions if p["world_size"] == 4) for name, predictions in
            profile["strategies"].items()}
    assert set(at_4) == {"ddp", "ddp_fp16", "fsdp"}
    assert at_4["ddp_fp16"]["bytes_sent_per_rank"] == pytest.approx(at_4["ddp"]["bytes_sent_per_rank"] / 2)
    assert at_4["fsdp"]["bytes_sent_per_rank"] == pytest.approx(1.5 * at_4["ddp"]["bytes_sent_per_rank"])
    # cnn1d is one FSDP unit, gathered whole while it runs: 1/4 of the state plus that unit's parameters and gradients
    gradient_bytes, units = profile["model"]["gradient_bytes"], profile["model"]["fsdp_unit_bytes"]
    assert units == [gradient_bytes]
    assert at_4["fsdp"]["model_state_bytes_per_rank"] == pytest.approx(gradient_bytes + 2 * gradient_bytes)
    assert at_4["ddp"]["model_state_bytes_per_rank"] == pytest.approx(4 * gradient_bytes)
    assert set(profile["host_effects"]["wrapper_step_s"]) == {"ddp", "ddp_fp16", "fsdp"}
    assert any(item["topic"] == "strategy" and "FSDP" in item["text"] for item in profile["recommendations"])


def test_scaling_map_rows_and_figure_from_a_real_profile(tiny_profile, tmp_path):
    from benchmarks.scaling.map import format_errors, map_rows, write_map_figure
    _, out = tiny_profile
    single = json.loads((out / "profile.json").read_text())
    double = two_rank_copy(single, 1.6)
    made_up = {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4, "source": "made up"}
    double["collective_links"] = dict.fromkeys(("allreduce", "allreduce_fp16", "all_gather", "reduce_scatter"),
                                               made_up)
    rows = map_rows("tiny", single, {"ddp": double, "fsdp": double}, [2, 4, 8])
    assert [(row["strategy"], row["ranks"]) for row in rows] == [
        ("one process", 1), ("ddp", 2), ("ddp", 4), ("ddp", 8), ("fsdp", 2), ("fsdp", 4), ("fsdp", 8)]
    measured = [row for row in rows if row.get("prediction_error") is not None]
    assert [row["ranks"] for row in measured] == [2, 2]
    assert measured[0]["measured_speedup"] == pytest.approx(1.6)
    assert measured[0]["prediction_error"] == pytest.approx(measured[0]["predicted_speedup"] / 1.6 - 1)
    assert rows[4]["bytes_sent_per_rank_mb"] == pytest.approx(1.5 * rows[1]["bytes_sent_per_rank_mb"])  # FSDP
    assert "largest error" in format_errors(rows)
    assert write_map_figure(rows, tmp_path / "map.png").stat().st_size > 0


def test_scaling_map_rounds_give_the_median_and_the_range_of_the_measured_speedup(tiny_profile, tmp_path):
    from benchmarks.scaling.map import combine_rounds, format_errors, map_rows, write_map_figure
    _, out = tiny_profile
    single = json.loads((out / "profile.json").read_text())
    made_up = {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4, "source": "made up"}
    rounds = []
    for measured_speedup, slower in ((1.2, 1.0), (1.9, 1.1), (1.6, 1.3)):
        lone = copy.deepcopy(single)  # each round its own 1-process step, so its own prediction
        lone["timing"]["step_time_s"]["mean"] *= slower
        double = two_rank_copy(lone, measured_speedup)
        double["collective_links"] = dict.fromkeys(("allreduce", "allreduce_fp16"), made_up)
        rounds.append(map_rows("tiny", lone, {"ddp": double}, [2, 4]))
    rows = combine_rounds(rounds)
    assert [(row["strategy"], row["ranks"], row["rounds"]) for row in rows] == [
        ("one process", 1, 3), ("ddp", 2, 3), ("ddp", 4, 3)]
    at_2 = rows[1]
    assert (at_2["measured_speedup"], at_2["measured_speedup_low"], at_2["measured_speedup_high"]) == \
        pytest.approx((1.6, 1.2, 1.9))
    predicted = sorted(each[1]["predicted_speedup"] for each in rounds)
    assert predicted[0] < predicted[2]  # a slower lone step leaves the exchange a smaller share
    assert at_2["predicted_speedup"] == pytest.approx(predicted[1])
    assert at_2["prediction_error"] == pytest.approx(predicted[1] / 1.6 - 1)
    assert rows[2].get("prediction_error") is None and rows[2]["predicted_speedup"] is not None
    assert "median of 3 rounds, 1.20-1.90x" in format_errors(rows)
    assert write_map_figure(rows, tmp_path / "map.png").stat().st_size > 0


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores for one thread per rank")
def test_one_process_profile_measures_its_step_beside_a_neighbour_and_leaves_none_behind(tmp_path):
    result = run_subprocess([sys.executable, "profiler.py", *SMALL_RUN, "--device", "cpu", "--warmup-steps", "1",
                             "--steps", "3", "--repeats", "2", "--phase-steps", "0", "--predict-gpus", "1,2",
                             "--output-dir", tmp_path], timeout=180, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    effects = json.loads((tmp_path / "profile.json").read_text())["host_effects"]
    assert list(effects["shared"]) == ["2"] and effects["shared"]["2"] > 0
    assert list(effects["slowdown"]) == ["2"] and effects["slowdown"]["2"] > 0
    leftovers = subprocess.run(["pgrep", "-f", "profiling.host_sharing"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""


def _process_state(pid, waiting_for=None, timeout_s=5.0):
    """The one-letter state in /proc/<pid>/stat (R, S, T for stopped...), polled until it is `waiting_for`."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if waiting_for is None or (state == "T") == (waiting_for == "T") or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_paused_neighbours_are_stopped_and_a_paused_one_still_ends_with_the_block():
    from profiling.host_sharing import Neighbours
    with Neighbours([*SMALL_RUN, "--device", "cpu", "--warmup-steps", "1"], 1, 1) as neighbours:
        process = neighbours.processes[0]
        neighbours.pause()
        assert _process_state(process.pid, waiting_for="T") == "T"  # the lone run has the cores to itself
        neighbours.resume()
        assert _process_state(process.pid, waiting_for="running") != "T"
        neighbours.pause()  # the block ends while it is stopped: it must still terminate, not hang
    assert process.returncode is not None


def test_interleave_reverses_the_order_every_other_round_and_keeps_each_sides_results():
    from profiling.interleave import interleave, per_side
    ran = []

    def side(name):
        return lambda round_index: ran.append(name) or f"{name}{round_index}"
    rounds = list(interleave({"a": side("a"), "b": side("b")}, 3))
    assert ran == ["a", "b", "b", "a", "a", "b"]
    assert per_side(rounds) == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}
    # Each round also says how busy other processes kept the host: a share of cores on Linux, else unknown.
    assert all((others is None) if sys.platform != "linux" else (isinstance(others, float) and others >= 0.0)
               for _, others in rounds)


def test_bad_input_is_one_line_and_exit_2():
    result = run_subprocess([sys.executable, "profiler.py", "--steps", "0", "--device", "cpu"], timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --steps must be at least 1, got 0"
    assert "Traceback" not in result.stderr


def test_an_output_dir_that_cannot_be_a_folder_is_refused_before_measuring(tmp_path):
    from profiling.cli import parse_profiler_args
    (tmp_path / "file").write_text("keep me")
    for out, says in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "p", "cannot be created")):
        with pytest.raises(OutputRefused, match=f"--output-dir {out} {says}"):
            parse_profiler_args([*TINY_DATA, "--device", "cpu", "--output-dir", str(out)])
    assert (tmp_path / "file").read_text() == "keep me"


def test_a_profile_folder_whose_files_are_held_by_other_things_is_refused_before_measuring(tmp_path):
    from profiling.cli import parse_profiler_args
    from profiling.report import check_profile_folder
    from training.errors import UsageError
    with pytest.raises(UsageError, match="--output-dir is empty"):
        parse_profiler_args([*TINY_DATA, "--device", "cpu", "--output-dir", ""])
    (tmp_path / "profile_runs.csv").mkdir()
    (tmp_path / "trace").write_text("keep me")
    with pytest.raises(OutputRefused, match="profile_runs.csv is a folder, where the profile writes a file"):
        check_profile_folder(tmp_path, trace=False)
    (tmp_path / "profile_runs.csv").rmdir()
    check_profile_folder(tmp_path, trace=False)
    with pytest.raises(OutputRefused, match="trace is a file, where the profile keeps a folder"):
        check_profile_folder(tmp_path, trace=True)
    assert (tmp_path / "trace").read_text() == "keep me"
    # The default folder, profiles/ in the working folder, is checked as a given one is.
    (tmp_path / "profiles").write_text("keep me")
    with pytest.raises(OutputRefused, match="profiles is a file"):
        check_profile_folder(tmp_path / "profiles" / "cnn1d_bs32_1xcpu", trace=False)


def test_a_batch_larger_than_the_data_is_one_line_not_an_endless_wait(tmp_path):
    # The profiler times full batches only; with none to draw it must say so instead of looping.
    result = run_subprocess([sys.executable, "profiler.py", *TINY_DATA, "--synthetic-windows-per-subject", "4",
                             "--batch-size", "512", "--device", "cpu", "--warmup-steps", "1", "--steps", "2",
                             "--repeats", "1", "--phase-steps", "0", "--output-dir", tmp_path / "p"], timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--batch-size 512 is more than one process's share" in result.stderr
    assert not (tmp_path / "p").exists()


def test_fsdp_keeping_gathered_parameters_sends_one_all_gather_less():
    link = Link(1e9, 1e-4, "made up")
    links = dict.fromkeys(("allreduce", "allreduce_fp16", "all_gather", "reduce_scatter"), link)
    resharded, kept = (predict_strategy("fsdp", 0.01, Exchange(4e6, (1e6, 1e6, 2e6), reshard_after_forward=flag), 4,
                                        links)
                       for flag in (True, False))
    # Two all-gathers and a reduce-scatter against one all-gather and the reduce-scatter.
    assert kept["bytes_sent_per_rank"] == pytest.approx(resharded["bytes_sent_per_rank"] * 2 / 3)
    assert kept["comm_s"] < resharded["comm_s"]
