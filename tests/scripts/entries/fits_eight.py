"""The README's example entry on a device where micro-batches above 8 run out of memory: what the
largest-batch search (autotune --versus largest-batch) must find, on any machine."""
import importlib.util
import os

# The README's example, loaded from its file (its folder is not on the path)
EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tuner", "entries", "my_train.py")
_spec = importlib.util.spec_from_file_location("fits_eight_example", EXAMPLE)
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)
build_example = _example.build

FITS_AT_MOST = 8


def build(micro_batch, device):
    if micro_batch > FITS_AT_MOST:
        raise MemoryError(f"out of memory: this entry stands for a device that fits {FITS_AT_MOST} samples")
    return build_example(micro_batch, device)
