"""The two failures the scripts report as exit code 2, each with a message naming what is wrong."""


class ResultFileError(Exception):
    """A result file that cannot be used; the message names the file and what is wrong with it."""


class UsageError(Exception):
    """Bad usage, or a run that could not be made; the message says which."""
