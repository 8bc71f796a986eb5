"""Nightly performance tracking for trainbench: result files, history, statistics, change points, plots.

The executables `scripts/nightly`, `scripts/compare` and `scripts/report` are thin wrappers over `cli`.
"""

__version__ = "0.1.0"
