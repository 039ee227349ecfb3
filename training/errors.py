"""User-facing errors: one line on stderr and a non-zero exit instead of a traceback."""
import os
import sys

from data.errors import DataError

EXIT_USAGE = 2  # a flag, file or data problem the message explains
EXIT_DIVERGED = 3  # the loss became NaN/inf; nothing was saved over the last good checkpoint
EXIT_RANK_LOST = 4  # another rank died, or a collective waited longer than --dist-timeout for it
EXIT_PREEMPTED = 75  # SIGTERM/SIGUSR1: the step finished and a checkpoint was saved; run again to resume
EXIT_INTERRUPTED = 130


class UsageError(ValueError):
    """A flag, file or environment problem the user can fix; the message says how."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; raised before anything is saved over a good checkpoint."""
    exit_code = EXIT_DIVERGED


class RankLost(RuntimeError):
    """Another rank closed its connection, or a collective waited longer than --dist-timeout."""
    exit_code = EXIT_RANK_LOST


def run_entry_point(main, argv=None):
    """Call main(argv) and turn the errors above into one `error: ...` line and their exit code.

    --debug or HAR_DEBUG=1 lets the traceback through for bug reports.
    """
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("HAR_DEBUG") == "1"
    try:
        return main(argv)
    except (UsageError, DataError, TrainingDiverged, RankLost) as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_USAGE)
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
