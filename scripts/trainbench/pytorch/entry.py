"""The user's own PyTorch model as an autotune trial: `autotune --executor torch --entry FILE.py:NAME`.

The contract (README, "Tuning your own PyTorch model: --entry"): NAME is a function
`NAME(micro_batch, device, **switches)` (it gets only the switches its signature names, and `rank` and
`world_size` if it names both: it then yields that rank's share of the data) that returns a dict
    model      an nn.Module, on `device`
    optimizer  a torch.optim.Optimizer over the model's parameters, or a function params -> one
    batches    the micro-batches: an iterable or a DataLoader of `micro_batch` samples each (tensors, tuples,
               lists or dicts of tensors), re-iterated when it runs out
    loss       a function (model, micro_batch) -> a scalar tensor, the micro-batch's mean
    max_grad_norm  (optional) clipping, default 1.0 as TrainingArguments; 0 turns it off
or a LightningModule (driven through training_step, configure_optimizers and train_dataloader). Two
ready-made entries: `hf:MODEL?key=value&...` (a transformers causal LM from its configuration class, random
weights, synthetic tokens; never downloads) and any FILE.py:NAME returning a LightningModule.

trainbench owns the loop: accumulation to the global batch (each micro-batch's loss divided by the
accumulation), clip_grad_norm_, the optimizer step, zero_grad(set_to_none=True), and the switches (SWITCHES).
Every trial first checks its candidate's first optimizer step against a reference step of the same global
batch in one micro-batch (fp32, the optimizer as given) from the same initial parameters: the relative
difference of the parameter updates must be within the switch's tolerance. When it is not, the same split in
fp32 tells a loss that depends on the micro-batch split (batch norm, a per-micro-batch mean) from a switch
that changes the numbers; both are `incorrect` trials that say which, with the difference.

The whole tune runs in one long-lived worker (worker.py): its `probe` validates the entry (probe_entry:
one line naming the file, the function and what was expected, and autotune exits 2) and says what autotune needs
of it; `largest_batch` is Lightning's BatchSizeFinder on the entry (`autotune --versus largest-batch`: the
largest power-of-two micro-batch that fits); then it builds each candidate from the entry function, checks it
and steps it as autotune asks.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .entry_graphs import GraphedMicroBatch, GraphRefused, refusal as graphs_refusal, zero_grads
from ..errors import UsageError

# The relative difference of the first step's parameter updates from the reference's, ||d - d_ref|| /
# ||d_ref||, allowed per switch: fp32 (summation order only; Adam-like updates turn a gradient's sign into a
# full step, so a few near-zero gradients flipped by rounding show up here), bf16 autocast (8 mantissa bits).
TOLERANCE_FP32 = 2e-2
TOLERANCE_BF16 = 2.5e-1
HF_SEQ_LEN = 64            # synthetic tokens per sample of an hf: entry, unless ?seq_len= says
HF_SAMPLES = 256           # rows of its synthetic dataset (cycled)
HF_SEED = 1234
HF_LR = 3e-4               # AdamW's learning rate for an hf: entry, unless ?lr= says
DEFAULT_MAX_GRAD_NORM = 1.0
SYNC_EVERY_N = 16
LARGEST_BATCH_STEPS = 3     # training steps at each size of the largest-batch search (BatchSizeFinder's steps_per_trial)
ENTRY_KEYS = ("model", "optimizer", "batches", "loss")
RETURNS = ("dict(model=nn.Module, optimizer=Optimizer or params -> Optimizer, batches=iterable of micro-batches, "
           "loss=(model, micro_batch) -> scalar tensor), or a LightningModule")
EXPECTED = "a function NAME(micro_batch, device) returning " + RETURNS


class EntryError(Exception):
    """A bad entry: autotune exits 2 with this one line, before any trial."""


# ---- loading -----------------------------------------------------------------------------------------------
def parse_spec(spec: str) -> Tuple[str, str, Dict[str, str]]:
    """'FILE.py:NAME' -> ('file', path, {}), 'hf:MODEL?k=v&k=v' -> ('hf', MODEL, {k: v})."""
    if not spec.isprintable():  # a newline or a NUL: no file is named so, and the message would not be one line
        raise EntryError(f"--entry {spec!r}: a control character in it; expected FILE.py:NAME or hf:MODEL")
    if spec.startswith("hf:"):
        name, _, query = spec[3:].partition("?")
        overrides = {}
        for pair in filter(None, query.split("&")):
            key, eq, value = pair.partition("=")
            if not eq or not key:
                raise EntryError(f"--entry {spec}: '{pair}' is not key=value (e.g. hf:gpt2?n_layer=4&n_embd=256)")
            overrides[key] = value
        if not name:
            raise EntryError(f"--entry {spec}: no model name after hf: (e.g. hf:gpt2)")
        return "hf", name, overrides
    path, colon, name = spec.rpartition(":")
    if not colon or not path or not name:
        raise EntryError(f"--entry {spec}: expected FILE.py:NAME ({EXPECTED}) or hf:MODEL")
    return "file", path, {"name": name}


def _typed(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


_MODULES: Dict[str, Any] = {}   # path -> the entry's module: imported once per process (a tune's worker)


def load_function(path: str, name: str) -> Callable:
    where = f"--entry {path}:{name}"
    if not os.path.isfile(path):
        raise EntryError(f"{where}: no such file")
    try:
        module = _MODULES.get(path)
        if module is None:
            # The entry's folder first on the path, as `python entry.py` would put it: the user's module imports
            # its siblings as it does when run on its own
            sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
            spec = importlib.util.spec_from_file_location(f"trainbench_entry_{abs(hash(path))}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _MODULES[path] = module
    except BaseException as e:  # noqa: B902 - any failure to import is the user's to fix
        if isinstance(e, KeyboardInterrupt):
            raise
        raise EntryError(f"{where}: cannot import {path}: {type(e).__name__}: {one_line(e)}") from None
    if not hasattr(module, name):
        raise EntryError(f"{where}: {path} has no '{name}'; expected {EXPECTED}")
    fn = getattr(module, name)
    if not callable(fn):
        raise EntryError(f"{where}: '{name}' is not callable (a {type(fn).__name__}); expected {EXPECTED}")
    return fn


def one_line(e: BaseException) -> str:
    """The exception's message on one line: all of it (transformers' validation errors say what is wrong on their
    second line), its lines joined, at most 500 characters."""
    text = " ".join(line.strip() for line in str(e).strip().splitlines() if line.strip())
    return (text[:497] + "...") if len(text) > 500 else (text or "(no message)")


def nonfinite_loss(loss: float, step: int, what: str = "") -> Optional[str]:
    """Why a step whose loss is NaN or infinite cannot be measured, or None: a model that diverges (or data with
    NaN in it) is incorrect whatever the switches, not a question of how the batch is split."""
    if math.isfinite(loss):
        return None
    return f"the loss is {'NaN' if math.isnan(loss) else 'inf' if loss > 0 else '-inf'} at step {step}{what}"


class Entry:
    """A built entry: what the loop needs, whichever kind of entry it came from. `make_schedulers(optimizer)`
    gives the learning-rate schedulers to step with that optimizer (a LightningModule's), as Scheduled."""

    def __init__(self, model, make_optimizer: Callable, batches, loss: Callable, max_grad_norm: float, label: str,
                 make_schedulers: Optional[Callable] = None):
        self.model, self.make_optimizer, self.batches, self.loss = model, make_optimizer, batches, loss
        self.max_grad_norm, self.label = max_grad_norm, label
        self.make_schedulers = make_schedulers or (lambda optimizer: [])
        self.micro_batch = 0  # set by build_entry: the samples of one of `batches`
        # With several ranks: why every rank would see the same micro-batches (the warning with its fix), else ""
        self.same_on_every_rank = ""


class Scheduled:
    """A learning-rate scheduler and when Lightning steps it: every `frequency` optimizer steps (interval
    "step") or epochs (interval "epoch", Lightning's default)."""

    def __init__(self, scheduler, interval: str = "epoch", frequency: int = 1):
        self.scheduler, self.interval, self.frequency = scheduler, interval, max(int(frequency), 1)


def _optimizer_maker(optimizer, model, where: str) -> Callable:
    """A function (params) -> Optimizer from what the entry returned (an optimizer or a function of the
    parameters); the result is rebuilt per variant by with_variant. An optimizer is remade over its groups'
    parameters as the model holds them now, by name: FSDP2 replaces a sharded model's parameters with its shards."""
    import torch
    if isinstance(optimizer, torch.optim.Optimizer):
        groups = [{k: v for k, v in g.items()} for g in optimizer.param_groups]
        cls, defaults = type(optimizer), dict(optimizer.defaults)
        names = {id(p): n for n, p in model.named_parameters()}

        def remake(_params):
            now = dict(model.named_parameters())
            return cls([dict(g, params=[now.get(names.get(id(p)), p) for p in g["params"]]) for g in groups],
                       **_accepted(cls, defaults))
        return remake
    if callable(optimizer):
        def make(params):
            made = optimizer(params)
            if not isinstance(made, torch.optim.Optimizer):
                raise EntryError(f"{where}: optimizer(params) returned a {type(made).__name__}, not a torch.optim.Optimizer")
            return made
        return make
    raise EntryError(f"{where}: 'optimizer' is a {type(optimizer).__name__}; expected a torch.optim.Optimizer or a "
                     "function of the parameters that makes one")


def with_variant(opt, variant: str):
    """The same optimizer (class, groups, hyper-parameters) per-tensor, foreach or fused, state empty."""
    flags = {"per_tensor": {"foreach": False, "fused": False}, "foreach": {"foreach": True, "fused": False},
             "fused": {"foreach": False, "fused": True}}[variant]
    defaults = dict(opt.defaults)
    groups = []
    for g in opt.param_groups:
        g = dict(g)
        for k, v in flags.items():
            if k in defaults:
                g[k] = v
        groups.append(g)
    for k, v in flags.items():
        if k in defaults:
            defaults[k] = v
    return type(opt)(groups, **_accepted(type(opt), defaults))


def _accepted(cls, kwargs: dict) -> dict:
    """The keyword arguments cls's constructor takes (an optimizer's defaults may hold more, e.g. AdamW's
    decoupled_weight_decay, which its groups carry anyway)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def own_variant(opt, on_gpu: bool) -> str:
    d = opt.defaults
    if d.get("fused"):
        return "fused"
    if d.get("foreach") is True:
        return "foreach"
    if d.get("foreach") is False:
        return "per_tensor"
    return "foreach" if on_gpu else "per_tensor"  # PyTorch's own choice for foreach=None


def _lightning_configuration(conf, where: str):
    """configure_optimizers()'s answer in any form Lightning accepts (an optimizer; a list of them; ([optimizers],
    [schedulers]); a dict with "optimizer" and "lr_scheduler"; a list of such dicts) as the first optimizer and
    the Scheduled that step it (a scheduler, or a dict with "scheduler", "interval", "frequency")."""
    import torch
    optimizers, schedulers = [], []
    if isinstance(conf, dict):
        conf = [conf]
    if (isinstance(conf, (list, tuple)) and len(conf) == 2 and isinstance(conf[0], (list, tuple))
            and isinstance(conf[1], (list, tuple))):
        optimizers, schedulers = list(conf[0]), list(conf[1])
    elif isinstance(conf, (list, tuple)):
        for item in conf:
            if isinstance(item, dict):
                optimizers.append(item.get("optimizer"))
                if item.get("lr_scheduler") is not None:
                    schedulers.append(item["lr_scheduler"])
            else:
                optimizers.append(item)
    else:
        optimizers = [conf]
    if not optimizers:
        raise EntryError(f"{where}: configure_optimizers() returned no optimizer")
    first = optimizers[0]
    scheduled = []
    for sched in schedulers:
        config = sched if isinstance(sched, dict) else {"scheduler": sched}
        made = config.get("scheduler")
        if isinstance(made, torch.optim.lr_scheduler.ReduceLROnPlateau):
            continue  # it steps on a monitored metric, which trainbench's loop does not compute
        if not isinstance(made, torch.optim.lr_scheduler.LRScheduler):
            raise EntryError(f"{where}: an lr_scheduler is a {type(made).__name__}; expected a "
                             "torch.optim.lr_scheduler scheduler or a dict with 'scheduler'")
        if made.optimizer is not first:
            continue  # it schedules another optimizer than the first, the one trainbench runs
        interval = config.get("interval", "epoch")
        if interval not in ("step", "epoch"):
            raise EntryError(f"{where}: an lr_scheduler's interval is '{interval}'; Lightning takes 'step' or 'epoch'")
        scheduled.append(Scheduled(made, interval, config.get("frequency", 1)))
    return first, scheduled


def _bind(scheduler, optimizer) -> None:
    """Points a scheduler (and those a SequentialLR or ChainedScheduler holds) at `optimizer`: the same
    optimizer rebuilt per-tensor, foreach or fused, whose groups carry the learning rates it set."""
    scheduler.optimizer = optimizer
    for inner in getattr(scheduler, "_schedulers", []):
        _bind(inner, optimizer)


def _from_lightning(module, where: str) -> Optional[Entry]:
    # Lightning takes seconds to import: only when the entry's module did
    kinds = [sys.modules[m].LightningModule for m in ("lightning.pytorch", "pytorch_lightning") if m in sys.modules]
    if not any(isinstance(module, k) for k in kinds):
        return None
    where = where + " (configure_optimizers)"
    first, _ = _lightning_configuration(module.configure_optimizers(), where)
    make = _optimizer_maker(first, module, where)

    def make_schedulers(optimizer):
        # a fresh configuration each time: each run's schedulers start from their first step
        _, scheduled = _lightning_configuration(module.configure_optimizers(), where)
        for s in scheduled:
            _bind(s.scheduler, optimizer)
        return scheduled

    def loss(model, batch):
        out = model.training_step(batch, 0)
        return out["loss"] if isinstance(out, dict) else out
    clip = getattr(module, "max_grad_norm", DEFAULT_MAX_GRAD_NORM)
    return Entry(module, make, module.train_dataloader(), loss, float(clip), "LightningModule " + type(module).__name__,
                 make_schedulers)


def build_file_entry(path: str, name: str, micro_batch: int, device, switches: Dict[str, str], rank: int = 0,
                     world_size: int = 1) -> Entry:
    import torch
    where = f"--entry {path}:{name}"
    fn = load_function(path, name)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = {k: v for k, v in switches.items() if k in params}
    takes_rank = "rank" in params and "world_size" in params
    if takes_rank:
        kwargs.update(rank=rank, world_size=world_size)
    try:
        got = fn(micro_batch, device, **kwargs)
    except EntryError:
        raise
    except BaseException as e:  # noqa: B902
        if isinstance(e, KeyboardInterrupt):
            raise
        if _looks_like_oom(e):
            raise
        raise EntryError(f"{where}: {name}({micro_batch}, {device}) raised {type(e).__name__}: {one_line(e)}") from None
    lightning = _from_lightning(got, where)
    if lightning is not None:
        lightning.model.to(device)
        return share_over_ranks(lightning, rank, world_size, where, takes_rank)
    if isinstance(got, (tuple, list)) and len(got) in (4, 5):
        got = dict(zip(ENTRY_KEYS + ("max_grad_norm",), got))
    if not isinstance(got, dict):
        raise EntryError(f"{where}: {name}() returned a {type(got).__name__}; expected {RETURNS}")
    missing = [k for k in ENTRY_KEYS if k not in got]
    if missing:
        raise EntryError(f"{where}: the dict {name}() returned has no {', '.join(missing)}; expected {RETURNS}")
    model = got["model"]
    if not isinstance(model, torch.nn.Module):
        raise EntryError(f"{where}: 'model' is a {type(model).__name__}, not an nn.Module")
    if not callable(got["loss"]):
        raise EntryError(f"{where}: 'loss' is a {type(got['loss']).__name__}; expected a function (model, micro_batch) -> "
                         "scalar tensor")
    batches = got["batches"]
    if not hasattr(batches, "__iter__") or isinstance(batches, (torch.Tensor, str)):
        raise EntryError(f"{where}: 'batches' is a {type(batches).__name__}; expected an iterable or a DataLoader of "
                         "micro-batches")
    entry = Entry(model, _optimizer_maker(got["optimizer"], model, where), batches, got["loss"],
                  _max_grad_norm(got.get("max_grad_norm", DEFAULT_MAX_GRAD_NORM), where), f"{os.path.basename(path)}:{name}")
    return share_over_ranks(entry, rank, world_size, where, takes_rank)


def _max_grad_norm(value, where: str) -> float:
    """The entry's clipping as a number >= 0 (None, 0 or False: off); EntryError for anything else."""
    try:
        clip = float(value or 0.0)
    except (TypeError, ValueError, OverflowError, RuntimeError):  # not a number; RuntimeError: a tensor of several elements
        clip = math.nan
    if not math.isfinite(clip) or clip < 0:
        shown = repr(value) if isinstance(value, (int, float, str)) else f"a {type(value).__name__}"
        raise EntryError(f"{where}: 'max_grad_norm' is {shown[:80]}; expected a number >= 0 (0 turns clipping off)")
    return clip


def share_over_ranks(entry: Entry, rank: int, world_size: int, where: str, takes_rank: bool) -> Entry:
    """Rank `rank` of `world_size` trains on its share of the global batch, as DistributedDataParallel expects: a
    function that names `rank` and `world_size` was given them and yields its share itself; a DataLoader gets a
    DistributedSampler (torch's: rank r takes every world_size-th sample, shuffled by the sampler's seed if the
    loader shuffled); any other iterable is the same on every rank, so its ranks would train on the same samples:
    the entry says so (same_on_every_rank), with the fix."""
    if world_size <= 1 or takes_rank:
        return entry
    shared = distributed_loader(entry.batches, rank, world_size)
    if shared is not None:
        entry.batches = shared
        return entry
    kind = type(entry.batches).__name__
    entry.same_on_every_rank = (
        f"{where}: its batches (a {kind}) are the same on every rank, so its {world_size} ranks would train on the same "
        "samples; name rank and world_size in the function's parameters and yield that rank's share, or return a "
        "DataLoader over a map-style dataset (it gets a DistributedSampler)")
    return entry


def distributed_loader(loader, rank: int, world_size: int):
    """The same DataLoader over rank `rank`'s share of its dataset (a DistributedSampler, shuffled where the loader
    shuffled, seed 0), or None where that cannot be done: not a DataLoader, an iterable-style dataset, or a
    batch sampler of its own. A loader that already has a DistributedSampler is kept as it is."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler
    if not isinstance(loader, DataLoader):
        return None
    if isinstance(loader.sampler, DistributedSampler):
        return loader
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
        return None
    sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank,
                                 shuffle=isinstance(loader.sampler, RandomSampler), seed=0, drop_last=loader.drop_last)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers,
                      collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
                      timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                      generator=torch.Generator().manual_seed(0))


def hf_settings(name: str, overrides: Dict[str, str]) -> Tuple[int, float, Dict[str, Any]]:
    """An hf: entry's query (parse_spec's overrides) as (seq_len, lr, the configuration's fields typed): seq_len a
    positive count of tokens, lr a positive finite number; EntryError naming the one that is not."""
    where = f"--entry hf:{name}"
    opts = {k: _typed(v) for k, v in overrides.items()}
    seq_len = opts.pop("seq_len", HF_SEQ_LEN)
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise EntryError(f"{where}: seq_len={overrides['seq_len']} is not a positive count of tokens (e.g. seq_len=128)")
    lr = opts.pop("lr", HF_LR)
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise EntryError(f"{where}: lr={overrides['lr']} is not a positive learning rate (e.g. lr=3e-4)")
    return seq_len, float(lr), opts


def build_hf_entry(name: str, overrides: Dict[str, str], micro_batch: int, device, rank: int = 0,
                   world_size: int = 1) -> Entry:
    """A transformers causal LM from its configuration class (random weights, nothing downloaded), trained on
    synthetic tokens; dropout off unless an override sets it (a random mask cannot be checked)."""
    import torch
    where = f"--entry hf:{name}"
    try:
        import transformers
        from transformers import AutoModelForCausalLM
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError as e:
        raise EntryError(f"{where}: transformers is not installed in {sys.executable} ({one_line(e)}); "
                         "scripts/install-deps --torch installs it") from None
    if name not in CONFIG_MAPPING:
        raise EntryError(f"{where}: '{name}' is not a model type of transformers {transformers.__version__} "
                         "(hf:MODEL takes a configuration's model_type, e.g. gpt2, llama, bert)")
    seq_len, lr, opts = hf_settings(name, overrides)
    config = CONFIG_MAPPING[name]()
    for key, value in opts.items():
        if not hasattr(config, key):
            raise EntryError(f"{where}: {type(config).__name__} has no '{key}'")
        try:
            setattr(config, key, value)
        except Exception as e:  # noqa: BLE001 - transformers validates its fields: its words, whole
            raise EntryError(f"{where}: {key}={overrides[key]} is refused by {type(config).__name__}: "
                             f"{type(e).__name__}: {one_line(e)}") from None
    for key in list(vars(config)):
        if (key.endswith("pdrop") or key.endswith("dropout") or key.endswith("dropout_prob")) and key not in opts \
                and isinstance(getattr(config, key), float):
            setattr(config, key, 0.0)
    try:
        with device:  # initialised where it trains: on a GPU, not each parameter drawn on the CPU and then copied
            model = AutoModelForCausalLM.from_config(config)
        model.to(device)
    except ValueError as e:
        raise EntryError(f"{where}: no causal language model for {type(config).__name__} ({one_line(e)})") from None
    vocab = int(config.vocab_size)
    g = torch.Generator().manual_seed(HF_SEED)
    n_rows = max(HF_SAMPLES, micro_batch * world_size)
    data = torch.randint(0, vocab, (n_rows, seq_len), generator=g)

    class Tokens:
        """The synthetic rows in micro-batches; with several ranks, the ranks' micro-batches of one step side by
        side are the rows one process would take as a micro-batch world_size times as large."""
        def __iter__(self):
            step_rows = micro_batch * world_size
            for start in range(0, n_rows - step_rows + 1, step_rows):
                rows = data[start + rank * micro_batch:start + (rank + 1) * micro_batch]
                yield {"input_ids": rows, "labels": rows}

    def loss(model, batch):
        return model(**batch).loss

    return Entry(model, lambda params: torch.optim.AdamW(params, lr=lr), Tokens(), loss, DEFAULT_MAX_GRAD_NORM,
                 f"hf:{name}")


def build_entry(spec: str, micro_batch: int, device, switches: Optional[Dict[str, str]] = None, rank: int = 0,
                world_size: int = 1) -> Entry:
    """The entry built for `micro_batch` samples a micro-batch on `device`; with world_size > 1, as rank `rank`
    builds it: its micro-batches are its share of each step's (share_over_ranks)."""
    kind, target, extra = parse_spec(spec)
    if kind == "hf":
        entry = build_hf_entry(target, extra, micro_batch, device, rank, world_size)
    else:
        entry = build_file_entry(target, extra["name"], micro_batch, device, switches or {}, rank, world_size)
    entry.micro_batch = micro_batch
    return entry


# ---- the loop ------------------------------------------------------------------------------------------------
def to_device(batch, device, non_blocking: bool = False):
    import torch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch


def concat(batches: List[Any]):
    """Micro-batches as one (tensors joined along their first dimension)."""
    import torch
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(batches)
    if isinstance(first, dict):
        return {k: concat([b[k] for b in batches]) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(concat([b[i] for b in batches]) for i in range(len(first)))
    return first


def leading_size(batch) -> Optional[int]:
    """The first tensor's first dimension: the micro-batch's samples."""
    import torch
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for v in values:
        size = leading_size(v)
        if size is not None:
            return size
    return None


def cycle(batches):
    while True:
        empty = True
        for b in batches:
            empty = False
            yield b
        if empty:
            raise EntryError("'batches' yielded no micro-batch (a DataLoader with drop_last and fewer samples than "
                             "the micro-batch?)")


class Loop:
    """trainbench's training step over an entry with a candidate's switches."""

    def __init__(self, entry: Entry, device, switches: Dict[str, str], accumulation: int, replicated=None):
        """`replicated`: the model and its loss wrapped for data parallelism (distributed.replicate); its forward
        takes a micro-batch and returns the loss, and with the no_sync switch on, the micro-batches before the last
        skip the gradients' all-reduce."""
        import torch
        self.entry, self.device, self.accumulation = entry, device, accumulation
        self.replicated = replicated
        self.no_sync = replicated is not None and switches.get("no_sync", "off") == "on"
        self.on_gpu = device.type == "cuda"
        self.bf16 = switches.get("bf16_matmuls", "off") == "on"
        self.non_blocking = switches.get("pin_memory", "off") == "on"
        self.sync = switches.get("sync", "every_step")
        self.sdpa = switches.get("sdpa", "default")
        self.graphs = switches.get("cuda_graphs", "off") == "on"
        self.graphed: Optional[GraphedMicroBatch] = None  # captured on the first step
        self.params = [p for p in entry.model.parameters() if p.requires_grad]
        if replicated is not None:
            self.forward = replicated
        else:
            self.forward = lambda batch: entry.loss(entry.model, batch)
        self.compile_seconds = 0.0
        if switches.get("compile", "off") == "on":
            self.forward = torch.compile(self.forward)
        self.steps = 0
        self.pending = None
        self.last_loss = float("nan")
        self.step_loss = None        # the last step's mean loss, a tensor on the device (read without a sync)
        self.diverged: Optional[str] = None  # why, from the first NaN or infinite loss read
        self.schedulers: Optional[List[Scheduled]] = None  # the entry's, bound to the optimizer of the first step
        self.samples = 0  # seen, for the epochs of epoch-interval schedulers

    def context(self):
        import contextlib
        import torch
        stack = contextlib.ExitStack()
        if self.bf16:  # a captured graph may not reuse autocast's cast cache (PyTorch's CUDA graphs notes)
            stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=not self.graphs))
        if self.sdpa != "default":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            stack.enter_context(sdpa_kernel({"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                                             "efficient": SDPBackend.EFFICIENT_ATTENTION,
                                             "cudnn": SDPBackend.CUDNN_ATTENTION}[self.sdpa]))
        return stack

    def micro_step(self, batch):
        """Forward, loss and backward of one micro-batch on the device; the loss, detached."""
        with self.context():
            loss = self.forward(batch)
        (loss / self.accumulation).backward()
        return loss.detach()

    def step(self, optimizer, micro_batches, timer=None) -> None:
        """One optimizer step over `micro_batches`. With a `timer` (data.PartTimer, a profiled step), each part's
        time: the copy to the device (data), forward and backward, clipping with the optimizer's step and zeroing,
        and the loss read by the host (sync)."""
        import torch
        mark = timer.mark if timer is not None else (lambda part: None)
        losses = []
        if self.graphs:
            if self.graphed is None:
                from .memory import looks_like_oom
                self.graphed = GraphedMicroBatch(self.micro_step, self.params, micro_batches[0], self.device, looks_like_oom)
            for batch in micro_batches:  # the graph copies each batch into its inputs as part of the replay
                losses.append(self.graphed(batch, self.non_blocking))
                mark("forward_backward")
        else:
            last = len(micro_batches) - 1
            for i, batch in enumerate(micro_batches):
                on_device = to_device(batch, self.device, self.non_blocking)
                mark("data")
                if self.no_sync and i < last:  # the gradients of all but the last micro-batch stay on this rank
                    with skipping_reduction(self.replicated):
                        losses.append(self.micro_step(on_device))
                else:
                    losses.append(self.micro_step(on_device))
                mark("forward_backward")
        if self.entry.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.entry.max_grad_norm)
        optimizer.step()
        if self.graphs:
            zero_grads(self.params)  # kept: the graph's backward adds into them
        else:
            optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self.step_schedulers(optimizer, sum(leading_size(b) or 0 for b in micro_batches))
        self.step_loss = torch.stack(losses).float().mean()
        mark("optimizer")
        self.read_loss(self.step_loss)
        mark("sync")

    def step_schedulers(self, optimizer, samples: int) -> None:
        """After each optimizer step, as Lightning does: interval "step" schedulers every `frequency` steps;
        interval "epoch" ones every `frequency` epochs, an epoch being one pass over the entry's batches (those
        of unknown length never end one). The first call binds the entry's schedulers to `optimizer`."""
        import warnings
        if self.schedulers is None:
            self.schedulers = self.entry.make_schedulers(optimizer)
        if not self.schedulers:
            return
        try:
            epoch_samples = len(self.entry.batches) * self.entry.micro_batch
        except TypeError:
            epoch_samples = 0
        epochs_before = self.samples // epoch_samples if epoch_samples else 0
        self.samples += samples
        epochs = self.samples // epoch_samples if epoch_samples else 0
        with warnings.catch_warnings():
            # a scheduler bound to a rebuilt optimizer warns that it did not see that optimizer's step run
            warnings.simplefilter("ignore", UserWarning)
            for s in self.schedulers:
                if s.interval == "step" and self.steps % s.frequency == 0:
                    s.scheduler.step()
                elif s.interval == "epoch":
                    for epoch in range(epochs_before + 1, epochs + 1):
                        if epoch % s.frequency == 0:
                            s.scheduler.step()

    def read_loss(self, loss) -> None:
        """The loss to the host per the sync switch: every step, every SYNC_EVERY_N, or one step late."""
        if self.sync == "every_step" or (self.sync.startswith("every_n") and self.steps % SYNC_EVERY_N == 0):
            self.last_loss = loss.item()
            read_at = self.steps
        elif self.sync == "async":
            if self.pending is None:
                read_at = 0
            else:
                self.last_loss = float(self.pending)
                read_at = self.steps - 1
            self.pending = loss.to("cpu", non_blocking=True) if self.on_gpu else loss
        else:
            read_at = 0
        if read_at and self.diverged is None:
            self.diverged = nonfinite_loss(self.last_loss, read_at)


def skipping_reduction(model):
    """A context in which a backward keeps its gradients on this rank (the no_sync switch): DDP's no_sync(), or
    FSDP2's set_requires_gradient_sync(False) (its reduce-scatter waits for the micro-batch that syncs)."""
    import contextlib
    if hasattr(model, "no_sync"):
        return model.no_sync()

    @contextlib.contextmanager
    def unsynced():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    return unsynced()


# ---- the check ---------------------------------------------------------------------------------------------
def initial_state(model):
    """A copy of the model's state: what a check returns it to."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def dropout_off(model) -> list:
    """Dropout switched off for a check (a random mask cannot be compared); the modules to switch on again."""
    import torch
    off = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training]
    for m in off:
        m.eval()
    return off


def update_difference(model, initial, reference) -> float:
    """||d - d_ref|| / ||d_ref||, d the parameters' change from `initial` now, d_ref the reference's (parameters
    sharded over ranks are gathered whole)."""
    import torch
    num = den = 0.0
    for name, p in model.named_parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        p0, pr = initial[name].double(), reference[name].to(p.device).double()
        d, dr = p.detach().double() - p0, pr - p0
        num += float(torch.sum((d - dr) ** 2))
        den += float(torch.sum(dr ** 2))
    if den == 0.0:
        return math.sqrt(num)
    return math.sqrt(num / den)


def first_step(entry: Entry, device, switches, micro_batches, variant: str, initial) -> Dict[str, Any]:
    """One step from `initial`; the parameters after it, and (under "seconds") how long the step took."""
    entry.model.load_state_dict(initial)
    loop = Loop(entry, device, switches, len(micro_batches))
    opt = with_variant(entry.make_optimizer(entry.model.parameters()), variant)
    started = time.perf_counter()
    loop.step(opt, micro_batches)
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    out = {k: v.detach().clone() for k, v in entry.model.named_parameters()}
    out["seconds"] = seconds
    out["loss"] = float(loop.step_loss)
    return out


def reference_step(entry: Entry, device, micro_batches, own: str, initial) -> Tuple[Dict[str, Any], int]:
    """The reference: the micro-batches joined into one, fp32, the optimizer as given; when that runs out of
    memory, joined into the fewest equal parts that fit (the largest micro-batch that fits). The parameters
    after it, and the parts it took."""
    import torch
    n, parts = len(micro_batches), 1
    while True:
        size = n // parts
        joined = [concat(micro_batches[i * size:(i + 1) * size]) for i in range(parts)]
        try:
            return first_step(entry, device, {"sync": "every_step"}, joined, own, initial), parts
        except Exception as e:  # noqa: BLE001 - an out-of-memory only; anything else is the trial's error
            if not _looks_like_oom(e) or parts == n:
                raise
        del joined
        if device.type == "cuda":
            torch.cuda.empty_cache()
        parts = next(k for k in range(parts + 1, n + 1) if n % k == 0)


def check_first_step(entry: Entry, device, switches: Dict[str, str], micro_batches, own: str,
                     timing: Optional[dict] = None, references: Optional[dict] = None,
                     reference_key: str = "") -> Optional[str]:
    """None when the candidate's first step matches the reference (the global batch in one micro-batch, fp32,
    the optimizer as given), else why not. Leaves the model at its initial parameters; `timing` gets the
    candidate's first step's seconds (with torch.compile, its compilation) as "first_step_seconds". With
    `references` (a long-lived worker's), the reference step of `reference_key` (the initial parameters and the
    first global batch) is computed once and kept there."""
    initial = initial_state(entry.model)
    off = dropout_off(entry.model)
    plain = {"sync": "every_step"}
    try:
        if references is not None and reference_key in references:
            reference, parts, reference_loss = references[reference_key]
        else:
            reference, parts = reference_step(entry, device, micro_batches, own, initial)
            reference.pop("seconds", None)
            reference_loss = reference.pop("loss")
            if references is not None:  # kept in host memory: not in a GPU candidate's peak
                references[reference_key] = ({k: v.to("cpu") for k, v in reference.items()}, parts, reference_loss)
        whole = "the whole batch" if parts == 1 else f"the batch in {parts} micro-batches (the whole did not fit)"
        diverged = nonfinite_loss(reference_loss, 1, f" of the reference ({whole} in fp32, the entry's own optimizer): "
                                                     "the model or its data, whatever the switches")
        if diverged:
            return diverged
        candidate = first_step(entry, device, switches, micro_batches, switches.get("optimizer", own), initial)
        if timing is not None:
            timing["first_step_seconds"] = candidate["seconds"]
        diverged = nonfinite_loss(candidate.pop("loss"), 1, f" with these switches (the reference's: {reference_loss:.4g})")
        if diverged:
            return diverged
        diff = update_difference(entry.model, initial, reference)
        tol = TOLERANCE_BF16 if switches.get("bf16_matmuls") == "on" else TOLERANCE_FP32
        why = None
        if not (diff <= tol):
            split = diff
            if len(micro_batches) > 1:
                first_step(entry, device, plain, micro_batches, own, initial)
                split = update_difference(entry.model, initial, reference)
            if len(micro_batches) > 1 and not (split <= TOLERANCE_FP32):
                why = (f"the loss depends on the micro-batch split (batch norm, or a mean per micro-batch?): one step of "
                       f"{len(micro_batches)} micro-batches in fp32 moves the parameters {split:.3g} (relative) away from "
                       f"one step of {whole} (tolerance {TOLERANCE_FP32:g})")
            else:
                why = (f"the first step's parameters differ from the reference's ({whole} in fp32) by {diff:.3g} "
                       f"relative to the update (tolerance {tol:g} with these switches)")
    finally:
        entry.model.load_state_dict(initial)
        for m in off:
            m.train()
    return why


# ---- probe and trial ---------------------------------------------------------------------------------------
def _looks_like_oom(e: BaseException) -> bool:
    from .memory import looks_like_oom
    try:
        return looks_like_oom(e)
    except ImportError:
        return isinstance(e, MemoryError)


def _device(request: dict):
    import torch
    if request.get("backend") == "cuda":
        device = torch.device("cuda", int(request.get("device", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def calls_sdpa(entry: Entry, batch, device) -> bool:
    import torch
    import torch.nn.functional as F
    seen = []
    original = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        seen.append(1)
        return original(*args, **kwargs)
    F.scaled_dot_product_attention = counting
    try:
        with torch.no_grad():
            entry.loss(entry.model, to_device(batch, device))
    finally:
        F.scaled_dot_product_attention = original
    return bool(seen)


def probe_entry(request: dict) -> dict:
    """What autotune needs of an entry, after validating it: raises EntryError with the one line to show."""
    import torch
    spec = request["entry"]
    device = _device(request)
    on_gpu = device.type == "cuda"
    micro = int(request.get("micro_batch", 0)) or 8
    started = time.perf_counter()
    torch.manual_seed(0)
    entry = build_entry(spec, micro, device)
    where = f"--entry {spec}"
    count = sum(p.numel() for p in entry.model.parameters() if p.requires_grad)
    if count == 0:
        raise EntryError(f"{where}: the model has no trainable parameters")
    try:
        opt = entry.make_optimizer(entry.model.parameters())
    except EntryError:
        raise
    except Exception as e:  # noqa: BLE001
        raise EntryError(f"{where}: making the optimizer raised {type(e).__name__}: {one_line(e)}") from None
    try:
        batch = next(iter(entry.batches))
    except StopIteration:
        raise EntryError(f"{where}: 'batches' yielded no micro-batch") from None
    except Exception as e:  # noqa: BLE001
        raise EntryError(f"{where}: iterating 'batches' raised {type(e).__name__}: {one_line(e)}") from None
    size = leading_size(batch)
    if size is None:
        raise EntryError(f"{where}: a micro-batch is a {type(batch).__name__} with no tensor in it; expected tensors, "
                         "tuples, lists or dicts of tensors")
    if size != micro:
        raise EntryError(f"{where}: 'batches' yields micro-batches of {size} samples when asked for {micro} (build the "
                         "loader with batch_size=micro_batch)")
    try:
        loss = entry.loss(entry.model, to_device(batch, device))
    except Exception as e:  # noqa: BLE001
        raise EntryError(f"{where}: loss(model, micro_batch) raised {type(e).__name__}: {one_line(e)}") from None
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
        raise EntryError(f"{where}: loss(model, micro_batch) returned {what}; expected a scalar tensor that requires grad")
    diverged = nonfinite_loss(float(loss.detach()), 1, " (the probe's first micro-batch, before any update): the model or "
                                                        "its data gives no finite loss to train on")
    if diverged:
        raise EntryError(f"{where}: {diverged}")
    loss.backward()
    opt.zero_grad(set_to_none=True)
    build_seconds = time.perf_counter() - started
    own = own_variant(opt, on_gpu)
    variants = ["per_tensor", "foreach"] + (["fused"] if "fused" in opt.defaults else [])
    switches = {"optimizer": [own] + [v for v in variants if v != own],
                "bf16_matmuls": ["off", "on"],
                "sync": ["every_step", f"every_n:{SYNC_EVERY_N}", "async"],
                "compile": ["off", "on"],
                "cuda_graphs": ["off", "on"]}  # offered on a CPU too, where a trial says why it is refused
    if calls_sdpa(entry, batch, device):
        switches["sdpa"] = ["default", "math"] + (["flash", "efficient"] if on_gpu else [])
    from .data import NEEDS_WORKERS, data_switches
    offered = data_switches(entry.batches, on_gpu, int(request.get("ranks", 1)))
    if not offered and on_gpu and isinstance(entry.batches, torch.utils.data.DataLoader):  # an iterable dataset's
        offered["pin_memory"] = ["on" if entry.batches.pin_memory else "off", "off" if entry.batches.pin_memory else "on"]
    switches.update(offered)
    # When a switch means something: the search keeps it at the entry's own value elsewhere
    applies_when = {name: "workers" for name in NEEDS_WORKERS if name in switches}
    # one timed step at the probe's micro-batch, for the budget's lower bound
    loop = Loop(entry, device, {"sync": "every_step"}, 1)
    t = time.perf_counter()
    loop.step(opt, [batch])
    step_seconds = time.perf_counter() - t
    return {"entry": spec, "label": entry.label, "parameters": count, "max_grad_norm": entry.max_grad_norm,
            "micro_batch": micro, "switches": switches, "applies_when": applies_when, "build_seconds": build_seconds,
            "step_seconds": step_seconds, "torch": torch.__version__, "python": sys.version.split()[0]}


def largest_batch(request: dict, warm: bool = True) -> dict:
    """Lightning's BatchSizeFinder (mode "power") on an entry, the configuration `autotune --versus
    largest-batch` races the choice against: the micro-batch doubled from 1 while LARGEST_BATCH_STEPS training
    steps at it fit in memory, in the entry's own configuration (its optimizer as given, fp32), at most the
    global batch and dividing it (the accumulation makes up the rest). The largest that fit, and every size
    tried with its outcome. An error other than out of memory is the entry's, raised."""
    import gc
    import torch
    from .memory import limit_host_memory, peak_host_bytes, warm_lazy_imports
    started = time.perf_counter()
    device = _device(request)
    on_gpu = device.type == "cuda"
    global_batch = int(request["global_batch"])
    limit = int(request.get("memory_limit_bytes", 0))
    if on_gpu and limit > 0:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
    if not on_gpu and warm:  # in a worker: done once, when it started
        warm_lazy_imports("per_tensor")
        limit_host_memory(limit)
    tried: List[Dict[str, Any]] = []
    largest, micro = 0, 1
    while micro <= global_batch and global_batch % micro == 0:
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(device)
        entry = loop = opt = None
        try:
            torch.manual_seed(0)
            entry = build_entry(request["entry"], micro, device)
            loop = Loop(entry, device, {"sync": "every_step"}, 1)
            opt = entry.make_optimizer(entry.model.parameters())
            stream = cycle(entry.batches)
            for _ in range(LARGEST_BATCH_STEPS):
                loop.step(opt, [next(stream)])
            if on_gpu:
                torch.cuda.synchronize(device)
            outcome = "fits"
        except Exception as e:  # noqa: BLE001 - out of memory ends the doubling; anything else is the entry's
            if not _looks_like_oom(e):
                raise
            outcome = f"out of memory ({type(e).__name__})"
        peak = int(torch.cuda.max_memory_allocated(device)) if on_gpu else peak_host_bytes()
        tried.append({"micro_batch": micro, "outcome": outcome, "peak_bytes": peak})
        del entry, loop, opt
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
        if outcome != "fits":
            break
        largest, micro = micro, micro * 2
    return {"micro_batch": largest, "tried": tried, "steps_per_size": LARGEST_BATCH_STEPS,
            "seconds": time.perf_counter() - started}
