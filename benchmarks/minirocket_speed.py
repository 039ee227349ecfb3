"""MiniRocket beside aeon's, on one machine: the transform's windows/s on the same windows and
threads, timed in turn (A B, B A, ...), ours also as a large pool counts it (compiled), the fit's
seconds, and with --data-dir the time to a model: `python main.py --data-dir D` with its defaults
against aeon's MiniRocket + ridge (`studies.minirocket_baseline`) on the same UCI HAR layout and
cores, each as its own process, wall time and test accuracy. main.py takes torch's default threads
(every core), so the time-to-model rounds give aeon --threads jobs: pass the machine's core count
there. aeon is a benchmark-only dependency (pip install aeon).

  python -m benchmarks.minirocket_speed --threads 1 --rounds 4
  python -m benchmarks.minirocket_speed --threads 2 --data-dir ~/data --model-rounds 2
"""
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import epoch_rates, format_rates, paired_ratio
from models import build_model
from models.minirocket import COMPILED_COUNT_WINDOWS
from profiling.entry_points import at_least, entry_parser, json_file, run_in_repo, write_json
from profiling.interleave import interleave, per_side
from training.config.settings import check_at_least
from training.entry_point import run_entry_point


def main(argv=None):
    parser = entry_parser("benchmarks.minirocket_speed", __doc__)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads and aeon's n_jobs")
    parser.add_argument("--windows", type=at_least(1), default=2048, help="windows transformed per round by each side")
    parser.add_argument("--batch-size", type=at_least(1), default=256, help="windows per call of our transform")
    parser.add_argument("--rounds", type=at_least(1), default=4)
    parser.add_argument("--data-dir", default=None, help="a UCI HAR layout: also time main.py against aeon")
    parser.add_argument("--model-rounds", type=int, default=1, help="rounds of the time-to-model comparison")
    parser.add_argument("--json", type=json_file, default=None, help="also write the figures here")
    opts = parser.parse_args(argv)
    check_at_least(("--threads", opts.threads, 1), ("--model-rounds", opts.model_rounds, 1))  # the rest: at_least
    try:
        from aeon.transformations.collection.convolution_based import MiniRocket as AeonMiniRocket
    except ImportError:
        parser.exit(2, "error: this benchmark needs aeon: pip install aeon\n")
    torch.set_num_threads(opts.threads)
    print(f"machine: {torch.get_num_threads()} torch threads, aeon n_jobs {opts.threads}, torch {torch.__version__}")
    figures = {"threads": opts.threads, **transform_figures(opts, AeonMiniRocket)}
    if opts.data_dir:
        figures["time_to_model"] = time_to_model(opts)
    write_json(opts.json, figures)
    return 0


def transform_figures(opts, aeon_class):
    """Both transforms on the same random-walk windows of UCI HAR's shape, and both fits."""
    windows = np.random.default_rng(0).normal(size=(opts.windows, 9, 128)).cumsum(axis=2).astype(np.float32)
    ours = build_model("minirocket", 9, 6).eval()
    aeon = aeon_class(n_kernels=10_000, n_jobs=opts.threads, random_state=0)
    aeon.fit(windows[:64])  # numba compiles on the first call; that stays out of the figures
    fits = {"ours": [], "aeon": []}
    for _ in range(3):
        for name, model in (("ours", ours), ("aeon", aeon)):
            start = time.perf_counter()
            model.fit(windows)
            fits[name].append(time.perf_counter() - start)
    tensor = torch.from_numpy(windows)
    # Ours as a large pool counts (its compare-and-count compiled, models.minirocket_compiled), beside
    # ours as every smaller one does; the compile stays out of the figures, as numba's does.
    compiled = copy.deepcopy(ours)
    compiled.prepare_pool(COMPILED_COUNT_WINDOWS, print)

    def side_of(model):
        def transform(epoch):
            with torch.no_grad():
                for chunk in tensor.split(opts.batch_size):
                    model.transform(chunk)
            return len(windows)
        return transform

    def aeon_side(epoch):
        aeon.transform(windows)
        return len(windows)

    sides = {"ours": side_of(ours), "compiled": side_of(compiled), "aeon": aeon_side}
    rates, others = epoch_rates(sides, opts.rounds, 1, lambda: None)
    print(f"transform, {len(windows)} windows of 9 x 128 a round, ours {ours.feature_mean.numel()} features "
          f"in calls of {opts.batch_size}, aeon {aeon.n_kernels} kernels:")
    print(format_rates(rates, "windows/s", [("ours", "aeon"), ("compiled", "aeon"), ("compiled", "ours")], others))
    print(f"fit seconds (3 tries, median): ours {statistics.median(fits['ours']):.2f}, "
          f"aeon {statistics.median(fits['aeon']):.2f} (after numba's compile)")
    return {"transform_windows_per_s": rates, "transform_ratio": paired_ratio(rates, "ours", "aeon"),
            "compiled_ratio": paired_ratio(rates, "compiled", "aeon"),
            "other_process_cores": others, "fit_s": fits}


def time_to_model(opts):
    """`python main.py --data-dir D` against aeon's MiniRocket + ridge, each a fresh process, in turn."""
    with tempfile.TemporaryDirectory(prefix="har-minirocket-speed-") as scratch:
        def side(name):
            def one_round(round_index):
                folder = Path(scratch) / f"{name}-{round_index}"
                if name == "main.py":
                    _, wall_s = run_in_repo([sys.executable, "main.py", "--data-dir", opts.data_dir, "--save-dir",
                                             str(folder)])
                    test = json.loads((folder / "test_report.json").read_text())
                else:
                    folder.mkdir(parents=True)
                    _, wall_s = run_in_repo([sys.executable, "-m", "studies.minirocket_baseline", "--data-dir",
                                             opts.data_dir, "--threads", str(opts.threads), "--json",
                                             str(folder / "baseline.json")])
                    test = json.loads((folder / "baseline.json").read_text())["runs"][-1]
                print(f"round {round_index + 1}: {name}: {wall_s:.1f} s, test accuracy {test['accuracy']:.4f}",
                      flush=True)
                return {"wall_s": wall_s, "accuracy": test["accuracy"], "worst_subject": test["worst_subject"]}
            return one_round
        rows = per_side(interleave({name: side(name) for name in ("main.py", "aeon")}, opts.model_rounds))
    for name, runs in rows.items():
        accuracies = ", ".join(f"{row['accuracy']:.4f}" for row in runs)
        print(f"{name}: median {statistics.median(row['wall_s'] for row in runs):.1f} s, test accuracy {accuracies}")
    return rows


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
