"""trainbench's Python side, two packages apart:

- `trainbench.tracking`: nightly performance tracking over benchsuite's result files (history, comparisons and
  their statistics, change points, reports, plots), behind scripts/nightly, compare, report and aa-check; numpy,
  scipy and matplotlib, never torch.
- `trainbench.pytorch`: every process that runs PyTorch: benchsuite's PyTorch rows (scripts/torch-peers) and
  autotune's PyTorch worker (scripts/torch-step: the twin of the training step, the user's own model).

`trainbench.errors` holds the two failures both report as exit code 2."""

__version__ = "0.1.0"
