"""An MLP of about 10M parameters fed by a DataLoader, for tunes on ranks (docs/measured: the budget on 2 CPU ranks):
mlp_25m.py's residual MLP with two blocks of Linear(1024, 2560) and Linear(2560, 1024) (10.5M parameters, 42 MB of
fp32 gradients a rank all-reduces), on 2,048 synthetic rows, shuffled (each rank gets its share through a
DistributedSampler), AdamW, the default clipping.
`autotune --entry tests/scripts/entries/mlp_10m.py:build --ranks 2 --batch 128`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlp_25m import residual_mlp  # noqa: E402 - its folder first, as a script beside it would import it


def build(micro_batch, device):
    return residual_mlp(micro_batch, device, hidden=2560, depth=2, samples=2048, shuffle=True)
