"""Entries whose data each rank of a data-parallel tune shares differently (entry.share_over_ranks): a DataLoader
(it gets a DistributedSampler), a function that names rank and world_size (it yields its own share), and a plain
generator of batches (the same on every rank: said, with the fix). Sample i of the dataset is the row [i, i, i, i],
so a test can tell which samples a rank saw."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES = 64


def _parts(device):
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)

    def loss(model, batch):
        return model(batch[0]).pow(2).mean()
    return model, loss


def _rows():
    return torch.arange(SAMPLES, dtype=torch.float32)[:, None].repeat(1, 4)


def loader(micro_batch, device, shuffle="off"):
    model, loss = _parts(device)
    data = DataLoader(TensorDataset(_rows()), batch_size=micro_batch, shuffle=shuffle == "on", drop_last=True)
    return dict(model=model, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batches=data, loss=loss)


def own_share(micro_batch, device, rank, world_size):
    model, loss = _parts(device)
    rows = _rows()[rank::world_size]
    batches = [(rows[i:i + micro_batch],) for i in range(0, len(rows) - micro_batch + 1, micro_batch)]
    return dict(model=model, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batches=batches, loss=loss)


def same_everywhere(micro_batch, device):
    model, loss = _parts(device)
    rows = _rows()
    batches = [(rows[i:i + micro_batch],) for i in range(0, SAMPLES - micro_batch + 1, micro_batch)]
    return dict(model=model, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batches=batches, loss=loss)


def batch_norm(micro_batch, device):
    """A DataLoader entry whose loss depends on the split of the global batch: batch norm's statistics."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).to(device)
    rows = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(1)) * torch.arange(1, SAMPLES + 1)[:, None]
    data = DataLoader(TensorDataset(rows), batch_size=micro_batch, drop_last=True)
    return dict(model=model, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batches=data,
                loss=lambda model, batch: model(batch[0]).pow(2).mean())


class Blocks(nn.Module):
    """Repeated blocks in a ModuleList, as a transformer's: FSDP2 shards each block, then the rest."""

    def __init__(self, width=8, depth=3):
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def blocks(micro_batch, device):
    """A DataLoader entry over a model of repeated blocks, with AdamW (and the default clipping)."""
    torch.manual_seed(0)
    model = Blocks().to(device)
    rows = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(1))
    data = DataLoader(TensorDataset(rows), batch_size=micro_batch, drop_last=True)
    return dict(model=model, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2), batches=data,
                loss=lambda model, batch: model(batch[0]).pow(2).mean())
