"""The PyTorch worker of one tune: `autotune --executor torch` (the twin of the step, or the user's own model with
--entry) starts `scripts/torch-step --serve START` once and keeps it for the whole tune, so that torch, the entry's
module and what PyTorch sets up on first use are paid once, not once a trial.

The worker speaks the request/response protocol of benchsuite's PyTorch rows (peers.py): one JSON object a
line on its stdin, one answer a line on its stdout, ops open / time / counters / close. autotune measures: it sizes
the samples, applies the stopping rule, computes the interval and runs the race's rounds (tuner/worker.cpp); the
worker only builds, checks and runs steps, and reads its clock around them.

  open      {"candidate": {...}, and for the twin "resolved", "reference", "warmup_steps"}: build the candidate from
            the entry function (same seed, fresh parameters, optimizer and loader: it starts from the state it would
            have alone), check its first optimizer step against the reference (the entry's: computed once per global
            batch and kept; the twin's: the C++ step's double forward, in the request), run the warm-up step, and say
            {"disposition": passed | incorrect | oom | error, "reason", "setup_seconds", "step_seconds",
            "compile_seconds", "checked"}. A candidate already checked in this worker is not checked again (a race
            slice); a compile=on candidate keeps its compiled model for its next opening.
  time      {"calls": N}: N whole optimizer steps of the open candidate between two reads of the clock (the device
            drained before and after) -> {"seconds": S}; a failure -> {"error", "class": oom | error}.
  profile   {"steps": N}: N steps of the open candidate under torch.profiler -> {"wall_seconds",
            "communication_seconds" (a collective in flight), "exposed_seconds" (of those, nothing computing: the step
            waited), "share" (exposed / wall)} (distributed.profiled_steps); on ranks, the rank that waited most's,
            with "rank_shares".
  split     {"steps": N}: N steps of the open candidate with a timer between their parts -> {"parts": {"data",
            "forward_backward", "optimizer", "communication", "sync"} (seconds a step), "step_seconds", "steps",
            "dataloader" (the candidate's loader settings and model threads)}: where the step's time goes, apart from
            the samples speed is judged on (data.PartTimer; on ranks, the communication a step waits for is taken
            from a profiled step and out of forward_backward; the slowest rank's).
  counters  {} -> {"peak_bytes"}: the candidate's own peak memory (the device's allocator on a GPU, reset at open;
            on the CPU the process's peak resident set, reset at open through /proc/self/clear_refs).
  close     {"failed": bool} -> {"restart": bool, "held_bytes"}: the candidate dropped, memory returned; "restart"
            when the device is in an error state, or when a failed candidate (an out-of-memory) left memory held
            beyond what the worker held before opening it: only a new process clears either.

For an entry, two more ops come before the candidates, so that the entry is imported in this process too:
  probe          {"micro_batch"}: the entry validated and what autotune needs of it (entry.probe_entry), or
                 {"error", "usage": true} with the one line that names what is wrong with it;
  largest_batch  {"global_batch", "memory_limit_bytes"}: Lightning's BatchSizeFinder on it (entry.largest_batch).

Under torchrun (WORLD_SIZE > 1), an entry's worker is a group of ranks (distributed.py): rank 0 speaks the protocol
above and hands each request to the others over torch.distributed; every rank builds the candidate on its share of
the global batch (global_batch = micro_batch x accumulation x ranks) in DistributedDataParallel, checks its first
step against one process on every rank's samples, and steps it; the answers come back as one (the first rank's
failure, else the slowest rank's seconds, "rank_seconds" beside them, and the largest peak memory).

Whatever the user's code prints goes to stderr: stdout is the conversation. The worker ignores SIGINT (autotune
owns the interrupt and ends the worker) and dies with its parent (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, TextIO

from .conversation import converse, die_with_parent
from ..errors import UsageError

PROTOCOL = "trainbench-torch-worker/1"   # tuner/worker.h torch_worker_protocol
HELD_SLACK_BYTES = 64 << 20              # memory still held after a close beyond this (and 5%): start afresh
COMPILED_KEPT = 4                        # compile=on candidates whose compiled model is kept for their next opening


def _one_line(e: BaseException) -> str:
    from .entry import one_line
    return f"{type(e).__name__}: {one_line(e)}"


def _where(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    return f" at {os.path.basename(frame.filename)}:{frame.lineno}" if frame else ""


def reset_peak_host_bytes() -> bool:
    """Resets the peak resident set (VmHWM) that peak_host_bytes reads; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def host_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def fingerprint(value: Any) -> str:
    """A digest of tensors (nested in tuples, lists, dicts): the reference of a global batch is reused only for the
    same samples and the same initial parameters."""
    import torch
    h = hashlib.sha1()

    def feed(v):
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            h.update(str((t.dtype, tuple(t.shape))).encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(v, dict):
            for k in sorted(v):
                h.update(str(k).encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            for x in v:
                feed(x)
        else:
            h.update(repr(v).encode())
    feed(value)
    return h.hexdigest()


class Opened:
    """One open candidate: its step function (`step(timer=None)`) and what close must drop."""

    def __init__(self, step, keep=None, diverged=None, stream=None, accumulation=1, dataloader=None, key=""):
        self.step = step
        self.key = key  # the candidate's (json of its request): what its kept stream is found by
        self.keep = keep  # a compiled candidate's parts, kept for its next opening
        self.diverged = diverged or (lambda: None)  # why its steps cannot be measured (a NaN loss), else None
        self.stream = stream  # an entry's micro-batches (data.DataStream), kept by the worker between openings
        self.accumulation = accumulation
        self.dataloader = dataloader or {}  # the candidate's loader settings and model threads (data.loader_settings)


class Worker:
    def __init__(self, start: dict):
        import torch
        from .memory import warm_lazy_imports
        self.torch = torch
        self.kind = start.get("kind", "entry")
        self.spec = start.get("entry", "")
        self.on_gpu = start.get("backend") == "cuda"
        from .distributed import world_from_environment
        # Under torchrun: this rank of an entry's candidates (a group of one rank when autotune says so)
        self.world = world_from_environment(one_rank=bool(start.get("distributed")))
        if self.world and self.kind != "entry":
            raise UsageError("several ranks run an entry's candidates (--entry); the twin is one process")
        if self.on_gpu:
            if not torch.cuda.is_available():
                raise UsageError("PyTorch sees no usable GPU (torch.cuda.is_available() is False)")
            index = self.world["local_rank"] if self.world else int(start.get("device", 0))
            self.device = torch.device("cuda", index)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
            if int(start.get("threads", 0)) > 0:  # a rank's threads (autotune --predict), not every core's
                torch.set_num_threads(int(start["threads"]))
            # What PyTorch imports lazily, imported before the address-space limit (memory.limit_host_memory)
            for variant in ("per_tensor", "foreach", "fused"):
                warm_lazy_imports(variant)
        self.limit = int(start.get("memory_limit_bytes", 0))
        self.can_reset_peak = reset_peak_host_bytes() if not self.on_gpu else True
        self.references: Dict[str, Any] = {}   # fingerprint of (initial parameters, first global batch) -> parameters after
        self.checked = set()                   # candidate keys whose first step passed
        self.compiled: Dict[str, Any] = {}     # candidate key -> (entry, loop, initial state), compile=on only
        self.opened: Optional[Opened] = None
        self.before_open = 0   # memory held before the last candidate was opened
        # candidate key -> its data.DataStream (iterator and loader workers), kept across the race's slices
        from collections import OrderedDict
        self.streams: "OrderedDict[str, Any]" = OrderedDict()
        self.base_threads = torch.get_num_threads()  # what a candidate's cpu_threads=all gives the model
        if self.world:
            from .distributed import join
            join(self.device)

    def import_entry(self) -> None:
        """The entry's imports, before the memory limit: the limit is for what a candidate allocates, and a library
        imported under it (transformers' losses pull in scipy, whose shared objects need address space) fails in
        ways that read as a broken install, not as out of memory. A failure here is left for the probe to say."""
        if self.kind != "entry":
            return
        from .entry import load_function, parse_spec
        try:
            kind, path, extra = parse_spec(self.spec)
            if kind == "file":
                load_function(path, extra["name"])
            else:  # the model's class and what it imports (its loss: scipy), resolved without building it
                import transformers.loss.loss_utils  # noqa: F401
                from transformers.models.auto.configuration_auto import CONFIG_MAPPING
                from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
                MODEL_FOR_CAUSAL_LM_MAPPING[type(CONFIG_MAPPING[path]())]
        except Exception:  # noqa: BLE001 - the probe reports a bad entry in its own words
            pass

    def limit_memory(self) -> None:
        if not self.on_gpu:
            from .memory import limit_host_memory
            limit_host_memory(self.limit)

    def held_bytes(self) -> int:
        if self.on_gpu:
            return int(self.torch.cuda.memory_allocated(self.device))
        return host_bytes("VmRSS")

    def peak_bytes(self) -> int:
        if self.on_gpu:
            return int(self.torch.cuda.max_memory_allocated(self.device))
        if self.can_reset_peak:
            return host_bytes("VmHWM")
        from .memory import peak_host_bytes
        return peak_host_bytes()

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize(self.device)

    def time_steps(self, calls: int, timer=None) -> float:
        """`calls` steps between two reads of the clock, the device drained before and after (with a `timer`,
        data.PartTimer, at each part too, which adds each part's seconds to it); with a stream, its next epoch
        started before the clock where one would end inside it, and the epochs' starts counted (in the data part)."""
        stream, micro_batches = self.opened.stream, calls * self.opened.accumulation
        if stream is not None:
            stream.prepare(micro_batches)
        self.sync()
        started = time.perf_counter()
        if timer is not None:
            timer.last = started
        for _ in range(calls):
            self.opened.step(timer) if timer is not None else self.opened.step()
        self.sync()
        seconds = time.perf_counter() - started
        if stream is not None:
            stream.stopped()
            epochs = stream.amortized_seconds(micro_batches)
            seconds += epochs
            if timer is not None:
                timer.seconds["data"] += epochs
        return seconds

    def split_steps(self, steps: int) -> dict:
        """Where `steps` steps of the open candidate spend their time (data.PartTimer), per step, and the same
        number of steps timed whole between them (two blocks of each, alternated): what the parts add up to is
        checked against the step as it runs without a clock between its parts, at the same moment."""
        from .data import PartTimer
        timer = PartTimer(self.device)
        blocks = [steps // 2, steps - steps // 2] if steps >= 4 else [steps]
        split = whole = 0.0
        for n in blocks:
            split += self.time_steps(n, timer)
            whole += self.time_steps(n)
        parts = {k: v / steps for k, v in timer.seconds.items()}
        parts["communication"] = 0.0
        if self.world:  # the all-reduce a step waits for happens inside backward: taken out of forward_backward
            from .distributed import profiled_steps
            profiled = profiled_steps(self.opened.step, 1, self.on_gpu)
            waited = min(profiled.get("share", 0.0) * split / steps, parts["forward_backward"])
            parts["communication"], parts["forward_backward"] = waited, parts["forward_backward"] - waited
        return {"parts": parts, "step_seconds": split / steps, "whole_step_seconds": whole / steps, "steps": steps,
                "dataloader": self.opened.dataloader}

    # ---- open --------------------------------------------------------------------------------------------------
    def open(self, request: dict) -> dict:
        self.close_quietly()
        self.before_open = self.held_bytes()
        started = time.perf_counter()
        if self.on_gpu:
            self.torch.cuda.reset_peak_memory_stats(self.device)
        elif self.can_reset_peak:
            reset_peak_host_bytes()
        said: Dict[str, Any] = {"disposition": "passed", "reason": "", "setup_seconds": 0.0, "step_seconds": 0.0,
                                "compile_seconds": 0.0, "checked": False}
        try:
            if self.kind == "twin":
                self.open_twin(request, said)
            else:
                self.open_entry(request, said)
        except UsageError as e:
            said.update(disposition="error", reason=str(e))
        except BaseException as e:  # noqa: B902 - any failure of the user's code is this candidate's result
            if isinstance(e, KeyboardInterrupt):
                raise
            from .data import NoMicroBatch
            from .entry import EntryError
            from .memory import looks_like_oom
            from .entry_graphs import GraphRefused
            if isinstance(e, (EntryError, NoMicroBatch)):
                said.update(disposition="error", reason=str(e))
            elif isinstance(e, GraphRefused):
                said.update(disposition="error", reason=f"cuda_graphs refused: {e}")
            elif looks_like_oom(e):
                said.update(disposition="oom", reason=f"out of memory ({_one_line(e)}){self.within()}")
            else:
                from .data import worker_failure
                said.update(disposition="error", reason=worker_failure(e) or f"{_one_line(e)}{_where(e)}")
        if said["disposition"] != "passed":
            self.close_quietly()
            self.drop_stream(json.dumps(request.get("candidate", {}), sort_keys=True))
        said["setup_seconds"] = time.perf_counter() - started
        return said

    def within(self) -> str:
        return f", held to {self.limit / 2**20:.0f} MiB more than the interpreter and PyTorch" if self.limit and not self.on_gpu else ""

    def open_twin(self, request: dict, said: dict) -> None:
        from .step import TrainingStep, check_first
        torch = self.torch
        key = json.dumps(request["candidate"], sort_keys=True)
        step = TrainingStep(request["resolved"], dtype=torch.float32, attention=request.get("attention"), device=self.device)
        first = step.step(record_first=True)
        said["checked"] = key not in self.checked
        why = check_first(request["reference"], first.micro_batches[0][0], first.first_losses.tolist())
        if why:
            said.update(disposition="incorrect", reason=why)
            return
        self.checked.add(key)
        self.opened = Opened(lambda: step.step())
        # The warm-up steps (with cuda_graphs, through the capturing step), the last one timed alone: it sizes samples
        for _ in range(max(int(request.get("warmup_steps", 1)), 1)):
            said["step_seconds"] = self.time_steps(1)

    def open_entry(self, request: dict, said: dict) -> None:
        from .entry_graphs import refusal as graphs_refusal
        from .entry import Loop, build_entry, check_first_step, cycle, own_variant, with_variant
        torch = self.torch
        cand = request["candidate"]
        key = json.dumps(cand, sort_keys=True)
        switches = dict(cand.get("switches", {}))
        global_batch, micro = int(cand["global_batch"]), int(cand["micro_batch"])
        ranks = self.world["world_size"] if self.world else 1
        accumulation = global_batch // (micro * ranks)
        if self.world:
            from .distributed import refusal as ranks_refusal
            why = ranks_refusal(switches) or (
                f"the global batch {global_batch} is not micro-batches of {micro} on {ranks} ranks"
                if global_batch % (micro * ranks) else
                "cuda_graphs on several ranks is not measured" if switches.get("cuda_graphs") == "on" else None)
            if why:
                said.update(disposition="error", reason=why)
                return
        refused = graphs_refusal(self.on_gpu, switches)
        if refused:
            said.update(disposition="error", reason=f"cuda_graphs refused: {refused}")
            return
        compiled = switches.get("compile") == "on"
        kept = self.compiled.pop(key, None) if compiled else None
        if kept is not None:  # its compiled model again, from the same initial parameters
            entry, loop, initial = kept
            entry.model.load_state_dict(initial)
            loop.steps, loop.pending, loop.schedulers, loop.samples, loop.diverged = 0, None, None, 0, None
        else:
            torch.manual_seed(0)
            entry = build_entry(self.spec, micro, self.device, switches, rank=self.world["rank"] if self.world else 0,
                                world_size=ranks)
            if entry.same_on_every_rank:
                said["warning"] = entry.same_on_every_rank
            initial = {k: v.detach().clone() for k, v in entry.model.state_dict().items()} if compiled else None
            loop = None
        stream, dataloader = self.candidate_stream(key, entry, switches, ranks)
        # Its steps take batches its loader's workers make meanwhile: autotune rates it by its samples' mean step
        said["pipelined"] = stream.workers > 0
        own = own_variant(entry.make_optimizer(entry.model.parameters()), self.on_gpu)
        variant = switches.get("optimizer", own)
        # The first step's micro-batches, for the check (an opening already checked takes none: the stream goes on
        # as if its slices were one run); the loader's workers stand still while the check computes
        first = stream.take(accumulation) if key not in self.checked else None
        stream.freeze()
        timing: Dict[str, float] = {}
        replicated = None
        if self.world:  # DDP over the entry's model, its first step against one process on every rank's samples
            from .distributed import replicate, replicate_checked
            if key in self.checked:
                replicated = replicate(entry, self.device, switches)
            else:
                said["checked"] = True
                replicated, why = replicate_checked(entry, self.device, switches, first, own)
                if why:
                    said.update(disposition="incorrect", reason=why)
                    return
                self.checked.add(key)
        elif key not in self.checked:
            said["checked"] = True
            why = check_first_step(entry, self.device, switches, first, own, timing, references=self.references,
                                   reference_key=self.reference_key(entry, first))
            if why:
                said.update(disposition="incorrect", reason=why)
                return
            self.checked.add(key)
        if loop is None or self.world:
            loop = Loop(entry, self.device, switches, accumulation, replicated=replicated)
        opt = with_variant(entry.make_optimizer(entry.model.parameters()), variant)

        def step(timer=None):
            if timer is None:
                loop.step(opt, stream.take(accumulation))
            else:  # a profiled step: waiting for the next micro-batches is the data part
                batches = stream.take(accumulation)
                timer.mark("data")
                loop.step(opt, batches, timer)
        # A compiled model is kept for its next opening in one process; on ranks it is wrapped (DDP) or sharded
        # in place (FSDP2) for this opening, so each opening builds its own
        keep = (key, (entry, loop, initial)) if compiled and not self.world else None
        self.opened = Opened(step, keep=keep, diverged=lambda: loop.diverged, stream=stream, accumulation=accumulation,
                             dataloader=dataloader, key=key)
        # One warm-up step, timed: it sizes the samples (the check's steps warmed PyTorch up already, and a slice's
        # first step is at most slower than the next: its samples are then smaller, not fewer)
        said["step_seconds"] = self.time_steps(1)
        if loop.diverged:
            said.update(disposition="incorrect", reason=loop.diverged)
            return
        if compiled and kept is None:  # compiled in its first step: the checked one
            said["compile_seconds"] = max(timing.get("first_step_seconds", 0.0) - said["step_seconds"], 0.0)

    def candidate_stream(self, key: str, entry, switches: Dict[str, str], ranks: int):
        """The candidate's micro-batches (data.DataStream), kept from its last opening when there was one (its
        iterator and loader workers are running), else over its batches rebuilt with its data switches; its loader
        settings; the model's intra-op threads set for it (on the CPU)."""
        from .data import DataStream, STREAMS_KEPT, is_map_style_loader, loader_settings, rebuilt_loader, refusal
        from .entry import EntryError
        torch = self.torch
        why = refusal(switches, entry.batches)
        if why:
            raise EntryError(why)
        settings = loader_settings(switches, entry.batches, self.base_threads, ranks)
        if not self.on_gpu:
            torch.set_num_threads(settings["cpu_threads"])
        stream = self.streams.pop(key, None)
        if stream is None:
            batches = entry.batches
            # Rebuilt where it has workers too: they then die with this process (data._InWorker), however it ends
            if is_map_style_loader(batches) and (any(k in switches for k in ("num_workers", "pin_memory"))
                                                 or batches.num_workers > 0):
                batches = rebuilt_loader(batches, settings)
            elif "pin_memory" in switches and isinstance(batches, torch.utils.data.DataLoader):
                batches.pin_memory = settings["pin_memory"]
            stream = DataStream(batches, settings["num_workers"], settings["prefetch_factor"] or 0)
            stream.prepare(0)  # its first epoch (the workers started) and a second, each start timed
        self.streams[key] = stream
        while len(self.streams) > STREAMS_KEPT:
            _, oldest = self.streams.popitem(last=False)
            oldest.close()
        return stream, settings

    def drop_stream(self, key: str) -> None:
        """A failed candidate's stream ends with it (its loader workers too)."""
        stream = self.streams.pop(key, None)
        if stream is not None:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - workers that already died
                pass

    def close_streams(self) -> None:
        for key in list(self.streams):
            self.drop_stream(key)

    def reference_key(self, entry, first) -> str:
        """The initial parameters (by per-tensor sums on the device: one small transfer) and the first global
        batch's samples (whole)."""
        from .entry import concat
        torch = self.torch
        with torch.no_grad():
            sums = [torch.stack([v.double().sum(), (v.double() ** 2).sum()]) for v in entry.model.state_dict().values()
                    if v.is_floating_point() and v.numel()]
            stats = torch.stack(sums) if sums else torch.zeros(0)
        return fingerprint([stats, concat(first)])   # the global batch, whatever its split

    # ---- close -------------------------------------------------------------------------------------------------
    def close_quietly(self) -> None:
        opened, self.opened = self.opened, None
        if opened is not None and opened.keep is not None:
            key, parts = opened.keep
            self.compiled[key] = parts
            while len(self.compiled) > COMPILED_KEPT:
                self.compiled.pop(next(iter(self.compiled)))
        del opened
        gc.collect()
        if self.on_gpu:
            self.torch.cuda.empty_cache()

    def close(self, failed: bool = False) -> dict:
        self.close_quietly()
        if self.on_gpu:
            try:
                self.torch.cuda.synchronize(self.device)
            except Exception:  # noqa: BLE001 - a sticky CUDA error: only a new process clears it
                return {"restart": True, "held_bytes": 0, "why": "the device is in an error state"}
        held = self.held_bytes() - self.before_open
        restart = failed and held > max(HELD_SLACK_BYTES, self.before_open // 20)
        return {"restart": bool(restart), "held_bytes": held}


def entry_request(worker: Worker, op: str, request: dict) -> dict:
    """probe and largest_batch: a bad entry is one line ("usage": autotune exits 2 with it)."""
    from .entry import EntryError, largest_batch, probe_entry
    if worker.kind != "entry":
        return {"error": f"{op} is for an entry's worker"}
    asked = dict(request, entry=worker.spec, backend="cuda" if worker.on_gpu else "cpu", device=worker.device.index or 0,
                 ranks=worker.world["world_size"] if worker.world else 1)
    try:
        if op == "probe":
            probed = probe_entry(asked)
            if worker.world and "switches" in probed:  # DDP's own, offered where there are ranks to replicate over
                from .distributed import REPLICATED_SWITCHES
                probed["switches"].update({k: list(v) for k, v in REPLICATED_SWITCHES.items()})
                probed.setdefault("applies_when", {})["no_sync"] = "accumulation"
            return probed
        # The host memory limit is the worker's already; on a GPU the search holds itself to the limit it is given
        asked["memory_limit_bytes"] = int(request.get("memory_limit_bytes", 0)) if worker.on_gpu else 0
        try:
            return largest_batch(asked, warm=False)
        finally:
            if worker.on_gpu:
                worker.torch.cuda.set_per_process_memory_fraction(1.0, worker.device)
    except (EntryError, UsageError) as e:
        return {"error": str(e), "usage": True}
    except BaseException as e:  # noqa: B902 - whatever else the entry does wrong: one line, as a bad entry
        if isinstance(e, KeyboardInterrupt):
            raise
        if op != "probe":
            return {"error": f"{_one_line(e)}{_where(e)}"}
        return {"error": f"--entry {worker.spec}: {_one_line(e)}", "usage": True}
    finally:
        gc.collect()


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: Any) -> str:
    """A request's value as an answer names it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def serve(worker: Worker, requests: TextIO, answers: TextIO) -> int:
    def handle(request: dict) -> dict:
        op = request.get("op")
        if op == "open":
            return worker.open(request)
        if op == "close":
            return worker.close(bool(request.get("failed", False)))
        if op in ("probe", "largest_batch"):
            return entry_request(worker, op, request)
        if op not in ("time", "counters", "profile", "split"):
            return {"error": f"unknown op {op!r}"}
        if worker.opened is None:
            return {"error": "no candidate is open"}
        if op == "counters":
            return {"peak_bytes": worker.peak_bytes()}
        if op in ("profile", "split"):
            steps = request.get("steps", 2 if op == "profile" else 3)
            if not _is_count(steps):
                return {"error": f"'steps' must be a count, not {_shown(steps)}"}
            if op == "profile":  # the communication a step waits for (distributed.profiled_steps)
                from .distributed import profiled_steps
                return profiled_steps(worker.opened.step, max(steps, 1), worker.on_gpu)
            return worker.split_steps(max(steps, 1))  # where a step's time goes
        calls = request.get("calls")
        if not _is_count(calls):
            return {"error": f"'calls' must be a count, not {_shown(calls)}"}
        try:
            seconds = worker.time_steps(calls)
            diverged = worker.opened.diverged()
            if diverged:  # a NaN loss is an incorrect model, never a time
                worker.close_quietly()
                return {"error": diverged, "class": "incorrect"}
            return {"seconds": seconds}
        except BaseException as e:  # noqa: B902
            if isinstance(e, KeyboardInterrupt):
                raise
            from .data import worker_failure
            from .memory import looks_like_oom
            oom = looks_like_oom(e)
            key = worker.opened.key
            worker.close_quietly()
            worker.drop_stream(key)
            return {"error": f"out of memory ({_one_line(e)}){worker.within()}" if oom else
                    worker_failure(e) or f"{_one_line(e)}{_where(e)}", "class": "oom" if oom else "error"}

    describe = lambda e: f"{_one_line(e)}{_where(e)}"  # noqa: E731
    try:
        if not worker.world:
            return converse(requests, answers, handle, describe)
        if worker.world["rank"] != 0:
            return follow(handle, describe)
        try:
            return converse(requests, answers, lambda request: lead(handle, describe, request), describe)
        finally:
            hand_out(None)  # the conversation ended: so do the other ranks
            leave()
    finally:
        worker.close_streams()  # the candidates' loader workers end with the tune


# ---- several ranks (torchrun) ------------------------------------------------------------------------------------
# Under torchrun, rank 0 speaks with autotune: it hands each request to the other ranks, every rank carries it out
# (the candidate's collectives, DDP's included, in the same order everywhere), and the ranks' answers come back to
# rank 0 as one (combined).
def hand_out(request: Optional[dict]) -> Optional[dict]:
    import torch.distributed as dist
    box = [request]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def lead(handle, describe, request: dict) -> dict:
    import torch.distributed as dist
    hand_out(request)
    mine = answered(handle, describe, request)
    everyone: List[Any] = [None] * dist.get_world_size()
    dist.gather_object(mine, everyone, dst=0)
    return combined(request.get("op", ""), everyone)


def follow(handle, describe) -> int:
    import torch.distributed as dist
    while True:
        request = hand_out(None)
        if request is None:
            leave()
            return 0
        dist.gather_object(answered(handle, describe, request), None, dst=0)


def leave() -> None:
    """Every rank at once: a rank that left while another still read the last message closed its connection under it
    (gloo's "connection closed by peer", the group's exit 1, one run in four)."""
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()


def answered(handle, describe, request: dict) -> dict:
    try:
        return handle(request)
    except Exception as e:  # noqa: BLE001 - as converse answers it, so that every rank answers
        return {"error": describe(e)}


def combined(op: str, answers: List[dict]) -> dict:
    """The ranks' answers to one request as one: the first rank's that failed (an error, or a candidate that did
    not pass), else rank 0's with the slowest rank's seconds (the step waits for it) and the largest peak memory; a
    close restarts when any rank must."""
    if op == "close":
        return dict(answers[0], restart=any(a.get("restart") for a in answers),
                    held_bytes=max(a.get("held_bytes", 0) for a in answers))
    failed = next((a for a in answers if "error" in a or a.get("disposition", "passed") != "passed"), None)
    if failed is not None:
        rank = answers.index(failed)
        out = dict(failed)
        for field in ("error", "reason"):
            if out.get(field):
                out[field] = f"rank {rank}: {out[field]}"
        return out
    out = dict(answers[0])
    for field in ("seconds", "step_seconds", "setup_seconds", "compile_seconds", "peak_bytes"):
        if field in out:
            out[field] = max(a[field] for a in answers)
    if op == "time":
        out["rank_seconds"] = [a["seconds"] for a in answers]
    if op == "split":  # the slowest rank's step speaks for the step
        out = dict(max(answers, key=lambda a: a.get("step_seconds", 0.0)))
    if op == "profile":  # the rank that waited most speaks for the step; every rank's share beside it
        out = dict(max(answers, key=lambda a: a.get("share", 0.0)))
        out["rank_shares"] = [a.get("share", 0.0) for a in answers]
    return out


# The start request's counts: device index, CPU threads (0: PyTorch's default), host memory limit (0: none).
START_COUNTS = ("device", "threads", "memory_limit_bytes")


def read_start(text: str) -> dict:
    """The start request (`torch-step --serve START`) as the worker reads it, checked before torch is imported:
    {"kind": "entry" | "twin", "entry": SPEC (an entry's, valid), "backend": "cpu" | "cuda", "device", "threads",
    "memory_limit_bytes": counts, "distributed": bool}, absent fields at their defaults, others left out. UsageError
    with one line naming what is wrong."""
    from .entry import EntryError, parse_spec
    try:
        start = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError; an integer of too many digits; too deep a nesting
        raise UsageError(f"the start request is not JSON: {' '.join(str(e).split())}") from None
    if not isinstance(start, dict):
        raise UsageError(f"the start request is a JSON {type(start).__name__}, not an object")
    read = {"kind": start.get("kind", "entry"), "entry": start.get("entry", ""), "backend": start.get("backend", "cpu"),
            "distributed": start.get("distributed", False)}
    if read["kind"] not in ("entry", "twin"):
        raise UsageError(f"the start request's 'kind' is {_shown(read['kind'])}; expected 'entry' or 'twin'")
    if read["backend"] not in ("cpu", "cuda"):
        raise UsageError(f"the start request's 'backend' is {_shown(read['backend'])}; expected 'cpu' or 'cuda'")
    if not isinstance(read["distributed"], bool):
        raise UsageError(f"the start request's 'distributed' is {_shown(read['distributed'])}; expected true or false")
    for name in START_COUNTS:
        value = start.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UsageError(f"the start request's '{name}' is {_shown(value)}; expected a count (0, 1, 2, ...)")
        read[name] = value
    if read["kind"] == "entry":
        if not isinstance(read["entry"], str):
            raise UsageError(f"the start request's 'entry' is {_shown(read['entry'])}; expected FILE.py:NAME or hf:MODEL")
        try:
            parse_spec(read["entry"])
        except EntryError as e:
            raise UsageError(str(e)) from None
    return read


def serve_main(start_text: str) -> int:
    """`torch-step --serve START`: START names what the worker runs ({"kind": "entry", "entry": SPEC} or {"kind":
    "twin"}), on which device ("backend", "device"), within what host memory ("memory_limit_bytes") and, on the CPU,
    with how many threads ("threads"; 0 or absent: PyTorch's default) (read_start)."""
    started = time.perf_counter()
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        start = read_start(start_text)
    except UsageError as e:
        print(f"torch-step --serve: {e}", file=sys.stderr)
        return 2
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())   # what the user's code prints stays out of the conversation
    try:
        import torch
        worker = Worker(start)
        if worker.kind == "entry":
            worker.import_entry()
        worker.limit_memory()
    except UsageError as e:
        print(f"torch-step --serve: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"torch-step --serve: PyTorch is not importable ({e})", file=sys.stderr)
        return 2
    if not worker.world or worker.world["rank"] == 0:  # the other ranks of a torchrun group stay silent
        hello = {"protocol": PROTOCOL, "torch": torch.__version__, "python": sys.version.split()[0], "cuda": worker.on_gpu,
                 "start_seconds": time.perf_counter() - started}
        if worker.world:
            hello["ranks"] = worker.world["world_size"]
        answers.write(json.dumps(hello) + "\n")
        answers.flush()
    return serve(worker, sys.stdin, answers)


def probe() -> dict:
    """`torch-step --probe`: the interpreter's versions, whether CUDA is usable, and the start-up a worker pays
    before its first step: importing torch and the twin, and the optimizer's first construction (which imports
    torch._dynamo: 1.6 s of 3 on the 2-core CI machine)."""
    started = time.perf_counter()
    import torch
    from .step import TrainingStep  # noqa: F401 - imported for its cost
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    import_seconds = time.perf_counter() - started
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "python": sys.version.split()[0], "cuda": cuda,
            "cuda_devices": torch.cuda.device_count() if cuda else 0, "import_seconds": import_seconds}


USAGE = ("usage: torch-step --serve START_JSON | --probe | --allreduce-probe REQUEST_JSON\n"
         "  the PyTorch side of autotune --executor torch: the tune's worker (--serve; the twin of trainbench's step\n"
         "  or the user's own model), what the interpreter has (--probe) and, on each rank under torchrun, the\n"
         "  gradients' all-reduce of autotune --entry --ranks N --predict (--allreduce-probe, allreduce_probe.py)")


def main(argv: Optional[List[str]] = None) -> int:
    """scripts/torch-step's command line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--serve":
        return serve_main(args[1])
    if len(args) == 2 and args[0] == "--allreduce-probe":
        from .allreduce_probe import main as allreduce_probe_main
        return allreduce_probe_main(args[1])
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if args == ["--probe"]:
        print(json.dumps(probe()))
        return 0
    print(USAGE, file=sys.stderr)
    return 2
