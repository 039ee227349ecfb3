"""The default model's fixed part on one device: MiniRocket's transform in windows/s at a few batch
sizes, as the fused Triton kernel (on a CUDA GPU with triton) and as the reference, comparing a
kernel's output with its biases one at a time (made for a CPU's caches) and all at once; how far the
fused kernel's features are from the reference's; and the seconds of its fit. Random-walk windows of
UCI HAR's shape.

    python -m benchmarks.gpu_check.minirocket --device cuda [--block-shapes] --json minirocket.json

Each figure is the median of --rounds timed passes over the windows, after one untimed pass per
batch size (cuDNN tunes its kernels for each new shape there, as in a training run on a GPU).
"""
import statistics
import sys
import time

import numpy as np
import torch

from models import build_model
from models.minirocket import triton_installed
from profiling.entry_points import at_least, comma_counts, entry_parser, json_file, write_json
from training.config.checks import check_at_least
from training.entry_point import run_entry_point

FUSED = "fused kernel"
FUSED_SHARED_SUMS = "fused kernel, shared sums"
FUSED_WAYS = (FUSED, FUSED_SHARED_SUMS)  # on a CUDA GPU with triton only
WAYS = {FUSED: {"fused": True}, FUSED_SHARED_SUMS: {"fused": True, "shared_sums": True},
        "one bias at a time": {"fused": False},
        "all biases at once": {"fused": False, "one_bias_at_a_time": False}}  # the transform's keywords
# (outputs a program, warps) that --block-shapes times for each fused kernel alone, at the largest
# batch: the kernels' defaults (models.minirocket_fused) were chosen on one H200 for the first kernel,
# and the shared-sums kernel, or another GPU, may run faster in another.
BLOCK_SHAPES = ((2048, 4), (1024, 4), (4096, 4), (2048, 8))


def main(argv=None):
    parser = entry_parser("benchmarks.gpu_check.minirocket", __doc__)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--windows", type=at_least(1), default=8192, help="windows in each timed pass")
    parser.add_argument("--batch-sizes", type=comma_counts, default=[256, 1024, 8192],
                        help="windows per call of the transform")
    parser.add_argument("--rounds", type=at_least(1), default=5)
    parser.add_argument("--block-shapes", action="store_true",
                        help="also time each fused kernel alone (CUDA) at the largest batch in each block shape "
                             f"(outputs a program x warps) of {', '.join(f'{o}x{w}' for o, w in BLOCK_SHAPES)}")
    parser.add_argument("--json", type=json_file, default=None, help="also write the figures here")
    opts = parser.parse_args(argv)
    check_at_least(("--batch-sizes", opts.batch_sizes, 1))  # --windows and --rounds: at_least(1) at parsing
    if opts.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "error: --device cuda: torch sees no CUDA GPU; pass --device cpu\n")
    device = torch.device(opts.device)
    torch.backends.cudnn.benchmark = device.type == "cuda"  # as a training run on a GPU has it
    walks = np.random.default_rng(0).normal(size=(opts.windows, 9, 128)).cumsum(axis=2).astype(np.float32)
    windows = torch.from_numpy(walks).to(device)
    model = build_model("minirocket", 9, 6).to(device).eval()
    fit_s = [timed(device, model.fit, windows) for _ in range(3)]
    print(f"fit: {statistics.median(fit_s):.3f} s (median of 3)")
    rates, fused_runs = {}, device.type == "cuda" and triton_installed()
    ways = {way: keywords for way, keywords in WAYS.items() if way not in FUSED_WAYS or fused_runs}
    agreements = {way: fused_agreement(model, windows[:1024], WAYS[way]) for way in FUSED_WAYS} if fused_runs else {}
    for way, agreement in agreements.items():
        print(f"{way} against the reference: {agreement['windows_equal_share']:.2%} of windows with every "
              f"feature equal, {agreement['features_differing_share']:.4%} of features differing", flush=True)
    for batch in opts.batch_sizes:
        for way, keywords in ways.items():
            transform_all(model, windows, batch, keywords)  # untimed: compiles, or cuDNN tunes for the new shapes
            seconds = statistics.median(timed(device, transform_all, model, windows, batch, keywords)
                                        for _ in range(opts.rounds))
            rates.setdefault(str(batch), {})[way] = len(windows) / seconds
            print(f"batch {batch}, {way}: {len(windows) / seconds:,.0f} windows/s", flush=True)
    shapes = block_shapes(model, windows, max(opts.batch_sizes), opts.rounds) if opts.block_shapes and fused_runs \
        else []
    write_json(opts.json, {"device": str(device), "torch": torch.__version__, "windows": opts.windows,
                           "features": model.feature_mean.numel(), "fit_s": fit_s, "windows_per_s": rates,
                           "block_shapes": shapes,
                           "fused_agreement": agreements.get(FUSED),
                           "shared_sums_agreement": agreements.get(FUSED_SHARED_SUMS)})
    return 0


@torch.no_grad()
def fused_agreement(model, windows, keywords):
    """The share of windows whose features, transformed with `keywords`, all equal the reference's, and
    of features that differ (where an output lies within float rounding of its bias,
    tests/test_minirocket_fused.py)."""
    fused, reference = model.transform(windows, **keywords), model.transform(windows, fused=False)
    return {"windows_equal_share": (fused == reference).all(dim=1).float().mean().item(),
            "features_differing_share": (fused != reference).float().mean().item()}


@torch.no_grad()
def block_shapes(model, windows, batch, rounds):
    """[{way, outputs_per_program, warps, windows_per_s, same_counts}] for each fused kernel in each of
    BLOCK_SHAPES: models.minirocket_fused.fused_counts alone (the counts, not yet divided into
    proportions), median of `rounds` passes over the windows after an untimed one that compiles.
    same_counts: the first 1,024 windows' counts equal those of the kernel's default shape (a block's
    shape changes which program computes an output, not the order of its sums)."""
    from models.minirocket_fused import fused_counts
    rows = []
    for way in FUSED_WAYS:
        shared = WAYS[way].get("shared_sums", False)
        default = fused_counts(windows[:1024], model, shared_sums=shared)
        for outputs, warps in BLOCK_SHAPES:
            shape = {"outputs_per_program": outputs, "warps": warps, "shared_sums": shared}
            counts_all(windows, batch, model, shape)  # untimed: compiles this shape's kernels
            seconds = statistics.median(timed(windows.device, counts_all, windows, batch, model, shape)
                                        for _ in range(rounds))
            same = torch.equal(fused_counts(windows[:1024], model, **shape), default)
            rows.append({"way": way, "outputs_per_program": outputs, "warps": warps,
                         "windows_per_s": len(windows) / seconds, "same_counts": same})
            print(f"block shape {outputs} x {warps} warps, {way} alone: {len(windows) / seconds:,.0f} windows/s"
                  f"{'' if same else ', counts differ from the default shape'}", flush=True)
    return rows


@torch.no_grad()
def counts_all(windows, batch, model, shape):
    from models.minirocket_fused import fused_counts
    for chunk in windows.split(batch):
        fused_counts(chunk, model, **shape)


@torch.no_grad()
def transform_all(model, windows, batch, keywords):
    for chunk in windows.split(batch):
        model.transform(chunk, **keywords)


def timed(device, function, *args):
    """Seconds of function(*args), the device's queued work included."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    function(*args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
