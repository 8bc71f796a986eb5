"""The README's --entry example: a small MLP classifier on synthetic data, as an ordinary PyTorch script
would build it. `autotune --executor torch --entry tuner/entries/my_train.py:build --batch 64`."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build(micro_batch, device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10)).to(device)
    x = torch.randn(4096, 64)
    y = torch.randint(0, 10, (4096,))
    loader = DataLoader(TensorDataset(x, y), batch_size=micro_batch, drop_last=True)

    def loss(model, batch):
        inputs, labels = batch
        return nn.functional.cross_entropy(model(inputs), labels)

    return dict(model=model,
                optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
                batches=loader,
                loss=loss)
