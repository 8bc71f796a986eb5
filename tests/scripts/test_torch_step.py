"""The PyTorch twin of the training step (scripts/trainbench/pytorch/step.py) against the C++ step.

dump_step (tests/dump_step.cpp) writes the CPU step of a workload in double: the resolved workload, the
parameters' names, shapes and initial values, the first micro-batch with its per-token losses and the
gradients one forward and backward of it leaves, and the results of optimizer steps. The twin, built from that
document, must start from the same parameters, draw the same batches, and compute the same losses,
gradients, solver counts and parameters after the steps, on `tiny` and on variants of it (each optimizer
variant, the propagator's switches, no clipping, no propagator). A perturbed twin, and one whose propagator
solves exactly instead of running model.h's CG, must fail the comparison.

Without a built dump_step (TRAINBENCH_DUMP_STEP, else the newest build*/tests/dump_step) the tests skip;
without torch only the dump tool's own tests run.
"""

import dataclasses
import json
import math
import os
import re
import subprocess

import pytest

from conftest import REPO, TORCH_STEP, TorchWorker, built_tool

TINY_YAML = os.path.join(REPO, "tuner", "workloads", "tiny.yaml")

# In double both sides round differently only in their sums' order (BLAS, reductions): measured worst
# differences on tiny are 0 (initial parameters), 6e-16 (loss), 1.1e-15 (gradients, relative to the tensor's
# largest) and 8e-15 (parameters after 5 steps). The bounds leave room for another BLAS or CPU.
LOSS_RTOL = 1e-12
GRAD_RTOL = 1e-10                  # of max |gradient| of the tensor
PARAMS_ATOL = 1e-12                # parameters after the optimizer steps
FP32_GRAD_RTOL = 1e-5              # a float32 twin against the double step (measured 7e-7)
STEPS = 3                          # optimizer steps compared: bias correction past step 1, the cache across steps


def dump_step_tool():
    return built_tool("TRAINBENCH_DUMP_STEP", "tests", "dump_step")


@pytest.fixture(scope="module")
def tool():
    path = dump_step_tool()
    if path is None:
        pytest.skip("no built dump_step (set TRAINBENCH_DUMP_STEP or build the dump_step target)")
    return path


def run_dump(tool, workload, *args):
    return subprocess.run([tool, str(workload), *map(str, args)], capture_output=True, text=True, timeout=120)


def dump(tool, workload, *args):
    done = run_dump(tool, workload, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tiny_variant(tmp_path, name, edit):
    """tiny.yaml with one edit (a function of its text), written to tmp_path/name.yaml."""
    with open(TINY_YAML) as f:
        text = f.read()
    edited = edit(text)
    assert edited != text, f"the edit for {name} changed nothing in tiny.yaml"
    path = tmp_path / f"{name}.yaml"
    path.write_text(edited)
    return path


def replaced(pattern, replacement):
    return lambda text: re.sub(pattern, replacement, text)


VARIANTS = {
    "foreach_decay": replaced(r"variant: fused, (.*)weight_decay: 0\.0", r"variant: foreach, \1weight_decay: 0.1"),
    "per_tensor_decay": replaced(r"variant: fused, (.*)weight_decay: 0\.0", r"variant: per_tensor, \1weight_decay: 0.1"),
    "no_clipping": replaced(r"grad_clip: 1\.0", "grad_clip: 0"),
    "no_propagator": replaced(r"\npropagator: .*\n", "\n"),
    "no_lazy_gate": lambda text: text + "switches: {lazy_cg: false}\n",
    "checkpointing": lambda text: text + "switches: {activation_checkpointing: true}\n",
}


# ---- the dump tool ---------------------------------------------------------------------------------------------
def test_dump_tool_refuses_bad_input_with_a_message(tool, tmp_path):
    done = run_dump(tool, "no_such_preset")
    assert done.returncode == 2 and "no workload preset 'no_such_preset'" in done.stderr
    done = run_dump(tool, "tiny", "--micro", 3)
    assert done.returncode == 2 and "--micro 3 does not divide the global batch (16)" in done.stderr
    bf16 = tiny_variant(tmp_path, "bf16", lambda text: text + "switches: {bf16_matmuls: true}\n")
    done = run_dump(tool, bf16)
    assert done.returncode == 2 and "bf16 matmuls are a CUDA switch" in done.stderr
    assert run_dump(tool, "tiny", "--steps", -1).returncode == 2


def test_dump_of_tiny_holds_the_resolved_workload_and_one_micro_batch(tool):
    doc = dump(tool, "tiny", "--micro", 4)
    w = doc["workload"]
    assert doc["schema"] == "trainbench-step-dump/1" and doc["precision"] == "double"
    assert w["model"] == {"layers": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 17, "mlp_ratio": 4}
    assert w["propagator"]["enabled"] and w["propagator"]["sparsity"] == 4
    assert w["batch"]["micro"] == 4 and w["batch"]["accumulation"] == 4
    assert w["optimizer"]["variant"] == "fused" and w["optimizer"]["betas"] == [0.9, 0.95]
    names = [p["name"] for p in doc["parameters"]]
    assert names[:3] == ["wte", "wpe", "h0.ln1w"] and names[-2:] == ["lnfw", "lnfb"] and len(names) == 2 + 2 * 12 + 2
    assert sum(math.prod(p["shape"]) for p in doc["parameters"]) == 26_528   # Workload::parameter_count
    mb = doc["micro_batch"]
    assert len(mb["samples"]) == 4 and len(mb["tokens"]) == len(mb["targets"]) == len(mb["losses"]) == 4 * 16
    assert mb["loss_scale"] == 1 / (4 * 16 * 4)
    assert math.isclose(mb["loss"], sum(mb["losses"]) * mb["loss_scale"], rel_tol=1e-14)
    assert abs(sum(mb["losses"]) / len(mb["losses"]) - math.log(17)) < 0.3   # a fresh model guesses uniformly
    assert "steps" not in doc


# ---- the twin against the dump ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ts():
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    from trainbench.pytorch import step as torch_step
    return torch_step


@pytest.fixture(scope="module")
def tiny(tool):
    return dump(tool, "tiny", "--steps", STEPS)


def gradient_differences(twin, doc):
    """name -> max |twin - C++| / max |C++| of each tensor's gradient after the first micro-batch."""
    import numpy as np
    out = {}
    for name, p in twin.model.layout():
        want = np.asarray(doc["micro_batch"]["gradients"][name])
        got = p.grad.detach().double().numpy().ravel()
        out[name] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))
    return out


def run_first_micro_batch(twin, doc):
    """The twin's first micro-batch (drawn by its own data path, checked to be the dump's): forward and
    backward; its share of the step's loss, the solver's counts, and (from one more forward) its per-token
    losses."""
    import torch
    import torch.nn.functional as F
    mb = doc["micro_batch"]
    samples = twin.data.next_samples(twin.micro)
    assert samples == mb["samples"]
    tokens, targets = twin.data.batch(samples)
    assert tokens.flatten().tolist() == mb["tokens"] and targets.flatten().tolist() == mb["targets"]
    loss = twin.micro_step(tokens, targets).item()
    stats = dataclasses.replace(twin.model.solve_stats())
    with torch.no_grad():
        logits = twin.model(tokens)
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return loss, stats, losses.double().tolist()


def solved(stats):
    """The solves that ran CG and their iterations: what a checkpointed C++ step's recomputed (and lazily
    skipped) solves leave unchanged."""
    if isinstance(stats, dict):
        return stats["solves"] - stats["skipped"], stats["iterations"], stats["matvecs"] - stats["skipped"]
    return stats.solves - stats.skipped, stats.iterations, stats.matvecs - stats.skipped


def expect_same_micro_batch(ts, doc, **twin_options):
    twin = ts.TrainingStep(doc, **twin_options)
    loss, stats, losses = run_first_micro_batch(twin, doc)
    mb = doc["micro_batch"]
    assert abs(loss - mb["loss"]) <= LOSS_RTOL * abs(mb["loss"]), (loss, mb["loss"])
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, mb["losses"])) <= LOSS_RTOL
    diffs = gradient_differences(twin, doc)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= GRAD_RTOL, f"gradient of {worst}: {diffs[worst]:.3g} of its scale"
    assert solved(stats) == solved(mb["solve_stats"]), (stats, mb["solve_stats"])


def expect_same_steps(ts, doc, **twin_options):
    import numpy as np
    twin = ts.TrainingStep(doc, **twin_options)
    want = doc["steps"]
    accumulation = doc["workload"]["batch"]["accumulation"]
    for k, report in enumerate(want["reports"]):
        got = twin.step()
        assert got.micro_batches == want["micro_batches"][k * accumulation:(k + 1) * accumulation]
        assert abs(got.loss.item() - report["loss"]) <= LOSS_RTOL * report["loss"], (k, got.loss.item(), report)
        assert abs(got.grad_norm.item() - report["grad_norm"]) <= LOSS_RTOL * report["grad_norm"], (k, report)
    assert solved(twin.model.solve_stats()) == solved(want["solve_stats"])
    for name, p in twin.model.layout():
        diff = np.abs(p.detach().numpy().ravel() - np.asarray(want["parameters"][name])).max()
        assert diff <= PARAMS_ATOL, f"{name} after {want['count']} steps: {diff:.3g} apart"


def test_twin_parameters_are_the_cpp_ones_exactly(ts, tiny):
    twin = ts.TrainingStep(tiny)
    layout = twin.model.layout()
    assert [(n, list(p.shape)) for n, p in layout] == [(p["name"], p["shape"]) for p in tiny["parameters"]]
    offsets = [0]
    for _, p in layout:
        offsets.append(offsets[-1] + p.numel())
    assert offsets[:-1] == [p["offset"] for p in tiny["parameters"]]
    for name, p in layout:
        assert p.detach().numpy().ravel().tolist() == tiny["initial"][name], name


def test_twin_data_path_is_the_trainers(ts, tiny):
    data = ts.TrainingStep(tiny).data
    picked = [data.next_samples(tiny["workload"]["batch"]["micro"]) for _ in tiny["steps"]["micro_batches"]]
    assert picked == tiny["steps"]["micro_batches"]
    # past the end of an epoch: the next epoch's shuffle starts from this one's order, as the trainer's does
    samples = tiny["workload"]["data"]["samples"]
    first_epoch = list(data.order)
    data.next_samples(samples)
    assert sorted(data.order) == list(range(samples)) and list(data.order) != first_epoch and data.epoch == 2


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_twin_loss_and_gradients_match_the_cpp_step_on_tiny(ts, tiny, attention):
    expect_same_micro_batch(ts, tiny, attention=attention)


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_twin_optimizer_steps_match_the_cpp_step_on_tiny(ts, tiny, attention):
    expect_same_steps(ts, tiny, attention=attention)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_twin_matches_the_cpp_step_on_variants_of_tiny(ts, tool, tmp_path, variant):
    doc = dump(tool, tiny_variant(tmp_path, variant, VARIANTS[variant]), "--steps", STEPS)
    expect_same_micro_batch(ts, doc)
    expect_same_steps(ts, doc)


def test_twin_in_float32_is_close(ts, tiny):
    import torch
    twin = ts.TrainingStep(tiny, dtype=torch.float32)
    run_first_micro_batch(twin, tiny)
    assert max(gradient_differences(twin, tiny).values()) <= FP32_GRAD_RTOL


def test_lazy_gate_skips_an_unchanged_input_and_solves_a_changed_one(ts, tiny):
    import torch
    solver = ts.RingSolver(tiny["workload"]["propagator"])
    cache = torch.zeros(8, 32, dtype=torch.float64)
    b = torch.linspace(-1, 1, 8 * 32, dtype=torch.float64).reshape(8, 32)
    first = solver.solve(b, cache, lazy=True)
    assert solver.stats.skipped == 0 and solver.stats.iterations > 0
    assert torch.equal(cache, first)
    residual = (b - solver.apply(first)).norm(dim=-1) / b.norm(dim=-1)
    assert residual.max().item() <= solver.cg_tol
    again = solver.solve(b, cache, lazy=True)
    assert solver.stats.skipped == 1 and torch.equal(again, first)
    b[0, 0] += 1.0
    solver.solve(b, cache, lazy=True)
    assert solver.stats.skipped == 1 and solver.stats.solves == 3


# ---- the check can fail ----------------------------------------------------------------------------------------
def test_a_perturbed_weight_fails_the_gradient_check(ts, tiny):
    import torch
    twin = ts.TrainingStep(tiny)
    with torch.no_grad():
        twin.model.blocks[1].fcw[0, 0] += 1e-6
    run_first_micro_batch(twin, tiny)
    diffs = gradient_differences(twin, tiny)
    assert max(diffs.values()) > 100 * GRAD_RTOL
    assert diffs["h1.fcw"] > GRAD_RTOL


def test_an_exact_propagator_fails_the_gradient_check(ts, tiny):
    """The C++ step's CG stops at cg_tol (1e-6 on tiny): a twin that solves to 1e-13 is a different step."""
    twin = ts.TrainingStep(tiny)
    twin.model.solver.cg_tol = 1e-13
    run_first_micro_batch(twin, tiny)
    assert max(gradient_differences(twin, tiny).values()) > 100 * GRAD_RTOL


# ---- the data path, the logging policy and bf16 ----------------------------------------------------------------
@pytest.mark.parametrize("location,per_sample_copy", [("host_pageable", True), ("host_pinned", False), ("device", False)])
def test_every_data_path_loads_the_trainers_batches(ts, tiny, location, per_sample_copy):
    """DataLoader with per-sample __getitem__ + stack, one __getitems__ gather, or rows resident on the device:
    the same samples in the same order, and each batch's tokens and targets those of SyntheticData.batch."""
    micro = tiny["workload"]["batch"]["micro"]
    samples = tiny["workload"]["data"]["samples"]
    twin_data = ts.TrainingStep(tiny).data
    path = ts.DataPath(ts.SyntheticData(samples, 16, 17, 41), {"location": location, "per_sample_copy": per_sample_copy},
                       micro)
    for _ in range(samples // micro + 2):   # past an epoch's end
        tokens, targets = path.next_batch()
        want = twin_data.next_samples(micro)
        assert path.picked == want
        want_tokens, want_targets = twin_data.batch(want)
        assert tokens.tolist() == want_tokens.tolist() and targets.tolist() == want_targets.tolist()


def test_loss_log_reads_as_the_logging_policy_says(ts):
    import torch

    def run(sync, interval=1, steps=6):
        log = ts.LossLog({"sync": sync, "interval": interval})
        reads = []
        for k in range(1, steps + 1):
            log.after_step(torch.tensor(float(k)), torch.tensor(10.0 * k))
            if log.read and (not reads or log.read != reads[-1]):
                reads.append(log.read)
        return reads

    assert run("every_step") == [(k, float(k), 10.0 * k) for k in range(1, 7)]
    # every 3rd step: the mean loss of the 3 steps since the last read, the grad norm of the last
    assert run("every_n", 3) == [(3, 2.0, 30.0), (6, 5.0, 60.0)]
    # async: each read is the copy queued one step earlier (nothing arrives at the first step)
    assert run("async") == [(k, float(k - 1), 10.0 * (k - 1)) for k in range(2, 7)]
    with pytest.raises(ts.UsageError, match="logging sync must be one of"):
        ts.LossLog({"sync": "sometimes", "interval": 1})


# ---- the worker (torch_worker.py, what autotune --executor torch runs) -------------------------------------------
FP32_TOL = {"atol": 2e-4, "rtol": 1e-4}   # runtime/tolerance.h's step_fp32
BF16_TOL = {"atol": 5e-2, "rtol": 2e-2}   # step_bf16


def open_request(doc, **extra):
    """An open request as TorchExecutor builds it: the candidate, its resolved workload, and the first sequence's
    double-precision losses as the reference (here the dump's first micro-batch: the C++ step in double)."""
    T = doc["workload"]["model"]["seq_len"]
    mb = doc["micro_batch"]
    request = {
        "resolved": {key: doc[key] for key in ("schema", "workload", "constants")},
        "candidate": {"global_batch": doc["workload"]["batch"]["global"], "micro_batch": doc["workload"]["batch"]["micro"],
                      "switches": {}},
        "warmup_steps": 1,
        "reference": {"sample": mb["samples"][0], "losses": mb["losses"][:T], **FP32_TOL},
    }
    request.update(extra)
    return request


@pytest.fixture(scope="module")
def trial():
    """The worker's side of a trial, where torch is: the twin's module, whose check_first the worker applies."""
    pytest.importorskip("torch")
    from trainbench.pytorch import step as torch_step
    return torch_step


def twin_worker(limit=0):
    return TorchWorker({"kind": "twin", "backend": "cpu", "device": 0, "memory_limit_bytes": limit})


def test_the_worker_checks_tiny_then_steps_it_as_asked(trial, tiny):
    with twin_worker() as w:
        import torch
        assert w.hello["protocol"] == "trainbench-torch-worker/1" and w.hello["torch"] == torch.__version__
        said = w.request("open", **open_request(tiny))
        assert said["disposition"] == "passed" and said["checked"], said
        assert said["step_seconds"] > 0 and said["setup_seconds"] > 0
        assert w.request("time", calls=3)["seconds"] > 0
        assert w.request("counters")["peak_bytes"] > 1 << 20   # the worker's peak resident set, PyTorch included
        assert w.request("close")["restart"] is False
        # Opened again (a race slice): built afresh, not checked again
        said = w.request("open", **open_request(tiny))
        assert said["disposition"] == "passed" and not said["checked"], said
        assert w.request("time", calls=1)["seconds"] > 0
        assert w.close() == 0


def test_a_candidate_whose_first_step_is_wrong_is_incorrect_and_not_opened(trial, tiny):
    with twin_worker() as w:
        request = open_request(tiny)
        request["reference"]["losses"][3] += 0.01
        said = w.request("open", **request)
        assert said["disposition"] == "incorrect"
        assert re.match(r"loss of token 3 of sample \d+ = [\d.]+, double reference [\d.]+", said["reason"]), said
        assert "error" in w.request("time", calls=1), "nothing is open to step"
        request = open_request(tiny)
        request["reference"]["sample"] += 1
        said = w.request("open", **request)
        assert said["disposition"] == "incorrect" and "the twin's data order differs" in said["reason"]


def test_bf16_autocast_passes_the_bf16_tolerance_and_changes_the_losses(ts, trial, tiny):
    import copy
    import torch
    doc = copy.deepcopy(tiny)
    doc["workload"]["switches"]["bf16_matmuls"] = True
    reference = open_request(tiny)["reference"]
    bf16 = ts.TrainingStep(doc, dtype=torch.float32).step(record_first=True)
    fp32 = ts.TrainingStep(tiny, dtype=torch.float32).step(record_first=True)
    assert trial.check_first({**reference, **BF16_TOL}, bf16.micro_batches[0][0], bf16.first_losses.tolist()) is None
    assert trial.check_first(reference, fp32.micro_batches[0][0], fp32.first_losses.tolist()) is None
    assert (bf16.first_losses - fp32.first_losses).abs().max().item() > 1e-5   # the products did run in bf16


def test_the_worker_reports_out_of_memory_as_a_result_and_goes_on(trial, tiny):
    """A dataset of 2M sequences (about 0.5 GiB as the twin builds it) in a worker held to 64 MiB beyond what the
    interpreter and PyTorch hold: an oom candidate, and the worker goes on. tiny itself runs under the same limit:
    PyTorch's lazy imports and its threads are set up before the limit is set."""
    import copy
    big = copy.deepcopy(tiny)
    big["workload"]["data"]["samples"] = 2_000_000
    with twin_worker(64 << 20) as w:
        said = w.request("open", **open_request(big))
        assert said["disposition"] == "oom", said
        assert said["reason"].startswith("out of memory (") and "held to 64 MiB more" in said["reason"], said
        assert w.request("close")["restart"] in (False, True)
        assert w.request("open", **open_request(tiny))["disposition"] == "passed"


def test_torch_step_refuses_bad_arguments_and_probes(trial):
    import sys
    done = subprocess.run([sys.executable, TORCH_STEP, "--trial", "{}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage: torch-step" in done.stderr
    done = subprocess.run([sys.executable, TORCH_STEP, "--serve", "{not json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "the start request is not JSON" in done.stderr
    done = subprocess.run([sys.executable, TORCH_STEP, "--probe"], capture_output=True, text=True, timeout=120)
    probe = json.loads(done.stdout)
    import torch
    assert probe["torch"] == torch.__version__ and probe["import_seconds"] > 0 and probe["cuda"] in (True, False)


# ---- cuda_graphs ------------------------------------------------------------------------------------------------
def test_cuda_graphs_are_refused_on_the_cpu_and_with_the_propagator(ts, tiny):
    import copy
    doc = copy.deepcopy(tiny)
    doc["workload"]["switches"]["cuda_graphs"] = True
    with pytest.raises(ts.UsageError, match="cuda_graphs needs a GPU"):
        ts.TrainingStep(doc)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        return
    with pytest.raises(ts.UsageError, match="cuda_graphs with the propagator"):
        ts.TrainingStep(doc, dtype=torch.float32, device="cuda")


def test_gpu_graphed_steps_match_eager_steps(ts, tool, tmp_path):
    """On a GPU: from GRAPH_CAPTURE_STEP on, the twin replays its captured micro-step; its losses and
    parameters follow the eager twin's (fp32: the same kernels, so to rounding)."""
    import copy
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    doc = dump(tool, tiny_variant(tmp_path, "no_propagator", VARIANTS["no_propagator"]), "--steps", 1)
    graphed_doc = copy.deepcopy(doc)
    graphed_doc["workload"]["switches"]["cuda_graphs"] = True
    eager = ts.TrainingStep(doc, dtype=torch.float32, device="cuda")
    graphed = ts.TrainingStep(graphed_doc, dtype=torch.float32, device="cuda")
    for k in range(4):
        e, g = eager.step(), graphed.step()
        assert e.micro_batches == g.micro_batches
        assert abs(e.loss.item() - g.loss.item()) <= 1e-5 * abs(e.loss.item()), k
    assert graphed.graphed is not None and eager.graphed is None
    for (name, a), (_, b) in zip(eager.model.layout(), graphed.model.layout()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name


# ---- the step's PyTorch row (torch_cases/step.py: benchsuite --backend cpu,torch --filter step) ---------------
def benchsuite_tool():
    return built_tool("TRAINBENCH_BENCHSUITE", "benches", "benchsuite")


@pytest.fixture(scope="module")
def step_row(tmp_path_factory):
    """The step's PyTorch row at `tiny` on the CPU as benchsuite lists it, with the input it writes for it
    (--torch-inputs): a torch_peers.Bench."""
    pytest.importorskip("torch")
    benchsuite = benchsuite_tool()
    if benchsuite is None:
        pytest.skip("no built benchsuite to write the row's input (set TRAINBENCH_BENCHSUITE)")
    from trainbench.pytorch import peers as torch_peers
    listed = subprocess.run([benchsuite, "--backend", "cpu,torch", "--quick", "--filter", "step/cpu/train/cpu_workload=tiny",
                             "--list", "--format", "json"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    inputs = tmp_path_factory.mktemp("step_inputs")
    written = subprocess.run([benchsuite, "--torch-inputs", str(inputs)], input=listed.stdout, capture_output=True,
                             text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    benches = torch_peers.select_benches(json.loads(written.stdout), "cpu")
    assert [(b.name, b.mirrors) for b in benches] == [("step/torch/twin/cpu_workload=tiny", "cpu/train")]
    return benches[0]


@pytest.fixture
def on_the_cpu():
    from trainbench.pytorch import case as torch_case
    torch_case.use_device("cpu")
    return torch_case


def test_the_step_rows_input_is_the_resolved_workload_and_the_cpp_double_forward(step_row, tiny):
    """What benchsuite writes for the row: dump_step's resolved workload, and as the reference the first
    sequence's per-token losses of the C++ forward in double (the dump's first micro-batch starts with it)."""
    from trainbench.pytorch.inputs import read_document
    doc = read_document(step_row, "step")
    assert doc["resolved"] == {key: tiny[key] for key in ("schema", "workload", "constants")}
    T = tiny["workload"]["model"]["seq_len"]
    reference = doc["reference"]
    assert reference["sample"] == tiny["micro_batch"]["samples"][0]
    # The reference solves the propagator for its one sequence, the step for the micro-batch's rows at once (CG
    # stops at the worst row's cg_tol, 1e-6): they agree to that, not to rounding (measured 2e-7 on tiny).
    worst = max(abs(a - b) for a, b in zip(reference["losses"], tiny["micro_batch"]["losses"][:T]))
    assert worst <= 10 * tiny["workload"]["propagator"]["cg_tol"]
    assert (reference["atol"], reference["rtol"]) == (FP32_TOL["atol"], FP32_TOL["rtol"])


def test_the_step_row_is_checked_then_timed_with_its_parts(step_row, on_the_cpu):
    """tiny on the CPU: the twin's first step passes the C++ step's own check, and the parts of the profiled
    steps after the samples carry the C++ row's names; the parts that always run took time (sync: tiny reads
    the loss every 4th step only). How the parts add up is test_a_profiled_step_is_the_same_step's (the marks
    cover the step) and, on the C++ side, StepTiming.PartsMakeUpTheStep*'s."""
    from trainbench.pytorch.cases import CASES
    case, said = on_the_cpu.open_case(CASES["step"], step_row)
    assert said["disposition"] == "passed", said["reason"]
    assert said["max_error"] < FP32_TOL["atol"]
    assert on_the_cpu.time_calls(case, 2) > 0
    counters = case.counters()
    parts = {"data_ns", "forward_ns", "backward_ns", "optimizer_ns", "sync_ns", "solver_ns"}
    assert set(counters) == parts
    assert all(counters[p] > 0 for p in parts - {"sync_ns"}), counters


def test_a_broken_twin_is_incorrect_and_not_timed(step_row, on_the_cpu):
    """A perturbed weight (the final layernorm's bias, which shifts every logit) moves the first losses out
    of the step's tolerance; a twin whose reference names another first sample has another data order."""
    import torch
    from trainbench.pytorch.cases.step import StepCase

    class PerturbedTwin(StepCase):
        def __init__(self, bench, env):
            super().__init__(bench, env)
            with torch.no_grad():
                self.twin.model.lnfb[0] += 1.0

    class OtherOrder(StepCase):
        def __init__(self, bench, env):
            super().__init__(bench, env)
            self.reference = dict(self.reference, sample=self.reference["sample"] + 1)

    case, perturbed = on_the_cpu.open_case(PerturbedTwin, step_row)
    assert case is None and perturbed["disposition"] == "incorrect", perturbed   # not kept: never timed
    assert perturbed["reason"].startswith("per-token loss of sample"), perturbed["reason"]
    case, reordered = on_the_cpu.open_case(OtherOrder, step_row)
    assert case is None and reordered["disposition"] == "incorrect"
    assert "the twin's data order differs" in reordered["reason"]


def test_a_profiled_step_is_the_same_step(ts, tiny):
    """The marks change no number: a twin stepped with a PartClock keeps the unprofiled twin's losses and
    parameters exactly; its marks are the step's parts, each micro-batch's in turn, the solves inside them."""
    import torch
    plain, profiled = ts.TrainingStep(tiny), ts.TrainingStep(tiny)
    accumulation = tiny["workload"]["batch"]["accumulation"]
    for _ in range(2):
        clock = ts.PartClock()
        assert plain.step().loss.item() == profiled.step(clock=clock).loss.item()
        parts = [part for part, _ in clock.marks]
        assert parts.count("data") == accumulation and parts[0] == "data" and parts[-3:] == ["optimizer", "sync", "end"]
        assert set(parts) == set(ts.STEP_PARTS) | {"end"}
        assert set(clock.seconds()) == set(ts.STEP_PARTS) and all(v >= 0 for v in clock.seconds().values())
        assert profiled.model.solver.clock is None
    for (name, a), (_, b) in zip(plain.model.layout(), profiled.model.layout()):
        assert torch.equal(a, b), name
