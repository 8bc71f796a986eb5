"""Entries a CUDA graph cannot capture, for the cuda_graphs switch's refusals: a loss that reads a value to the
host (.item()), and micro-batches whose sequence length changes from one step to the next."""
import torch
from torch import nn


def _model(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 1)).to(device)


def _loss(model, batch):
    return model(batch).mean(dim=1).pow(2).mean()


def host_sync(micro_batch, device):
    model = _model(device)
    tokens = torch.randint(0, 100, (64, 8), generator=torch.Generator().manual_seed(1))
    batches = [tokens[i:i + micro_batch] for i in range(0, 64 - micro_batch + 1, micro_batch)]

    def loss(m, b):
        value = _loss(m, b)
        if value.item() > 1e9:  # a host sync: the CPU waits for the GPU's value
            raise RuntimeError("diverged")
        return value
    return dict(model=model, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3), batches=batches, loss=loss)


def changing_shapes(micro_batch, device):
    model = _model(device)
    g = torch.Generator().manual_seed(1)
    # four micro-batches of 8 tokens, then four of 12: a step of 4 x 4 sees one length, the next step the other
    batches = [torch.randint(0, 100, (micro_batch, 8 if i < 4 else 12), generator=g) for i in range(8)]
    return dict(model=model, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3), batches=batches, loss=_loss)
