"""A model of about 25M parameters for the no_sync benchmark (scripts/no-sync-bench): six residual blocks of
Linear(1024, 2048) and Linear(2048, 1024) (25.2M parameters, 101 MB of fp32 gradients a rank all-reduces), on
synthetic rows in a DataLoader (each rank gets its share through a DistributedSampler), AdamW, the default
clipping. `residual_mlp` builds the same kind of model at other sizes (mlp_10m.py)."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WIDTH, HIDDEN, DEPTH, SAMPLES = 1024, 2048, 6, 1024


class Block(nn.Module):
    def __init__(self, width=WIDTH, hidden=HIDDEN):
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self, width=WIDTH, hidden=HIDDEN, depth=DEPTH):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(depth))
        self.head = nn.Linear(width, 16)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def residual_mlp(micro_batch, device, width=WIDTH, hidden=HIDDEN, depth=DEPTH, samples=SAMPLES, shuffle=False):
    torch.manual_seed(0)
    model = Model(width, hidden, depth).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(samples, width, generator=g)
    y = torch.randint(0, 16, (samples,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=micro_batch, shuffle=shuffle, drop_last=True)
    return dict(model=model, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4), batches=loader,
                loss=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]))


def build(micro_batch, device):
    return residual_mlp(micro_batch, device)
