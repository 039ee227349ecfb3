"""Under torchrun: one training epoch of DDP through the trainer's public interface, eager and then
compiled, counting the gradient buckets DDP exchanges with a communication hook.

Usage: torchrun --nproc-per-node=2 tests/scripts/count_allreduces.py OUT.json SAVE_DIR <training flags>
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402

from training.config.cli import parse_config  # noqa: E402
from training.distributed.strategy import make_strategy  # noqa: E402
from training.entry_point import exit_process  # noqa: E402
from training.loop.epochs import train_epoch  # noqa: E402
from training.trainer import Trainer  # noqa: E402


def main(out, save_dir, flags):
    counts = {}
    strategy = None
    for variant, extra in (("eager", []), ("compiled", ["--compile"])):
        config = parse_config([*flags, *extra, "--multi-gpu", "ddp", "--save-dir", f"{save_dir}/{variant}",
                               "--no-resume"], multi_gpu=True)
        strategy = strategy or make_strategy(config)  # one process group for both runs
        trainer = Trainer.build(config, strategy, quiet=True)
        exchanged = []

        def counting_allreduce(state, bucket, exchanged=exchanged):
            exchanged.append(bucket.index())
            return default_hooks.allreduce_hook(state, bucket)

        strategy.register_comm_hook(None, counting_allreduce)
        result = train_epoch(trainer, 0)
        counts[variant] = {"steps": result.steps, "micro_batches": len(trainer.loaders["train"]),
                           "buckets_exchanged": len(exchanged), "buckets": len(set(exchanged))}
    if strategy.is_main:
        Path(out).write_text(json.dumps(counts))
    strategy.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    exit_process(0)  # as the trainer's workers leave: DDP's gloo threads outlive the closed group
