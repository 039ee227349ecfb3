"""The one exception type data code raises for bad input a user can fix."""


class DataError(ValueError):
    """A problem with the data on disk or the data options, stated in one line."""
