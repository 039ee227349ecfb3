"""What a dataset may declare about itself, one rule each, for every reader that takes it (an .npz of
windows, a description, the store's converter's flags): the names of its channels and classes, its
sample rate, and its windows' length. A name or number is refused by the first reader that meets
it, so no later step (training, predict.py, a store opened) reads it otherwise.

Names are refused, not stripped, when they begin or end with whitespace: a CSV header and a
comma-separated flag are read without it, so a stripped name would match a column the data does not
name, and a kept one would match nothing the recordings give; either way the name the user wrote
would not be the one used, which only they can settle."""
from data.errors import DataError

RESERVED_CHANNELS = ("time_s", "label", "subject")  # a recording's own columns, never a channel
# Activity data is sampled at 20 to 200 Hz and inertial sensors output at most a few kHz (a MEMS
# accelerometer's fastest rate is near 6.4 kHz): a rate beyond 10 kHz is a unit slip (a period, or
# mHz), and every recording would be resampled to it and then refused.
MAX_SAMPLE_RATE_HZ = 10_000
MIN_WINDOW_STEPS = 8  # two stride-2 or pooling stages in every model still leave two steps
# A window of 2^16 samples is 22 minutes at 50 Hz, far past any activity's; beyond, one window's
# arrays would be sized without bound (1e20 failed inside numpy).
MAX_WINDOW_STEPS = 2 ** 16


def checked_names(names, kind, where):
    """`names` (strings) as a tuple, each a name a channel or class (`kind`) may have and none twice;
    else one DataError line that starts with `where` (the file and field they came from)."""
    names = tuple(names)
    for position, name in enumerate(names):
        problem = _name_problem(name, kind)
        if problem:
            raise DataError(f"{where} must be {problem}")
        if name in names[:position]:
            raise DataError(f"{where} must be distinct names: {name!r} is given twice")
    return names


def _name_problem(name, kind):
    """Why `name` cannot name a channel or class, or None."""
    if not name.strip():
        return f"non-empty names: {name!r} is empty or blank; give every {kind} a name"
    if name != name.strip():
        return (f"names without whitespace at either end: {name!r} would be read as {name.strip()!r} from a CSV "
                "header or a flag, which then is not the same name; remove the whitespace")
    if "," in name:
        return (f"names without commas: {name!r} would be split in two where names are written as a "
                "comma-separated list (--class-names, --channels); use another character, such as '_' or '/'")
    if kind == "channel" and name in RESERVED_CHANNELS:
        return (f"distinct names other than {', '.join(RESERVED_CHANNELS[:-1])} and {RESERVED_CHANNELS[-1]}: "
                f"{name!r} is a recording's own column, which predict.py reads as that, not as a channel; rename it")
    return None


def rate_problem(rate_hz):
    """Why a number cannot be a sample rate in Hz, or None."""
    if not 0 < rate_hz <= MAX_SAMPLE_RATE_HZ:  # NaN fails this too
        return (f"a positive number of Hz, at most {MAX_SAMPLE_RATE_HZ:,} (activity data is sampled at 20 to "
                "200 Hz; more is a unit slip)")
    return None
