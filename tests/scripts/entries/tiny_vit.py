"""A small vision transformer for autotune --entry's tests and the worker's benchmark: patch embedding, two
pre-norm blocks whose attention calls scaled_dot_product_attention (so the sdpa switch is offered), a class
token, AdamW."""
import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyViT(nn.Module):
    def __init__(self, dim=96, heads=3, depth=2, patch=4, image=32, classes=10):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, classes))

    def forward(self, images):
        x = self.embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.blocks(x)[:, 0])


def build(micro_batch, device):
    torch.manual_seed(0)
    model = TinyViT().to(device)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(256, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (256,), generator=g)
    batches = [(images[i:i + micro_batch], labels[i:i + micro_batch]) for i in range(0, 256 - micro_batch + 1, micro_batch)]
    return {"model": model, "optimizer": lambda p: torch.optim.AdamW(p, lr=1e-3), "batches": batches,
            "loss": lambda m, b: F.cross_entropy(m(b[0]), b[1])}
