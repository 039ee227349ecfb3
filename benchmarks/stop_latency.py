"""How long a training run takes to exit after SIGTERM: finish the step, agree across ranks, save, leave.

Starts a real run (main.py, or main_multi_gpu.py with its own torchrun for --ranks > 1), sends
SIGTERM to it once the first epoch is logged plus a random delay (so the signal lands anywhere
between two check-ins), and times the exit. Repeats, and prints the figures.
"""
import json
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from models import MODELS
from profiling.entry_points import REPO, at_least, entry_parser
from training.entry_point import run_entry_point

STOPPED = re.compile(r"stopped after step (\d+)")


def main(argv=None):
    parser = entry_parser("benchmarks.stop_latency", __doc__)
    parser.add_argument("--ranks", type=at_least(1), default=2, help="1: main.py; more: DDP ranks under torchrun")
    parser.add_argument("--model", choices=tuple(MODELS), default="cnn1d")
    parser.add_argument("--batch-size", type=at_least(1), default=32)
    parser.add_argument("--log-interval", type=at_least(1), default=10, help="the check-in interval in steps")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="cpu")
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--seed", type=int, default=0, help="for the random delays")
    opts = parser.parse_args(argv)
    draw = random.Random(opts.seed)
    rows = []
    for repeat in range(opts.repeats):
        with tempfile.TemporaryDirectory(prefix="har-stop-") as scratch:
            latency_s, code, step, step_ms = one_stop(opts, Path(scratch) / "run", draw.uniform(0.0, 1.0))
        rows.append(latency_s)
        steps = f", stopped after step {step}" if step is not None else ""
        pace = f", {step_ms:.1f} ms per step in epoch 1" if step_ms else ""
        print(f"repeat {repeat + 1}: SIGTERM to exit {latency_s:.2f} s, exit code {code}{steps}{pace}", flush=True)
    print(f"SIGTERM to exit: median {statistics.median(rows):.2f} s, max {max(rows):.2f} s over {opts.repeats} "
          f"runs ({opts.ranks} rank(s), {opts.model}, batch {opts.batch_size}, check-in every "
          f"{opts.log_interval} steps, {opts.device}); this includes the checkpoint write and process exit")
    return 0


def one_stop(opts, save_dir, delay_s):
    """(seconds from SIGTERM to exit, exit code, step it stopped after, ms per step of epoch 1)."""
    flags = ["--dataset", "synthetic", "--synthetic-windows-per-subject", "64", "--model", opts.model,
             "--batch-size", str(opts.batch_size), "--log-interval", str(opts.log_interval), "--device",
             opts.device, "--epochs", "50", "--save-every-steps", "0", "--no-resume", "--save-dir", str(save_dir)]
    script = ["main.py"] if opts.ranks == 1 else ["main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node",
                                                  str(opts.ranks)]
    process = subprocess.Popen([sys.executable, *script, *flags], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    metrics = save_dir / "metrics.jsonl"
    while not metrics.exists() and process.poll() is None:
        time.sleep(0.01)
    time.sleep(delay_s)
    signalled = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=300)
    latency_s = time.perf_counter() - signalled
    stopped = STOPPED.search(out)
    samples_per_s = json.loads(metrics.read_text().splitlines()[0]).get("samples_per_s") if metrics.exists() else None
    step_ms = opts.batch_size * opts.ranks / samples_per_s * 1e3 if samples_per_s else None
    return latency_s, process.returncode, int(stopped.group(1)) if stopped else None, step_ms


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
