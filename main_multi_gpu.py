"""Train a HAR model with nn.DataParallel (--multi-gpu dp), DDP (--multi-gpu ddp) or FSDP (--multi-gpu
fsdp). See README.md."""

from training.config.cli import parse_config
from training.config.settings import SHARDED_OR_DDP
from training.distributed.launch import launch_under_torchrun, workers_ended
from training.distributed.slurm import refuse_srun_tasks, take_ranks_from_srun
from training.distributed.strategy import distributed_env
from training.entry_point import exit_process, launched_by_torchrun, run_entry_point
from training.errors import UsageError


def main(argv):
    config = parse_config(argv, multi_gpu=True)
    multi_gpu = config.parallel.multi_gpu
    if multi_gpu in SHARDED_OR_DDP:
        take_ranks_from_srun()  # tasks srun started without torchrun become the ranks of one run
    else:
        refuse_srun_tasks(f"--multi-gpu {multi_gpu}")
    if multi_gpu in SHARDED_OR_DDP and not launched_by_torchrun():
        return launch_under_torchrun(config, __file__, argv)
    if multi_gpu not in SHARDED_OR_DDP and distributed_env()[2] > 1:
        raise UsageError(f"--multi-gpu {multi_gpu} under torchrun would start identical runs in "
                         "every process; use --multi-gpu ddp or fsdp, or plain python for dp")
    if config.recipe.cv_folds:  # folds are independent runs: one per process, each on its own GPU
        from crossval.folds import cross_validate
        return cross_validate(config)
    from training.trainer import train  # after parsing, so --help stays fast
    return train(config)


if __name__ == "__main__":
    # A launcher whose workers have ended has nothing left to close: the teardown of an interpreter
    # holding torch (about 0.3 s) would only keep the shell waiting.
    exit_process(run_entry_point(main), at_once=workers_ended())
