"""The default on more ranks: `python main.py` against `python main_multi_gpu.py --multi-gpu ddp
--nproc-per-node N --device cpu`, each a fresh process on synthetic data of UCI HAR's size, in turn
(A B, B A, ...): wall time, their ratio, test accuracy, and the windows each rank transformed for the
feature pool. Then the machine's ceiling for the transform: N independent processes of one thread
each transforming 1/N of the pool's windows, against one process transforming them all.

  python -m benchmarks.pool_shares --rounds 2
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from data.splits import Split
from models import build_model
from profiling.entry_points import REPO, at_least, entry_parser, json_file, run_in_repo, write_json
from profiling.interleave import interleave, per_side
from training.distributed.single import SingleDevice
from training.entry_point import run_entry_point
from training.pool.build import PoolPlan, build_feature_pool
from training.reporting.logger import RunLogger


def main(argv=None):
    parser = entry_parser("benchmarks.pool_shares", __doc__)
    parser.add_argument("--rounds", type=at_least(1), default=2)
    parser.add_argument("--nproc", type=at_least(2), default=2, help="ranks of the DDP side")
    parser.add_argument("--windows-per-subject", type=at_least(1), default=343,
                        help="synthetic windows per subject (30 subjects; 343 is UCI HAR's size)")
    parser.add_argument("--transform", type=at_least(1), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=json_file, default=None, help="also write the figures here")
    opts = parser.parse_args(argv)
    if opts.transform is not None:  # one process of the ceiling's: its windows' seconds on stdout
        print(json.dumps({"seconds": transform_seconds(opts.transform)}))
        return 0
    print(f"machine: {torch.get_num_threads()} torch threads in one process, torch {torch.__version__}")
    runs = time_to_model(opts)
    pool_windows = runs["main.py"][0]["windows"][0]
    figures = {"runs": runs, "ceiling": ceiling(pool_windows, opts.nproc, opts.rounds)}
    write_json(opts.json, figures)
    return 0


def time_to_model(opts):
    data = ["--dataset", "synthetic", "--synthetic-windows-per-subject", str(opts.windows_per_subject), "--no-figures"]
    commands = {"main.py": [sys.executable, "main.py", *data],
                "ddp": [sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node",
                        str(opts.nproc), "--device", "cpu", *data]}
    with tempfile.TemporaryDirectory(prefix="har-pool-shares-") as scratch:
        def side(name):
            def one_round(round_index):
                folder = Path(scratch) / f"{name}-{round_index}"
                stdout, wall_s = run_in_repo([*commands[name], "--save-dir", str(folder)])
                accuracy = json.loads((folder / "test_report.json").read_text())["accuracy"]
                windows = ranks_windows(stdout)
                print(f"round {round_index + 1}: {name}: {wall_s:.1f} s, test accuracy {accuracy:.4f}, windows "
                      f"transformed by each rank {', '.join(f'{count:,}' for count in windows)}", flush=True)
                return {"wall_s": wall_s, "accuracy": accuracy, "windows": windows}
            return one_round
        rows = per_side(interleave({name: side(name) for name in commands}, opts.rounds))
    walls = {name: statistics.median(row["wall_s"] for row in runs) for name, runs in rows.items()}
    print(f"median wall: main.py {walls['main.py']:.1f} s, ddp x{opts.nproc} {walls['ddp']:.1f} s, "
          f"ddp / main.py {walls['ddp'] / walls['main.py']:.2f}")
    return rows


def ranks_windows(stdout):
    """The windows each rank transformed, from the feature pool's closing line."""
    line = next(line for line in stdout.splitlines() if line.startswith("features: "))
    shares = re.findall(r"([\d,]+) at [\d,]+/s", line)
    total = re.search(r"= ([\d,]+) transformed once", line).group(1)
    return [int(count.replace(",", "")) for count in (shares or [total])]


def ceiling(pool_windows, nproc, rounds):
    """The transform's seconds when nproc one-thread processes (as torchrun's ranks have) transform
    pool_windows / nproc each at once (the slowest's), against one process with torch's default
    threads transforming them all, in turn; each process reports its own build's seconds, so Python's
    start and the fit stay out."""
    def run(counts, threads):
        def one_round(round_index):
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
            children = [subprocess.Popen([sys.executable, "-m", "benchmarks.pool_shares", "--transform", str(count)],
                                         cwd=REPO, env=env, stdout=subprocess.PIPE, text=True) for count in counts]
            return max(json.loads(child.communicate()[0])["seconds"] for child in children)
        return one_round
    share = [pool_windows // nproc + (rank < pool_windows % nproc) for rank in range(nproc)]
    together = f"{nproc} processes"
    rows = per_side(interleave({"one process": run([pool_windows], None), together: run(share, 1)}, rounds))
    one, shared = (statistics.median(rows[name]) for name in ("one process", together))
    print(f"ceiling: {pool_windows:,} windows transformed by one process in {one:.1f} s, by {nproc} one-thread "
          f"processes at once ({', '.join(f'{count:,}' for count in share)}) in {shared:.1f} s: {one / shared:.2f}x")
    return rows


def transform_seconds(windows):
    """Seconds this process takes to build a one-view feature pool of `windows` random-walk windows of
    UCI HAR's shape (the fit excluded), through the trainer's own build."""
    signals = np.random.default_rng(0).normal(size=(windows, 9, 128)).cumsum(axis=2).astype(np.float32)
    model = build_model("minirocket", 9, 6)
    model.fit(signals)
    split = Split(signals, np.zeros(windows, dtype=np.int64), np.zeros(windows, dtype=np.int64))
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        build_feature_pool(model, {"train": split}, PoolPlan(views=1, seed=0), SingleDevice(torch.device("cpu")),
                           RunLogger(folder, enabled=False))
        return time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
