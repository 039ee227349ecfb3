"""What a run reads before it builds anything, read once and checked as it is read: the data,
--save-dir and its lock, and the checkpoint to resume. It runs before any process group exists, so
bad input fails on all ranks alike, in one line, instead of in one rank while the others wait in a
collective."""
from dataclasses import dataclass
from pathlib import Path

from data.splits import HarData, load_har_data
from training.checkpoint import files as ckpt
from training.checkpoint.save_dir_lock import NoLock, SaveDirLock
from training.config.cli import SHARDED_OR_DDP, data_options, save_dir_of
from training.config.environment import distributed_env
from training.config.same_run import check_same_run


@dataclass
class RunInputs:
    """The data as read (not yet normalised), the checkpoint to resume (None for a fresh run) and
    --save-dir's lock, released by whoever asked for the inputs."""
    data: HarData | None
    resume_from: Path | None
    checkpoint: dict | None
    lock: object  # SaveDirLock, or NoLock where another process holds the folder
    warnings: list  # one line per checkpoint passed over, said once the run's log exists

    def take(self):
        """(data, resume_from, checkpoint, warnings), handed over once: the run normalises its own
        copy of the data and keeps the parts it restores, so the raw data and the checkpoint are
        not held twice for the whole run."""
        taken = (self.data, self.resume_from, self.checkpoint, self.warnings)
        self.data = self.checkpoint = None
        return taken


def read_run_inputs(config, hold_lock=True):
    """The data, then --save-dir (locked by rank 0 when `hold_lock`) and the checkpoint to resume."""
    data = load_har_data(**data_options(config))  # first: refused data leaves no new --save-dir behind
    return _read_save_dir(config, data, hold_lock)


def check_run_inputs(config):
    """read_run_inputs's refusals for a launcher whose workers read for themselves: it checks that
    the folder is free without keeping its lock (the rank 0 worker takes it), and the data with
    check_data."""
    check_data(config)
    _read_save_dir(config, None, hold_lock=True).lock.release()


def check_data(config):
    """Load the data the run will use, as the run will, but only to see that it can: UCI HAR is
    parsed and cached on the way (so the run starts from the cache); the synthetic data is made
    with one window per subject, which checks the same flags in a fraction of the time."""
    windows = min(config.data.synthetic_windows_per_subject, 1)  # below 1 stays, to be refused
    load_har_data(**data_options(config, synthetic_windows_per_subject=windows))


def _read_save_dir(config, data, hold_lock):
    save_dir = save_dir_of(config)
    ckpt.check_save_dir(save_dir)
    # DDP ranks share one folder and rank 0 holds it for all; any other run (a cross-validation
    # fold under torchrun included) has a folder of its own to hold.
    holder = hold_lock and (config.parallel.multi_gpu not in SHARDED_OR_DDP or distributed_env()[0] == 0)
    lock = SaveDirLock(save_dir).acquire() if holder else NoLock()
    warnings = []
    try:
        resume_from, checkpoint = ckpt.load_resume_checkpoint(config.output.resume, save_dir, warnings.append)
        if config.output.resume == "auto":  # a checkpoint named with --resume PATH is resumed on purpose
            check_same_run(config, checkpoint, save_dir)
    except BaseException:
        lock.release()
        raise
    return RunInputs(data, resume_from, checkpoint, lock, warnings)
