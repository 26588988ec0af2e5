"""The one exception type for bad input data."""


class DataError(ValueError):
    """Bad or missing input data. The message always names the file or folder and what was expected."""
