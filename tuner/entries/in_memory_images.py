"""The image classifier of augmented_images.py with its data already in memory as micro-batches: every image
decoded, cropped, flipped and normalised once, the batches made once, so a step waits for nothing but the copy of
its tensors (the pre-batched data seed 001's report moves to). Beside augmented_images.py, it shows what the step's
time split says when the data path costs nothing, and that a loader's switches are not offered where there is no
loader to tune. `autotune --executor torch --entry tuner/entries/in_memory_images.py:build --batch 32`."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import augmented_images as images  # noqa: E402 - its folder first, as a script beside it would import it

_DECODED = {}  # the whole dataset decoded once a process


def _decoded():
    if "all" not in _DECODED:
        dataset = images.CompressedImages()
        samples = [dataset[i] for i in range(len(dataset))]
        _DECODED["all"] = (torch.stack([x for x, _ in samples]), torch.tensor([y for _, y in samples]))
    return _DECODED["all"]


def build(micro_batch, device):
    entry = images.build(micro_batch, device)
    x, y = _decoded()
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(y), generator=g)
    entry["batches"] = [(x[order[i:i + micro_batch]], y[order[i:i + micro_batch]])
                        for i in range(0, len(y) - micro_batch + 1, micro_batch)]
    return entry
