"""The machine the check ran on: versions, the GPU and the commit."""
import json
import os
import platform
import re
import sys

import torch

from benchmarks.gpu_check.runner import run_command
from profiling.cli import env_without_torchrun


def machine_info():
    """Versions and the GPU. Run in a child process, so the check itself never holds a CUDA context."""
    info = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cpu_cores": os.cpu_count(), "gpu": None}
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                    gpu_memory_gib=round(properties.total_memory / 2**30, 1),
                    compute_capability=f"{properties.major}.{properties.minor}", cudnn=torch.backends.cudnn.version())
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            info["nccl"] = None
    return info


def probe_machine():
    probe = "import json; from benchmarks.gpu_check.machine import machine_info; print(json.dumps(machine_info()))"
    outcome, stdout = run_command([sys.executable, "-c", probe], 60, env_without_torchrun())
    info = json.loads(stdout) if outcome["status"] == "ok" else {"error": outcome.get("tail", outcome["status"])}
    outcome, commit = run_command(["git", "rev-parse", "--short", "HEAD"], 10)
    info["commit"] = commit.strip() if outcome["status"] == "ok" else None
    return info


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "unknown"
