"""scripts/torch-peers: the rows of a listing it serves, its conversation with benchsuite (--serve: open,
time, counters, close), the command line without torch; the inputs benchsuite --torch-inputs writes for the
rows (the stages' own generators); the cases' checks on the CPU against those inputs and, where torch sees a
GPU, every quick row opened and timed. How benchsuite measures the rows (rounds, disturbance, pairs) is
tests/test_cli.cpp's and tests/test_harness.cpp's.

fixtures/benchsuite_list_cpu_quick.json is `benchsuite --backend cpu,torch --list --format json --quick`
trimmed to adamw, gradnorm, attention, spmv, cg and collate (stages with their axes and CPU variants' ids and
axes), with its "constants" and "torch" rows.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO, SCRIPTS, built_tool, run_script, write_json
from trainbench.pytorch import inputs as tpi
from trainbench.pytorch import peers as tp


def listing(name="benchsuite_list_cpu_quick.json"):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


@pytest.fixture(autouse=True)
def generator_constants():
    """The constants the generators and checks take from a listing (benchsuite's, recorded in the fixture)."""
    tpi.use_constants(listing()["constants"])


def bench_row(stage, variant, problem, device="cpu"):
    label = ",".join(f"{k}={v}" for k, v in problem.items())
    return {"name": f"{stage}/torch/{variant}/{label}", "stage": stage, "variant": variant, "label": label,
            "mirrors": f"{device}/{variant}", "problem": problem}


def listing_with_inputs(doc, tmp_path):
    """`doc` with the inputs of its PyTorch rows, written by benchsuite --torch-inputs (as a run writes them)."""
    benchsuite = built_tool("TRAINBENCH_BENCHSUITE", "benches", "benchsuite")
    if benchsuite is None:
        pytest.skip("no built benchsuite to write the rows' inputs (set TRAINBENCH_BENCHSUITE)")
    p = subprocess.run([benchsuite, "--torch-inputs", str(tmp_path / "inputs")], input=json.dumps(doc),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def with_inputs(rows, tmp_path, device="cpu"):
    """The Benches of `rows` (bench_row's), each with its inputs."""
    doc = dict(listing(), torch={"device": device, "rows": rows})
    return tp.select_benches(listing_with_inputs(doc, tmp_path), device)


# ---- the rows of the listing -----------------------------------------------------------------------------
def test_the_rows_are_the_listings_torch_rows():
    """Which PyTorch row stands beside which selected row is benchsuite's (tests/test_cli.cpp checks the rows
    it lists): the script measures the listing's "torch" rows, in its order, and nothing else."""
    doc = listing()
    benches = tp.select_benches(doc, "cpu")
    assert [b.name for b in benches] == [r["name"] for r in doc["torch"]["rows"]] and len(benches) == 25
    naive = next(b for b in benches if b.name == "attention/torch/naive/cpu_shape=1x8x1024x64")
    assert (naive.stage, naive.variant, naive.mirrors) == ("attention", "naive", "cpu/naive_mask_cached")
    assert naive.problem == {"cpu_shape": "1x8x1024x64", "dtype": "fp32", "causal": "causal"}
    with pytest.raises(tp.UsageError, match="for --device cpu, not cuda"):
        tp.select_benches(doc, "cuda")
    del doc["torch"]
    with pytest.raises(tp.UsageError, match="has no PyTorch rows"):
        tp.select_benches(doc, "cpu")


def test_list_prints_the_listings_rows_without_torch(tmp_path):
    doc = listing()
    doc["torch"]["rows"] = [r for r in doc["torch"]["rows"] if r["stage"] == "spmv"]
    p = run_script("torch-peers", "--device", "cpu", "--listing", write_json(tmp_path / "list.json", doc), "--list")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["spmv/torch/csr/graph=ring8,rows=1048576", "spmv/torch/spmm_csr/graph=ring8,rows=1048576,rhs=8"]


# ---- the command line ------------------------------------------------------------------------------------
def test_a_bad_listing_or_none_is_bad_usage(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something-else"}')
    p = run_script("torch-peers", "--device", "cpu", "--listing", str(bad), "--list")
    assert p.returncode == 2 and "not a benchsuite --list --format json document" in p.stderr
    p = run_script("torch-peers", "--device", "cpu", "--listing", str(tmp_path / "missing.json"), "--list")
    assert p.returncode == 2 and "cannot read" in p.stderr
    malformed = listing()
    del malformed["torch"]["rows"][0]["problem"]
    p = run_script("torch-peers", "--device", "cpu", "--listing", write_json(tmp_path / "m.json", malformed), "--list")
    assert p.returncode == 2 and "PyTorch rows are malformed" in p.stderr
    p = run_script("torch-peers", "--device", "cpu", "--list")
    assert p.returncode == 2 and "--listing" in p.stderr


def test_without_torch_one_message_and_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)   # import torch raises ImportError
    for name in [m for m in sys.modules if m.startswith("trainbench.pytorch.case")]:
        monkeypatch.delitem(sys.modules, name)
    p = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; "
                        "from trainbench.pytorch import peers; sys.exit(peers.main(sys.argv[1:]))",
                        "--device", "cpu", "--listing", write_json(tmp_path / "list.json", listing()), "--serve"],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=SCRIPTS))
    assert p.returncode == 2 and p.stdout == ""   # nothing said on the conversation
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("torch-peers: error: PyTorch is not importable ("), p.stderr


def test_it_serves_or_lists_and_nothing_else(tmp_path):
    p = run_script("torch-peers", "--device", "cpu", "--listing", write_json(tmp_path / "list.json", listing()))
    assert p.returncode == 2 and "one of the arguments --serve --list is required" in p.stderr


class Conversation:
    """scripts/torch-peers --serve on a listing, spoken to as benchsuite speaks to it (benches/torch_rows.cpp)."""

    def __init__(self, doc, tmp_path, device="cpu"):
        self.p = subprocess.Popen([sys.executable, os.path.join(REPO, "scripts", "torch-peers"), "--device", device,
                                   "--listing", write_json(tmp_path / "list.json", doc), "--serve"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.hello = json.loads(self.p.stdout.readline() or "null")

    def ask(self, op, row, **more):
        self.p.stdin.write(json.dumps(dict(op=op, row=row, **more)) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def end(self):
        self.p.stdin.close()
        return self.p.wait(timeout=60), self.p.stderr.read()


def spmv_listing(tmp_path):
    doc = listing()
    doc["torch"]["rows"] = [dict(r, name="spmv/torch/csr/graph=ring8,rows=1000", label="graph=ring8,rows=1000",
                                 problem={"graph": "ring8", "rows": "1000"})
                            for r in doc["torch"]["rows"] if r["stage"] == "spmv" and r["variant"] == "csr"]
    return listing_with_inputs(doc, tmp_path)


def test_the_conversation_opens_times_counts_and_closes_a_row(tmp_path):
    """benchsuite's requests, answered one a line: a row opened (built and checked), n calls timed by the
    script's clock, what it counted, closed; what cannot be done is an error answer, and the script goes on."""
    pytest.importorskip("torch")
    talk = Conversation(spmv_listing(tmp_path), tmp_path)
    assert talk.hello["protocol"] == "trainbench-torch-serve/1" and talk.hello["torch"]["version"]
    row = "spmv/torch/csr/graph=ring8,rows=1000"
    assert "is not open" in talk.ask("time", row, calls=3)["error"]
    opened = talk.ask("open", row)
    assert opened["disposition"] == "passed" and opened["max_error"] >= 0, opened
    # Seconds for the calls asked for, not per call: the fastest of a few single calls (after one that pays the
    # row's first-call costs, 11 ms once on a loaded CI machine) against 2000 calls.
    talk.ask("time", row, calls=1)
    one = min(talk.ask("time", row, calls=1)["seconds"] for _ in range(5))
    many = talk.ask("time", row, calls=2000)["seconds"]
    assert 0 < one and one < many
    assert "must be a count" in talk.ask("time", row, calls=-1)["error"]
    assert set(talk.ask("counters", row)) == {"counters", "per_unit"}
    assert talk.ask("close", row) == {}
    assert "is not open" in talk.ask("counters", row)["error"]
    assert "no PyTorch row" in talk.ask("open", "spmv/torch/csr/elsewhere")["error"]
    assert "unknown op" in talk.ask("fly", row)["error"]
    code, err = talk.end()
    assert code == 0 and f"{row}: passed" in err


# ---- the inputs (benchsuite's, drawn by the stages' own generators) ---------------------------------------
def test_each_row_reads_the_inputs_benchsuite_wrote(tmp_path):
    """benchsuite --torch-inputs writes what each row reads once per problem (spmv and cg at one graph share
    the matrix), and the arrays are the stages': A = I + alpha L is symmetric with unit row sums, the
    parameter set has its tensors and total, the epoch's order is a permutation."""
    np = pytest.importorskip("numpy")
    rows = [bench_row("spmv", "csr", {"graph": "random8", "rows": "300"}),
            bench_row("cg", "host_checked", {"graph": "random8", "rows": "300", "alpha": "0.5", "drift": "1e-6"}),
            bench_row("adamw", "fused", {"params": "10000", "tensors": "20", "dtype": "fp32"}),
            bench_row("collate", "per_sample", {"layout": "tokens", "order": "shuffled", "samples": "64", "batch": "8",
                                                "seq_len": "16", "embed_dim": "0", "compute_us": "0"})]
    spmv, cg, adamw, collate = with_inputs(rows, tmp_path)
    assert spmv.inputs["col"] == cg.inputs["col"] and len(os.listdir(spmv.inputs_dir)) == 6
    row_ptr, col, val = (tpi.read_input(spmv, k) for k in ("row_ptr", "col", "val"))
    dense = np.zeros((300, 300))
    dense[np.repeat(np.arange(300), np.diff(row_ptr)), col] = val
    assert np.array_equal(dense, dense.T) and np.allclose(dense.sum(axis=1), 1.0)
    assert tpi.read_input(cg, "rhs").shape == (17, 300)
    sizes = tpi.read_input(adamw, "tensor_sizes")
    assert (sizes.size, int(sizes.sum())) == (20, 10000)
    assert sorted(tpi.read_input(collate, "order").tolist()) == list(range(64))
    with pytest.raises(tp.UsageError, match="no input 'rhs'"):
        tpi.read_input(spmv, "rhs")


# ---- the cases on the CPU -----------------------------------------------------------------------------------
def cpu_case(stage, variant, problem, monkeypatch, tmp_path):
    """The case of (stage, variant) on `problem`, on the CPU (GPU patterns included: their logic runs anywhere)."""
    torch_case = pytest.importorskip("trainbench.pytorch.case")
    from trainbench.pytorch.cases import CASES
    monkeypatch.setattr(torch_case, "DEVICE", torch_case.torch.device("cpu"))
    env = torch_case.Env()
    env.enter(stage)
    (bench,) = with_inputs([bench_row(stage, variant, problem)], tmp_path)
    return torch_case, CASES[stage](bench, env)


CG_PROBLEM = {"graph": "ring8", "rows": "65536", "alpha": "0.5", "drift": "1e-6"}
HOSTSYNC_PROBLEM = {"steps": "50", "elements": "4096"}


def test_naive_attention_on_the_cpu_declines_what_would_not_fit(monkeypatch, tmp_path):
    """The CUDA problem 4x16x4096x128 holds 4 GiB of fp32 scores: on the CPU the naive peer is unsupported
    there, before anything is allocated; the CPU variants' largest quick problem runs."""
    torch_case, case = cpu_case("attention", "naive", {"cpu_shape": "1x8x1024x64", "causal": "causal", "dtype": "fp32"},
                                monkeypatch, tmp_path)
    assert case.q.shape == (1, 8, 1024, 64) and case.q.dtype == torch_case.torch.float32 and case.causal
    verdict = case.check()
    assert verdict.ok, verdict.detail
    from trainbench.pytorch.cases import CASES
    big = tp.Bench("", "attention", "naive", "", {"shape": "4x16x4096x128", "causal": "causal", "dtype": "fp32"},
                   "cuda/naive")
    case, said = torch_case.open_case(CASES["attention"], big)
    assert case is None and said["disposition"] == "unsupported" and "4 GiB" in said["reason"]


def test_gradnorm_peers_on_the_cpu_match_the_fp64_reference(monkeypatch, tmp_path):
    """clip_grad_norm_ (foreach=False, foreach=True, and with .item()) against the norm and clip written out in
    fp64, on a 2M-parameter set of the stage's shape; a wrong max_norm is caught; repeated calls keep clipping
    in place, as the stage's do; bf16 is unsupported."""
    small = {"params": "2000000", "tensors": "200", "dtype": "fp32"}
    for variant in ("per_tensor", "foreach", "foreach_item"):
        torch_case, case = cpu_case("gradnorm", variant, small, monkeypatch, tmp_path)
        assert len(case.params) == 200 and sum(q.grad.numel() for q in case.params) == 2000000
        verdict = case.check()
        assert verdict.ok, (variant, verdict.detail)
        norm = case.call()
        assert abs(float(norm) - 1.0) < 1e-4   # about max_norm after the first clip
    torch = torch_case.torch
    _, wrong = cpu_case("gradnorm", "foreach", small, monkeypatch, tmp_path)
    wrong.call = lambda: torch.nn.utils.clip_grad_norm_(wrong.params, 2.0, foreach=True)
    verdict = wrong.check()
    assert not verdict.ok and "grad of tensor" in verdict.detail
    from trainbench.pytorch.cases import CASES
    _, bf16 = torch_case.open_case(CASES["gradnorm"], tp.Bench("", "gradnorm", "per_tensor", "", dict(small, dtype="bf16"),
                                                               "cpu/per_tensor"))
    assert bf16["disposition"] == "unsupported" and "bf16" in bf16["reason"]


# The C++ CPU rows' counters on the same problem (benchsuite --quick --backend cpu --filter cg, drift 1e-6):
# iterations per solve 20 cold, 3.0625 warm, 2.125 with the gate, which skips 6 of 16 solves.
CG_DECISIONS = {"host_checked": (0.0, 20.0), "host_checked_warm": (0.0, 3.0625), "host_checked_lazy": (0.375, 2.125),
                "device_loop": (0.0, 20.0), "device_loop_warm": (0.0, 3.0625), "device_loop_lazy": (0.375, 2.125)}


@pytest.mark.parametrize("variant", sorted(CG_DECISIONS))
def test_cg_peers_pass_and_take_the_stages_decisions(variant, monkeypatch, tmp_path):
    _, case = cpu_case("cg", variant, CG_PROBLEM, monkeypatch, tmp_path)
    verdict = case.check()
    assert verdict.ok, verdict.detail
    counters = case.counters()
    assert (counters["skip_rate"], counters["iterations_per_solve"]) == CG_DECISIONS[variant]
    reads = counters["reads_per_solve"]
    # .item() every iteration, or once per block of 8 (and once for the gate)
    assert reads > 20 if variant == "host_checked" else reads <= 3 if variant.startswith("device_loop") else True
    case.call()   # a timed call repeats the window from the cache
    assert case.check().ok


def test_a_cg_that_solves_the_wrong_system_is_incorrect(monkeypatch, tmp_path):
    _, case = cpu_case("cg", "host_checked_warm", dict(CG_PROBLEM, drift="2e-6"), monkeypatch, tmp_path)
    case.b[1:] = case.b[:-1].clone()   # every solve a step behind: the solver's copy, not the check's
    verdict = case.check()
    assert not verdict.ok and "step 1 (solved): true relative residual" in verdict.detail


@pytest.mark.parametrize("variant", ["no_reads", "item_every_step", "sync_every_n", "metrics_separate",
                                     "metrics_batched"])
def test_hostsync_peers_pass_their_checks_on_the_cpu(variant, monkeypatch, tmp_path):
    _, case = cpu_case("hostsync", variant, HOSTSYNC_PROBLEM, monkeypatch, tmp_path)
    verdict = case.check()
    assert verdict.ok, verdict.detail
    case.call()   # the running sums go on growing; what the host read follows them
    if variant in ("sync_every_n", "metrics_batched", "metrics_separate"):
        assert case.host[0] == pytest.approx(2 * case.want[0], rel=1e-5)


def test_a_hostsync_loss_off_by_a_little_is_incorrect(monkeypatch, tmp_path):
    _, case = cpu_case("hostsync", "metrics_batched", dict(HOSTSYNC_PROBLEM, steps="5"), monkeypatch, tmp_path)
    case.targets.mul_(1.001)
    verdict = case.check()
    assert not verdict.ok and "device running sums after 5 steps" in verdict.detail


def test_hostsync_async_pinned_is_a_gpu_pattern(monkeypatch, tmp_path):
    torch_case = pytest.importorskip("trainbench.pytorch.case")
    with pytest.raises(torch_case.Unsupported, match="a GPU pattern"):
        cpu_case("hostsync", "async_pinned", dict(HOSTSYNC_PROBLEM, steps="5"), monkeypatch, tmp_path)


def test_a_wrong_case_is_opened_as_incorrect_and_not_kept(monkeypatch, tmp_path):
    torch_case, _ = cpu_case("spmv", "csr", {"graph": "ring8", "rows": "1000"}, monkeypatch, tmp_path)
    from trainbench.pytorch.cases import CASES

    class Wrong(CASES["spmv"]):
        def call(self):
            return super().call() * 1.01
    (bench,) = with_inputs([bench_row("spmv", "csr", {"graph": "ring8", "rows": "1000"})], tmp_path)
    case, said = torch_case.open_case(Wrong, bench)
    assert case is None and said["disposition"] == "incorrect" and said["reason"], said


# ---- on a GPU with torch ------------------------------------------------------------------------------------
def test_quick_peers_on_the_gpu_pass(tmp_path):
    """Every quick CUDA row opened (checked) and timed through the conversation benchsuite holds."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    benchsuite = built_tool("TRAINBENCH_BENCHSUITE", "benches", "benchsuite")
    if benchsuite is None:
        pytest.skip("no built benchsuite (set TRAINBENCH_BENCHSUITE or build build/benches/benchsuite)")
    listed = subprocess.run([benchsuite, "--backend", "cuda,torch", "--quick", "--list", "--format", "json"],
                            capture_output=True, text=True, timeout=120, check=True)
    doc = listing_with_inputs(json.loads(listed.stdout), tmp_path)
    assert len(doc["torch"]["rows"]) == 76
    talk = Conversation(doc, tmp_path, device="cuda")
    outcomes = {}
    for row in doc["torch"]["rows"]:
        said = talk.ask("open", row["name"])
        outcomes[row["name"]] = said.get("disposition"), said.get("reason") or said.get("error")
        if said.get("disposition") == "passed":
            assert talk.ask("time", row["name"], calls=2)["seconds"] > 0
            talk.ask("close", row["name"])
    code, err = talk.end()
    assert code == 0, err[-3000:]
    assert {d for d, _ in outcomes.values()} <= {"passed", "unsupported"}, \
        {name: o for name, o in outcomes.items() if o[0] != "passed"}
