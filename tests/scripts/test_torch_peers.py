"""scripts/torch-peers: the rows of a listing it measures, the samples it writes, the command line
without torch; the inputs benchsuite --torch-inputs writes for the rows (the stages' own generators), the
watching for other load on synthetic /proc ticks; the cases' checks on the CPU against those inputs and, where
torch sees a GPU, the measured path. What benchsuite makes of the samples (summaries, pairs) is
tests/test_cli.cpp's.

fixtures/benchsuite_list_cpu_quick.json is `benchsuite --backend cpu,torch --list --format json --quick`
trimmed to adamw, gradnorm, attention, spmv, cg and collate (stages with their axes and CPU variants' ids and
axes), with its "constants" and "torch" rows.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO, run_script, write_json
from trainbench_tracking import torch_inputs as tpi
from trainbench_tracking import torch_peers as tp
from trainbench_tracking import torch_watch as watch


def listing(name="benchsuite_list_cpu_quick.json"):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


@pytest.fixture(autouse=True)
def generator_constants():
    """The constants the generators and checks take from a listing (benchsuite's, recorded in the fixture)."""
    tpi.use_constants(listing()["constants"])


def live_tool(env_name, *relative):
    """A built trainbench tool: $env_name, else the repository's build; None when neither exists."""
    path = os.environ.get(env_name) or os.path.join(REPO, *relative)
    return path if os.access(path, os.X_OK) else None


def bench_row(stage, variant, problem, device="cpu"):
    label = ",".join(f"{k}={v}" for k, v in problem.items())
    return {"name": f"{stage}/torch/{variant}/{label}", "stage": stage, "variant": variant, "label": label,
            "mirrors": f"{device}/{variant}", "problem": problem}


def listing_with_inputs(doc, tmp_path):
    """`doc` with the inputs of its PyTorch rows, written by benchsuite --torch-inputs (as a run writes them)."""
    benchsuite = live_tool("TRAINBENCH_BENCHSUITE", "build", "benches", "benchsuite")
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
    for name in [m for m in sys.modules if m.startswith("trainbench_tracking.torch_case")]:
        monkeypatch.delitem(sys.modules, name)
    rc = tp.main(["--device", "cpu", "--listing", write_json(tmp_path / "list.json", listing()),
                  "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("torch-peers: error: PyTorch is not importable (")
    assert not (tmp_path / "x.json").exists()


def test_bad_repetitions_exit_2():
    with pytest.raises(SystemExit) as e:
        tp.main(["--listing", "x.json", "--repetitions", "0"])
    assert e.value.code == 2


def test_the_samples_document_is_raw(tmp_path):
    """--out: per row the samples and what the row saw, and nothing derived from them (no median, interval,
    rate or pair: benchsuite computes those)."""
    pytest.importorskip("torch")
    doc = listing()
    doc["torch"]["rows"] = [dict(r, name="spmv/torch/csr/graph=ring8,rows=1000", label="graph=ring8,rows=1000",
                                 problem={"graph": "ring8", "rows": "1000"})
                            for r in doc["torch"]["rows"] if r["stage"] == "spmv" and r["variant"] == "csr"]
    doc = listing_with_inputs(doc, tmp_path)
    out = tmp_path / "samples.json"
    p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "torch-peers"), "--device", "cpu", "--listing",
                        write_json(tmp_path / "list.json", doc), "--repetitions", "3", "--min-time", "0.001",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    written = json.loads(out.read_text())
    assert written["schema"] == "trainbench-torch-samples/1" and written["device"] == "cpu"
    (row,) = written["rows"]
    assert (row["stage"], row["variant"], row["label"], row["mirrors"]) == ("spmv", "csr", "graph=ring8,rows=1000", "cpu/csr")
    assert row["disposition"] == "passed" and len(row["samples_ns"]) == 3 and row["max_error"] >= 0
    assert not {"median_ns", "ci_low_ns", "noisy", "bytes", "gb_per_s", "pairs"} & (set(row) | set(written))


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


# ---- other load: read raw, judged by benchsuite (benches/torch_rows.cpp measure_torch_rows) ----------------
def test_read_cpu_ticks_reads_proc_stat_and_the_processs_own_time(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 1 5 100 4 2 3 6 0 0\ncpu0 5 0 2 50 2 1 1 3 0 0\n")
    own = tmp_path / "self_stat"
    fields = ["S"] + [str(f) for f in range(4, 14)] + ["7", "9"] + ["0"] * 30   # fields 3.., utime 7, stime 9
    own.write_text("1234 (a (b) c) " + " ".join(fields) + "\n")
    assert watch.read_cpu_ticks(str(stat), str(own)) == [27, 131, 16]   # busy, total, own
    assert watch.read_cpu_ticks(str(tmp_path / "missing"), str(own)) is None
    stat.write_text("intr 1 2 3\n")
    assert watch.read_cpu_ticks(str(stat), str(own)) is None
    busy, total, _ = watch.read_cpu_ticks()
    assert 0 <= busy <= total


# ---- the cases on the CPU -----------------------------------------------------------------------------------
def cpu_case(stage, variant, problem, monkeypatch, tmp_path):
    """The case of (stage, variant) on `problem`, on the CPU (GPU patterns included: their logic runs anywhere)."""
    torch_case = pytest.importorskip("trainbench_tracking.torch_case")
    from trainbench_tracking.torch_cases import CASES
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
    from trainbench_tracking.torch_cases import CASES
    big = tp.Bench("", "attention", "naive", "", {"shape": "4x16x4096x128", "causal": "causal", "dtype": "fp32"},
                   "cuda/naive")
    outcome = torch_case.run_bench(CASES["attention"], big, 1, 0.001)
    assert outcome.disposition == "unsupported" and "4 GiB" in outcome.reason


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
    from trainbench_tracking.torch_cases import CASES
    bf16 = torch_case.run_bench(CASES["gradnorm"], tp.Bench("", "gradnorm", "per_tensor", "", dict(small, dtype="bf16"),
                                                            "cpu/per_tensor"), 1, 0.001)
    assert bf16.disposition == "unsupported" and "bf16" in bf16.reason


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
    torch_case = pytest.importorskip("trainbench_tracking.torch_case")
    with pytest.raises(torch_case.Unsupported, match="a GPU pattern"):
        cpu_case("hostsync", "async_pinned", dict(HOSTSYNC_PROBLEM, steps="5"), monkeypatch, tmp_path)


def test_a_cpu_row_carries_what_was_read_at_the_ends_of_its_samples(monkeypatch, tmp_path):
    """The readings, raw, before the first sample and after the last: benchsuite decides whether the row was
    disturbed and takes it again (tests/test_cli.cpp)."""
    torch_case, _ = cpu_case("spmv", "csr", {"graph": "ring8", "rows": "1000"}, monkeypatch, tmp_path)
    from trainbench_tracking.torch_cases import CASES
    reads = iter([[100, 1000, 20], [600, 2000, 220]])
    monkeypatch.setattr(torch_case, "read_cpu_ticks", lambda: next(reads))
    (bench,) = with_inputs([bench_row("spmv", "csr", {"graph": "ring8", "rows": "1000"})], tmp_path)
    outcome = torch_case.run_bench(CASES["spmv"], bench, 3, 0.001)
    assert outcome.disposition == "passed" and len(outcome.samples_ns) == 3, outcome.reason
    record = tp.samples_record(bench, outcome)
    assert record["watch"] == {"cpu_ticks": [[100, 1000, 20], [600, 2000, 220]]}
    assert not {"disturbed", "retaken", "others_share", "throttled_share"} & set(record)


# ---- on a GPU with torch ------------------------------------------------------------------------------------
def test_quick_peers_on_the_gpu_pass(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    benchsuite = live_tool("TRAINBENCH_BENCHSUITE", "build", "benches", "benchsuite")
    if benchsuite is None:
        pytest.skip("no built benchsuite (set TRAINBENCH_BENCHSUITE or build build/benches/benchsuite)")
    listed = subprocess.run([benchsuite, "--backend", "cuda,torch", "--quick", "--list", "--format", "json"],
                            capture_output=True, text=True, timeout=120, check=True)
    out = tmp_path / "samples.json"
    p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "torch-peers"), "--listing",
                        write_json(tmp_path / "list.json", listing_with_inputs(json.loads(listed.stdout), tmp_path)), "--quick",
                        "--repetitions", "3", "--min-time", "0.002", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 74
    assert {r["disposition"] for r in rows} <= {"passed", "unsupported"}, \
        [(r["stage"], r["variant"], r["reason"]) for r in rows if r["disposition"] != "passed"]
