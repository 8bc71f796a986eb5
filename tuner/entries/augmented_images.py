"""An image classifier whose Dataset decodes and augments each sample, as a vision script's does (a JPEG decoded,
cropped at random, flipped, normalised): the step waits for its data unless the loader's workers prepare the next
batch while the model computes. Synthetic images, stored compressed (zlib standing in for JPEG), decoded per sample.
`autotune --executor torch --entry tuner/entries/augmented_images.py:build --batch 32`."""
import zlib

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

IMAGES = 4096       # the dataset's samples: 128 steps of 32 an epoch, so that an epoch's start is a small part of it
SIDE = 72           # stored images are SIDE x SIDE x 3 bytes
CROP = 64           # the model sees CROP x CROP crops
CLASSES = 10


_STORED = {}  # (n, seed) -> (blobs, labels): made once a process, as a script opens its image folder once


def _stored(n, seed):
    if (n, seed) not in _STORED:
        rng = np.random.default_rng(seed)
        blobs, labels = [], rng.integers(0, CLASSES, n)
        for _ in range(n):
            base = rng.integers(0, 256, (SIDE // 8, SIDE // 8, 3), dtype=np.uint8)
            image = np.kron(base, np.ones((8, 8, 1), dtype=np.uint8))  # smooth blocks: compress as photos do
            image = (image + rng.integers(0, 8, image.shape, dtype=np.uint8)).astype(np.uint8)
            blobs.append(zlib.compress(image.tobytes(), 6))
        _STORED[(n, seed)] = (blobs, labels)
    return _STORED[(n, seed)]


class CompressedImages(Dataset):
    """Images kept compressed in memory; __getitem__ decodes one, crops it at random, flips it half of the time
    and normalises it, with a generator seeded per sample (the same sample gives the same crop in every process)."""

    def __init__(self, n=IMAGES, seed=0):
        self.blobs, self.labels = _stored(n, seed)

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        image = np.frombuffer(zlib.decompress(self.blobs[i]), dtype=np.uint8).reshape(SIDE, SIDE, 3)
        y, x = rng.integers(0, SIDE - CROP + 1, 2)
        crop = image[y:y + CROP, x:x + CROP].astype(np.float32) / 255.0
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        crop = (crop - crop.mean(axis=(0, 1))) / (crop.std(axis=(0, 1)) + 1e-5)
        # a few more passes of per-pixel work, as colour jitter and resizing would do
        for gamma in (0.9, 1.1, 1.0):
            crop = np.sign(crop) * np.abs(crop) ** gamma
        return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1))), int(self.labels[i])


def build(micro_batch, device):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 5, stride=2, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * (CROP // 4) ** 2, 64), nn.ReLU(), nn.Linear(64, CLASSES)).to(device)
    loader = DataLoader(CompressedImages(), batch_size=micro_batch, shuffle=True, drop_last=True)

    def loss(model, batch):
        images, labels = batch
        return nn.functional.cross_entropy(model(images), labels)

    return dict(model=model, optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3), batches=loader, loss=loss)
