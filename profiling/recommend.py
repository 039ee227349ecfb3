"""Recommendations as numbers worked out from the measured figures, each with what it assumes."""
import math
from dataclasses import dataclass, replace

from profiling.comm_model import (
    BYTES_PER_MB,
    DDP_BUCKET_CAP_MB,
    DDP_FIRST_BUCKET_BYTES,
    accumulation_for_efficiency,
    ddp_bucket_count,
    predict_world,
    share,
)
from profiling.topology import Topology, counted, plural, ring_link

GOOD_EFFICIENCY = 0.8  # the efficiency below which more GPUs are called poor value
ACCUMULATION_TARGET = 0.9
DATA_WAIT_WORRY = 0.1  # a data-wait share above this is worth fixing before anything else


@dataclass
class Figures:
    """What the recommendations are computed from; times are per optimizer step of one rank (a GPU, or
    a CPU process: topology.unit)."""
    compute_s: float  # T_compute: the step with no all-reduce
    gradient_bytes: int
    topology: Topology
    batch_size: int  # per rank
    amp_enabled: bool
    data_wait_share: float
    backward_s: float = None  # from the phase breakdown, when it ran
    planned: int = None  # the world size the advice is for; None: the largest predicted
    host_effects: dict = None  # what N ranks add beyond the lone step (profiling/host_sharing.py)
    strategies: dict = None  # strategy name -> comm_model.predict_strategy for each N
    device_memory_bytes: int = None  # the GPU's memory; None on CPU


def recommendations(figures, world_sizes):
    """Every recommendation as {"topic", "text", "figures"}; the text carries the numbers. The advice on
    strategy, batch, accumulation, precision and buckets is for the planned world size; with none
    above 1 there is nothing to scale, and the advice says how to name one."""
    planned = figures.planned or max(world_sizes)
    if planned <= 1:
        return [_item("gpu count", f"planned on {counted(1, figures.topology.unit)}: no count to predict; name the "
                                   "cluster with --plan NODESxGPUS (e.g. 2x8) or counts with --predict-gpus", {}),
                _data_loading(figures)]
    figures = replace(figures, planned=planned)
    return [_gpu_count(figures, world_sizes), _strategy(figures), _larger_batch(figures), _accumulation(figures),
            _half_precision_gradients(figures), _buckets(figures), _data_loading(figures)]


def larger_batch_shares(compute_s, allreduce_s, batch_size, new_batch_size):
    """All-reduce share of the step before and after raising the per-GPU batch, assuming compute
    time grows in proportion to the batch while the all-reduce (same gradient bytes) does not."""
    scaled_compute_s = compute_s * new_batch_size / batch_size
    return share(allreduce_s, compute_s + allreduce_s), share(allreduce_s, scaled_compute_s + allreduce_s)


def _gpu_count(f, world_sizes):
    unit = f.topology.unit
    predicted = [_predict(f, n) for n in world_sizes if n > 1]
    table = {f"speedup_{p['world_size']}": p["speedup"] for p in predicted}
    worthwhile = [p for p in predicted if p["efficiency"] >= GOOD_EFFICIENCY]
    first = predicted[0]
    if all(p["speedup"] < 1 for p in predicted):
        text = (f"stay on one {unit}: predicted speedup on {counted(first['world_size'], unit)} "
                f"{first['speedup']:.2f}x < 1 (all-reduce {_ms(first['allreduce_s'])} vs compute "
                f"{_ms(f.compute_s)} per step)")
    elif worthwhile:
        best = worthwhile[-1]
        text = (f"up to {counted(best['world_size'], unit)} stay above {GOOD_EFFICIENCY:.0%} efficiency: predicted "
                f"speedup {best['speedup']:.2f}x ({best['efficiency']:.0%})")
    else:
        gain = max(predicted, key=lambda p: p["speedup"])
        text = (f"more {plural(unit)} help but waste most of each: best predicted speedup {gain['speedup']:.2f}x on "
                f"{counted(gain['world_size'], unit)} ({gain['efficiency']:.0%} efficiency)")
    if not worthwhile:
        # A model this small rarely fills one GPU, so the GPUs pay off as independent jobs instead.
        text += (f"; what would pay: a larger batch per {unit} or --grad-accum-steps (see below), which spread "
                 f"the all-reduce and DDP's fixed cost over more samples, or independent jobs, one per {unit}: "
                 "cross-validation folds with torchrun ... main_multi_gpu.py --multi-gpu ddp --cv-folds K, or "
                 "separate seeds or recipes")
    text += (f" [link on {counted(f.planned, unit)}: {ring_link(f.topology, f.planned).source}; no overlap of "
             "all-reduce and backward assumed]")
    return _item("gpu count", text, table)


MEMORY_SHARE_FOR_STATE = 0.5  # beyond this share of the GPU for the model state, activations will not fit


def _strategy(f):
    """DDP, DDP with fp16 gradients or FSDP at the planned N, from the predicted speedup and what
    each leaves of the GPU's memory."""
    if not f.strategies:
        return _item("strategy", "not compared (no strategy predictions)", {})
    n, unit = f.planned, f.topology.unit
    at_n = {name: _at(predictions, n) for name, predictions in f.strategies.items()}
    figures = {f"speedup_{name}": p["speedup"] for name, p in at_n.items()}
    figures.update({f"model_state_mb_{name}": p["model_state_bytes_per_rank"] / BYTES_PER_MB
                    for name, p in at_n.items()})
    described = "; ".join(
        f"{_STRATEGY_NAMES[name]} {p['speedup']:.2f}x, {p['bytes_sent_per_rank'] / BYTES_PER_MB:.2f} MB sent and "
        f"{p['model_state_bytes_per_rank'] / BYTES_PER_MB:.2f} MB of model state per {unit}"
        for name, p in at_n.items())
    fits = {name: f.device_memory_bytes is None or
            p["model_state_bytes_per_rank"] <= MEMORY_SHARE_FOR_STATE * f.device_memory_bytes
            for name, p in at_n.items()}
    candidates = [name for name in at_n if fits[name]] or ["fsdp"]
    best = max(candidates, key=lambda name: at_n[name]["speedup"])
    if at_n[best]["speedup"] < 1:
        verdict = f"none of them beats one {unit} here: keep one {unit} per job (cross-validation folds, seeds)"
    elif not fits["ddp"]:
        verdict = (f"DDP's model state would take over {MEMORY_SHARE_FOR_STATE:.0%} of the GPU: use --multi-gpu fsdp, "
                   "which keeps 1/N of it per GPU")
    else:
        verdict = f"use {_STRATEGY_FLAGS[best]} (the fastest that fits)"
    return _item("strategy", f"predicted on {counted(n, unit)}: {described}. {verdict} [no overlap of communication "
                             "and compute assumed; FSDP's sharded optimizer step, 1/N of the work, not counted]",
                 figures)


_STRATEGY_NAMES = {"ddp": "DDP", "ddp_fp16": "DDP with fp16 gradients", "fsdp": "FSDP"}
_STRATEGY_FLAGS = {"ddp": "--multi-gpu ddp", "ddp_fp16": "--multi-gpu ddp --grad-compression fp16 (or bf16)",
                   "fsdp": "--multi-gpu fsdp"}


def _larger_batch(f):
    new_batch = f.batch_size * 8
    n, unit = f.planned, f.topology.unit
    allreduce_s = _predict(f, n)["allreduce_s"]
    before, after = larger_batch_shares(f.compute_s, allreduce_s, f.batch_size, new_batch)
    text = (f"batch per {unit} {f.batch_size} -> {new_batch} would cut the predicted all-reduce share of the step "
            f"on {counted(n, unit)} from {before:.0%} to {after:.0%} (assumes compute grows in proportion to the "
            "batch; a small batch that leaves the device idle grows less, so the real cut is smaller; the "
            "learning rate must follow the larger global batch)")
    return _item("batch size", text, {"batch_size": f.batch_size, "new_batch_size": new_batch,
                                      "allreduce_share_before": before, "allreduce_share_after": after})


def _accumulation(f):
    n, k = f.planned, 4
    plain, accumulated = _predict(f, n), _predict(f, n, accumulation=k)
    needed = accumulation_for_efficiency(f.compute_s, plain["allreduce_s"], ACCUMULATION_TARGET, plain["rank_step_s"])
    reach = (f"{ACCUMULATION_TARGET:.0%} efficiency needs k >= {needed}" if needed else
             f"no k reaches {ACCUMULATION_TARGET:.0%} efficiency: without the all-reduce a rank's step is already "
             f"{f.compute_s / plain['rank_step_s']:.0%} as fast as the lone one (neighbours on its node, the wait for "
             "the slowest rank, DDP's own cost)")
    text = (f"--grad-accum-steps {k} would give a predicted speedup of {accumulated['speedup']:.2f}x on "
            f"{counted(n, f.topology.unit)} (vs {plain['speedup']:.2f}x without), by all-reducing once per {k} "
            f"micro-batches; {reach}. The global batch grows k-fold, with the same effect on the learning rate as a "
            "larger batch")
    return _item("gradient accumulation", text, {"accumulation": k, "speedup_without": plain["speedup"],
                                                 "speedup_with": accumulated["speedup"],
                                                 "accumulation_for_target": needed})


def _half_precision_gradients(f):
    n = f.planned
    amp_state = "on" if f.amp_enabled else "off"
    text = (f"AMP (here {amp_state}) does not shrink the all-reduce: autocast keeps parameters and "
            f"gradients in fp32, so DDP sends {f.gradient_bytes / BYTES_PER_MB:.2f} MB either way; "
            "--grad-compression fp16 (or bf16) compresses them in a DDP communication hook and sends "
            f"{f.gradient_bytes / 2 / BYTES_PER_MB:.2f} MB")
    if f.strategies and {"ddp", "ddp_fp16"} <= set(f.strategies):
        # The strategy table's own figures: the fp16 all-reduce over its own link (where a run measured
        # it, a backend may sum half precision slower than it saves in bytes) and the hook's cost, so
        # the two never disagree.
        full, half = (_at(f.strategies[name], n) for name in ("ddp", "ddp_fp16"))
        full_s, half_s = full["comm_s"], half["comm_s"]
        measured = f.topology.intra["allreduce_fp16"].source.startswith("measured")
        how = ("the fp16 all-reduce as this run measured it inside a node" if measured else
               "the fp16 all-reduce assumed as fast as fp32's, no collective measured") + \
            "; the speedup counts the hook's own cost"
    else:
        full, half = _predict(f, n), _predict(f, n, sent_bytes=f.gradient_bytes // 2)
        full_s, half_s, how = full["allreduce_s"], half["allreduce_s"], "fp32's link, latency unchanged"
    text += (f", predicted all-reduce {_ms(full_s)} -> {_ms(half_s)} on {counted(n, f.topology.unit)} ({how}), "
             f"speedup {full['speedup']:.2f}x -> {half['speedup']:.2f}x")
    if half["speedup"] < full["speedup"]:
        text += ": here it does not pay"
    text += ". AMP's faster compute raises the all-reduce share instead"
    return _item("precision", text, {"gradient_mb": f.gradient_bytes / BYTES_PER_MB,
                                     "compressed_gradient_mb": f.gradient_bytes / 2 / BYTES_PER_MB,
                                     "speedup_fp32_grads": full["speedup"], "speedup_half_grads": half["speedup"]})


def _buckets(f):
    n, unit = f.planned, f.topology.unit
    buckets = ddp_bucket_count(f.gradient_bytes)
    allreduce_s = _predict(f, n)["allreduce_s"]
    gradient_mb = f.gradient_bytes / BYTES_PER_MB
    text = (f"bucket_cap_mb: gradients are {gradient_mb:.2f} MB vs DDP's {DDP_BUCKET_CAP_MB} MiB buckets "
            f"(first bucket {DDP_FIRST_BUCKET_BYTES / 1024 ** 2:.0f} MiB): {buckets} bucket(s)")
    if buckets == 1:
        text += (", so the all-reduce starts only after the whole backward and nothing overlaps; smaller "
                 "buckets could overlap it with backward")
    else:
        text += ", which DDP all-reduces while backward still runs"
    if f.backward_s is not None:
        hidden_s = min(allreduce_s, f.backward_s)
        text += (f"; overlap could hide at most {_ms(hidden_s)} of the predicted {_ms(allreduce_s)} all-reduce on "
                 f"{counted(n, unit)} (backward takes {_ms(f.backward_s)})")
    text += (f", while each extra bucket adds {_ms(2 * (n - 1) * ring_link(f.topology, n).latency_s)} of latency. "
             "bucket_cap_mb is not a flag here: DDP is built in training/distributed/strategy.py")
    return _item("ddp buckets", text, {"gradient_mb": gradient_mb, "buckets": buckets,
                                       "bucket_cap_mb": DDP_BUCKET_CAP_MB})


def _data_loading(f):
    if f.data_wait_share > DATA_WAIT_WORRY:
        text = (f"data loading takes {f.data_wait_share:.0%} of the step: fix it first (--num-workers, "
                "pinned memory); it adds to every rank's step and no all-reduce change removes it")
    else:
        text = f"data loading takes {f.data_wait_share:.1%} of the step: not the bottleneck"
    return _item("data loading", text, {"data_wait_share": f.data_wait_share})


def _predict(f, world_size, accumulation=1, sent_bytes=None):
    """predict_world for the figures' DDP step; the buckets stay those of the fp32 gradients."""
    sent_bytes = f.gradient_bytes if sent_bytes is None else sent_bytes
    return predict_world(f.compute_s, sent_bytes, world_size, ring_link(f.topology, world_size),
                         ddp_bucket_count(f.gradient_bytes), accumulation, f.host_effects)


def _at(predictions, world_size):
    """The prediction for `world_size` among one strategy's predictions."""
    return next(p for p in predictions if p["world_size"] == world_size)


def _item(topic, text, numbers):
    return {"topic": topic, "text": text, "figures": numbers}


def _ms(seconds):
    if math.isinf(seconds):
        return "inf ms"
    return f"{seconds * 1e3:.3g} ms"
