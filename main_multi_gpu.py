"""Train a HAR model with nn.DataParallel (--multi-gpu dp) or DDP (--multi-gpu ddp). See README.md."""
import sys

from training.cli import parse_args
from training.errors import run_entry_point
from training.launch import relaunch_under_torchrun
from training.strategy import launched_by_torchrun


def main(argv):
    args = parse_args(argv, multi_gpu=True)
    if args.multi_gpu == "ddp" and not launched_by_torchrun():
        return relaunch_under_torchrun(args, __file__, argv)  # does not return on success
    from training.trainer import train  # after parsing, so --help stays fast
    return train(args)


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
