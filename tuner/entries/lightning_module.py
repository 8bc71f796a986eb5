"""A LightningModule as an --entry: autotune drives it through training_step, configure_optimizers and
train_dataloader. `autotune --executor torch --entry tuner/entries/lightning_module.py:build --format lightning`."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl


class Regressor(pl.LightningModule):
    def __init__(self, batch_size=16):
        super().__init__()
        self.batch_size = batch_size
        self.net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(2048, 32, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True).sin()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size, drop_last=True)


def build(micro_batch, device):
    torch.manual_seed(0)
    return Regressor(batch_size=micro_batch)
