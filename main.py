"""Train a HAR model on one device (CUDA if present, else CPU). See README.md."""

from training.config.cli import parse_config
from training.distributed.slurm import refuse_srun_tasks
from training.distributed.strategy import distributed_env
from training.entry_point import exit_process, run_entry_point
from training.errors import UsageError


def main(argv):
    config = parse_config(argv, multi_gpu=False)
    refuse_srun_tasks("main.py")
    if distributed_env()[2] > 1:
        raise UsageError("main.py is single-device; under torchrun use main_multi_gpu.py --multi-gpu ddp")
    if config.recipe.cv_folds:
        from crossval.folds import cross_validate
        return cross_validate(config)
    from training.trainer import train  # after parsing, so --help stays fast
    return train(config)


if __name__ == "__main__":
    # The run has closed its files by the time main returns; the teardown of an interpreter holding
    # torch took 0.8 s after a 12 s run on the 2-core development machine, so it is skipped (unless a
    # profiler or coverage tool waits for it), as each torchrun worker skips it.
    exit_process(run_entry_point(main), at_once=True)
