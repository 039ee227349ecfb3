"""How every entry point ends: main(argv) run, a user-facing error (training/errors.py) turned into one
`error: ...` line and its exit code, torchrun told why, and a torchrun worker's exit."""
import json
import multiprocessing
import os
import signal
import sys
import time
import traceback

from data.errors import DataError
from outputs.safety import OutputRefused
from training.errors import EXIT_INTERRUPTED, EXIT_USAGE, SAME_ON_EVERY_RANK, RankLost, TrainingDiverged, UsageError

QUIET_RANK_EXIT_DELAY_S = 3.0  # how long a silent rank waits for local rank 0 to print


def run_entry_point(main, argv=None):
    """Call main(argv) and turn the errors above into one `error: ...` line and their exit code.

    --debug or HAR_DEBUG=1 lets the traceback through for bug reports.
    """
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("HAR_DEBUG") == "1"
    forked = forked_by_torchrun()
    if forked:
        start_as_a_fresh_worker()
    try:
        return main(argv)
    except (UsageError, DataError, OutputRefused, TrainingDiverged, RankLost) as exc:
        if debug:
            raise
        code = getattr(exc, "exit_code", EXIT_USAGE)
        shared = isinstance(exc, SAME_ON_EVERY_RANK) and not getattr(exc, "this_rank_only", False)
        quiet = shared and os.environ.get("LOCAL_RANK", "0") != "0"
        _record_for_torchrun(exc, delay_s=QUIET_RANK_EXIT_DELAY_S if quiet else 0.0)
        if quiet:
            # Local rank 0 says it for the node. Leaving a moment later lets it print before
            # torchrun, seeing this rank fail, stops the others.
            time.sleep(QUIET_RANK_EXIT_DELAY_S)
            return code
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        if debug:
            raise
        if os.environ.get("LOCAL_RANK", "0") == "0":  # Ctrl-C reaches every rank: one line a node
            print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        if not forked or debug:
            raise
        # torchrun keeps a forked worker's traceback in an error file nothing shows; a fresh
        # worker's interpreter prints it.
        traceback.print_exc()
        return 1


def launched_by_torchrun():
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def forked_by_torchrun():
    """A worker torchrun forked from its own process and runs the script in (--run-path)."""
    return launched_by_torchrun() and multiprocessing.parent_process() is not None


def start_as_a_fresh_worker():
    """What a worker forked by torchrun inherits from its launcher and a fresh one would not have.

    The intra-op threads torchrun gives its workers (OMP_NUM_THREADS, 1 where it starts several and
    the user set none): a fresh worker's torch reads it as it loads; a forked worker's torch was
    loaded in the launcher before torchrun set it, with a thread per core, and N workers of that many
    threads would share the cores. The signal handlers: torchrun's agent turns SIGINT, SIGTERM,
    SIGHUP and SIGQUIT into its own exception in the launcher, which a worker (and its DataLoader
    workers) must not raise: Ctrl-C is a KeyboardInterrupt again, the others end the process until
    the run installs its own (training.trainer.StopSignals)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch  # loaded already: the launcher imported it before forking this worker
        torch.set_num_threads(int(threads))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)


def exit_is_watched():
    """Whether a profiler, tracer or coverage tool (python -m cProfile, coverage run, a debugger)
    watches this interpreter, through sys.settrace / sys.setprofile or Python 3.12's sys.monitoring."""
    if sys.gettrace() is not None or sys.getprofile() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(tool) is not None for tool in range(6))


def exit_process(code, at_once=False):
    """sys.exit(code); a torchrun worker instead leaves at once, its output flushed, without the
    interpreter's teardown. In torch 2.13 the process group outlives destroy_process_group once DDP
    or FSDP has used it (torch._dynamo, first imported by DDP's constructor, keeps references to the
    groups that exist then; DTensor's sharding caches keep FSDP's mesh), and gloo's worker threads
    with it; one that frees a finished collective's tensor while the interpreter tears down aborts
    the process ("terminate called without an active exception", SIGABRT) after a run that
    succeeded. By the time main returns, the run has closed its files and its process group.
    at_once: leave at once outside torchrun too (a run that has ended, a launcher whose workers
    have), unless a profiler, tracer or coverage tool watches this interpreter: those write what
    they found while it tears down."""
    if forked_by_torchrun():
        # torchrun takes a SystemExit from the script (0 as the run's result) and ends this
        # process itself, without the interpreter's teardown.
        sys.exit(code or 0)
    if not (launched_by_torchrun() or (at_once and not exit_is_watched())):
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if code is None else code)


def one_line(exc):
    """The message of `exc`. A DataLoader worker's error comes back as "Caught X in DataLoader
    worker process N. Original Traceback ..." with the worker's traceback, then `module.X: message`
    on its last line: that message alone."""
    text = str(exc)
    if "Original Traceback" not in text:
        return text
    last = text.rstrip().splitlines()[-1]
    return last.split(": ", 1)[1] if last.startswith(f"{type(exc).__module__}.{type(exc).__name__}: ") else last


def _record_for_torchrun(exc, delay_s):
    """Under torchrun, leave the message where its failure summary looks (TORCHELASTIC_ERROR_FILE),
    so the summary shows it instead of a link to the docs on enabling tracebacks.

    torchrun names the failure with the earliest time stamp (whole seconds) as the root cause; a
    quiet rank dates its record `delay_s` later, so a tie never makes it the root cause instead
    of the local rank 0 that printed the message."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    stamp = str(int(time.time() + delay_s))
    message = {"message": f"{type(exc).__name__}: {exc}",
               "extraInfo": {"py_callstack": f"{type(exc).__name__}: {exc}", "timestamp": stamp}}
    try:
        with open(path, "w") as handle:
            json.dump({"message": message}, handle)
    except OSError:
        pass  # the summary then says less; the error line itself is unaffected
