"""Reading and validating `trainbench-results/1` files (see results/README.md) and deriving the machine key."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Dict, List, Optional

from ..errors import ResultFileError

SCHEMA = "trainbench-results/1"
DISPOSITIONS = ("passed", "incorrect", "unsupported", "failed")
# Backends whose rows ran on a GPU: benchsuite's cuda, and scripts/torch-peers' torch_cuda (its --device cpu rows, torch, ran on the CPU).
GPU_BACKENDS = ("cuda", "torch_cuda")
# "<UTC timestamp>_<commit>.json", the name nightly stores a run under.
STORED_NAME = re.compile(r"^(\d{8}T\d{6}Z)(?:-\d+)?_([a-z0-9]+)\.json$")
TIMESTAMP_FORMAT = "%Y%m%dT%H%M%SZ"


@dataclass
class Row:
    """One benchmark row; `samples` is None unless the row passed."""

    name: str
    stage: str
    variant: str
    backend: str
    mode: str
    disposition: str
    reason: str
    samples: Optional[List[float]]
    raw: dict = field(repr=False)

    @property
    def key(self) -> str:
        """Identity across runs: the name, plus the mode when it is not the default `hot`."""
        return self.name if self.mode in ("", "hot") else f"{self.name} [{self.mode}]"

    @property
    def passed(self) -> bool:
        return self.disposition == "passed"

    @property
    def disturbed(self) -> bool:
        """benchsuite saw the machine busy with other work during the samples, or the GPU throttled, and
        could not get clean samples by taking them again: the timing measures the disturbance."""
        return self.raw.get("disturbed") is True

    @property
    def disturbance(self) -> str:
        """What benchsuite saw, in words ("" for a clean row)."""
        parts = []
        share = self.raw.get("others_cpu_share")
        if _is_number(share) and share >= 0:
            parts.append(f"other processes used {share:.0%} of the CPUs")
        reasons = self.raw.get("throttle_reasons")
        if isinstance(reasons, list) and reasons:
            parts.append(f"GPU throttled ({', '.join(str(r) for r in reasons)})")
        clocks = [self.raw.get(k) for k in ("sm_clock_min_mhz", "sm_clock_max_mhz")]
        if all(_is_number(c) for c in clocks) and clocks[0] != clocks[1]:
            parts.append(f"SM clock {clocks[0]:.0f}-{clocks[1]:.0f} MHz")
        if not self.disturbed:
            return ""
        return "disturbed: " + ("; ".join(parts) if parts else "the machine was busy")

    @property
    def median(self) -> Optional[float]:
        if not self.samples:
            return None
        s = sorted(self.samples)
        n = len(s)
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass
class Run:
    """One result file."""

    path: str
    data: dict = field(repr=False)
    rows: Dict[str, Row]
    machine_key: str
    date: Optional[datetime]
    commit: str

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def label(self) -> str:
        """Short human label: date and commit."""
        when = self.date.strftime("%Y-%m-%d %H:%M") if self.date else self.name
        return f"{when} {self.commit}" if self.commit else when

    def clock_mhz(self, row: Row) -> Optional[float]:
        """The clock that bounds this row's speed: the GPU's SM clock for GPU rows, the CPU clock otherwise."""
        ctx = self.data.get("context", {})
        if row.backend in GPU_BACKENDS:
            devices = ctx.get("devices") if isinstance(ctx.get("devices"), list) else []
            settings = ctx.get("settings") if isinstance(ctx.get("settings"), dict) else {}
            want = settings.get("device")
            dev = next((d for d in devices if isinstance(d, dict) and d.get("index") == want), None)
            if dev is None and devices and isinstance(devices[0], dict):
                dev = devices[0]
            value = dev.get("sm_clock_mhz") if dev else None
        else:
            value = ctx.get("mhz_per_cpu")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
        return None


def slug(text: str) -> str:
    """Lower-case, `[a-z0-9.-]` only (runs of anything else become one '-')."""
    s = re.sub(r"[^a-z0-9.]+", "-", str(text).lower()).strip("-.")
    return s or "unknown"


def machine_key(data: dict, where: str = "result") -> str:
    """The results/ folder name for a run: GPU model + driver + CUDA runtime, or CPU model + cores."""
    ctx = data.get("context") if isinstance(data, dict) else None
    if not isinstance(ctx, dict):
        raise ResultFileError(f"{where}: no 'context' object")
    rows = [r for r in (data.get("benchmarks") or []) if isinstance(r, dict) and r.get("backend") in GPU_BACKENDS]
    devices = ctx.get("devices")
    has_device = isinstance(devices, list) and bool(devices) and isinstance(devices[0], dict)
    passed = [r.get("backend") for r in rows if r.get("disposition") == "passed"]
    if passed and not has_device:
        raise ResultFileError(f"{where}: has passed {passed[0]} rows but context.devices is empty, "
                              "so there is no machine key")
    # cuda rows on a machine without a usable GPU are all unavailable: that is a CPU run
    if rows and has_device:
        dev = devices[0]
        missing = [k for k in ("name", "driver_version", "runtime_version") if dev.get(k) in (None, "")]
        if missing:
            raise ResultFileError(f"{where}: context.devices[0] lacks {', '.join(missing)}, "
                                  "needed for the machine key")
        return f"{slug(dev['name'])}_drv{slug(dev['driver_version'])}_cuda{slug(dev['runtime_version'])}"
    host = ctx.get("host")
    if not isinstance(host, dict) or host.get("cpu_model") in (None, "") or host.get("cores") in (None, ""):
        raise ResultFileError(f"{where}: context.host.cpu_model and context.host.cores "
                              "are needed for the machine key")
    cores = host["cores"]
    if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1:
        raise ResultFileError(f"{where}: context.host.cores must be a positive integer, got {cores!r}")
    return f"{slug(host['cpu_model'])}_{cores}c"


def parse_date(text) -> Optional[datetime]:
    """An aware UTC datetime from an ISO-8601 string (naive means UTC); None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        d = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    except (ValueError, OverflowError):  # OverflowError: a date at the calendar's edge, moved past it to UTC
        return None


def _date_from_name(path: str) -> Optional[datetime]:
    m = STORED_NAME.match(os.path.basename(path))
    if not m:
        return None
    try:
        return datetime.strptime(m.group(1), TIMESTAMP_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:  # the shape of a stored name, not a date (month 13)
        return None


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _parse_row(i: int, r, where: str) -> Optional[Row]:
    if not isinstance(r, dict):
        raise ResultFileError(f"{where}: benchmarks[{i}] is not an object")
    name = r.get("name")
    if not isinstance(name, str) or not name:
        raise ResultFileError(f"{where}: benchmarks[{i}] has no 'name'")
    # Google Benchmark may add mean/stddev/cv aggregate rows; trainbench's row is the median.
    if r.get("run_type") == "aggregate" and r.get("aggregate_name") not in (None, "median"):
        return None
    at = f"{where}: benchmarks[{i}] ({name if name.isprintable() else repr(name)})"  # a newline in it: still one line
    disp = r.get("disposition")
    if disp not in DISPOSITIONS:
        raise ResultFileError(f"{at}: 'disposition' is {disp!r}, expected one of {', '.join(DISPOSITIONS)}")
    parts = name.split("/")
    stage = r.get("stage") if isinstance(r.get("stage"), str) and r.get("stage") else parts[0]
    backend = r.get("backend") if isinstance(r.get("backend"), str) and r.get("backend") else "cpu"
    variant = r.get("variant") if isinstance(r.get("variant"), str) else (parts[2] if len(parts) > 2 else name)
    mode = r.get("mode") if isinstance(r.get("mode"), str) else "hot"
    reason = r.get("reason") if isinstance(r.get("reason"), str) else ""
    samples = None
    if disp == "passed":
        s = r.get("samples_ns")
        if not isinstance(s, list) or not s:
            raise ResultFileError(f"{at}: a passed row needs a non-empty 'samples_ns' list")
        bad = [x for x in s if not _is_number(x) or x <= 0]
        if bad:
            raise ResultFileError(f"{at}: 'samples_ns' must hold positive finite numbers, found {bad[0]!r}")
        samples = [float(x) for x in s]
    return Row(name=name, stage=stage, variant=variant, backend=backend, mode=mode,
               disposition=disp, reason=reason, samples=samples, raw=r)


def parse_run(data, path: str) -> Run:
    """Validate a decoded result document; raises ResultFileError with the first problem found."""
    where = path
    if not isinstance(data, dict):
        raise ResultFileError(f"{where}: top level is not a JSON object")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ResultFileError(f"{where}: 'schema' is {schema!r}, expected {SCHEMA!r}")
    if not isinstance(data.get("context"), dict):
        raise ResultFileError(f"{where}: no 'context' object")
    bench = data.get("benchmarks")
    if not isinstance(bench, list):
        raise ResultFileError(f"{where}: no 'benchmarks' list")
    rows: Dict[str, Row] = {}
    for i, r in enumerate(bench):
        row = _parse_row(i, r, where)
        if row is None:
            continue
        if row.key in rows:
            raise ResultFileError(f"{where}: benchmark {row.key!r} appears twice")
        rows[row.key] = row
    key = machine_key(data, where)
    ctx = data["context"]
    tb = ctx.get("trainbench") if isinstance(ctx.get("trainbench"), dict) else {}
    commit = tb.get("git_commit") if isinstance(tb.get("git_commit"), str) else ""
    date = parse_date(ctx.get("date")) or _date_from_name(path)
    return Run(path=path, data=data, rows=rows, machine_key=key, date=date, commit=commit)


def load_run(path: str) -> Run:
    """Read and validate one result file."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ResultFileError(f"{path}: cannot read ({e.strerror or e})") from None
    if not raw.strip():
        raise ResultFileError(f"{path}: empty file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ResultFileError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ResultFileError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except ValueError:   # an integer of more digits than Python converts (4300)
        raise ResultFileError(f"{path}: not a result file (an integer too long to read)") from None
    except RecursionError:
        raise ResultFileError(f"{path}: not a result file (JSON nested too deeply)") from None
    return parse_run(data, path)


def stored_name(run: Run, now: Optional[datetime] = None) -> str:
    """`<UTC timestamp>_<commit>.json` for a run (its own date, else now)."""
    when = run.date or now or datetime.now(timezone.utc)
    commit = re.sub(r"[^a-z0-9]", "", (run.commit or "").lower())[:12] or "unknown"
    return f"{when.astimezone(timezone.utc).strftime(TIMESTAMP_FORMAT)}_{commit}.json"
