"""An MLP of about 10M parameters fed by a DataLoader, for tunes on ranks (docs/measured: the budget on 2 CPU ranks):
two residual blocks of Linear(1024, 2560) and Linear(2560, 1024) (10.5M parameters, 42 MB of fp32 gradients a rank
all-reduces), on synthetic rows (each rank gets its share through a DistributedSampler), AdamW, the default
clipping. `autotune --entry tests/scripts/entries/mlp_10m.py:build --ranks 2 --batch 128`."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WIDTH, HIDDEN, DEPTH, SAMPLES = 1024, 2560, 2, 2048


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 16)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(micro_batch, device):
    torch.manual_seed(0)
    model = Model().to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, WIDTH, generator=g)
    y = torch.randint(0, 16, (SAMPLES,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=micro_batch, shuffle=True, drop_last=True)
    return dict(model=model, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4), batches=loader,
                loss=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]))
