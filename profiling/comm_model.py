"""Pure arithmetic of data-parallel scaling: ring all-reduce cost, compute/communication split, speedup.

Conventions used throughout:
- Weak scaling: the per-GPU batch stays fixed, so N GPUs process N times the samples per step,
  and speedup is measured in global samples/s: S(N) = N x T_step(1) / T_step(N).
- No overlap: the predicted step time is T_compute + T_allreduce(N), as if the all-reduce
  started only after the whole backward pass. That is exact when every gradient lands in one
  DDP bucket (DDP then launches the all-reduce at the end of backward) and pessimistic otherwise.
- Bandwidth is bus bandwidth in bytes/s (the nccl-tests convention), latency is per ring step; which
  link paces a ring over several nodes is profiling/topology.py's to say.
"""
import math
from dataclasses import dataclass

BYTES_PER_GB = 1e9  # decimal gigabytes, as bandwidths are quoted
BYTES_PER_MB = 1e6
DDP_FIRST_BUCKET_BYTES = 1024 ** 2  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_CAP_MB = 25  # DistributedDataParallel's default bucket_cap_mb (MiB)


@dataclass(frozen=True)
class Link:
    """What the all-reduce runs over: bus bandwidth, latency per ring step and where they came from."""
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str  # e.g. "measured: gloo, 2 ranks" or "assumed: --assumed-bandwidth-gbps 20"


def ring_allreduce_time_s(gradient_bytes, world_size, bandwidth_bytes_per_s, latency_s=0.0, messages=1, passes=2):
    """Time of a ring all-reduce: 2 (N-1)/N x bytes / bandwidth, plus 2 (N-1) latencies per message. It is a
    reduce-scatter and an all-gather (passes=1: one of them alone), each N-1 steps that move 1/N of the buffer;
    `messages` counts separate calls (DDP buckets), each paying the latency."""
    if world_size <= 1:
        return 0.0
    ring_steps = passes * (world_size - 1)
    bandwidth_s = ring_steps / world_size * gradient_bytes / bandwidth_bytes_per_s
    return bandwidth_s + ring_steps * latency_s * messages


def bus_bandwidth_bytes_per_s(buffer_bytes, seconds, world_size):
    """Bus bandwidth of a measured all-reduce, comparable across N (nccl-tests' busbw)."""
    if world_size <= 1 or seconds <= 0:
        return math.inf
    return 2 * (world_size - 1) / world_size * buffer_bytes / seconds


def fit_ring_link(buffer_bytes, buffer_s, tiny_s, world_size, source, passes=2):
    """A Link from two timings of a collective of `passes` ring passes (see ring_allreduce_time_s): the
    one-element call gives the latency, the rest of the buffer's gives the bandwidth. Reproduces buffer_s."""
    ring_steps = passes * (world_size - 1)
    payload_s = buffer_s - tiny_s
    # A buffer no slower than one element is all latency; its bandwidth cannot be told apart.
    bandwidth = ring_steps / world_size * buffer_bytes / payload_s if payload_s > 0 else math.inf
    return Link(bandwidth, tiny_s / ring_steps, source)


# What the advisor compares. FSDP's units: each transformer block and the root (training/distributed/fsdp.py).
STRATEGIES = ("ddp", "ddp_fp16", "fsdp")
# The collectives those strategies call, each with a link of its own where a run measured them.
COLLECTIVES = ("allreduce", "allreduce_fp16", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Exchange:
    """What a step's collectives move: the gradients' bytes, and the parameter bytes of each unit FSDP
    gathers on its own (empty: one unit of all of them)."""
    gradient_bytes: int
    unit_bytes: tuple = ()
    reshard_after_forward: bool = True

    @property
    def units(self):
        return len(self.unit_bytes) or 1

    @property
    def largest_unit_bytes(self):
        return max(self.unit_bytes, default=self.gradient_bytes)


def strategy_comm(strategy, exchange, world_size, links):
    """(seconds of communication per optimizer step, bytes each rank sends) for one strategy, no overlap
    with compute assumed: DDP's ring all-reduce of the gradients (fp16 halves them), or FSDP's
    collectives_per_step, each call moving a unit: about 1.5 times DDP's bytes."""
    if world_size <= 1:
        return 0.0, 0.0
    ring = (world_size - 1) / world_size
    gradient_bytes = exchange.gradient_bytes
    if strategy in ("ddp", "ddp_fp16"):
        payload = gradient_bytes / 2 if strategy == "ddp_fp16" else gradient_bytes
        link = links["allreduce_fp16" if strategy == "ddp_fp16" else "allreduce"]
        # The buckets hold fp32 gradients; the hook halves each bucket's bytes, not their number.
        seconds = ring_allreduce_time_s(payload, world_size, link.bandwidth_bytes_per_s, link.latency_s,
                                        ddp_bucket_count(gradient_bytes))
        return seconds, 2 * ring * payload
    gathers = fsdp_gathers(exchange.reshard_after_forward)
    seconds = sum(calls * ring_allreduce_time_s(gradient_bytes, world_size, link.bandwidth_bytes_per_s, link.latency_s,
                                                exchange.units, passes=1)
                  for calls, link in ((gathers, links["all_gather"]), (1, links["reduce_scatter"])))
    return seconds, (gathers + 1) * ring * gradient_bytes


def collectives_per_step(strategy, gradient_bytes, units=1, reshard_after_forward=True):
    """Separate collective calls of one optimizer step: DDP one all-reduce per bucket (a compression hook
    shrinks each bucket, not their number); FSDP per unit its all-gathers and a reduce-scatter."""
    if strategy == "fsdp":
        return (fsdp_gathers(reshard_after_forward) + 1) * units
    return ddp_bucket_count(gradient_bytes)


def fsdp_gathers(reshard_after_forward):
    """All-gathers of each unit per step: for forward, and again for backward when resharded after forward."""
    return 2 if reshard_after_forward else 1


def model_state_bytes(strategy, parameter_bytes, world_size, largest_unit_bytes=0):
    """A rank's parameters, gradients and AdamW moments (4 x the parameters in fp32): whole under DDP;
    1/N under FSDP, plus the largest unit gathered whole (its parameters and gradients) while it runs."""
    if strategy == "fsdp" and world_size > 1:
        return 4 * parameter_bytes / world_size + 2 * largest_unit_bytes
    return 4 * parameter_bytes


def ddp_bucket_count(gradient_bytes):
    """Buckets DDP fills (approximately: real buckets end at parameter boundaries)."""
    if gradient_bytes <= DDP_FIRST_BUCKET_BYTES:
        return 1
    return 1 + math.ceil((gradient_bytes - DDP_FIRST_BUCKET_BYTES) / (DDP_BUCKET_CAP_MB * 1024 ** 2))


def comm_split(step_s, compute_s):
    """(T_comm, R) from a normal step and the same step under no_sync: T_comm = max(T_step -
    T_compute, 0) is the communication left exposed; R = T_compute / T_comm (inf when 0)."""
    comm_s = max(step_s - compute_s, 0.0)
    return comm_s, (compute_s / comm_s if comm_s > 0 else math.inf)


def speedup(world_size, step_1_s, step_n_s):
    """Global samples/s of N GPUs over one, each GPU with the same per-GPU batch."""
    return world_size * step_1_s / step_n_s


def share(part_s, whole_s):
    return part_s / whole_s if whole_s > 0 else 0.0


def rank_step_s(compute_s, world_size, host_effects=None, strategy="ddp"):
    """One rank's step without its communication when N ranks run: the lone step, or, with the host
    effects a 1-process profile measured (profiling/host_sharing.py), the step and the strategy's
    own cost (DDP's where a profile predates the others), both slowed by the neighbours that share
    a rank's node (the ranks on the busiest node, however many nodes there are), plus the wait for
    the slowest of all N ranks."""
    if world_size <= 1 or not host_effects:
        return compute_s
    slowdowns = host_effects.get("slowdown", {})  # none in a profile written before it was measured
    # A profile written before the topology measured every count it had on one node.
    per_node = host_effects.get("ranks_per_node") or max(map(int, slowdowns), default=1)
    slowdown = _worst_up_to(slowdowns, min(world_size, per_node), 1.0)
    straggler_s = _worst_up_to(host_effects["straggler_s"], world_size, 0.0)
    own_s = 0.0 if strategy == "replicated" else (  # a replica steps the bare model: no wrapper
        (host_effects.get("wrapper_step_s") or {}).get(strategy, host_effects["ddp_step_s"]))
    return (compute_s + own_s) * slowdown + straggler_s


def _worst_up_to(table, count, floor):
    """The largest figure measured for `count` or fewer ranks (at least `floor`): one more neighbour
    never speeds a rank up, one more rank never shortens the wait for the slowest, so two noisy
    measurements cannot make more ranks look cheaper than fewer. JSON turns the integer keys into
    strings; a profile read back predicts the same."""
    return max([floor, *(value for key, value in table.items() if int(key) <= count)])


def predict_world(compute_s, gradient_bytes, world_size, link, messages=1, accumulation=1, host_effects=None):
    """The predicted DDP step on N GPUs from one GPU's compute time. With gradient accumulation k the
    all-reduce is paid once per k micro-batches: the per-micro-batch step is T_compute + T_allreduce / k."""
    allreduce_s = ring_allreduce_time_s(gradient_bytes, world_size, link.bandwidth_bytes_per_s,
                                        link.latency_s, messages) / accumulation
    rank_s = rank_step_s(compute_s, world_size, host_effects)
    step_s = rank_s + allreduce_s
    gain = speedup(world_size, compute_s, step_s)
    return {"world_size": world_size, "allreduce_s": allreduce_s, "rank_step_s": rank_s, "step_s": step_s,
            "speedup": gain, "efficiency": gain / world_size, "allreduce_share": share(allreduce_s, step_s),
            "compute_to_comm_ratio": rank_s / allreduce_s if allreduce_s > 0 else math.inf}


def predict_strategy(strategy, compute_s, exchange, world_size, links, host_effects=None):
    """predict_world for one strategy of STRATEGIES, with its bytes on the wire and per-rank model state;
    `links`: {collective kind: the Link that paces it on world_size ranks}."""
    rank_s = rank_step_s(compute_s, world_size, host_effects, strategy)
    comm_s, sent_bytes = strategy_comm(strategy, exchange, world_size, links)
    step_s = rank_s + comm_s
    gain = speedup(world_size, compute_s, step_s)
    state_bytes = model_state_bytes(strategy, exchange.gradient_bytes, world_size, exchange.largest_unit_bytes)
    return {"strategy": strategy, "world_size": world_size, "comm_s": comm_s, "bytes_sent_per_rank": sent_bytes,
            "step_s": step_s, "speedup": gain, "efficiency": gain / world_size,
            "model_state_bytes_per_rank": state_bytes}


def accumulation_for_efficiency(compute_s, allreduce_s, target_efficiency, rank_s=None):
    """Smallest accumulation k with T_compute / (T_rank + T_allreduce / k) >= target, where T_rank is a
    rank's step without its all-reduce (the lone step where not given); None where no k reaches the
    target, a rank's own step being too slow already (neighbours, the slowest rank, DDP's own cost)."""
    rank_s = compute_s if rank_s is None else rank_s
    slack_s = compute_s / target_efficiency - rank_s  # the all-reduce time a step may carry
    if allreduce_s <= 0 and slack_s >= -1e-15:
        return 1
    if slack_s <= 0:
        return None
    return max(1, math.ceil(allreduce_s / slack_s - 1e-12))
