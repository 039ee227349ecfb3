"""User-facing errors and their exit codes (training/entry_point.py turns them into one line on stderr and a
non-zero exit instead of a traceback)."""
from data.errors import DataError
from outputs.safety import OutputRefused

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


# Every rank checks the same flags, files and data, and agrees on a NaN step before stopping, so
# these read the same on every rank; a lost peer (RankLost) is each rank's own story, and so is an
# error marked `this_rank_only` (a cross-validation fold that only this rank runs).
SAME_ON_EVERY_RANK = (UsageError, DataError, OutputRefused, TrainingDiverged)
