"""What a whole-file fallback checkpoint costs beside a hard link: one save of last.pt (torch.save,
fsync, rename), one copy of it as the trainer places step-XXXXXXXX.pt and best.pt (copy, fsync,
rename), and one hard link, for a checkpoint of a given size, in turn, repeated.

The checkpoint holds four float32 tensors of --mparams million values each: the weights, their
moving average and AdamW's two moments of a model that size.
"""
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import at_least, entry_parser, positive
from training.checkpoint.files import place_copy, save_checkpoint
from training.errors import run_entry_point


def main(argv=None):
    parser = entry_parser("benchmarks.checkpoint_copies", __doc__)
    parser.add_argument("--mparams", type=positive, default=10.6, help="model parameters, in millions")
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--dir", default=None, help="folder on the filesystem to measure (default: the temp folder)")
    args = parser.parse_args(argv)
    values = int(args.mparams * 1e6)
    state = {part: torch.randn(values) for part in ("model", "ema", "exp_avg", "exp_avg_sq")}
    folder = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        for repeat in range(args.repeats):
            started = time.perf_counter()
            save_checkpoint(state, folder / "last.pt")
            saved = time.perf_counter()
            place_copy(folder / "last.pt", folder / "step.pt")
            copied = time.perf_counter()
            os.link(folder / "last.pt", folder / f"link-{repeat}.pt")
            linked = time.perf_counter()
            print(f"{os.path.getsize(folder / 'last.pt') / 2**20:.0f} MiB: save {saved - started:.2f} s, "
                  f"copy {copied - saved:.2f} s, hard link {(linked - copied) * 1e3:.2f} ms", flush=True)
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
