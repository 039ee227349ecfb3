"""What a run reads before it builds anything, read once and checked as it is read: the data,
--save-dir and its lock, and the checkpoint to resume, which a run resumes by itself only when it
is the run the command describes. It runs before any process group exists, so bad input fails on
all ranks alike, in one line, instead of in one rank while the others wait in a collective.

The checkpoint is held against the run once, here, by checkpoint/judge.py: an automatic resume
(--resume auto) continues only the run the command describes (the same data, model and LR
schedule); any other setting may change on resume with a warning.

The lock: one run at a time per --save-dir, an flock on <save-dir>/.lock, which the OS drops when
the holder dies, so a killed run never leaves the folder locked. Not the `filelock` package,
although torch installs it: the refusal names the holder from a line the holder writes into the
lock file (pid, host, start time, command), and filelock releases up to 3.29 truncate that file on
every attempt, a refused one included (tox-dev/filelock#591), while later ones keep the file after
release by design. This lock removes its file on release, safely: a taker checks that the file it
locked is still the one at the path."""
import datetime
import fcntl
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.sources import load_har_data
from data.splits import HarData, untrained_classes_warning
from models import MODELS
from training.checkpoint import files as ckpt
from training.checkpoint.earlier_run import check_movable, continues_its_folder, earlier_run_files
from training.checkpoint.judge import judge
from training.config.settings import SHARDED_OR_DDP
from training.distributed.strategy import distributed_env
from training.errors import UsageError
from training.loop.recipe import build_augmenter


@dataclass(kw_only=True)
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


def read_run_inputs(config, hold_lock=True, data=None):
    """The data, then --save-dir (locked by rank 0 when `hold_lock`) and the checkpoint to resume.
    `data`: the config's data already loaded, by a benchmark that builds many runs of one dataset."""
    if data is None:
        data = load_har_data(**config.data_options())  # first: refused data leaves no new --save-dir behind
    check_model_reads(config, data)
    check_class_flags(config.recipe, data)  # also where no augmentation runs (a head solved by ridge)
    inputs = _read_save_dir(config, data, hold_lock)
    inputs.warnings += [*data.warnings, *untrained_classes_warning(data)]
    return inputs


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
    data = load_har_data(**config.data_options(synthetic_windows_per_subject=windows))
    check_model_reads(config, data)
    check_class_flags(config.recipe, data)


def check_model_reads(config, data):
    """Windows of unequal lengths (padded at their end with NaN) go to a model that reads each over its
    own steps; any other would read the padding as signal."""
    name = config.model.name
    if data.padded and not MODELS[name].READS_NAN_PADDING:
        shortest, longest = data.own_lengths
        readers = ", ".join(model for model, kind in MODELS.items() if kind.READS_NAN_PADDING)
        raise UsageError(f"--model {name} reads windows of one length, and these are of {shortest} to {longest} steps, "
                         f"padded at their end with NaN: use --model {readers}, which reads each over its own steps, "
                         "or cut every window to one length")


def check_class_flags(recipe, data):
    """The recipe's class flags name classes of this data: refused before any worker or fold starts,
    as each one's build would refuse them."""
    unit = {"mean": np.zeros(len(data.channel_names)), "std": np.ones(len(data.channel_names))}
    build_augmenter(recipe, unit, data.channel_names, data.class_names, warn=lambda message: None,
                    triples=data.sensor_triples())


def _read_save_dir(config, data, hold_lock):
    save_dir = config.save_dir
    created = ckpt.check_save_dir(save_dir)
    # DDP ranks share one folder and rank 0 holds it for all; any other run (a cross-validation
    # fold under torchrun included) has a folder of its own to hold.
    holder = hold_lock and (config.parallel.multi_gpu not in SHARDED_OR_DDP or distributed_env()[0] == 0)
    lock = SaveDirLock(save_dir, created).acquire() if holder else NoLock()
    warnings = []
    try:
        resume_from, checkpoint = ckpt.load_resume_checkpoint(config.output.resume, save_dir, warnings.append)
        if checkpoint is not None:  # a checkpoint named with --resume PATH is resumed on purpose
            judgement = judge(checkpoint, resume_from, config, data, on_purpose=config.output.resume != "auto")
            if judgement.refusal:
                raise UsageError(judgement.refusal)
            warnings.extend(judgement.warnings)
        if not continues_its_folder(resume_from, save_dir):  # its first save moves an earlier run aside
            check_movable(save_dir, earlier_run_files(save_dir))
    except BaseException:
        lock.release()
        raise
    return RunInputs(data=data, resume_from=resume_from, checkpoint=checkpoint, lock=lock, warnings=warnings)


LOCK_NAME = ".lock"


class SaveDirLock:
    """Held from acquire() to release() (or the end of the process). `created`: the outermost folder
    check_save_dir made for this run, removed at release where the run left it empty."""

    def __init__(self, save_dir, created=None):
        self.path = Path(save_dir) / LOCK_NAME
        self.created = created
        self._file = None

    def acquire(self):
        """Take the lock or refuse in one line naming the run that holds it."""
        while self._file is None:
            handle = open(self.path, "a+")  # noqa: SIM115 - the open file is the lock, held until release()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "a process that has not yet written its name"
                handle.close()
                raise UsageError(f"--save-dir {self.path.parent} is in use by another run ({holder}); wait for "
                                 "it to finish, or start this one with another --save-dir") from None
            except OSError as exc:
                handle.close()
                raise UsageError(f"--save-dir {self.path.parent} cannot be locked ({exc.strerror}); use a "
                                 "folder on a filesystem with file locks") from None
            # A holder that just released unlinks the file: a lock on that old file guards nothing.
            if _same_file(handle, self.path):
                self._file = handle
                # A forked child (a DataLoader worker) shares the open file and with it the lock, which
                # would outlive this process by the seconds an orphaned worker takes to notice: it lets go.
                os.register_at_fork(after_in_child=self._let_go_in_child)
            else:
                handle.close()
        self._file.seek(0)
        self._file.truncate()
        started = datetime.datetime.now(datetime.timezone.utc)
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()}, started {started:%Y-%m-%d %H:%M:%S} UTC: "
                         + " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\n")
        self._file.flush()
        return self

    def _let_go_in_child(self):
        """In a forked child: close its copy of the lock's file, the lock staying with this process."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def release(self):
        """Remove the file while still holding it, so nobody locks a name another run then recreates."""
        if self._file is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            self._file.close()
            self._file = None
        ckpt.remove_empty_folders(self.path.parent, self.created)

    def __del__(self):
        self.release()


class NoLock:
    """Stands in on ranks other than 0, which write nothing to --save-dir."""

    def release(self):
        pass


def _same_file(handle, path):
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
