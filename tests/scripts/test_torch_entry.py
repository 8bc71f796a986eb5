"""autotune --entry's child side (scripts/trainbench/pytorch/entry.py), in-process: a bad entry is one
EntryError line naming the file, the function and what was expected; the ready-made entries (hf:, a
LightningModule) build; the optimizer is rebuilt per-tensor, foreach and fused; and the first-step check passes
a correct split and switch, and names a model whose loss depends on the micro-batch split.

autotune's own runs of the entries (the README's example, GPT-2, a LightningModule, a CNN, the bad inputs'
exit 2) are ctest tests (tests/CMakeLists.txt). Without torch these tests skip.
"""

import os

import pytest

from conftest import REPO, TorchWorker, built_tool

torch = pytest.importorskip("torch")
from trainbench.pytorch import entry as te  # noqa: E402 - after the skip

ENTRIES = os.path.join(REPO, "tests", "scripts", "entries")
BAD = os.path.join(ENTRIES, "bad_entries.py")
CNN = os.path.join(ENTRIES, "small_cnn.py")
EXAMPLE = os.path.join(REPO, "tuner", "entries", "my_train.py")
LIGHTNING = os.path.join(REPO, "tuner", "entries", "lightning_module.py")
TINY_GPT2 = "hf:gpt2?n_layer=2&n_embd=32&n_head=2&vocab_size=256&n_positions=64&seq_len=16"
CPU = torch.device("cpu")


def probe(spec):
    return te.probe_entry({"entry": spec, "backend": "cpu", "micro_batch": 4})


@pytest.mark.parametrize("spec, expected", [
    (f"{BAD}:not_callable", "'not_callable' is not callable"),
    (f"{BAD}:raises", "raised RuntimeError: the data folder is missing"),
    (f"{BAD}:wrong_return", "wrong_return() returned a Linear; expected dict(model="),
    (f"{BAD}:no_parameters", "the model has no trainable parameters"),
    (f"{BAD}:ignores_the_micro_batch", "yields micro-batches of 3 samples when asked for 4"),
    (f"{BAD}:no_such_function", "has no 'no_such_function'"),
    (f"{os.path.join(ENTRIES, 'broken_import.py')}:build", "cannot import"),
    (f"{os.path.join(ENTRIES, 'missing.py')}:build", "no such file"),
    ("build_without_a_file", "expected FILE.py:NAME"),
    ("hf:no_such_model_type", "is not a model type of transformers"),
    ("hf:gpt2?n_layer=abc", "n_layer=abc is refused by GPT2Config"),  # the reason, past transformers' colon too
])
@pytest.mark.python_only
def test_a_bad_entry_is_one_line_naming_it(spec, expected):
    if spec.startswith("hf:"):
        pytest.importorskip("transformers")
    with pytest.raises(te.EntryError) as e:
        probe(spec)
    text = str(e.value)
    assert expected in text
    assert "\n" not in text
    assert text.startswith(f"--entry {spec.split('?')[0]}")


@pytest.mark.python_only
def test_the_example_and_the_cnn_probe_with_their_switches():
    for spec in (f"{EXAMPLE}:build", f"{CNN}:build"):
        p = probe(spec)
        assert p["parameters"] > 0
        assert p["switches"]["optimizer"][0] == "per_tensor"  # foreach=None on the CPU is the for-loop
        assert "fused" in p["switches"]["optimizer"]
        assert p["switches"]["bf16_matmuls"] == ["off", "on"]
        assert "sdpa" not in p["switches"]  # neither calls scaled_dot_product_attention


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
    lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=True),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
])
@pytest.mark.python_only
def test_the_optimizer_is_rebuilt_per_variant_with_its_hyperparameters(make):
    model = torch.nn.Linear(3, 2)
    opt = make(model.parameters())
    for variant in ("per_tensor", "foreach", "fused"):
        again = te.with_variant(opt, variant)
        assert type(again) is type(opt)
        g = again.param_groups[0]
        assert g["lr"] == opt.param_groups[0]["lr"]
        assert g["foreach"] is (variant == "foreach")
        assert bool(g.get("fused")) is (variant == "fused")
        assert [id(p) for p in g["params"]] == [id(p) for p in model.parameters()]


def first_micro_batches(entry, accumulation):
    stream = te.cycle(entry.batches)
    return [next(stream) for _ in range(accumulation)]


@pytest.mark.parametrize("switches", [{}, {"optimizer": "foreach"}, {"optimizer": "fused", "sync": "async"},
                                      {"bf16_matmuls": "on"}])
@pytest.mark.python_only
def test_a_split_into_micro_batches_passes_the_first_step_check(switches):
    entry = te.build_entry(f"{CNN}:build", 8, CPU)
    before = {k: v.clone() for k, v in entry.model.state_dict().items()}
    assert te.check_first_step(entry, CPU, switches, first_micro_batches(entry, 4), "per_tensor") is None
    for k, v in entry.model.state_dict().items():  # the model is left at its initial parameters
        assert torch.equal(v, before[k])


@pytest.mark.python_only
def test_a_loss_that_depends_on_the_split_is_named_with_its_difference():
    entry = te.build_entry(f"{CNN}:build_batchnorm", 8, CPU)
    why = te.check_first_step(entry, CPU, {}, first_micro_batches(entry, 4), "per_tensor")
    assert why and "depends on the micro-batch split" in why and "relative" in why
    # the whole batch in one micro-batch is the reference itself
    whole = te.build_entry(f"{CNN}:build_batchnorm", 32, CPU)
    assert te.check_first_step(whole, CPU, {}, first_micro_batches(whole, 1), "per_tensor") is None


@pytest.mark.python_only
def test_a_wrong_step_fails_the_check():
    """A loss that is not a mean (a sum) over the micro-batch: accumulation changes the step's size."""
    entry = te.build_entry(f"{CNN}:build", 8, CPU)
    mean = entry.loss
    entry.loss = lambda m, b: mean(m, b) * b[0].shape[0]
    entry.make_optimizer = lambda ps: torch.optim.SGD(ps, lr=0.01)  # SGD: the step's size is the gradient's
    entry.max_grad_norm = 0  # clipping to a norm would hide the factor
    why = te.check_first_step(entry, CPU, {}, first_micro_batches(entry, 4), "per_tensor")
    assert why is not None


@pytest.mark.python_only
def test_hf_gpt2_builds_from_its_configuration_without_downloading(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    entry = te.build_entry(TINY_GPT2, 2, CPU)
    assert entry.model.config.n_layer == 2 and entry.model.config.n_embd == 32
    assert entry.model.config.resid_pdrop == 0.0  # dropout off: a random mask cannot be checked
    batch = next(iter(entry.batches))
    assert batch["input_ids"].shape == (2, 16)
    assert te.calls_sdpa(entry, batch, CPU)
    assert te.check_first_step(entry, CPU, {"optimizer": "foreach"}, first_micro_batches(entry, 4), "per_tensor") is None
    with pytest.raises(te.EntryError, match="GPT2Config has no 'n_wings'"):
        te.build_entry("hf:gpt2?n_wings=4", 2, CPU)


@pytest.mark.python_only
def test_a_lightning_module_is_driven_through_its_hooks():
    pytest.importorskip("lightning")
    entry = te.build_entry(f"{LIGHTNING}:build", 8, CPU)
    assert entry.label == "LightningModule Regressor"
    assert isinstance(entry.make_optimizer(entry.model.parameters()), torch.optim.Adam)
    assert te.check_first_step(entry, CPU, {"optimizer": "foreach"}, first_micro_batches(entry, 2), "per_tensor") is None


def entry_worker(spec, limit=0):
    return TorchWorker({"kind": "entry", "entry": spec, "backend": "cpu", "device": 0, "memory_limit_bytes": limit})


@pytest.mark.python_only
def test_the_worker_opens_checks_and_steps_candidates_and_a_split_dependent_one_is_incorrect():
    with entry_worker(f"{CNN}:build") as w:
        for switches in ({"optimizer": "foreach"}, {"optimizer": "per_tensor", "sync": "async"}):
            said = w.request("open", candidate={"global_batch": 16, "micro_batch": 8, "switches": switches})
            assert said["disposition"] == "passed" and said["checked"], said
            assert w.request("time", calls=2)["seconds"] > 0
            assert w.request("close")["restart"] is False
    with entry_worker(f"{CNN}:build_batchnorm") as w:
        said = w.request("open", candidate={"global_batch": 16, "micro_batch": 8, "switches": {}})
        assert said["disposition"] == "incorrect" and "micro-batch split" in said["reason"], said


@pytest.mark.python_only
def test_a_nan_loss_is_named_as_such_never_as_a_split_dependent_model():
    """A model whose loss is NaN is incorrect whatever the switches: the probe refuses one that is NaN from the start
    (before any trial is spent on it), and a step that turns NaN while measured ends its trial as incorrect, with
    the step. Neither is ever diagnosed as a loss that depends on the micro-batch split."""
    faulty = os.path.join(ENTRIES, "faulty.py")
    with entry_worker(f"{faulty}:nan_at_once") as w:
        said = w.request("probe", micro_batch=8)
        assert said.get("usage") and "the loss is NaN at step 1" in said["error"], said
    entry = te.build_entry(f"{faulty}:nan_at_once", 8, CPU)
    why = te.check_first_step(entry, CPU, {}, first_micro_batches(entry, 2), "per_tensor")
    assert why and why.startswith("the loss is NaN at step 1 of the reference") and "split" not in why, why
    with entry_worker(f"{faulty}:diverges") as w:
        said = w.request("open", candidate={"global_batch": 16, "micro_batch": 8, "switches": {}})
        assert said["disposition"] == "passed", said   # five finite losses: the check's and the warm-up step's
        timed = w.request("time", calls=2)
        assert timed.get("class") == "incorrect" and timed["error"].startswith("the loss is NaN at step "), timed
        assert "split" not in timed["error"]


@pytest.mark.python_only
def test_the_reference_of_a_global_batch_is_computed_once_and_kept(monkeypatch):
    """A long-lived worker keeps the reference step of each (initial parameters, first global batch): the second
    candidate of that batch is checked against it without running it again; other samples get their own."""
    calls = []
    real = te.reference_step
    monkeypatch.setattr(te, "reference_step", lambda *a: calls.append(1) or real(*a))
    from trainbench.pytorch.worker import Worker
    w = Worker({"kind": "entry", "entry": f"{CNN}:build", "backend": "cpu"})
    for micro, switches in ((8, {}), (4, {"optimizer": "foreach"}), (16, {})):
        said = w.open({"candidate": {"global_batch": 16, "micro_batch": micro, "switches": switches}})
        assert said["disposition"] == "passed", said
    assert len(calls) == 1, "one reference for the three splits of one global batch"
    assert w.open({"candidate": {"global_batch": 32, "micro_batch": 16, "switches": {}}})["disposition"] == "passed"
    assert len(calls) == 2, "another global batch: its own reference"


@pytest.mark.python_only
def test_an_allocation_refused_under_the_memory_limit_is_an_oom_candidate():
    """The worker as autotune starts it, held to 64 MiB more than it has after importing PyTorch."""
    pytest.importorskip("transformers")
    # 512 MiB of logits (256 x 64 tokens x 8192)
    with entry_worker("hf:gpt2?n_layer=1&n_embd=32&n_head=2&vocab_size=8192&seq_len=64", 64 << 20) as w:
        said = w.request("open", candidate={"global_batch": 256, "micro_batch": 256, "switches": {}})
        assert said["disposition"] == "oom", said


def test_a_crash_a_hang_and_an_out_of_memory_each_cost_their_candidate_and_the_tune_finishes(tmp_path):
    """autotune over the stand-in entry that aborts (optimizer=foreach), hangs (sync=async) and allocates 8 GiB
    (optimizer=fused, under --memory-limit 2G): each is a failed trial of its own class, the worker is started
    again after each crash and hang (the out-of-memory left nothing held), and a configuration is chosen. The
    tune ends when its few candidates are done (this whole file takes about a minute on an idle 2-core machine);
    the budget is room for a loaded one, where at 100 s the hung candidate was cut by the budget's end before its
    hang limit."""
    import json
    import subprocess
    autotune = built_tool("TRAINBENCH_AUTOTUNE", "tuner", "autotune")
    if autotune is None:
        pytest.skip("autotune is not built")
    out = tmp_path / "faulty.json"
    done = subprocess.run([autotune, "--gpu", "cpu", "--entry", f"{os.path.join(ENTRIES, 'faulty.py')}:build", "--batch", "32",
                           "--switches", "optimizer,sync", "--memory-limit", "2G", "--budget", "200", "--trial-seconds", "1",
                           "--race-rounds", "3", "--format", "json", "--journal", str(tmp_path / "j.jsonl"), "--out", str(out)],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    t = json.loads(out.read_text())["trainbench_autotune"]
    assert t["chosen"] is not None
    failed = {(f["config"].split("optimizer=")[1], f["class"]) for f in t["failed_trials"]}
    assert ("foreach sync=every_step", "error") in failed, t["failed_trials"]
    assert ("per_tensor sync=async", "timeout") in failed, t["failed_trials"]
    assert any(opt.startswith("fused") and cls == "oom" for opt, cls in failed), t["failed_trials"]
    crash = next(f for f in t["failed_trials"] if "foreach" in f["config"])
    assert "killed by signal 6" in crash["message"], crash
    # Each crash and each hang (the search may try a failing switch value with other switches too) restarted the
    # worker, and nothing else did: the out-of-memory left nothing held, and no other candidate failed.
    lost = [f for f in t["failed_trials"] if f["class"] == "timeout" or "killed by signal 6" in f["message"]]
    worker = t["executor"]["worker"]
    assert worker["restarts"] == len(lost) >= 2 and worker["starts"] == worker["restarts"] + 1, (worker, t["failed_trials"])
    assert f"{len(lost)} restarts" in done.stderr


@pytest.mark.python_only
def test_a_reference_that_does_not_fit_whole_runs_in_the_fewest_parts_that_do(monkeypatch):
    entry = te.build_entry(f"{CNN}:build", 4, CPU)
    batches = first_micro_batches(entry, 8)
    real = te.first_step

    def small_memory(entry_, device, switches, micro_batches, variant, initial):
        if max(te.leading_size(b) for b in micro_batches) > 8:  # more than 8 samples at once: out of memory
            raise MemoryError("out of memory")
        return real(entry_, device, switches, micro_batches, variant, initial)
    monkeypatch.setattr(te, "first_step", small_memory)
    initial = {k: v.clone() for k, v in entry.model.state_dict().items()}
    _, parts = te.reference_step(entry, CPU, batches, "per_tensor", initial)
    assert parts == 4  # 32 samples as 4 x 8
    assert te.check_first_step(entry, CPU, {"optimizer": "foreach"}, batches, "per_tensor") is None


@pytest.mark.python_only
def test_the_largest_batch_search_doubles_until_out_of_memory():
    # BatchSizeFinder's power mode: 1, 2, 4, 8 fit, 16 does not; the global batch 32 is never reached.
    found = te.largest_batch({"entry": os.path.join(ENTRIES, "fits_eight.py") + ":build", "backend": "cpu",
                              "global_batch": 32})
    assert found["micro_batch"] == 8
    assert [t["micro_batch"] for t in found["tried"]] == [1, 2, 4, 8, 16]
    assert [t["outcome"] for t in found["tried"]][:4] == ["fits"] * 4
    assert found["tried"][-1]["outcome"].startswith("out of memory")


@pytest.mark.python_only
def test_the_largest_batch_stops_at_the_largest_power_of_two_dividing_the_global_batch():
    # 24 = 8 x 3: 16 would not divide it, so 8 with accumulation 3, though 16 fits
    found = te.largest_batch({"entry": f"{EXAMPLE}:build", "backend": "cpu", "global_batch": 24})
    assert found["micro_batch"] == 8 and [t["micro_batch"] for t in found["tried"]] == [1, 2, 4, 8]


def worker_trial(spec, backend, candidate):
    """A candidate opened in the worker (in-process) and, when it passes, stepped twice: the open's answer."""
    from trainbench.pytorch.worker import Worker
    w = Worker({"kind": "entry", "entry": spec, "backend": backend, "device": 0})
    said = w.open({"candidate": candidate})
    if said["disposition"] == "passed":
        said["step_seconds"] = w.time_steps(2) / 2
    w.close()
    return said


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA graph path is checked "
                               "on a GPU (scripts/gpu-node torch)")
UNFRIENDLY = os.path.join(ENTRIES, "graph_unfriendly.py")


def graphs_trial(spec, backend, micro_batch=4, global_batch=16, **switches):
    return worker_trial(spec, backend, {"global_batch": global_batch, "micro_batch": micro_batch,
                                        "switches": dict(switches, cuda_graphs="on")})


@pytest.mark.python_only
def test_cuda_graphs_on_a_cpu_are_refused_with_the_reason():
    r = graphs_trial(f"{EXAMPLE}:build", "cpu")
    assert r["disposition"] == "error"
    assert r["reason"].startswith("cuda_graphs refused: no CUDA device here"), r["reason"]
    assert "cuda_graphs" in probe(f"{EXAMPLE}:build")["switches"]


@needs_gpu
@pytest.mark.parametrize("spec", [f"{EXAMPLE}:build", f"{CNN}:build", TINY_GPT2])
def test_gpu_cuda_graphs_pass_the_first_step_check_and_measure(spec):
    # the replayed micro-batches accumulate the gradients the eager reference computes (a DataLoader, a list of
    # tuples, a dict of tokens), with accumulation 4, and with bf16 autocast
    for bf16 in ("off", "on"):
        r = graphs_trial(spec, "cuda", bf16_matmuls=bf16, optimizer="foreach")
        assert r["disposition"] == "passed", (bf16, r["reason"])
        assert r["step_seconds"] > 0


@needs_gpu
def test_gpu_a_host_sync_in_the_loss_refuses_capture():
    r = graphs_trial(f"{UNFRIENDLY}:host_sync", "cuda")
    assert r["disposition"] == "error" and r["reason"].startswith("cuda_graphs refused: capture failed"), r["reason"]
    assert graphs_trial(f"{UNFRIENDLY}:host_sync", "cuda", micro_batch=16, global_batch=16)["disposition"] == "error"


@needs_gpu
def test_gpu_micro_batches_that_change_shape_are_refused():
    r = graphs_trial(f"{UNFRIENDLY}:changing_shapes", "cuda")
    assert r["disposition"] == "error" and "the micro-batches change shape" in r["reason"], r["reason"]


@pytest.mark.python_only
def test_the_unfriendly_entries_run_eagerly():
    # what the GPU tests refuse is the graph's limit, not a broken entry: eager, both run on the CPU
    for name in ("host_sync", "changing_shapes"):
        r = worker_trial(f"{UNFRIENDLY}:{name}", "cpu", {"global_batch": 16, "micro_batch": 4, "switches": {}})
        assert r["disposition"] == "passed", (name, r["reason"])


SCHEDULED = os.path.join(ENTRIES, "lightning_scheduled.py")


def scheduled_loop(name, micro_batch, accumulation, variant="per_tensor"):
    pytest.importorskip("lightning")
    entry = te.build_entry(f"{SCHEDULED}:{name}", micro_batch, CPU)
    opt = te.with_variant(entry.make_optimizer(entry.model.parameters()), variant)
    return entry, te.Loop(entry, CPU, {}, accumulation), opt, te.cycle(entry.batches)


@pytest.mark.python_only
def test_a_lightning_scheduler_is_stepped_after_the_optimizer_step_in_the_first_step_check():
    # LambdaLR gives the first optimizer step the whole learning rate and every later one none: stepped per
    # micro-batch or before the optimizer step, the candidate's first step (4 micro-batches) would not move the
    # parameters while the reference's (one) would, and the check would fail
    pytest.importorskip("lightning")
    entry = te.build_entry(f"{SCHEDULED}:per_step", 4, CPU)
    batches = first_micro_batches(entry, 4)
    assert te.check_first_step(entry, CPU, {"optimizer": "foreach"}, batches, "per_tensor") is None
    initial = te.initial_state(entry.model)
    moved = te.first_step(entry, CPU, {}, batches, "per_tensor", initial)
    assert any(not torch.equal(moved[k], initial[k]) for k in initial), "the first step must move the parameters"


@pytest.mark.python_only
def test_step_interval_schedulers_step_every_frequency_optimizer_steps_in_the_timed_loop():
    entry, loop, opt, stream = scheduled_loop("per_step", 4, 2, "foreach")
    loop.step(opt, [next(stream) for _ in range(2)])
    assert opt.param_groups[0]["lr"] == 0.0  # the rebuilt (foreach) optimizer is the one scheduled
    entry, loop, opt, stream = scheduled_loop("every_second_step", 4, 2)
    lrs = []
    for _ in range(4):
        loop.step(opt, [next(stream) for _ in range(2)])
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.1, 0.05, 0.05, 0.025])


@pytest.mark.python_only
def test_epoch_interval_schedulers_step_when_a_pass_over_the_loader_ends():
    # 64 samples in micro-batches of 8, 2 to a step: an epoch is 4 optimizer steps; StepLR halves per epoch
    entry, loop, opt, stream = scheduled_loop("per_epoch", 8, 2)
    lrs = []
    for _ in range(9):
        loop.step(opt, [next(stream) for _ in range(2)])
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.1] * 3 + [0.05] * 4 + [0.025] * 2)


# ---- each rank's share of the global batch (entry.share_over_ranks) ------------------------------------------------
RANKED = os.path.join(ENTRIES, "ranked_data.py")


def samples_seen(entry):
    """The sample indices of each of the entry's micro-batches (sample i is the row [i, i, i, i])."""
    return [sorted(int(v) for v in batch[0][:, 0]) for batch in entry.batches]


@pytest.mark.parametrize("shuffle", ["off", "on"])
@pytest.mark.python_only
def test_a_dataloader_is_shared_by_a_distributed_sampler(shuffle):
    """Two ranks of a DataLoader entry: their micro-batches are disjoint, and those of one step together are one
    micro-batch of a process taking both ranks' samples, over the whole dataset; one rank alone keeps the loader."""
    alone = te.build_entry(f"{RANKED}:loader", 4, CPU, {"shuffle": shuffle})
    assert alone.same_on_every_rank == "" and len(samples_seen(alone)) == 16
    ranks = [te.build_entry(f"{RANKED}:loader", 4, CPU, {"shuffle": shuffle}, rank=r, world_size=2) for r in (0, 1)]
    seen = [samples_seen(e) for e in ranks]
    assert all(e.same_on_every_rank == "" for e in ranks)
    assert len(seen[0]) == len(seen[1]) == 8, "each rank has half the micro-batches of one pass"
    everything = [i for rank in seen for batch in rank for i in batch]
    assert sorted(everything) == list(range(64)), "disjoint shares of the whole dataset"
    if shuffle == "off":  # torch's DistributedSampler: rank r takes samples r, r + 2, r + 4, ...
        assert seen[0][0] == [0, 2, 4, 6] and seen[1][0] == [1, 3, 5, 7]


@pytest.mark.python_only
def test_an_entry_that_names_rank_and_world_size_yields_its_own_share():
    """It is given them (rank 0 of 1 when the tune has one process) and its batches are kept as it made them."""
    one = te.build_entry(f"{RANKED}:own_share", 4, CPU)
    assert samples_seen(one)[0] == [0, 1, 2, 3]
    second = te.build_entry(f"{RANKED}:own_share", 4, CPU, rank=1, world_size=2)
    assert second.same_on_every_rank == ""
    assert samples_seen(second)[0] == [1, 3, 5, 7]


@pytest.mark.python_only
def test_batches_that_are_the_same_on_every_rank_are_said_with_the_fix():
    one = te.build_entry(f"{RANKED}:same_everywhere", 4, CPU)
    assert one.same_on_every_rank == ""
    shared = te.build_entry(f"{RANKED}:same_everywhere", 4, CPU, rank=1, world_size=2)
    said = shared.same_on_every_rank
    assert "same_everywhere" in said and "the same on every rank" in said, said
    assert "name rank and world_size" in said and "DistributedSampler" in said, said
    assert samples_seen(shared)[0] == [0, 1, 2, 3], "left as it is: the tune says so, it does not guess a split"


@pytest.mark.python_only
def test_an_hf_entrys_ranks_take_side_by_side_rows_of_one_processs_micro_batch():
    one = te.build_entry(TINY_GPT2, 8, CPU)
    ranks = [te.build_entry(TINY_GPT2, 4, CPU, rank=r, world_size=2) for r in (0, 1)]
    for step, (whole, first, second) in enumerate(zip(one.batches, ranks[0].batches, ranks[1].batches)):
        assert torch.equal(torch.cat([first["input_ids"], second["input_ids"]]), whole["input_ids"]), step

