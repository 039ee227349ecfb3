"""The checks every process makes before any process group exists, so that bad input fails on all
ranks alike, in one line, instead of in one rank while the others wait in a collective."""
from data.splits import load_har_data
from training.checkpoint import files as ckpt
from training.checkpoint.save_dir_lock import NoLock, SaveDirLock
from training.config.cli import SHARDED_OR_DDP, data_options, save_dir_of
from training.config.environment import check_parallel_args, distributed_env
from training.config.same_run import check_same_run


def check_before_training(config, keep_lock=True):
    """Flags, the data, --save-dir (locked by rank 0) and the checkpoint to resume.

    Returns the lock, held until its release() when keep_lock; the self-launcher only checks that
    the folder is free (keep_lock=False), since its rank 0 worker takes the lock itself."""
    check_parallel_args(config)
    check_data(config)  # first: refused data leaves no new --save-dir behind
    save_dir = save_dir_of(config)
    ckpt.check_save_dir(save_dir)
    # DDP ranks share one folder and rank 0 holds it for all; any other run (a cross-validation
    # fold under torchrun included) has a folder of its own to hold.
    holder = config.parallel.multi_gpu not in SHARDED_OR_DDP or distributed_env()[0] == 0
    lock = SaveDirLock(save_dir).acquire() if holder else NoLock()
    try:
        _, checkpoint = ckpt.load_resume_checkpoint(config.output.resume, save_dir,
                                                    warn=lambda message: None)  # the run warns later
        if config.output.resume == "auto":  # refused here, the self-launcher prints that line alone
            check_same_run(config, checkpoint, save_dir)
    except BaseException:
        lock.release()
        raise
    if not keep_lock:
        lock.release()
    return lock


def check_data(config):
    """Load the data the run will use, as the run will, but only to see that it can: UCI HAR is
    parsed and cached on the way (so the run starts from the cache); the synthetic data is made
    with one window per subject, which checks the same flags in a fraction of the time."""
    windows = min(config.data.synthetic_windows_per_subject, 1)  # below 1 stays, to be refused
    load_har_data(**data_options(config, synthetic_windows_per_subject=windows))
