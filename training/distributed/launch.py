"""`--multi-gpu ddp` started without torchrun: check once, then run torch.distributed.run here."""
import logging
import os
import re
import shlex
import sys
import tempfile

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from training.checkpoint.files import LAST, saved_progress
from training.distributed.strategy import check_parallel_args
from training.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED, UsageError
from training.run_inputs import check_run_inputs


def processes_per_node(config, placement):
    """--nproc-per-node, else one per GPU in use, else one CPU process. placement: the (device type,
    backend) check_parallel_args gave for this config. Where no GPU is visible and --device is auto,
    the processes run on the CPU, as plain torchrun's would."""
    device_type, backend = placement
    hardware, nproc = config.hardware, config.parallel.nproc_per_node
    gpus = len(hardware.gpu_ids) if hardware.gpu_ids else (torch.cuda.device_count() if device_type == "cuda" else 0)
    if nproc is None:
        return max(1, gpus)
    sharing_gpus = device_type == "cuda" and gpus > 0 and backend == "gloo"  # gloo ranks may share a GPU
    if device_type == "cuda" and nproc > gpus and not sharing_gpus:
        raise UsageError(f"--nproc-per-node {nproc} is more than the {gpus} GPU(s) in use; "
                         "lower it, pass --backend gloo to share GPUs, or pass --device cpu to run that many "
                         "CPU processes")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if device_type == "cpu" and nproc > cores:
        raise UsageError(f"--nproc-per-node {nproc} is more CPU processes than the {cores} core(s) this process may "
                         f"use; each rank needs a core of its own: give at most {cores}")
    if hardware.device == "auto" and device_type == "cpu":
        print(f"no GPU is visible: {nproc} CPU processes (gloo)", flush=True)
    return nproc


def torchrun_arguments(script, argv, nproc, fork=False):
    """A single-node torchrun invocation; --standalone picks a free rendezvous port itself.

    fork: the workers are forks of this process, which runs the script in them (torchrun's
    --run-path --start-method fork) instead of fresh interpreters, so no worker imports torch
    again (about a second of a short run's wall time). For CPU ranks only: a process forked after
    CUDA was set up cannot use CUDA, and this one asked CUDA how many GPUs there are."""
    start = ["--start-method=fork", "--run-path"] if fork else []
    return ["--standalone", f"--nproc-per-node={nproc}", *start, script, *argv]


def launch_arguments(config, script, argv):
    """torchrun's arguments for running `script argv` on this machine with config's ranks; checks
    the parallel flags."""
    placement = check_parallel_args(config)
    nproc = processes_per_node(config, placement)
    return torchrun_arguments(script, argv, nproc, fork=placement[0] == "cpu")


def launch_under_torchrun(config, script, argv):
    """Run the same command under torchrun; returns the exit code of the first failed worker."""
    launcher_args = launch_arguments(config, script, argv)
    check_run_inputs(config)  # the user errors every worker would hit, caught once before any starts
    if config.hardware.gpu_ids:
        print(f"  (local ranks map onto --gpu-ids {','.join(map(str, config.hardware.gpu_ids))} in order)", flush=True)
    return run_torchrun(launcher_args, save_dir=config.save_dir)


_workers_ended = False  # set once torchrun, run in this process, has seen its workers end
# Where torchrun says a worker failed; for a forked worker it adds the launcher's own traceback of
# noticing it, which says nothing about the failure (the worker has printed its own message).
TORCHRUN_WORKER_REPORTS = "torch.distributed.elastic.multiprocessing.api"


# A worker that ends with one of the trainer's own codes has said why in its own line (training/errors.py);
# torchrun's line that it failed would only follow it with a pid.
SAID_BY_THE_WORKER = re.compile(r"failed \(exitcode: (2|3|4|75|130)\)")


def _without_traceback(record):
    """torchrun's report of a failed worker: without the launcher's traceback of noticing it, and left out
    where the worker's own line has said it all."""
    record.exc_info, record.exc_text = None, None
    return not SAID_BY_THE_WORKER.search(record.getMessage())


def workers_ended():
    """Whether this process launched torchrun's workers here and they have all ended."""
    return _workers_ended


# How this process starts the workers and nothing else: left out of the command it prints, which a
# user would copy into a script (it runs the same without them, each worker a fresh interpreter).
IN_PROCESS_FLAGS = ("--start-method=fork", "--run-path")


def run_torchrun(launcher_args, save_dir=None):
    """torch.distributed.run in this process, printed first; the first failed worker's exit code,
    EXIT_INTERRUPTED after Ctrl-C, or EXIT_PREEMPTED after another stop signal. `save_dir`: where the
    run keeps last.pt, read after a stop to say what was saved."""
    global _workers_ended
    # Forked workers share this process's stdout; line by line, as `python -u` workers write
    # (a stream put in its place, as a test's capture, may not offer it).
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    shown = [part for part in launcher_args if part not in IN_PROCESS_FLAGS]
    print("launching: " + " ".join(shlex.quote(str(part)) for part in
                                   [sys.executable, "-m", "torch.distributed.run", *shown]), flush=True)
    reports = logging.getLogger(TORCHRUN_WORKER_REPORTS)
    last_before = _file_version(save_dir)
    try:
        # torchrun keeps its workers' error files under --log-dir; left to itself it makes a
        # torchelastic_* folder in the temp directory on every launch and never removes it.
        with tempfile.TemporaryDirectory(prefix="har-torchrun-") as log_dir:
            reports.addFilter(_without_traceback)
            try:
                run(get_args_parser().parse_args(["--log-dir", log_dir, *launcher_args]))
            finally:
                _workers_ended = True
                reports.removeFilter(_without_traceback)
    except ChildFailedError as failure:
        # The worker already printed its own message; torchrun's report would only repeat it.
        first = min(failure.failures.items())[1]
        return first.exitcode if first.exitcode and first.exitcode > 0 else 1
    except SignalException as stop:
        # torchrun passed the signal on to the workers and waited for them; say in one line, instead
        # of torchrun's traceback, what they left on disk.
        print(f"launcher received {stop.sigval.name}: {saved_by_the_workers(save_dir, last_before)}",
              file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED if stop.sigval.name == "SIGINT" else EXIT_PREEMPTED
    return 0


def _file_version(save_dir):
    """What tells one last.pt from the next (the file is replaced by a rename on every save)."""
    try:
        found = os.stat(save_dir / LAST)
    except (OSError, TypeError):
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


def saved_by_the_workers(save_dir, last_before):
    """What the workers stopped by a signal saved, as read from --save-dir: a stop signal makes them finish
    their step and save; Ctrl-C, or a signal during their set-up, stops them where they are."""
    progress = saved_progress(save_dir / LAST) if save_dir is not None else None
    if progress is None:
        return f"nothing was saved: {save_dir} holds no checkpoint" if save_dir else "nothing was saved"
    epoch, step, position = progress
    if _file_version(save_dir) == last_before:
        return f"nothing was saved since this command started ({save_dir / LAST} is the one from before, step {step})"
    where = f"in epoch {epoch + 1}, {position} samples in" if position else f"at the end of epoch {epoch}"
    return (f"the workers saved a checkpoint ({save_dir / LAST}: step {step}, {where}); run the same command "
            "again to resume")
