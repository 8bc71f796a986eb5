"""argparse value types the command-line tools share."""

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1, or argparse's usage error naming what was given."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return v
