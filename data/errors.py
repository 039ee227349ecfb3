"""The one exception type data code raises for bad input a user can fix."""
import sys


class DataError(ValueError):
    """A problem with the data on disk or the data options, stated in one line."""


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
