"""One error type for everything the user typed wrong: printed as one line, exit code 2."""


class UsageError(Exception):
    """A bad recipe, key, value, path or flag on the command line."""

    exit_code = 2
