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


def seconds_up_to(limit: float):
    """A number of seconds in (0, limit], or argparse's usage error naming what was given."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not 0 < v <= limit:
            raise argparse.ArgumentTypeError(f"must be in (0, {limit:g}] seconds: {text!r}")
        return v
    return parse
