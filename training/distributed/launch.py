"""`--multi-gpu ddp` started without torchrun: check once, then run torch.distributed.run here."""
import logging
import shlex
import sys
import tempfile

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from training.distributed.strategy import check_parallel_args
from training.errors import EXIT_PREEMPTED, UsageError
from training.run_inputs import check_run_inputs


def processes_per_node(config, placement):
    """--nproc-per-node, else one per GPU in use, else one CPU process. placement: the (device type,
    backend) check_parallel_args gave for this config."""
    device_type, backend = placement
    hardware, nproc = config.hardware, config.parallel.nproc_per_node
    gpus = len(hardware.gpu_ids) if hardware.gpu_ids else (torch.cuda.device_count() if device_type == "cuda" else 0)
    if nproc is None:
        return max(1, gpus)
    sharing_gpus = device_type == "cuda" and gpus > 0 and backend == "gloo"  # gloo ranks may share a GPU
    if hardware.device != "cpu" and nproc > gpus and not sharing_gpus:
        raise UsageError(f"--nproc-per-node {nproc} is more than the {gpus} GPU(s) in use; "
                         "lower it, pass --backend gloo to share GPUs, or pass --device cpu to run that many "
                         "CPU processes")
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
    return run_torchrun(launcher_args)


_workers_ended = False  # set once torchrun, run in this process, has seen its workers end
# Where torchrun says a worker failed; for a forked worker it adds the launcher's own traceback of
# noticing it, which says nothing about the failure (the worker has printed its own message).
TORCHRUN_WORKER_REPORTS = "torch.distributed.elastic.multiprocessing.api"


def _without_traceback(record):
    record.exc_info, record.exc_text = None, None
    return True


def workers_ended():
    """Whether this process launched torchrun's workers here and they have all ended."""
    return _workers_ended


def run_torchrun(launcher_args):
    """torch.distributed.run in this process, printed first; the first failed worker's exit code,
    or EXIT_PREEMPTED when a stop signal reached the launcher."""
    global _workers_ended
    # Forked workers share this process's stdout; line by line, as `python -u` workers write
    # (a stream put in its place, as a test's capture, may not offer it).
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    print("launching: " + " ".join(shlex.quote(part) for part in
                                   [sys.executable, "-m", "torch.distributed.run", *launcher_args]), flush=True)
    reports = logging.getLogger(TORCHRUN_WORKER_REPORTS)
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
        # torchrun passed the signal on as SIGTERM and waited for the workers, which finished
        # their step and saved; say so in one line instead of torchrun's traceback.
        print(f"launcher received {stop.sigval.name}: the workers saved a checkpoint; run the same command "
              "again to resume", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    return 0
