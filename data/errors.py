"""The one exception type data code raises for bad input a user can fix."""
import sys
from pathlib import Path


class DataError(ValueError):
    """A problem with the data on disk or the data options, stated in one line."""


def not_a_file(path):
    """Why `path`, which should name a file, does not: for the one line that refuses it."""
    path = Path(path)
    if path.is_dir():
        return "is a folder"
    return "is not a regular file (a device, pipe or socket)" if path.exists() else "does not exist"


def exit_from_command(main, interrupted="interrupted"):
    """sys.exit(main()) for a data command (`python -m data.X`): a DataError is one `error:` line
    and exit 2, as the training entry points report bad data, and Ctrl-C prints `interrupted`."""
    try:
        sys.exit(main())
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        sys.exit(130)
