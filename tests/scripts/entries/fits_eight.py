"""The README's example entry on a device where micro-batches above 8 run out of memory: what the
largest-batch search (autotune --versus largest-batch) must find, on any machine."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tuner", "entries"))
from my_train import build as build_example  # noqa: E402 - the path first

FITS_AT_MOST = 8


def build(micro_batch, device):
    if micro_batch > FITS_AT_MOST:
        raise MemoryError(f"out of memory: this entry stands for a device that fits {FITS_AT_MOST} samples")
    return build_example(micro_batch, device)
