"""What the stages' PyTorch cases take from benchsuite's listing: the constants their inputs and checks are
built with (seeds, tolerances, CG's window: generator_constants() in benches/torch_rows.cpp), and the inputs
each row reads, drawn by the stages' own generators and written by benchsuite beside the listing
(attach_torch_inputs in benches/torch_inputs.cpp): no generator is copied here. A leaf: it imports nothing of
trainbench but its error type, and numpy only where an array is read."""

from __future__ import annotations

import os
from typing import Dict

from ..errors import UsageError

_constants: Dict[str, object] = {}


def use_constants(values: Dict[str, object]) -> None:
    _constants.clear()
    _constants.update(values)


def constant(name: str):
    """One of the listing's constants; a UsageError when the listing carries none of that name."""
    if name not in _constants:
        raise UsageError(f"the listing carries no constant {name!r} (from a benchsuite older than this script?)")
    return _constants[name]


def read_input(bench, name: str):
    """The row's input `name` as a numpy array: a raw file under the listing's inputs_dir."""
    import numpy as np
    spec = bench.inputs.get(name)
    if spec is None:
        raise UsageError(f"the listing gives {bench.name or bench.stage} no input {name!r}: make it with "
                         "benchsuite --torch-inputs DIR (a run of --backend ...,torch does)")
    path = os.path.join(bench.inputs_dir, spec["file"])
    try:
        return np.fromfile(path, dtype=spec["dtype"]).reshape(spec["shape"])
    except (OSError, ValueError) as e:
        raise UsageError(f"input {name!r} of {bench.name or bench.stage}: cannot read {path} ({e})") from None


def read_document(bench, name: str):
    """The row's input `name` as the JSON document benchsuite wrote ({"file", "format": "json"})."""
    import json
    spec = bench.inputs.get(name)
    if spec is None or spec.get("format") != "json":
        raise UsageError(f"the listing gives {bench.name or bench.stage} no JSON input {name!r}: make it with "
                         "benchsuite --torch-inputs DIR (a run of --backend ...,torch does)")
    path = os.path.join(bench.inputs_dir, spec["file"])
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"input {name!r} of {bench.name or bench.stage}: cannot read {path} ({e})") from None
