"""The one exception type for bad input data."""

from robusttrain.errors import InputError


class DataError(InputError):
    """Bad or missing input data. The message always names the file or folder and what was expected."""
