"""scripts/torch-peers: problems, names, work models and generators against benchsuite's, the result file
against the loaders, the command line without torch; the measured path where torch sees a GPU.

fixtures/benchsuite_list*.json are `benchsuite --list --format json --backend all [--quick]` trimmed to the
peers' stages (rows without their `unsupported` text, stages with their axes only). The C++ figures below
(parameter-set and CSR digests, orders, coefficients) were printed by kernels/adamw/param_set.cpp,
kernels/spmv/laplacian.cpp and kernels/runtime/random.h compiled into a small program.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO, run_script, write_json
from trainbench_tracking import torch_peers as tp
from trainbench_tracking.resultfile import load_run, slug

GPU = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0000", "compute_capability": "9.0", "sms": 132,
       "memory_bytes": 85520809984, "l2_bytes": 52428800, "sm_clock_mhz": 1980, "driver_version": 13000,
       "runtime_version": 13000}
TORCH = {"version": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91300, "gpu_name": GPU["name"]}
GPU_KEY = "nvidia-h100-80gb-hbm3_drv13000_cuda13000"


def listing(quick=False):
    with open(os.path.join(FIXTURES, "benchsuite_list_quick.json" if quick else "benchsuite_list.json")) as f:
        return json.load(f)


def live_tool(env_name, *relative):
    """A built trainbench tool: $env_name, else the repository's build; None when neither exists."""
    path = os.environ.get(env_name) or os.path.join(REPO, *relative)
    return path if os.access(path, os.X_OK) else None


# ---- problems and names ------------------------------------------------------------------------------------
@pytest.mark.parametrize("quick", [False, True])
def test_the_copied_axes_are_benchsuites(quick):
    stages = {s["name"]: {a["name"]: a for a in s["axes"]} for s in listing(quick)["stages"]}
    for stage, axes in tp.AXES.items():
        for name, (values, quick_values) in axes.items():
            listed = stages[stage][name]
            assert (tuple(listed["values"]), tuple(listed["quick_values"])) == (values, quick_values), (stage, name)


@pytest.mark.parametrize("quick", [False, True])
def test_builtin_problems_are_those_benchsuite_lists(quick):
    doc = listing(quick)
    for peer in tp.PEERS:
        assert tp.builtin_problems(peer, quick) == tp.problems_from_list(doc, peer), peer
    assert [b.name for b in tp.select_benches(quick, None)] == [b.name for b in tp.select_benches(quick, None, doc)]


def test_a_live_benchsuite_lists_the_same_problems():
    benchsuite = live_tool("TRAINBENCH_BENCHSUITE", "build", "benches", "benchsuite")
    if benchsuite is None:
        pytest.skip("no built benchsuite (set TRAINBENCH_BENCHSUITE or build build/benches/benchsuite)")
    for quick in (False, True):
        doc = tp.benchsuite_list(benchsuite, quick)
        for peer in tp.PEERS:
            assert tp.builtin_problems(peer, quick) == tp.problems_from_list(doc, peer), (peer, quick)


def test_rows_line_up_with_the_cuda_rows_they_mirror():
    cuda_names = {r["name"] for r in listing()["benchmarks"] if r["backend"] == "cuda"}
    benches = tp.select_benches(False, None)
    for b in benches:
        stage, backend, variant, label = b.name.split("/", 3)
        assert (stage, backend, variant) == (b.peer.stage, "torch_cuda", b.peer.variant)
        assert f"{stage}/cuda/{b.peer.mirrors}/{label}" in cuda_names
    names = [b.name for b in benches]
    assert len(names) == len(set(names)) == 71
    assert "adamw/torch_cuda/fused/params=29900000,tensors=200,dtype=fp32" in names
    assert "attention/torch_cuda/sdpa_flash/shape=4x16x4096x128,causal=causal,dtype=bf16" in names
    assert "attention/torch_cuda/sdpa_flash/shape=4x16x4096x128,causal=causal,dtype=fp32" not in names
    assert "launch/torch_cuda/graph/steps=64,kernels_per_step=12,elements=4096" in names
    assert not [n for n in names if n.startswith("collate/") and not n.endswith("compute_us=0")]
    assert len(tp.select_benches(True, None)) == 29


def test_filter_selects_by_name_and_a_filter_matching_nothing_says_what_exists():
    assert [b.name for b in tp.select_benches(False, "launch/torch_cuda/graph")] == \
        ["launch/torch_cuda/graph/steps=64,kernels_per_step=12,elements=4096"]
    with pytest.raises(tp.UsageError, match="matches no benchmark; there are: adamw/torch_cuda/foreach, "):
        tp.select_benches(False, "nothing-like-this")
    with pytest.raises(tp.UsageError, match="not a valid regular expression"):
        tp.select_benches(False, "(")


# ---- work models, sizes and generators against the C++ ----------------------------------------------------
def _listed_work():
    return {r["name"]: r["work"] for r in listing()["benchmarks"] if "work" in r}


def test_adamw_and_spmv_work_models_are_the_stages():
    work = _listed_work()
    checked = 0
    for b in tp.select_benches(False, "adamw|spmv"):
        cpu_variant = {"fused": "fused", "foreach": "foreach", "per_tensor": "per_tensor", "csr": "csr",
                       "spmm_csr": "spmm_csr"}[b.peer.variant]
        listed = work[f"{b.peer.stage}/cpu/{cpu_variant}/{b.label}"]   # the CPU rows' problems are the same
        w = tp.work_model(b)
        assert (w.bytes, w.flops, w.bound) == (listed["bytes"], listed["flops"], listed["bound"]), b.name
        assert (w.footprint if w.footprint is not None else w.bytes) == listed["footprint_bytes"]
        checked += 1
    assert checked == 15
    bf16 = tp.Bench(tp.PEERS[0], "", {"params": "29900000", "tensors": "200", "dtype": "bf16"})
    assert tp.work_model(bf16).bytes == work["adamw/cpu/fused/params=29900000,tensors=200,dtype=bf16"]["bytes"]


def test_attention_work_model_is_the_stages():
    naive = next(p for p in tp.PEERS if p.stage == "attention" and p.variant == "naive")
    rows = [r for r in listing()["benchmarks"] if r["name"].startswith("attention/cpu/naive/")]
    for r in rows:   # the CPU rows are fp32 on cpu_shape; the formula is the CUDA rows'
        problem = {"shape": r["problem"]["cpu_shape"], "causal": r["problem"]["causal"], "dtype": "fp32"}
        w = tp.work_model(tp.Bench(naive, "", problem))
        assert (w.bytes, w.flops) == (r["work"]["bytes"], r["work"]["flops"])
    assert len(rows) == 6
    flash = tp.select_benches(False, "sdpa_flash/shape=4x16x4096x128,causal=causal")[0]
    assert tp.work_model(flash).flops == 4 * 4 * 16 * 4096 * 4096 * 128 / 2
    assert tp.work_model(flash).peak_key == "cuda.gemm_bf16"


@pytest.mark.parametrize("total, tensors, width_first_last, digest", [
    (29900000, 200, (1926444, 1926444), -4165660058717632112),
    (10000000, 200, (655730, 655730), -2319058926275109144),
    (1000, 200, (295, 295), -284522825002621856),
    (1, 1, (1, 1), 1),
    (1000003, 7, (62656, 62656), 5747081157692914945),
    (5000, 3, (312, 313), 312006247016246),
    (29900000, 14, (1868950, 1868950), 8420808817533796260),
])
def test_param_set_sizes_are_param_set_cpps(total, tensors, width_first_last, digest):
    sizes = tp.param_set_sizes(total, tensors)
    h = 0
    for n in sizes:
        h = (h * 1000003 + n) & ((1 << 64) - 1)
    assert (len(sizes), sum(sizes), (sizes[0], sizes[-1])) == (tensors, total, width_first_last)
    assert (h - (1 << 64) if h >= 1 << 63 else h) == digest


def _fnv(row_ptr, col):
    import numpy as np
    h = 1469598103934665603
    for v in np.concatenate([row_ptr.astype(np.uint64), col.astype(np.uint64)]).tolist():
        h = ((h ^ v) * 1099511628211) & ((1 << 64) - 1)
    return h


@pytest.mark.parametrize("graph, n, nnz, digest, weighted_sum", [
    ("ring8", 1000, 9000, 6655044810901173081, 4008.0),
    ("ring8", 12, 108, 929959044072623421, 34.5),
    ("ring8", 4099, 36891, 13347558639695961386, 16370.0),
    ("ring5", 4099, 24593, 14940688371624835796, 16379.5),
    ("ring5", 12, 72, 17843874737329336025, 14.5),
    ("grid3d", 1000, 6400, 15254995133098742185, 4006.0),
    ("grid3d", 4099, 27149, 11981380490049802682, 16376.5),
    ("grid3d", 12, 52, 15522731662415536637, 20.5),
    ("grid2d", 1000, 4872, 9630671235247839803, 4005.0),
    ("grid2d", 12, 46, 1743217863700134335, 40.5),
    ("random8", 1000, 8962, 4207747055382999101, 3598.0),
    ("random8", 4099, 36867, 8354402814833674460, 16298.5),
    ("random8", 12, 86, 12527671037471787475, 22.0),
])
def test_laplacian_is_the_stages_matrix(graph, n, nnz, digest, weighted_sum):
    import numpy as np
    row_ptr, col, val = tp.laplacian_csr(graph, n)
    assert (row_ptr.dtype, col.dtype, val.dtype) == (np.int32, np.int32, np.float64)
    assert val.size == nnz and _fnv(row_ptr, col) == digest
    assert float(np.sum(val * ((np.arange(val.size) % 7) + 1))) == pytest.approx(weighted_sum, abs=1e-6)


def test_laplacian_is_symmetric_with_unit_row_sums():
    import numpy as np
    for graph in ("ring8", "random8", "grid3d", "ring5"):
        row_ptr, col, val = tp.laplacian_csr(graph, 300)
        dense = np.zeros((300, 300))
        rows = np.repeat(np.arange(300), np.diff(row_ptr))
        dense[rows, col] = val
        assert np.array_equal(dense, dense.T), graph
        assert np.allclose(dense.sum(axis=1), 1.0), graph   # A = I + alpha L and L's rows sum to 0
        assert all(np.all(np.diff(col[row_ptr[i]:row_ptr[i + 1]]) > 0) for i in range(300)), graph


@pytest.mark.parametrize("graph, n, nnz", [
    ("ring8", 1048576, 9437184), ("ring8", 4194304, 37748736), ("grid3d", 1048576, 7278058),
    ("grid3d", 4194304, 29204018), ("random8", 4194304, 37748736), ("grid2d", 1048576, 5238784),
    ("ring5", 4099, 24593), ("grid3d", 4099, 27149),
])
def test_nnz_closed_forms_are_the_stages(graph, n, nnz):
    assert tp.laplacian_nnz(graph, n) == nnz


def test_epoch_order_and_launch_window_are_the_stages():
    order = tp.epoch_order(32768, True)
    assert order[:8] == [24747, 20818, 843, 3064, 2779, 16162, 26614, 29777]
    assert order[-4:] == [22422, 4695, 32440, 22602] and sorted(order) == list(range(32768))
    assert tp.epoch_order(5, False) == [0, 1, 2, 3, 4]
    window = tp.launch_window(64, 12)
    assert len(window) == 768
    # weights are 1 - a, a the stage's coefficients 0.570969999, 0.571370602, 0.505604744
    assert [round(1 - w, 9) for _, _, w in window[:3]] == [0.570969999, 0.571370602, 0.505604744]
    assert [(d, s) for d, s, _ in window[:5]] == [(0, 1), (1, 2), (2, 3), (3, 0), (0, 1)]
    assert all(d != s and 0 < w <= 0.5 for d, s, w in window)


# ---- statistics -------------------------------------------------------------------------------------------
def test_summary_is_benchsuites_order_statistic_interval():
    samples = [float(x) for x in (10, 3, 7, 1, 9, 2, 8, 6, 4, 5)]
    s = tp.summarize(samples)
    assert (s.median, s.ci_low, s.ci_high) == (5.5, 2.0, 9.0)
    assert s.ci_level == pytest.approx(1 - 2 * 11 / 1024)   # results/README.md's 0.9786 at 10 samples
    assert s.noisy
    few = tp.summarize([2.0, 1.0, 3.0])
    assert (few.ci_low, few.ci_high, few.ci_level) == (1.0, 3.0, 0.75)
    assert not tp.summarize([100.0, 101.0, 99.0, 100.5, 100.2]).noisy


def test_ratio_is_hodges_lehmann_with_an_interval():
    base = [100.0 + i for i in range(10)]
    ratio, low, high, level = tp.ratio_estimate(base, [b / 2 for b in base])
    assert ratio == pytest.approx(2.0) and low < 2.0 < high and level == 0.95
    ratio, low, high, level = tp.ratio_estimate([2.0, 2.0], [1.0, 1.0])
    assert (ratio, low, high) == (2.0, 2.0, 2.0) and level == pytest.approx(1 - 2 / 6)


# ---- the result file -----------------------------------------------------------------------------------
def fake_document(scale=1.0, incorrect=(), failed=()):
    """Every default row with made-up timings; `incorrect` / `failed`: names given those dispositions."""
    rows = []
    for i, b in enumerate(tp.select_benches(False, None)):
        if b.name in incorrect:
            outcome = tp.Outcome("incorrect", "output[3] = 1, reference 2", 1.0)
        elif b.name in failed:
            outcome = tp.Outcome("failed", "OutOfMemoryError: CUDA out of memory")
        else:
            base = (1000.0 + 37 * i) * scale
            outcome = tp.Outcome("passed", "", 1e-7, [base * (1 + 0.002 * ((k * 7) % 5)) for k in range(10)], 4,
                                 {"us_per_kernel": 1.5} if b.peer.stage == "launch" else {},
                                 "a note" if b.peer.stage == "spmv" else "")
        rows.append(tp.make_row(b, outcome))
    settings = {"mode": "hot", "repetitions": 10, "min_time_s": 0.05, "quick": False, "noise_target": 0.05,
                "backend": "torch_cuda", "filter": "", "device": 0}
    return tp.results_document(tp.make_context([dict(GPU)], dict(TORCH), settings), rows)


def test_the_result_file_reads_back_with_a_gpu_machine_key(tmp_path):
    broken = "adamw/torch_cuda/per_tensor/params=29900000,tensors=200,dtype=fp32"
    oom = "attention/torch_cuda/naive/shape=4x16x4096x128,causal=full,dtype=fp32"
    doc = fake_document(incorrect=[broken], failed=[oom])
    out = tmp_path / "torch.json"
    tp.write_atomically(str(out), json.dumps(doc))
    run = load_run(str(out))
    assert run.machine_key == GPU_KEY
    assert len(run.rows) == 71
    assert all(r.backend == "torch_cuda" for r in run.rows.values())
    assert run.rows[broken].disposition == "incorrect" and run.rows[broken].samples is None
    assert "median_ns" not in run.rows[broken].raw and "samples_ns" not in run.rows[oom].raw
    fused = run.rows["adamw/torch_cuda/fused/params=29900000,tensors=200,dtype=fp32"]
    assert fused.raw["bytes"] == 28 * 29900000 and fused.raw["gb_per_s"] == pytest.approx(28 * 29.9e6 / fused.median)
    assert run.clock_mhz(fused) == 1980.0
    assert run.data["context"]["torch"]["version"] == "2.11.0+cu130"
    assert run.data["context"]["settings"]["backend"] == "torch_cuda"
    graph = run.rows["launch/torch_cuda/graph/steps=64,kernels_per_step=12,elements=4096"].raw
    assert graph["counters"] == {"steps": 64.0, "kernels": 768.0, "us_per_kernel": 1.5}
    labels = {p["label"] for p in doc["pairs"]}
    assert "torch AdamW: fused vs foreach" in labels and "torch AdamW: fused vs per-tensor" not in labels
    assert os.listdir(tmp_path) == ["torch.json"]   # no temporary file left beside it


def test_cpp_validator_accepts_the_file(tmp_path):
    validator = live_tool("TRAINBENCH_VALIDATE_RESULTS", "build", "tests", "validate_results")
    if validator is None:
        pytest.skip("no built validate_results (set TRAINBENCH_VALIDATE_RESULTS or build build/tests)")
    path = write_json(tmp_path / "torch.json", fake_document())
    p = subprocess.run([validator, path, "--all-passed"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "valid, 71 benchmarks, 0 peaks" in p.stdout


def test_compare_and_nightly_read_torch_files(tmp_path, cli):
    a = write_json(tmp_path / "a.json", fake_document())
    b = write_json(tmp_path / "b.json", fake_document(scale=1.3))
    rc, out, err = cli("compare", a, b, "--format", "json")
    assert rc in (0, 1), err
    comparisons = {c["benchmark"]: c for c in json.loads(out)["comparisons"]}
    assert comparisons["launch/torch_cuda/eager/steps=64,kernels_per_step=12,elements=4096"]["backend"] == "torch_cuda"
    rc, out, err = cli("nightly", "--input", a, "--results-dir", tmp_path / "results", "--no-report")
    assert rc == 0, err
    assert os.listdir(tmp_path / "results") == [GPU_KEY]


def test_write_atomically_replaces_the_old_file(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old")
    tp.write_atomically(str(out), "new\n")
    assert out.read_text() == "new\n" and os.listdir(tmp_path) == ["r.json"]


# ---- the command line without torch -------------------------------------------------------------------
def test_list_runs_without_torch():
    p = run_script("torch-peers", "--list", "--quick", "--filter", "launch|alloc")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [b.name for b in tp.select_benches(True, "launch|alloc")]


def test_without_torch_one_message_and_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)   # import torch raises ImportError
    monkeypatch.delitem(sys.modules, "trainbench_tracking.torch_peer_cases", raising=False)
    rc = tp.main(["--filter", "launch", "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("torch-peers: error: PyTorch is not importable (")
    assert not (tmp_path / "x.json").exists()


def test_bad_usage_exits_2(capsys):
    assert tp.main(["--filter", "nothing-like-this"]) == 2
    assert "matches no benchmark" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        tp.main(["--repetitions", "0"])
    assert e.value.code == 2


def test_scripts_compile():
    for name in ("torch_peers.py", "torch_peer_cases.py"):
        subprocess.run([sys.executable, "-m", "py_compile", os.path.join(REPO, "scripts", "trainbench_tracking", name)],
                       check=True)


# ---- on a GPU with torch ------------------------------------------------------------------------------------
def test_quick_run_on_the_gpu_passes_and_reads_back(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    out = tmp_path / "torch.json"
    p = subprocess.run([os.path.join(REPO, "scripts", "torch-peers"), "--quick", "--repetitions", "3", "--min-time",
                        "0.002", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    run = load_run(str(out))
    assert len(run.rows) == 29
    assert {r.disposition for r in run.rows.values()} <= {"passed", "unsupported"}, \
        [(r.name, r.reason) for r in run.rows.values() if r.disposition != "passed"]
    assert run.machine_key.startswith(slug(torch.cuda.get_device_properties(0).name) + "_drv")


# ---- on the CPU with torch ------------------------------------------------------------------------------------
def test_cpu_peers_pass_their_checks_and_read_back(tmp_path):
    """--device cpu: the peers that are no GPU pattern, on the quick problems small enough for a CPU, each
    checked against its reference (a wrong one would be `incorrect`, and the run would exit 1)."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "torch-cpu.json"
    p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "torch-peers"), "--device", "cpu", "--quick",
                        "--repetitions", "2", "--min-time", "0.002", "--filter", "adamw|shape=4x6x256|spmv|batch=64,",
                        "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    run = load_run(str(out))
    assert {r.backend for r in run.rows.values()} == {"torch"}
    assert {r.name.split("/")[0] for r in run.rows.values()} == {"adamw", "attention", "spmv", "collate"}
    assert all(r.disposition == "passed" for r in run.rows.values()), \
        [(r.name, r.reason) for r in run.rows.values() if r.disposition != "passed"]
    assert not any(n.startswith(("launch/", "alloc/")) or "sdpa_flash" in n or "pin" in n for n in run.rows)
    assert run.data["context"]["devices"] == [] and run.data["context"]["torch"]["version"] == torch.__version__
    assert run.machine_key.endswith("c")   # a CPU machine key, "<cpu model>_<cores>c"
