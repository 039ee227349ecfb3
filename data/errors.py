"""The one exception type data code raises for bad input a user can fix."""
import sys

from outputs.safety import OutputRefused, not_a_file  # noqa: F401 (not_a_file: said of inputs too)


class DataError(ValueError):
    """A problem with the data on disk or the data options, stated in one line."""


def exit_from_command(main, interrupted="interrupted"):
    """sys.exit(main()) for a data command (`python -m data.X`): a DataError is one `error:` line
    and exit 2, as the training entry points report bad data, and Ctrl-C prints `interrupted`."""
    try:
        sys.exit(main())
    except (DataError, OutputRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        sys.exit(130)
