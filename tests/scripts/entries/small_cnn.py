"""A model that is not a transformer, for autotune --entry's tests: a small CNN on synthetic images, the
optimizer given as an instance (SGD with momentum) and the batches as a list of (images, labels) tuples."""
import torch
from torch import nn


def build(micro_batch, device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10)).to(device)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(256, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (256,), generator=g)
    batches = [(images[i:i + micro_batch], labels[i:i + micro_batch]) for i in range(0, 256 - micro_batch + 1, micro_batch)]
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            "batches": batches, "loss": lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])}


def build_batchnorm(micro_batch, device):
    """The same with batch norm: its loss depends on the micro-batch split."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 10)).to(device)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(256, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (256,), generator=g)
    batches = [(images[i:i + micro_batch], labels[i:i + micro_batch]) for i in range(0, 256 - micro_batch + 1, micro_batch)]
    return {"model": model, "optimizer": lambda p: torch.optim.AdamW(p, lr=1e-3), "batches": batches,
            "loss": lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])}


def build_groupnorm(micro_batch, device):
    """A convolutional model whose work is its convolutions, with group norm (independent of the micro-batch
    split): the kind of model bf16 autocast speeds up on a CPU with bf16 matrix units (measured 1.9-2.1x on the
    2-core CI machine)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.ReLU(),
                          nn.Conv2d(64, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(64, 128, 3, padding=1), nn.GroupNorm(8, 128), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).to(device)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(256, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (256,), generator=g)
    batches = [(images[i:i + micro_batch], labels[i:i + micro_batch]) for i in range(0, 256 - micro_batch + 1, micro_batch)]
    return {"model": model, "optimizer": lambda p: torch.optim.AdamW(p, lr=1e-3), "batches": batches,
            "loss": lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])}
