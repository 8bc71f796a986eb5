"""The entry's data path as autotune tunes and measures it.

Switches (data_switches): where the entry's batches are a torch.utils.data.DataLoader over a map-style dataset,
`num_workers` (the entry's own first, then 0, 1, 2, 4, ... up to the cores a rank has), and where workers run,
`prefetch_factor` (2, 4), `persistent_workers` and, on the CPU, `cpu_threads` (the model's intra-op threads: all of
the rank's, or those its loader workers leave). `pin_memory` is a GPU switch. The loader is rebuilt with them over
the same dataset, sampler (and so its shuffle and generator), batch sampler, collate_fn, worker_init_fn, drop_last
and multiprocessing context (rebuilt_loader): every candidate draws the same samples in the same order, so the first
step's check holds as for every switch.

The stream (DataStream): a candidate's micro-batches for its whole life in the worker. Its iterator, and with it the
loader's worker processes, is kept across the race's slices, so a slice times steps of a loader that is already
running. An epoch starts outside a slice's clock (where an epoch holds a slice) and what starting it cost (the
iterator, new worker processes where they are not persistent, the first batch) is counted in each step's time,
spread over the epoch's steps: persistent_workers is chosen for what it saves.

Between two clocks the loader's workers are stopped (SIGSTOP) and go on where they were when the next clock starts
(SIGCONT), so that the clocks of a candidate add up to one run of its steps. Left running, they would work while
nothing is timed: in the gaps between a trial's samples (a few per cent of a slice of 20 ms samples: the shorter the
samples, the faster a loader-fed candidate looked) and, while other candidates ran, on batches that then made its
next slice fast and slowed the others' with work of its own.

Workers are the tune's processes: each dies with the worker that forked it (die_with_parent in its init), and one
that fails (a dataset that cannot be pickled, raises in __getitem__, holds a CUDA tensor) fails its candidate with
the worker's own reason (worker_failure)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Dict, List, Optional

# Switches that mean something only where the loader has worker processes: elsewhere the search keeps them at the
# entry's own value (the probe's "applies_when": "workers").
NEEDS_WORKERS = ("prefetch_factor", "persistent_workers", "cpu_threads")
PREFETCH_FACTORS = ("2", "4")
DEFAULT_PREFETCH_FACTOR = 2      # torch.utils.data.DataLoader's, with workers
STREAMS_KEPT = 8                 # candidates whose stream (iterator and workers) a worker keeps between openings


def cores_per_rank(ranks: int) -> int:
    """The cores this process may run on, shared among `ranks` ranks on the node."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, ranks))


def is_map_style_loader(batches) -> bool:
    from torch.utils.data import DataLoader, IterableDataset
    return isinstance(batches, DataLoader) and not isinstance(batches.dataset, IterableDataset)


def data_switches(batches, on_gpu: bool, ranks: int) -> Dict[str, List[str]]:
    """The data switches an entry's batches offer, each with the entry's own value first: none where they are not a
    DataLoader over a map-style dataset (an iterable dataset yields what each worker makes of it, so its workers
    cannot change without changing the samples)."""
    if not is_map_style_loader(batches):
        return {}
    own_workers = int(batches.num_workers)
    most = cores_per_rank(ranks)
    counts, n = [0], 1
    while n <= most:
        counts.append(n)
        n *= 2
    if most not in counts:
        counts.append(most)
    out = {"num_workers": [str(own_workers)] + [str(c) for c in counts if c != own_workers]}
    own_prefetch = str(batches.prefetch_factor or DEFAULT_PREFETCH_FACTOR) if own_workers else str(DEFAULT_PREFETCH_FACTOR)
    out["prefetch_factor"] = [own_prefetch] + [p for p in PREFETCH_FACTORS if p != own_prefetch]
    own_persistent = "on" if batches.persistent_workers else "off"
    out["persistent_workers"] = [own_persistent, "off" if own_persistent == "on" else "on"]
    if on_gpu:
        own_pin = "on" if batches.pin_memory else "off"
        out["pin_memory"] = [own_pin, "off" if own_pin == "on" else "on"]
    else:
        # The entry's own loader with workers runs its model on PyTorch's threads (all); without, "left" is all too
        out["cpu_threads"] = ["all", "left"] if own_workers else ["left", "all"]
    return out


def loader_settings(switches: Dict[str, str], batches, base_threads: int, ranks: int) -> Dict[str, Any]:
    """The loader settings and model threads a candidate's switches stand for (the entry's own where it has none)."""
    workers = int(switches.get("num_workers", getattr(batches, "num_workers", 0) or 0))
    own_prefetch = getattr(batches, "prefetch_factor", None) or DEFAULT_PREFETCH_FACTOR
    prefetch = int(switches.get("prefetch_factor", own_prefetch))
    persistent = switches.get("persistent_workers", "on" if getattr(batches, "persistent_workers", False) else "off") == "on"
    pin = switches.get("pin_memory", "on" if getattr(batches, "pin_memory", False) else "off") == "on"
    threads = base_threads
    if switches.get("cpu_threads") == "left" and workers:
        threads = max(1, min(base_threads, cores_per_rank(ranks) - workers))
    return {"num_workers": workers, "prefetch_factor": prefetch if workers else None,
            "persistent_workers": persistent if workers else False, "pin_memory": pin, "cpu_threads": threads}


def refusal(switches: Dict[str, str], batches) -> Optional[str]:
    """Why these data switches cannot run on this entry's batches, or None."""
    named = [k for k in ("num_workers", "prefetch_factor", "persistent_workers", "cpu_threads") if k in switches]
    if named and not is_map_style_loader(batches):
        return (f"{', '.join(named)}: the entry's batches are a {type(batches).__name__}, not a DataLoader over a "
                "map-style dataset")
    return None


class NoMicroBatch(Exception):
    """An epoch of the entry's batches that yields nothing: the candidate's error, in these words."""


class _InWorker:
    """A loader worker's init: the worker dies with the process that forked it (autotune's worker, which dies with
    autotune), then the entry's own worker_init_fn. A class, not a closure, so that a spawn context can pickle it."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        from .conversation import die_with_parent
        die_with_parent()
        if self.inner is not None:
            self.inner(worker_id)


def rebuilt_loader(loader, settings: Dict[str, Any]):
    """The same DataLoader (dataset, sampler or batch sampler, collate_fn, worker_init_fn, drop_last, generator,
    timeout, multiprocessing context) with the candidate's workers, prefetch, persistence and pinning."""
    from torch.utils.data import DataLoader
    inner = loader.worker_init_fn.inner if isinstance(loader.worker_init_fn, _InWorker) else loader.worker_init_fn
    kw: Dict[str, Any] = dict(num_workers=settings["num_workers"], collate_fn=loader.collate_fn,
                              pin_memory=settings["pin_memory"], timeout=loader.timeout, worker_init_fn=_InWorker(inner),
                              generator=loader.generator)
    if settings["num_workers"]:  # DataLoader refuses these without workers
        kw.update(prefetch_factor=settings["prefetch_factor"], persistent_workers=settings["persistent_workers"],
                  multiprocessing_context=loader.multiprocessing_context)
    if getattr(loader, "pin_memory_device", ""):
        kw["pin_memory_device"] = loader.pin_memory_device
    if hasattr(loader, "in_order"):
        kw["in_order"] = loader.in_order
    if loader.batch_size is not None:
        kw.update(batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kw.update(batch_sampler=loader.batch_sampler)
    else:  # automatic batching off: each of the dataset's items is a micro-batch
        kw.update(batch_size=None, sampler=loader.sampler)
    return DataLoader(loader.dataset, **kw)


def worker_failure(e: BaseException) -> Optional[str]:
    """The reason a loader worker gave, where `e` is a failure re-raised from one (PyTorch's "Caught X in DataLoader
    worker process N. Original Traceback ...": its last line), a worker that died, or a dataset the loader could not
    hand to its workers (pickling, for a spawn context); None for any other failure."""
    text = str(e)
    if "DataLoader worker" in text:
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        where = lines[0].split(".")[0] if lines else "a DataLoader worker failed"
        return f"{where}: {lines[-1]}" if len(lines) > 1 else where
    if "pickle" in text.lower() or type(e).__name__ == "PicklingError":
        return f"the loader's dataset cannot be handed to its worker processes ({type(e).__name__}: {text.strip()})"
    return None


class DataStream:
    """A candidate's micro-batches for its life: one iterator over its batches (a DataLoader's workers kept with it),
    an epoch started outside the clock when the next slice would cross its end, and the starts' cost counted per
    micro-batch (amortized)."""

    def __init__(self, batches, workers: int = 0, prefetch_factor: int = 0):
        self.batches = batches
        self.workers = workers
        try:
            self.per_epoch: Optional[int] = len(batches)
        except TypeError:
            self.per_epoch = None  # an iterable of unknown length: its epochs end where they end, inside a slice
        self.iterator = None
        self.held: List[Any] = []         # taken while starting an epoch, handed out first
        self.left: Optional[int] = None   # micro-batches left in this epoch after `held`
        self.first_start = 0.0            # the candidate's first epoch start (its workers started from nothing)
        self.restarts: List[float] = []   # seconds of each later epoch start
        self.frozen: List[int] = []       # the loader workers' pids, stopped between clocks

    def worker_pids(self) -> List[int]:
        """The live worker processes of the current iterator (a DataLoader's with num_workers > 0)."""
        workers = getattr(self.iterator, "_workers", None) or []
        return [w.pid for w in workers if w.pid is not None and w.is_alive()]

    def freeze(self) -> None:
        """Stops the loader's workers where they are (what they hold and their queues kept) until thaw()."""
        self.thaw()
        for pid in self.worker_pids():
            try:
                os.kill(pid, signal.SIGSTOP)
                self.frozen.append(pid)
            except (ProcessLookupError, PermissionError):
                pass

    def thaw(self) -> None:
        frozen, self.frozen = self.frozen, []
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass

    def start_epoch(self) -> float:
        """A new iterator and its first micro-batch (held): the seconds that took."""
        self.thaw()  # the previous iterator's workers end (where not persistent): stopped, they could not
        started = time.perf_counter()
        self.iterator = None  # the previous epoch's iterator (and its workers, where not persistent) go first
        self.iterator = iter(self.batches)
        try:
            self.held = [next(self.iterator)]
        except StopIteration:
            raise NoMicroBatch("'batches' yielded no micro-batch (a DataLoader with drop_last and fewer samples than "
                             "the micro-batch?)") from None
        self.left = self.per_epoch - 1 if self.per_epoch is not None else None
        return time.perf_counter() - started

    def open(self) -> None:
        """Starts the candidate's stream: its first epoch, then a second, so that what an epoch's start costs
        is measured as every later epoch pays it (persistent workers are only reset)."""
        self.first_start = self.start_epoch()
        self.restarts.append(self.start_epoch())

    def next(self):
        if self.frozen:  # batches taken outside a clock (a candidate's check at its opening)
            self.thaw()
        if self.held:
            return self.held.pop(0)
        try:
            batch = next(self.iterator)
        except StopIteration:  # inside a clock: an epoch shorter than a slice, whose start is measured where it falls
            self.start_epoch()
            return self.held.pop(0)
        if self.left is not None:
            self.left -= 1
        return batch

    def take(self, n: int) -> List[Any]:
        return [self.next() for _ in range(n)]

    def available(self) -> Optional[int]:
        return None if self.left is None else len(self.held) + self.left

    def prepare(self, n: int) -> None:
        """Before a clock that takes `n` micro-batches: the workers go on where the last clock stopped them, and a
        new epoch starts here when this one would end inside the clock."""
        self.thaw()
        if self.iterator is None:
            self.open()
        left = self.available()
        if left is not None and left < n <= self.per_epoch:
            self.restarts.append(self.start_epoch())

    def amortized_seconds(self, n: int) -> float:
        """What the epochs' starts add to `n` micro-batches taken: the mean start over the epoch's micro-batches;
        0 where epochs are shorter than `n` (their starts fall inside the clock) or of unknown length."""
        if not self.per_epoch or n > self.per_epoch or not self.restarts:
            return 0.0
        return n * (sum(self.restarts) / len(self.restarts)) / self.per_epoch

    def stopped(self) -> None:
        """A clock stopped: the workers stop with it."""
        self.freeze()

    def close(self) -> None:
        """Ends the iterator and its worker processes (persistent ones are the loader's: dropped with it)."""
        self.thaw()  # a stopped worker would not see its end
        iterator, self.iterator = self.iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self.held = []
        loader_iterator = getattr(self.batches, "_iterator", None)
        shutdown = getattr(loader_iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


class PartTimer:
    """Where a profiled step's time goes: the seconds since the last mark, added to the part named (the device
    drained at each mark, so that a GPU's asynchronous work is counted in the part that queued it)."""

    PARTS = ("data", "forward_backward", "optimizer", "sync")

    def __init__(self, device):
        import torch
        self.seconds = dict.fromkeys(self.PARTS, 0.0)
        self.drain = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        self.last = 0.0

    def start(self) -> None:
        self.drain()
        self.last = time.perf_counter()

    def mark(self, part: str) -> None:
        self.drain()
        now = time.perf_counter()
        self.seconds[part] += now - self.last
        self.last = now
