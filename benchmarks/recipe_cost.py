"""What the generalisation recipe costs per training step: augmentation and the weight average against neither."""
import sys

import torch

from benchmarks import entry_parser, write_json
from benchmarks.common import (
    add_run_flags,
    format_rates,
    machine_line,
    paired_ratio,
    trainer_rates,
    trainer_runs,
)
from data.augment import AUGMENTATIONS
from profiling.workload import RECIPE_OFF
from training.errors import run_entry_point

TARGET_RATIO = 0.9  # the augmentation may cost at most a tenth of a step
FULL_AUGMENT = {**RECIPE_OFF, "augment": ",".join(AUGMENTATIONS)}
SIDES = {"plain": RECIPE_OFF, "augment": FULL_AUGMENT,
         "recipe": {**FULL_AUGMENT, "ema_decay": 0.998, "label_smoothing": None}}  # None: the model's own


def main(argv=None):
    parser = entry_parser("benchmarks.recipe_cost", __doc__)
    add_run_flags(parser)
    opts = parser.parse_args(argv)
    with trainer_runs(opts, "har-recipe-", {name: ("auto", recipe) for name, recipe in SIDES.items()}) as runs:
        device = runs["plain"].strategy.device
        print("plain: the trainer's epoch with no augmentation, no weight average; augment: all of "
              f"{', '.join(AUGMENTATIONS)} on every batch; recipe: augment plus the weight average "
              "(decay 0.998) and the model's label smoothing", flush=True)
        print(machine_line(device), flush=True)
        rates, other_cores = trainer_rates(runs, opts)
    print(format_rates(rates, "samples/s", [("augment", "plain"), ("recipe", "plain")], other_cores))
    print(f"augment/plain = {paired_ratio(rates, 'augment', 'plain'):.3f}, recipe/plain = "
          f"{paired_ratio(rates, 'recipe', 'plain'):.3f} (median of per-round ratios over {opts.rounds} rounds; "
          f"{opts.model}, batch {opts.batch_size}, {device}, {torch.get_num_threads()} threads; "
          f"target: augmentation >= {TARGET_RATIO})")
    write_json(opts.json, {"samples_per_s": rates, "augment_over_plain": paired_ratio(rates, "augment", "plain"),
                           "recipe_over_plain": paired_ratio(rates, "recipe", "plain"), "model": opts.model,
                           "batch_size": opts.batch_size, "device": str(device), "rounds": opts.rounds})
    return 0


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
