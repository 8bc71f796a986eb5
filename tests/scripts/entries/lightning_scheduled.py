"""LightningModules whose configure_optimizers returns learning-rate schedulers, in Lightning's forms: a dict
with an lr_scheduler config stepped every optimizer step, and ([optimizer], [scheduler]) stepped every epoch
(Lightning's default interval). 64 samples: an epoch is 64 / micro_batch micro-batches."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

LR = 0.1
SAMPLES = 64


def full_then_none(step):
    """The whole learning rate for the first optimizer step, none after: a scheduler stepped too early (per
    micro-batch, or before the optimizer step) leaves the first step without any update."""
    return 1.0 if step == 0 else 0.0


class Scheduled(pl.LightningModule):
    def __init__(self, batch_size, form):
        super().__init__()
        self.batch_size, self.form = batch_size, form
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(SAMPLES, 8, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=LR)
        if self.form == "per_step":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, full_then_none),
                                                       "interval": "step", "frequency": 1}}
        if self.form == "every_second_step":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5),
                                                       "interval": "step", "frequency": 2}}
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]  # per epoch

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size, drop_last=True)


def per_step(micro_batch, device):
    torch.manual_seed(0)
    return Scheduled(micro_batch, "per_step")


def every_second_step(micro_batch, device):
    torch.manual_seed(0)
    return Scheduled(micro_batch, "every_second_step")


def per_epoch(micro_batch, device):
    torch.manual_seed(0)
    return Scheduled(micro_batch, "per_epoch")
