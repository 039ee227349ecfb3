"""The cluster the advisor predicts for: how many ranks share a node, the link inside a node and the
link between nodes (each a bus bandwidth and a latency per ring step, see comm_model.py), which
counts to predict, and where each of these came from: a flag, this run's measurement, or a preset.

A collective over ranks on several nodes is modelled as one flat ring paced by the slowest link it
crosses: every ring step moves 1/N of the buffer over every hop at once, so a step lasts as long as
its slowest hop. That is how NCCL's rings behave, and why nccl-tests report the bus bandwidth of an
all-reduce across nodes close to the network bandwidth of one node (all its NICs together), however
fast NVLink is inside it. A hierarchical all-reduce (reduce-scatter inside each node, all-reduce of
1/g of the buffer between nodes, all-gather inside) or NCCL's tree can do better with many nodes, so
predictions across nodes lean pessimistic.
"""
import argparse
import math
import os
from dataclasses import dataclass, replace

import torch

from profiling.comm_model import BYTES_PER_GB, COLLECTIVES, Link


@dataclass(frozen=True)
class Preset:
    bandwidth_gbps: float  # bus bandwidth, GB/s (1e9 bytes/s)
    latency_us: float  # per ring step
    what: str  # the assumption behind the figures


# Assumptions, not measurements: a run with 2+ ranks measures its own link inside a node; flags
# override any of them.
LINK_PRESETS = {
    # nccl-tests issue 212: NVLink 4 on H100 SXM runs at 450 GB/s line rate, NCCL's ring reaching
    # about 370 GB/s bus bandwidth after protocol overhead (NVLink SHARP more).
    "nvlink": Preset(370.0, 3.0, "NVLink 4 (H100 SXM), NCCL's ring"),
    "pcie": Preset(20.0, 5.0, "PCIe 4.0 x16 without NVLink, 32 GB/s line rate a direction, NCCL about 20"),
    # Two gloo processes on the 2-core development machine, each call after a step's busy time
    # (profiling/allreduce_bench.py): 0.1 to 1.5 GB/s and 0.5 to 1.4 ms per ring step.
    "loopback": Preset(0.5, 800.0, "gloo over loopback TCP between CPU processes on one host"),
    "infiniband": Preset(50.0, 5.0, "InfiniBand NDR, 400 Gb/s = 50 GB/s, one NIC per node"),
    "ethernet": Preset(12.5, 50.0, "100 GbE, 12.5 GB/s, one NIC per node, TCP"),
}
INTRA_NODE = ("nvlink", "pcie", "loopback")
INTER_NODE = ("infiniband", "ethernet")
DEFAULT_LINKS = {"cuda": ("pcie", "infiniband"), "cpu": ("loopback", "ethernet")}  # (inside, between)


@dataclass(frozen=True)
class Topology:
    ranks_per_node: int
    intra: dict  # collective kind (COLLECTIVES) -> Link between two ranks of one node
    inter: Link  # between nodes: one node's network bandwidth, all its NICs together
    unit: str  # what a rank is: "GPU" or "CPU process"


@dataclass(frozen=True)
class Plan:
    """Which world sizes to predict (1 first) and the one the advice is for, with why."""
    ranks_per_node: int
    counts: tuple
    planned: int
    why: str


def nodes_for(world_size, ranks_per_node):
    return math.ceil(world_size / ranks_per_node)


def ranks_on_node(world_size, ranks_per_node):
    """Ranks that share the busiest node: nodes are filled one after the other."""
    return min(world_size, ranks_per_node)


def ring_link(topology, world_size, kind="allreduce"):
    """The link that paces a ring of `world_size` ranks: inside a node while they fit on one, the
    link between nodes with one rank per node, else the slower of the two in bandwidth and latency."""
    intra = topology.intra[kind]
    if world_size <= topology.ranks_per_node:
        return intra
    inter = topology.inter
    if topology.ranks_per_node == 1:
        return inter
    return Link(min(intra.bandwidth_bytes_per_s, inter.bandwidth_bytes_per_s), max(intra.latency_s, inter.latency_s),
                f"the slower of the links inside a node ({intra.source}) and between nodes ({inter.source})")


def links_at(topology, world_size):
    """{collective kind: the Link that paces it on `world_size` ranks}."""
    return {kind: ring_link(topology, world_size, kind) for kind in topology.intra}


def counted(count, unit):
    """'1 GPU', '8 GPUs', '2 CPU processes'."""
    return f"{count} {unit if count == 1 else plural(unit)}"


def plural(unit):
    return unit + ("es" if unit.endswith("s") else "s")


def unit_of(device_type):
    return "GPU" if device_type == "cuda" else "CPU process"


def plan_flag(text):
    """An argparse type: NODESxGPUS such as 2x8 -> (2, 8)."""
    nodes, _, per_node = text.lower().partition("x")
    try:
        shape = int(nodes), int(per_node)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NODESxGPUS such as 2x8, got {text!r}") from None
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(f"nodes and GPUs per node must be at least 1, got {text!r}")
    return shape


def default_ranks_per_node(device_type, threads, local_world_size, visible_gpus, cores):
    """What one node holds when no flag says: its GPUs, or for CPU processes as many as its cores
    give each the profiled threads; never fewer than this run already placed on it."""
    held = visible_gpus if device_type == "cuda" else cores // max(threads, 1)
    return max(held, local_world_size, 1)


def planned_counts(named, plan, world_size, ranks_per_node):
    """(counts to predict: 1, this run's world size (measured), the planned count and the named ones;
    the planned count): --plan's, else the largest named, else this run's world size, else one full node."""
    if plan:
        planned = plan[0] * plan[1]
    elif named:
        planned = max(named)
    else:
        planned = world_size if world_size > 1 else ranks_per_node
    return tuple(sorted({1, world_size, planned, *(named or ())})), planned


def resolve_plan(args, device_type, world_size):
    """The Plan of this profile from its flags and this machine."""
    threads, cores = torch.get_num_threads(), available_cores()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    unit = unit_of(device_type)
    if args.plan:
        per_node, per_node_why = args.plan[1], f"--plan {args.plan[0]}x{args.plan[1]}"
    elif args.gpus_per_node:
        per_node, per_node_why = args.gpus_per_node, "--gpus-per-node"
    else:
        visible = torch.cuda.device_count() if device_type == "cuda" else 0
        per_node = default_ranks_per_node(device_type, threads, local, visible, cores)
        per_node_why = (f"this machine's {visible} visible GPU(s)" if device_type == "cuda" else
                        f"this host's {cores} core(s) / {threads} thread(s) a process") + \
            (f", this run's {local} on it" if local > 1 else "")
    counts, planned = planned_counts(args.predict_gpus, args.plan, world_size, per_node)
    planned_why = (f"--plan {args.plan[0]}x{args.plan[1]}" if args.plan else "the largest of --predict-gpus"
                   if args.predict_gpus else f"this run's {world_size} ranks" if world_size > 1 else "one full node")
    why = f"{counted(per_node, unit)} per node ({per_node_why}); planned: {counted(planned, unit)} ({planned_why})"
    return Plan(per_node, counts, planned, why)


def available_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def build_topology(args, device_type, ranks_per_node, measured=None, spans_nodes=False):
    """The Topology for the predictions: for each link a flag wins, then this run's measurement
    (`measured`: {kind: Link} of 2+ ranks, which lie inside one node unless `spans_nodes`), then the
    preset (--intra-node / --inter-node, else the device's default)."""
    intra_name, inter_name = args.intra_node or DEFAULT_LINKS[device_type][0], args.inter_node or \
        DEFAULT_LINKS[device_type][1]
    measured = measured or {}
    intra = {kind: _chosen(intra_name, "intra-node", (args.intra_node_gbps, args.intra_node_latency_us),
                           measured.get(kind)) for kind in COLLECTIVES}
    inter = _chosen(inter_name, "inter-node", (args.inter_node_gbps, args.inter_node_latency_us),
                    measured.get("allreduce") if spans_nodes else None)
    return Topology(ranks_per_node, intra, inter, unit_of(device_type))


def _chosen(preset_name, scope, flags, measured):
    preset = LINK_PRESETS[preset_name]
    bandwidth_gbps, latency_us = flags
    if bandwidth_gbps is not None:
        bandwidth, bandwidth_from = bandwidth_gbps * BYTES_PER_GB, f"assumed (--{scope}-gbps)"
    elif measured:
        bandwidth, bandwidth_from = measured.bandwidth_bytes_per_s, measured.source
    else:
        bandwidth, bandwidth_from = preset.bandwidth_gbps * BYTES_PER_GB, f"assumed ({preset_name}: {preset.what})"
    if latency_us is not None:
        latency, latency_from = latency_us * 1e-6, f"assumed (--{scope}-latency-us)"
    elif measured:
        latency, latency_from = measured.latency_s, measured.source
    else:
        latency, latency_from = preset.latency_us * 1e-6, f"assumed ({preset_name})"
    gbps = "inf" if math.isinf(bandwidth) else f"{bandwidth / BYTES_PER_GB:.3g}"
    return Link(bandwidth, latency, f"{gbps} GB/s {bandwidth_from}, {latency * 1e6:.3g} us per ring step "
                                    f"{latency_from}")


def with_intra(topology, intra_links):
    """The topology with the links inside a node replaced: a measured {kind: Link}, or one Link for all."""
    if isinstance(intra_links, Link):
        intra_links = dict.fromkeys(COLLECTIVES, intra_links)
    return replace(topology, intra={**topology.intra, **intra_links})
