"""Memory figures of one device: CUDA allocator counters, or the process RSS on CPU."""
import os
import resource
import sys

import torch

GIB = 1024 ** 3
CUDA_FIELDS = ("allocated_gib", "peak_allocated_gib", "reserved_gib")
CPU_FIELDS = ("rss_gib", "peak_rss_gib")


def memory_fields(device):
    return CUDA_FIELDS if device.type == "cuda" else CPU_FIELDS


def read_memory(device):
    """Values in GiB, in the order of memory_fields(device). Peaks cover the process's life, or on
    CUDA the time since the last reset_peaks(device)."""
    if device.type == "cuda":
        return [torch.cuda.memory_allocated(device) / GIB, torch.cuda.max_memory_allocated(device) / GIB,
                torch.cuda.memory_reserved(device) / GIB]
    return [_current_rss_bytes() / GIB, _peak_rss_bytes() / GIB]


def reset_peaks(device):
    """Start a new peak window on a CUDA device (e.g. one per epoch), from the memory in use now.

    The CPU figure is getrusage's peak RSS, which no call can lower: it keeps covering the run."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def describe(label, fields, values):
    return {"device": label, **{name: round(value, 4) for name, value in zip(fields, values, strict=True)}}


def format_memory(entries):
    """One compact console fragment for all devices, e.g. 'cuda:0 0.10/0.31/0.50 GiB'."""
    parts = []
    for entry in entries:
        if "reserved_gib" in entry:
            parts.append(f"{entry['device']} {entry['allocated_gib']:.2f}/{entry['peak_allocated_gib']:.2f}/"
                         f"{entry['reserved_gib']:.2f} GiB")
        else:
            parts.append(f"{entry['device']} peak RSS {entry['peak_rss_gib']:.2f} GiB")
    legend = " (alloc/peak/reserved)" if entries and "reserved_gib" in entries[0] else ""
    return "mem " + ", ".join(parts) + legend


def _peak_rss_bytes():
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _current_rss_bytes():
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()


def free_bytes(device):
    """Memory a new allocation can take on `device`: CUDA's free memory, or the host's MemAvailable
    (None where /proc/meminfo is not there)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as handle:
            fields = dict(line.split(":", 1) for line in handle)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
