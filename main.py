"""Train a HAR model on one device (CUDA if present, else CPU). See README.md."""
import sys

from training.config.cli import parse_config
from training.distributed.strategy import distributed_env
from training.entry_point import run_entry_point
from training.errors import UsageError


def main(argv):
    config = parse_config(argv, multi_gpu=False)
    if distributed_env()[2] > 1:
        raise UsageError("main.py is single-device; under torchrun use main_multi_gpu.py --multi-gpu ddp")
    if config.recipe.cv_folds:
        from crossval.folds import cross_validate
        return cross_validate(config)
    from training.trainer import train  # after parsing, so --help stays fast
    return train(config)


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
