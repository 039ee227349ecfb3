"""Under torchrun: a replicated head (DDP's --pool-head replicated) trained one epoch, every rank but
rank 0 then moved off its replica, and Trainer.align_replicas run. Rank 0 writes, for each of the
weights, the optimizer's moments and the weight average, whether every rank holds its values, and
whether a module that differs between ranks is rank 0's on every rank once the strategy wraps it.

Usage: torchrun --nproc-per-node=2 tests/scripts/align_replicas.py OUT.json SAVE_DIR <training flags>
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from training.config.cli import parse_config  # noqa: E402
from training.distributed.strategy import make_strategy  # noqa: E402
from training.entry_point import exit_process  # noqa: E402
from training.loop.epochs import train_epoch  # noqa: E402
from training.trainer import Trainer  # noqa: E402


def replica_parts(trainer):
    moments = [value for state in trainer.step.optimizer.state.values() for value in state.values()
               if torch.is_tensor(value) and value.dim() > 0]
    return {"weights": list(trainer.model.parameters()), "moments": moments,
            "average": list(trainer.step.ema.module.parameters())}


def main(out, save_dir, flags):
    config = parse_config([*flags, "--multi-gpu", "ddp", "--save-dir", save_dir, "--no-resume"], multi_gpu=True)
    strategy = make_strategy(config)
    trainer = Trainer.build(config, strategy, quiet=True)
    train_epoch(trainer, 0)
    with torch.no_grad():
        for tensors in replica_parts(trainer).values():
            for tensor in tensors:
                tensor.add_(strategy.rank)  # rank 0 keeps its own
    trainer.align_replicas()
    agreed = {}
    for part, tensors in replica_parts(trainer).items():
        flat = torch.cat([tensor.detach().flatten() for tensor in tensors])
        gathered = strategy.gather_objects(flat)
        agreed[part] = {"tensors": len(tensors), "same": all(torch.equal(flat, other) for other in gathered)}
    # Wrapping a replica starts it from rank 0's weights and buffers, as DDP's constructor does.
    module = torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        module.weight.add_(strategy.rank)
        module.running_mean.add_(strategy.rank)
    strategy.wrap(module, trainer.precision)
    flat = torch.cat([tensor.flatten().float() for tensor in module.state_dict().values()])
    wrapped_same = all(torch.equal(flat, other) for other in strategy.gather_objects(flat))
    if strategy.is_main:
        Path(out).write_text(json.dumps({"replicated": trainer.replicated, "parts": agreed,
                                         "wrapped_same": wrapped_same}))
    strategy.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    exit_process(0)
