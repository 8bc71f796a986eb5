"""Entries that are wrong in one way each, for autotune --entry's bad-input tests."""
import torch
from torch import nn

not_callable = 42


def raises(micro_batch, device):
    raise RuntimeError("the data folder is missing")


def wrong_return(micro_batch, device):
    return nn.Linear(2, 2)


def no_parameters(micro_batch, device):
    model = nn.ReLU()
    return dict(model=model, optimizer=lambda p: torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),
                batches=[torch.zeros(micro_batch, 2)], loss=lambda m, b: m(b).sum())


def ignores_the_micro_batch(micro_batch, device):
    model = nn.Linear(2, 1)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                batches=[torch.zeros(3, 2)], loss=lambda m, b: m(b).mean())
