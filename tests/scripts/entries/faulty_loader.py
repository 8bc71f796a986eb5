"""Stand-in entries whose Dataset fails only in a DataLoader worker process, for the loader's switches: each fault
costs the candidate with workers, never the tune (tests/scripts/test_dataloader.py). The small MLP of the README's
example over a map-style dataset:
- `unpicklable`: its dataset holds a lambda and worker processes start by spawning (as on macOS), so the
  dataset cannot be handed to a worker (it sets the process's start method: a test puts it back);
- `build`: __getitem__ raises in a worker when the loader has one worker, and hangs in a worker when it has two
  (in the main process, num_workers=0, both are fine)."""
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Samples(Dataset):
    def __init__(self, n=512, transform=None):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        self.transform = transform

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        worker = get_worker_info()
        if worker is not None and worker.num_workers == 1:
            raise ValueError(f"sample {i} is corrupt (seen in a worker)")
        if worker is not None and worker.num_workers == 2:
            time.sleep(3600)
        x = self.x[i] if self.transform is None else self.transform(self.x[i])
        return x, self.y[i]


def _entry(micro_batch, device, loader):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10)).to(device)
    return {"model": model, "optimizer": lambda p: torch.optim.AdamW(p, lr=1e-3), "batches": loader,
            "loss": lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])}


def build(micro_batch, device):
    return _entry(micro_batch, device, DataLoader(Samples(), batch_size=micro_batch, shuffle=True, drop_last=True))


class _Plain(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(512, 32, generator=g), torch.randint(0, 10, (512,), generator=g)
        self.transform = lambda x: x * 1.0  # a lambda: not picklable

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.transform(self.x[i]), self.y[i]


def unpicklable(micro_batch, device):
    # Worker processes started by spawning, as macOS does (and forkserver, Python 3.14's default on Linux): each gets
    # the dataset pickled
    torch.multiprocessing.set_start_method("spawn", force=True)
    loader = DataLoader(_Plain(), batch_size=micro_batch, shuffle=True, drop_last=True)
    return _entry(micro_batch, device, loader)
