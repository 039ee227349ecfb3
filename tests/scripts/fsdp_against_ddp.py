"""Under torchrun: every model (the convolutional ones with BatchNorm and GroupNorm) trained for one
epoch through the trainer under FSDP and under DDP with the same flags (--amp among them), on one
process group; writes, per configuration, the largest difference between the two runs' full weights,
how far the DDP run's weights moved from where both started, and the precision line, to OUT.json;
and under "overflow", what each rank's fp16 GradScaler did with an inf in one rank's gradient shard.

Usage: torchrun --nproc-per-node=N tests/scripts/fsdp_against_ddp.py OUT.json SAVE_DIR <training flags>
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from training.config.cli import parse_config  # noqa: E402
from training.distributed import ddp  # noqa: E402
from training.distributed.strategy import make_strategy  # noqa: E402
from training.entry_point import exit_process  # noqa: E402
from training.loop.epochs import train_epoch  # noqa: E402
from training.trainer import Trainer  # noqa: E402

CONFIGURATIONS = [("cnn1d", "batch"), ("cnn1d", "group"), ("cnn_lstm", "batch"), ("transformer", "batch"),
                  ("transformer", "group"), ("minirocket", "batch")]


def largest_difference(state_a, state_b):
    assert state_a.keys() == state_b.keys()
    return max((state_a[k].double() - state_b[k].double()).abs().max().item()
               for k in state_a if state_a[k].is_floating_point())


def trained_weights(strategy, flags, save_dir):
    """(weights before, weights after one epoch, the run's precision line), full tensors on rank 0."""
    config = parse_config([*flags, "--save-dir", save_dir, "--no-resume"], multi_gpu=True)
    trainer = Trainer.build(config, strategy, quiet=True)
    state = trainer.strategy.module_state(trainer.model)
    before = {key: tensor.clone() for key, tensor in state.state_dict().items()}
    train_epoch(trainer, 0)
    return before, state.state_dict(), trainer.precision.describe()


def main(out, save_dir, flags):
    strategies, figures = {}, {}
    for name, norm in CONFIGURATIONS:
        runs = {}
        for mode in ("fsdp", "ddp"):
            run_flags = [*flags, "--model", name, "--norm", norm, "--multi-gpu", mode]
            if mode not in strategies:
                strategies[mode] = make_strategy(parse_config(run_flags, multi_gpu=True))
                # Both strategies on the process group the first one joined.
                ddp.join_process_group = lambda *args, **kwargs: None
            runs[mode] = trained_weights(strategies[mode], run_flags, f"{save_dir}/{name}-{norm}-{mode}")
        if strategies["fsdp"].is_main:
            (fsdp_before, fsdp_after, precision), (ddp_before, ddp_after, _) = runs["fsdp"], runs["ddp"]
            figures[f"{name}/{norm}"] = {"start_difference": largest_difference(fsdp_before, ddp_before),
                                         "max_abs_difference": largest_difference(fsdp_after, ddp_after),
                                         "ddp_movement": largest_difference(ddp_before, ddp_after),
                                         "precision": precision}
    figures["overflow"] = overflow_on_one_rank()
    if strategies["fsdp"].is_main:
        Path(out).write_text(json.dumps(figures))
    strategies["fsdp"].close()


def overflow_on_one_rank():
    """fp16's GradScaler over FSDP's sharded gradients, an inf in rank 1's shard alone: whether each rank
    skipped its step and halved its scale (torch's DTensor GradScaler takes the max of found_inf over
    the ranks; a rank that stepped while another skipped would leave the shards of two different models)."""
    torch.manual_seed(0)
    model = fully_shard(torch.nn.Sequential(torch.nn.Linear(8, 8)))
    before = [p.to_local().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(model(torch.ones(4, 8)).sum()).backward()
    if dist.get_rank() == 1:
        next(model.parameters()).grad.to_local().view(-1)[0] = float("inf")
    scaler.step(optimizer)
    scaler.update()
    stepped = any(not torch.equal(p.to_local(), b) for p, b in zip(model.parameters(), before, strict=True))
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, {"stepped": stepped, "scale": scaler.get_scale()})
    return every_rank


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    exit_process(0)  # as the trainer's workers leave: DDP's gloo threads outlive the closed group
