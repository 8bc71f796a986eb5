"""scripts/torch-peers: problems, names, work models and generators against benchsuite's, the result file
against the loaders, the command line without torch, the watching for other load on synthetic /proc ticks;
the measured path where torch sees a GPU.

fixtures/benchsuite_list*.json are `benchsuite --list --format json --backend all [--quick]` trimmed to the
peers' stages (rows without their `unsupported` text, stages with their axes only);
fixtures/benchsuite_list_cpu_quick.json is `benchsuite --list --format json --backend cpu --quick` trimmed
to adamw, gradnorm, attention, spmv, cg and collate (stages with their axes and CPU variants' ids and axes). The C++ figures below
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


def cpu_listing():
    with open(os.path.join(FIXTURES, "benchsuite_list_cpu_quick.json")) as f:
        return json.load(f)


@pytest.fixture
def on_cpu(monkeypatch):
    """Rows named as --device cpu names them (backend torch), for one test."""
    monkeypatch.setattr(tp, "BACKEND", tp.BACKENDS["cpu"])


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
        assert b.mirrors == f"cuda/{b.peer.mirrors}" and f"{stage}/{b.mirrors}/{label}" in cuda_names
    names = [b.name for b in benches]
    assert len(names) == len(set(names)) == 134
    assert "adamw/torch_cuda/fused/params=29900000,tensors=200,dtype=fp32" in names
    assert "attention/torch_cuda/sdpa_flash/shape=4x16x4096x128,causal=causal,dtype=bf16" in names
    assert "attention/torch_cuda/sdpa_flash/shape=4x16x4096x128,causal=causal,dtype=fp32" not in names
    assert "launch/torch_cuda/graph/steps=64,kernels_per_step=12,elements=4096" in names
    assert not [n for n in names if n.startswith("collate/") and not n.endswith("compute_us=0")]
    assert "gradnorm/torch_cuda/foreach_item/params=29900000,tensors=200,dtype=fp32" in names
    assert not [n for n in names if n.startswith("gradnorm/") and n.endswith("bf16")]
    assert "cg/torch_cuda/device_loop_lazy/graph=ring8,rows=262144,alpha=0.5,drift=5e-7" in names
    assert "hostsync/torch_cuda/async_pinned/steps=500,elements=4096" in names
    assert len(tp.select_benches(True, None)) == 74


# ---- mirroring the CPU variants (--device cpu --benchsuite) ---------------------------------------------------
CPU_QUICK_ROWS = [
    "adamw/torch/fused/params=10000000,tensors=200,dtype=fp32",
    "adamw/torch/foreach/params=10000000,tensors=200,dtype=fp32",
    "adamw/torch/per_tensor/params=10000000,tensors=200,dtype=fp32",
    "gradnorm/torch/per_tensor/params=29900000,tensors=200,dtype=fp32",
    "gradnorm/torch/foreach/params=29900000,tensors=200,dtype=fp32",
    "gradnorm/torch/foreach_item/params=29900000,tensors=200,dtype=fp32",
    "attention/torch/sdpa/cpu_shape=4x6x256x64,causal=causal",
    "attention/torch/sdpa/cpu_shape=1x8x1024x64,causal=causal",
    "attention/torch/naive/cpu_shape=4x6x256x64",
    "attention/torch/naive/cpu_shape=1x8x1024x64",
    "spmv/torch/csr/graph=ring8,rows=1048576",
    "spmv/torch/spmm_csr/graph=ring8,rows=1048576,rhs=8",
] + [f"cg/torch/{v}/graph=ring8,rows=65536,alpha=0.5,drift={d}"
     for v in ("host_checked", "host_checked_warm", "host_checked_lazy") for d in ("2e-6", "1e-6", "5e-7")] + [
    "collate/torch/per_sample/layout=text_pair,order=shuffled,samples=8192,batch=64,embed_dim=768,seq_len=128",
    "collate/torch/per_sample/layout=text_pair,order=shuffled,samples=8192,batch=4096,embed_dim=768,seq_len=128",
    "collate/torch/index_select/layout=text_pair,order=shuffled,samples=8192,batch=64,embed_dim=768,seq_len=128",
    "collate/torch/index_select/layout=text_pair,order=shuffled,samples=8192,batch=4096,embed_dim=768,seq_len=128",
]


def test_cpu_mirror_takes_the_cpu_variants_problems_and_labels(on_cpu):
    doc = cpu_listing()
    cpu_names = {r["name"] for r in doc["benchmarks"]}
    benches = tp.select_benches(True, None, doc, "cpu")
    assert [b.name for b in benches] == CPU_QUICK_ROWS
    for b in benches:
        stage, backend, variant, label = b.name.split("/", 3)
        assert backend == "torch" and b.mirrors.startswith("cpu/")
        assert f"{stage}/{b.mirrors}/{label}" in cpu_names, b.name   # the benchsuite row it stands beside
    assert {(b.peer.stage, b.peer.variant): b.mirrors for b in benches} == {
        ("adamw", "fused"): "cpu/fused", ("adamw", "foreach"): "cpu/foreach", ("adamw", "per_tensor"): "cpu/per_tensor",
        ("gradnorm", "per_tensor"): "cpu/per_tensor", ("gradnorm", "foreach"): "cpu/multi_tensor",
        ("gradnorm", "foreach_item"): "cpu/multi_tensor",
        ("attention", "sdpa"): "cpu/fused", ("attention", "naive"): "cpu/naive_mask_cached",
        ("spmv", "csr"): "cpu/csr", ("spmv", "spmm_csr"): "cpu/spmm_csr", ("collate", "per_sample"): "cpu/per_sample",
        ("cg", "host_checked"): "cpu/host_checked", ("cg", "host_checked_warm"): "cpu/host_checked_warm",
        ("cg", "host_checked_lazy"): "cpu/host_checked_lazy", ("collate", "index_select"): "cpu/gather"}
    # the GPU patterns have no CPU row: flash attention, CUDA graphs, the caching allocator, pinned copies
    assert not [b for b in benches if b.peer.needs_cuda]
    assert not [b for b in benches if b.peer.stage in ("launch", "alloc", "hostsync") or "pin" in b.peer.variant]
    assert not [b for b in benches if "device_loop" in b.peer.variant]   # no CPU graph variant to stand beside
    # fp32 AdamW only; the CPU attention variants run fp32, and naive_mask_cached (no causal axis) is causal
    assert "adamw/cpu/fused/params=10000000,tensors=200,dtype=bf16" in cpu_names
    naive = next(b for b in benches if b.name == "attention/torch/naive/cpu_shape=1x8x1024x64")
    assert naive.problem == {"cpu_shape": "1x8x1024x64", "dtype": "fp32", "causal": "causal"}
    sdpa = next(b for b in benches if b.peer.variant == "sdpa")
    assert sdpa.problem == {"causal": "causal", "cpu_shape": "4x6x256x64", "dtype": "fp32"}
    collate = next(b for b in benches if b.peer.stage == "collate")
    assert "compute_us" not in collate.problem   # the CPU variants have no compute to overlap


def test_cpu_mirror_work_models_and_peak_keys_are_the_cpu_rows(on_cpu):
    doc = cpu_listing()
    listed = {r["name"]: r["work"] for r in doc["benchmarks"]}
    for b in tp.select_benches(True, None, doc, "cpu"):
        stage, _, _, label = b.name.split("/", 3)
        want = listed[f"{stage}/{b.mirrors}/{label}"]
        w = tp.work_model(b)
        footprint = w.footprint if w.footprint is not None else w.bytes
        assert (w.bytes, w.flops, w.bound, footprint) == \
            (want["bytes"], want["flops"], want["bound"], want["footprint_bytes"]), b.name
        row = tp.make_row(b, tp.Outcome("passed", "", 0.0, [1e6, 1.1e6, 1.05e6], 1))
        assert (row["mirrors"], row["peak_key"], row["backend"]) == (b.mirrors, want["peak_key"], "torch")


def test_cpu_mirror_needs_a_listing_and_filters_by_name(on_cpu):
    with pytest.raises(ValueError):
        tp.select_benches(True, None, None, "cpu")
    doc = cpu_listing()
    assert [b.name for b in tp.select_benches(True, "attention/torch/naive", doc, "cpu")] == \
        ["attention/torch/naive/cpu_shape=4x6x256x64", "attention/torch/naive/cpu_shape=1x8x1024x64"]
    doc["benchmarks"] = [r for r in doc["benchmarks"] if r["variant"] != "naive_mask_cached"]
    with pytest.raises(tp.UsageError, match="benchsuite lists no attention/cpu/naive_mask_cached problems"):
        tp.select_benches(True, None, doc, "cpu")


def test_without_benchsuite_the_cpu_rows_mirror_the_cuda_problems(on_cpu):
    benches = tp.select_benches(True, None)
    assert len(benches) == 27 and all(b.name.split("/")[1] == "torch" for b in benches)
    assert all(b.mirrors == f"cuda/{b.peer.mirrors}" for b in benches)
    assert "attention/torch/naive/shape=4x6x256x64,causal=causal,dtype=fp32" in [b.name for b in benches]


def fake_cpu_benchsuite(tmp_path):
    """A benchsuite whose `--list --format json --backend cpu --quick` prints the CPU fixture (else: exit 2)."""
    path = tmp_path / "benchsuite"
    path.write_text("#!/bin/sh\n"
                    f"[ \"$*\" = '--list --format json --backend cpu --quick' ] || exit 2\n"
                    f"exec cat '{os.path.join(FIXTURES, 'benchsuite_list_cpu_quick.json')}'\n")
    path.chmod(0o755)
    return str(path)


def test_cpu_list_through_benchsuite_runs_without_torch(tmp_path):
    bench = fake_cpu_benchsuite(tmp_path)
    p = run_script("torch-peers", "--device", "cpu", "--quick", "--benchsuite", bench, "--list")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == CPU_QUICK_ROWS
    p = run_script("torch-peers", "--device", "cpu", "--benchsuite", bench, "--list")   # not --quick: exit 2
    assert p.returncode == 2 and "exited 2" in p.stderr


def cpu_mirror_document():
    """Every CPU-mirroring quick row with made-up timings, one of them incorrect."""
    tp.BACKEND = tp.BACKENDS["cpu"]
    try:
        rows = []
        for i, b in enumerate(tp.select_benches(True, None, cpu_listing(), "cpu")):
            if b.peer.variant == "per_tensor":
                outcome = tp.Outcome("incorrect", "parameter tensor 3[0] = 1, reference 2", 1.0)
            else:
                outcome = tp.Outcome("passed", "", 1e-7, [(1000.0 + 37 * i) * (1 + 0.002 * k) for k in range(10)], 4)
            rows.append(tp.make_row(b, outcome))
        settings = {"mode": "hot", "repetitions": 10, "min_time_s": 0.01, "quick": True, "noise_target": 0.05,
                    "backend": "torch", "filter": "", "device": None, "mirrors": "cpu"}
        return tp.results_document(tp.make_context([], {"version": "2.15.0"}, settings), rows)
    finally:
        tp.BACKEND = tp.BACKENDS["cuda"]


def test_the_cpu_mirror_file_reads_back_and_validates(tmp_path):
    path = write_json(tmp_path / "torch-cpu.json", cpu_mirror_document())
    run = load_run(path)
    assert sorted(run.rows) == sorted(CPU_QUICK_ROWS)
    assert {r.raw["mirrors"] for r in run.rows.values()} == {
        "cpu/fused", "cpu/foreach", "cpu/per_tensor", "cpu/multi_tensor", "cpu/naive_mask_cached", "cpu/csr",
        "cpu/spmm_csr", "cpu/per_sample", "cpu/host_checked", "cpu/host_checked_warm", "cpu/host_checked_lazy", "cpu/gather"}
    assert run.machine_key.endswith("c")   # a CPU machine key
    # rows pair by problem, not label: naive_mask_cached's label has no causal axis, its problem is causal
    pairs = {(p["label"], p["baseline"], p["improved"]) for p in cpu_mirror_document()["pairs"]}
    assert ("torch attention: SDPA vs naive", "attention/torch/naive/cpu_shape=1x8x1024x64",
            "attention/torch/sdpa/cpu_shape=1x8x1024x64,causal=causal") in pairs
    assert not [p for p in pairs if p[2].endswith("causal=full")]
    assert ("torch collate: index_select into a reused batch vs per-sample + stack",
            "collate/torch/per_sample/" + CPU_QUICK_ROWS[-1].split("/", 3)[3], CPU_QUICK_ROWS[-1]) in pairs
    validator = live_tool("TRAINBENCH_VALIDATE_RESULTS", "build", "tests", "validate_results")
    if validator is None:
        pytest.skip("no built validate_results (set TRAINBENCH_VALIDATE_RESULTS or build build/tests)")
    p = subprocess.run([validator, path], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"valid, {len(CPU_QUICK_ROWS)} benchmarks" in p.stdout


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


def test_gradnorm_work_model_is_the_stages():
    """3 B-per-element passes (a read for the norm, a read and a write for the scale) of the gradients, for every
    variant; fp32 and bf16 as the CPU rows list them (the CUDA rows have the same formula)."""
    work = _listed_work()
    peers = [p for p in tp.PEERS if p.stage == "gradnorm"]
    assert [(p.variant, p.mirrors, p.mirrors_cpu) for p in peers] == [
        ("per_tensor", "per_tensor", "per_tensor"), ("foreach", "multi_tensor", "multi_tensor"),
        ("foreach_item", "multi_tensor", "multi_tensor")]
    for dtype in ("fp32", "bf16"):
        label = f"params=29900000,tensors=200,dtype={dtype}"
        problem = {"params": "29900000", "tensors": "200", "dtype": dtype}
        for peer in peers:
            listed = work[f"gradnorm/cpu/{peer.mirrors_cpu}/{label}"]
            w = tp.work_model(tp.Bench(peer, label, problem))
            assert (w.bytes, w.flops, w.bound, w.footprint) == \
                (listed["bytes"], listed["flops"], listed["bound"], listed["footprint_bytes"]), (peer, dtype)
    assert {(s, b, i) for s, b, i, _ in tp.PAIRS if s == "gradnorm"} == {
        ("gradnorm", "per_tensor", "foreach"), ("gradnorm", "foreach_item", "foreach"),
        ("gradnorm", "per_tensor", "foreach_item")}


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
    assert len(run.rows) == 134
    assert all(r.backend == "torch_cuda" for r in run.rows.values())
    assert run.rows[broken].disposition == "incorrect" and run.rows[broken].samples is None
    assert run.rows[broken].raw["mirrors"] == "cuda/per_tensor" and run.rows[oom].raw["mirrors"] == "cuda/naive"
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
    assert "torch clip_grad_norm_: foreach vs for-loop" in labels
    assert os.listdir(tmp_path) == ["torch.json"]   # no temporary file left beside it


def test_cpp_validator_accepts_the_file(tmp_path):
    validator = live_tool("TRAINBENCH_VALIDATE_RESULTS", "build", "tests", "validate_results")
    if validator is None:
        pytest.skip("no built validate_results (set TRAINBENCH_VALIDATE_RESULTS or build build/tests)")
    path = write_json(tmp_path / "torch.json", fake_document())
    p = subprocess.run([validator, path, "--all-passed"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "valid, 134 benchmarks, 0 peaks" in p.stdout


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


# ---- other load (benches/harness.cpp check_disturbance) ------------------------------------------------------
def test_others_share_is_the_other_processes_part_of_all_cpu_time():
    before = tp.CpuTicks(busy=100, total=1000, own=20, valid=True)
    # 500 busy ticks in a window of 1000, 200 of them this process's (its torch threads included)
    assert tp.others_share(before, tp.CpuTicks(600, 2000, 220, True)) == pytest.approx(0.3)
    assert tp.others_share(before, tp.CpuTicks(600, 2000, 700, True)) == 0.0     # own ticks sampled high
    assert tp.others_share(before, tp.CpuTicks(1200, 1100, 20, True)) == 1.0     # clamped
    assert tp.others_share(tp.CpuTicks(), tp.CpuTicks(600, 2000, 220, True)) == -1.0   # a read failed
    assert tp.others_share(before, tp.CpuTicks(600, 2000, 220)) == -1.0
    assert tp.others_share(before, tp.CpuTicks(104, 1007, 20, True)) == -1.0     # 7 ticks: too short to tell
    assert tp.others_share(before, tp.CpuTicks(104, 1008, 20, True)) == pytest.approx(0.5)


def test_read_cpu_ticks_reads_proc_stat_and_the_processs_own_time(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 1 5 100 4 2 3 6 0 0\ncpu0 5 0 2 50 2 1 1 3 0 0\n")
    own = tmp_path / "self_stat"
    fields = ["S"] + [str(f) for f in range(4, 14)] + ["7", "9"] + ["0"] * 30   # fields 3.., utime 7, stime 9
    own.write_text("1234 (a (b) c) " + " ".join(fields) + "\n")
    assert tp.read_cpu_ticks(str(stat), str(own)) == tp.CpuTicks(busy=27, total=131, own=16, valid=True)
    assert not tp.read_cpu_ticks(str(tmp_path / "missing"), str(own)).valid
    stat.write_text("intr 1 2 3\n")
    assert not tp.read_cpu_ticks(str(stat), str(own)).valid
    live = tp.read_cpu_ticks()
    assert live.valid and 0 <= live.busy <= live.total


def test_throttled_share_goes_by_the_disturbing_clock_reasons():
    assert tp.throttled_share(None, 0) == -1.0 and tp.throttled_share(0, None) == -1.0
    assert tp.throttled_share(0x1, 0x4) == 0.0   # idle, software power cap: no disturbance
    assert tp.throttled_share(0x20, 0x0) == 1.0 and tp.throttled_share(0x4, 0x40) == 1.0


def share_sequence(window, retakes):
    """A Watch whose first window (two reads) saw `window` and whose n-th retake saw retakes(n)."""
    reads = iter(range(10 ** 6))
    return tp.Watch(lambda: next(reads), lambda a, b: window if a == 0 else retakes((a - 2) // 2), tp.DISTURBED_SHARE)


def test_a_disturbed_window_takes_each_sample_again_up_to_three_times():
    taken = iter(range(1, 10 ** 6))
    samples, seen = tp.take_watched(lambda: float(next(taken)), 3, share_sequence(0.1, lambda n: 1.0))
    assert samples == [1.0, 2.0, 3.0] and seen == tp.Watched(0.1, False, 0)   # clean: no retake
    samples, seen = tp.take_watched(lambda: 5.0, 3, share_sequence(-1.0, lambda n: 1.0))
    assert seen == tp.Watched(-1.0, False, 0)                                  # unknown: as clean
    # loaded, then the first sample's second attempt and every later first attempt clean: one extra
    taken = iter(range(1, 10 ** 6))
    samples, seen = tp.take_watched(lambda: float(next(taken)), 3, share_sequence(0.9, lambda n: 0.5 if n == 0 else 0.1))
    assert samples == [5.0, 6.0, 7.0] and seen == tp.Watched(0.1, False, 4)
    # loaded throughout: three attempts each, the last kept, the row disturbed
    taken = iter(range(1, 10 ** 6))
    samples, seen = tp.take_watched(lambda: float(next(taken)), 3, share_sequence(0.9, lambda n: 0.6))
    assert samples == [6.0, 9.0, 12.0] and seen == tp.Watched(0.6, True, 9)
    assert tp.take_watched(lambda: 1.0, 2, None) == ([1.0, 1.0], tp.Watched())   # unwatched


def cpu_rows(disturbed=(), share=0.4):
    """adamw's three torch CPU rows on one problem; those named in `disturbed` marked so."""
    label = "params=10000000,tensors=200,dtype=fp32"
    peers = [p for p in tp.PEERS if p.stage == "adamw"]
    rows = []
    for k, peer in enumerate(peers):
        watched = {"disturbed": True, "retaken": 30, "others_share": share} if peer.variant in disturbed else \
            {"retaken": 2, "others_share": 0.05}
        outcome = tp.Outcome("passed", "", 1e-7, [1e6 * (k + 1) * (1 + 0.01 * i) for i in range(10)], 1, **watched)
        rows.append(tp.make_row(tp.Bench(peer, label, {"params": "10000000", "tensors": "200", "dtype": "fp32"},
                                         "cpu/" + peer.mirrors_cpu), outcome))
    return rows


def test_rows_carry_what_watching_saw(on_cpu):
    fused, foreach, per_tensor = cpu_rows(disturbed=["fused"])
    assert fused["name"].startswith("adamw/torch/fused/")
    assert (fused["disturbed"], fused["retaken_samples"], fused["others_cpu_share"]) == (True, 30, 0.4)
    assert (foreach["disturbed"], foreach["retaken_samples"], foreach["others_cpu_share"]) == (False, 2, 0.05)
    assert "throttled_share" not in fused
    problem = {"params": "10000000", "tensors": "200", "dtype": "fp32"}
    unknown = tp.make_row(tp.Bench(tp.PEERS[0], "", problem, "cpu/fused"), tp.Outcome("passed", "", 0.0, [1e6], 1))
    assert (unknown["disturbed"], unknown["retaken_samples"]) == (False, 0) and "others_cpu_share" not in unknown
    gpu = tp.make_row(tp.Bench(tp.PEERS[0], "", problem, "cuda/fused"),
                      tp.Outcome("passed", "", 0.0, [1e6], 1, disturbed=True, retaken=3, throttled_share=1.0))
    assert gpu["throttled_share"] == 1.0 and "others_cpu_share" not in gpu
    assert tp.result_text(fused) == "passed (disturbed)" and tp.result_text(foreach) == "passed"
    assert tp.disturbance_text(gpu) == "the GPU was throttled 100% of the time"


def test_a_pair_with_a_disturbed_row_is_withheld(on_cpu, tmp_path):
    rows = cpu_rows(disturbed=["fused"])
    pairs, withheld = tp.make_pairs(rows)
    assert [p["label"] for p in pairs] == ["torch AdamW: foreach vs per-tensor"]
    fused = rows[0]["name"]
    assert withheld == [
        {"stage": "adamw", "label": "torch AdamW: fused vs per-tensor", "baseline": rows[2]["name"], "improved": fused,
         "why": f"{fused} was disturbed: other processes used 40% of the CPUs during its samples"},
        {"stage": "adamw", "label": "torch AdamW: fused vs foreach", "baseline": rows[1]["name"], "improved": fused,
         "why": f"{fused} was disturbed: other processes used 40% of the CPUs during its samples"}]
    # a disturbed baseline withholds as well
    _, withheld = tp.make_pairs(cpu_rows(disturbed=["per_tensor"], share=0.62))
    assert [w["label"] for w in withheld] == ["torch AdamW: fused vs per-tensor", "torch AdamW: foreach vs per-tensor"]
    assert "per_tensor/" in withheld[0]["why"] and "62% of the CPUs" in withheld[0]["why"]
    doc = tp.results_document(tp.make_context([], {"version": "2.11.0"}, {"backend": "torch"}), rows)
    assert doc["pairs_withheld"] == tp.make_pairs(rows)[1]
    text = tp.render_console(rows, doc["pairs"], doc["pairs_withheld"])
    assert "passed (disturbed)" in text and "torch AdamW: fused vs foreach [params=10000000,tensors=200,dtype=fp32]: " \
        "no ratio: " + fused + " was disturbed" in text
    run = load_run(write_json(tmp_path / "torch.json", doc))
    assert run.rows[fused].disturbed and run.rows[fused].disturbance == "disturbed: other processes used 40% of the CPUs"


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
    assert len(run.rows) == 74
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


def test_cpu_run_through_benchsuite_lines_up_with_its_cpu_rows(tmp_path):
    """--device cpu --benchsuite, as `benchsuite --backend cpu,torch` runs it: the CPU variants' quick problems,
    each row passed and named as the benchsuite row of the same label it mirrors. AdamW is left out here for
    time (its check on 10M parameters takes 10-40 s on two busy cores; the test above runs it on the same
    problem)."""
    pytest.importorskip("torch")
    benchsuite = live_tool("TRAINBENCH_BENCHSUITE", "build", "benches", "benchsuite")
    if benchsuite is None:
        pytest.skip("no built benchsuite (set TRAINBENCH_BENCHSUITE or build build/benches/benchsuite)")
    listed = subprocess.run([benchsuite, "--list", "--format", "json", "--backend", "cpu", "--quick"],
                            capture_output=True, text=True, timeout=120, check=True)
    cpu_names = {r["name"] for r in json.loads(listed.stdout)["benchmarks"] if r["backend"] == "cpu"}
    out = tmp_path / "torch-cpu.json"
    p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "torch-peers"), "--device", "cpu", "--quick",
                        "--benchsuite", benchsuite, "--repetitions", "2", "--min-time", "0.002",
                        "--filter", "cpu_shape=4x6x256|spmv/torch/csr|batch=64,|host_checked_lazy/.*drift=1e-6",
                        "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    run = load_run(str(out))
    collate = "layout=text_pair,order=shuffled,samples=8192,batch=64,embed_dim=768,seq_len=128"
    assert sorted(run.rows) == sorted([
        "attention/torch/sdpa/cpu_shape=4x6x256x64,causal=causal", "attention/torch/naive/cpu_shape=4x6x256x64",
        "spmv/torch/csr/graph=ring8,rows=1048576", "collate/torch/per_sample/" + collate,
        "collate/torch/index_select/" + collate, "cg/torch/host_checked_lazy/graph=ring8,rows=65536,alpha=0.5,drift=1e-6"])
    # A pair whose row other processes disturbed is withheld, with why, as every pair is (the machine's
    # load decides that, not the code): formed or withheld for that reason, both pairs are there.
    formed = {p["label"] for p in run.data["pairs"]}
    withheld = {w["label"] for w in run.data.get("pairs_withheld", []) if "disturbed" in w["why"]}
    assert formed | withheld == {
        "torch attention: SDPA vs naive", "torch collate: index_select into a reused batch vs per-sample + stack"}
    assert all(r.disposition == "passed" for r in run.rows.values()), \
        [(r.name, r.reason) for r in run.rows.values() if r.disposition != "passed"]
    for r in run.rows.values():
        stage, backend, _, label = r.name.split("/", 3)
        assert backend == "torch" and r.raw["mirrors"].startswith("cpu/")
        assert f"{stage}/{r.raw['mirrors']}/{label}" in cpu_names, r.name
    assert run.data["context"]["settings"]["mirrors"] == "cpu"


def test_naive_attention_on_the_cpu_declines_what_would_not_fit(monkeypatch, on_cpu):
    """The CUDA problem 4x16x4096x128 holds 4 GiB of fp32 scores: on the CPU the naive peer is unsupported
    there, before anything is allocated; the CPU variants' largest quick problem runs."""
    torch = pytest.importorskip("torch")
    from trainbench_tracking import torch_peer_cases as cases
    monkeypatch.setattr(cases, "DEVICE", torch.device("cpu"))
    naive = next(p for p in tp.PEERS if p.variant == "naive")
    big = tp.Bench(naive, "", {"shape": "4x16x4096x128", "causal": "causal", "dtype": "fp32"}, "cuda/naive")
    outcome = cases.run_bench(big, 1, 0.001)
    assert outcome.disposition == "unsupported" and "4 GiB" in outcome.reason
    cpu = next(b for b in tp.select_benches(True, "naive/cpu_shape=1x8x1024x64", cpu_listing(), "cpu"))
    case = cases.AttentionCase(cpu, cases.Env())
    assert case.q.shape == (1, 8, 1024, 64) and case.q.dtype == torch.float32 and case.causal
    verdict = case.check()
    assert verdict.ok, verdict.detail


def test_gradnorm_peers_on_the_cpu_match_the_fp64_reference(monkeypatch, on_cpu):
    """clip_grad_norm_ (foreach=False, foreach=True, and with .item()) against the norm and clip written out in
    fp64, on a 2M-parameter set of the stage's shape (the 29.9M quick problem's check takes ~10 s per peer on two
    busy cores); a wrong max_norm is caught; repeated calls keep clipping in place, as the stage's do; bf16 is
    unsupported. Then one peer on the CPU listing's quick problem, checked and timed through run_bench."""
    torch = pytest.importorskip("torch")
    from trainbench_tracking import torch_peer_cases as cases
    monkeypatch.setattr(cases, "DEVICE", torch.device("cpu"))
    peers = [p for p in tp.PEERS if p.stage == "gradnorm"]
    small = {"params": "2000000", "tensors": "200", "dtype": "fp32"}
    for peer in peers:
        case = cases.GradNormCase(tp.Bench(peer, "", small, "cpu/" + peer.mirrors_cpu), cases.Env())
        assert len(case.params) == 200 and sum(q.grad.numel() for q in case.params) == 2000000
        verdict = case.check()
        assert verdict.ok, (peer.variant, verdict.detail)
        norm = case.call()
        assert abs(float(norm) - tp_clip_norm(case)) < 1e-3   # about max_norm after the first clip
        assert abs(float(norm) - 1.0) < 1e-4
    wrong = cases.GradNormCase(tp.Bench(peers[1], "", small, "cpu/multi_tensor"), cases.Env())
    wrong.call = lambda: torch.nn.utils.clip_grad_norm_(wrong.params, 2.0, foreach=True)
    verdict = wrong.check()
    assert not verdict.ok and "grad of tensor" in verdict.detail
    bf16 = cases.run_bench(tp.Bench(peers[0], "", dict(small, dtype="bf16"), "cpu/per_tensor"), 1, 0.001)
    assert bf16.disposition == "unsupported" and "bf16" in bf16.reason
    quick = tp.select_benches(True, "gradnorm/torch/foreach_item", cpu_listing(), "cpu")
    assert [b.name for b in quick] == ["gradnorm/torch/foreach_item/params=29900000,tensors=200,dtype=fp32"]
    outcome = cases.run_bench(quick[0], 2, 0.001)
    assert outcome.disposition == "passed", outcome.reason
    row = tp.make_row(quick[0], outcome)
    assert (row["mirrors"], row["peak_key"], row["bytes"]) == ("cpu/multi_tensor", "cpu.triad", 3 * 4 * 29900000.0)


def tp_clip_norm(case):
    """The gradients' 2-norm now, in fp64."""
    return sum(float(q.grad.double().square().sum()) for q in case.params) ** 0.5


# ---- cg and hostsync ---------------------------------------------------------------------------------------
# Printed by a small program over kernels/cg/cg_reference.cpp and kernels/hostsync/hostsync_reference.cpp:
# cg::RhsSequence(n, drift, 16) as sum over t, i of b_t[i] x ((31 t + i) % 97) and its first drawn drifts, and
# hostsync::metric_sums(steps, 4096).
CG_RHS = [(65536, 1e-6, 115987.22915899807, (7.8124999999999993e-07, 1.4062499999999999e-06, 7.1875e-07)),
          (1000, 2e-6, 18765.335320681417, (1.5624999999999999e-06, 2.8124999999999998e-06, 1.4375e-06))]
HOSTSYNC_SUMS = {1: (0.6787837100777645, 0.67267733055632561, 0.33483987309317453),
                 500: (330.89907816882982, 332.12184881715802, 166.65819638631396)}


@pytest.mark.parametrize("n, drift, weighted, drifts", CG_RHS)
def test_cg_right_hand_sides_are_the_stages(n, drift, weighted, drifts):
    np = pytest.importorskip("numpy")
    b, drawn = tp.cg_rhs_sequence(n, drift)
    assert b.shape == (17, n) and tuple(drawn[1:4]) == drifts
    assert [float(v) for v in b[0, :5]] == [tp.uniform_at(41, i) for i in range(5)]   # b_0 bit for bit
    t, i = np.arange(17)[:, None], np.arange(n)[None, :]
    # the norms are summed in another order than the C++'s: the same to ~1e-15 of the total
    assert float((b * ((31 * t + i) % 97)).sum()) == pytest.approx(weighted, rel=1e-13)


@pytest.mark.parametrize("steps", sorted(HOSTSYNC_SUMS))
def test_hostsync_reference_is_the_stages(steps):
    pytest.importorskip("numpy")
    assert tp.hostsync_metric_sums(steps, 4096) == pytest.approx(HOSTSYNC_SUMS[steps], rel=1e-13)


def test_cg_and_hostsync_work_models_are_the_stages():
    work = _listed_work()
    benches = tp.select_benches(False, "^cg/")
    assert len(benches) == 36
    for b in benches:   # the CPU rows list their work on a machine without a GPU; their problems are the same
        listed = work[f"cg/cpu/{b.peer.mirrors.replace('graph', 'host_checked')}/{b.label}"]
        w = tp.work_model(b)
        assert (w.bytes, w.flops, w.bound, w.peak_key) == (0.0, listed["flops"], listed["bound"], ""), b.name
    # hostsync::bytes_per_call: per step the forward's 4 B, the loss's 8 B per element + 12 B, 60 B accumulated;
    # and the reads (4 B per step for item_every_step, 8 B for sync_every_n)
    hostsync = {b.name: tp.work_model(b) for b in tp.select_benches(False, "^hostsync/")}
    assert len(hostsync) == 24
    step = 4 * 4096 + 8 * 4096 + 12 + 60
    assert hostsync["hostsync/torch_cuda/item_every_step/steps=5,elements=4096"].bytes == 5 * step + 20
    assert hostsync["hostsync/torch_cuda/sync_every_n/steps=500,elements=4096"].bytes == 500 * step + 8
    assert hostsync["hostsync/torch_cuda/metrics_separate/steps=50,elements=4096"].counters["syncs"] == 3


def _cpu_case(stage, variant, label_part, monkeypatch):
    """The case of the first built-in problem of (stage, variant) whose label holds label_part, on the CPU
    (GPU patterns included: their logic runs anywhere)."""
    cases = pytest.importorskip("trainbench_tracking.torch_peer_cases")
    monkeypatch.setattr(cases, "DEVICE", cases.torch.device("cpu"))
    monkeypatch.setattr(tp, "BACKEND", tp.BACKENDS["cpu"])
    peer = next(p for p in tp.PEERS if (p.stage, p.variant) == (stage, variant))
    label, problem = next((lb, pb) for lb, pb in tp.builtin_problems(peer, True) if label_part in lb)
    env = cases.Env()
    env.enter(stage)
    return cases, cases.CASES[stage](tp.Bench(peer, label, problem), env)


# The C++ CPU rows' counters on the same problem (benchsuite --quick --backend cpu --filter cg, drift 1e-6):
# iterations per solve 20 cold, 3.0625 warm, 2.125 with the gate, which skips 6 of 16 solves.
CG_DECISIONS = {"host_checked": (0.0, 20.0), "host_checked_warm": (0.0, 3.0625), "host_checked_lazy": (0.375, 2.125),
                "device_loop": (0.0, 20.0), "device_loop_warm": (0.0, 3.0625), "device_loop_lazy": (0.375, 2.125)}


@pytest.mark.parametrize("variant", sorted(CG_DECISIONS))
def test_cg_peers_pass_and_take_the_stages_decisions(variant, monkeypatch):
    _, case = _cpu_case("cg", variant, "drift=1e-6", monkeypatch)
    verdict = case.check()
    assert verdict.ok, verdict.detail
    counters = case.counters(1e6)
    assert (counters["skip_rate"], counters["iterations_per_solve"]) == CG_DECISIONS[variant]
    reads = counters["reads_per_solve"]
    # .item() every iteration, or once per block of 8 (and once for the gate)
    assert reads > 20 if variant == "host_checked" else reads <= 3 if variant.startswith("device_loop") else True
    case.call()   # a timed call repeats the window from the cache
    assert case.check().ok


def test_a_cg_that_solves_the_wrong_system_is_incorrect(monkeypatch):
    _, case = _cpu_case("cg", "host_checked_warm", "drift=2e-6", monkeypatch)
    case.b[1:] = case.b[:-1].clone()   # every solve a step behind: the solver's copy, not the check's
    verdict = case.check()
    assert not verdict.ok and "step 1 (solved): true relative residual" in verdict.detail


@pytest.mark.parametrize("variant", ["no_reads", "item_every_step", "sync_every_n", "metrics_separate",
                                     "metrics_batched"])
def test_hostsync_peers_pass_their_checks_on_the_cpu(variant, monkeypatch):
    _, case = _cpu_case("hostsync", variant, "steps=50,", monkeypatch)
    verdict = case.check()
    assert verdict.ok, verdict.detail
    case.call()   # the running sums go on growing; what the host read follows them
    if variant in ("sync_every_n", "metrics_batched", "metrics_separate"):
        assert case.host[0] == pytest.approx(2 * tp.hostsync_metric_sums(50, 4096)[0], rel=1e-5)


def test_a_hostsync_loss_off_by_a_little_is_incorrect(monkeypatch):
    _, case = _cpu_case("hostsync", "metrics_batched", "steps=5,", monkeypatch)
    case.targets.mul_(1.001)
    verdict = case.check()
    assert not verdict.ok and "device running sums after 5 steps" in verdict.detail


def test_hostsync_async_pinned_is_a_gpu_pattern(monkeypatch):
    cases = pytest.importorskip("trainbench_tracking.torch_peer_cases")
    with pytest.raises(cases.Unsupported, match="a GPU pattern"):
        _cpu_case("hostsync", "async_pinned", "steps=5,", monkeypatch)


def fake_cpu_ticks(load):
    """A read_cpu_ticks under which other processes used load(n) of the CPUs between reads n and n + 1
    (100 ticks each, none of them this process's)."""
    reads = {"n": 0, "busy": 0, "total": 0}

    def read():
        ticks = tp.CpuTicks(reads["busy"], reads["total"], 0, True)
        reads["busy"] += round(100 * load(reads["n"]))
        reads["total"] += 100
        reads["n"] += 1
        return ticks
    return read


@pytest.mark.parametrize("load, retaken, disturbed, share", [
    (lambda n: 0.9 if n == 0 else 0.0, 3, False, 0.0),   # loaded while the samples were first taken, then not
    (lambda n: 0.6, 9, True, 0.6),                       # loaded throughout: three attempts per sample
])
def test_a_cpu_row_under_load_takes_its_samples_again(monkeypatch, on_cpu, load, retaken, disturbed, share):
    torch = pytest.importorskip("torch")
    from trainbench_tracking import torch_peer_cases as cases
    monkeypatch.setattr(cases, "DEVICE", torch.device("cpu"))
    monkeypatch.setattr(cases, "read_cpu_ticks", fake_cpu_ticks(load))
    csr = next(p for p in tp.PEERS if p.variant == "csr")
    bench = tp.Bench(csr, "graph=ring8,rows=1000", {"graph": "ring8", "rows": "1000"}, "cpu/csr")
    outcome = cases.run_bench(bench, 3, 0.001)
    assert outcome.disposition == "passed", outcome.reason
    assert (outcome.retaken, outcome.disturbed, outcome.others_share) == (retaken, disturbed, pytest.approx(share))
    assert len(outcome.samples_ns) == 3 and outcome.throttled_share == -1.0
    row = tp.make_row(bench, outcome)
    assert (row["retaken_samples"], row["disturbed"], row["others_cpu_share"]) == (retaken, disturbed, pytest.approx(share))
    assert tp.result_text(row).startswith("passed") and ("disturbed" in tp.result_text(row)) == disturbed


def test_collate_peers_leave_the_token_rows_layout_out():
    # layout=token_rows (the training step's rows) has no PyTorch peer: none may time a field layout
    # under its label.
    problem = {"layout": "text_pair", "order": "shuffled", "samples": "32768", "batch": "16", "embed_dim": "768",
               "seq_len": "128", "compute_us": "0"}
    collate_peers = [p for p in tp.PEERS if p.stage == "collate"]
    assert collate_peers
    for peer in collate_peers:
        assert peer.accepts(problem), peer.variant
        assert not peer.accepts(dict(problem, layout="token_rows")), peer.variant


# ---- benchsuite hands torch-peers the problems it selected ----------------------------------------------
def test_a_listing_file_gives_the_rows_its_problems(tmp_path, on_cpu):
    """--listing: the problems of the document, not the built-in copy's (here an attention shape no default has)."""
    doc, seen = cpu_listing(), set()
    rows = []
    for b in doc["benchmarks"]:   # every attention problem at one shape, as --axis attention.cpu_shape=... lists it
        if b["stage"] == "attention" and "cpu_shape" in b["problem"]:
            old = b["problem"]["cpu_shape"]
            b = dict(b, name=b["name"].replace(old, "1x2x7x16"), problem=dict(b["problem"], cpu_shape="1x2x7x16"))
            if b["name"] in seen:
                continue
            seen.add(b["name"])
        rows.append(b)
    doc["benchmarks"] = rows
    listing = write_json(tmp_path / "list.json", doc)
    p = run_script("torch-peers", "--device", "cpu", "--quick", "--listing", listing, "--list", "--filter", "attention")
    assert p.returncode == 0, p.stderr
    names = p.stdout.split()
    assert names and all("cpu_shape=1x2x7x16" in n for n in names), names
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something-else"}')
    p = run_script("torch-peers", "--device", "cpu", "--listing", str(bad), "--list")
    assert p.returncode == 2 and "not a benchsuite --list --format json document" in p.stderr
    p = run_script("torch-peers", "--listing", listing, "--benchsuite", "/bin/true", "--list")
    assert p.returncode == 2 and "give one" in p.stderr


def test_benchsuite_hands_the_torch_rows_exactly_its_selection(tmp_path):
    """benchsuite --backend cpu,torch with --axis: the script it starts (a fake here, as TRAINBENCH_TORCH_PEERS)
    receives a listing with the requested shape and none of the defaults, and no --benchsuite to list from."""
    benchsuite = live_tool("TRAINBENCH_BENCHSUITE", "build", "benches", "benchsuite")
    if benchsuite is None:
        pytest.skip("no built benchsuite (set TRAINBENCH_BENCHSUITE or build build/benches/benchsuite)")
    record = tmp_path / "received.json"
    peers = tmp_path / "fake_torch_peers"
    peers.write_text(
        "import json, shutil, sys\n"
        "a = sys.argv[1:]\n"
        "assert '--benchsuite' not in a, a\n"
        f"shutil.copy(a[a.index('--listing') + 1], {str(record)!r})\n"
        "json.dump({'schema': 'trainbench-results/1', 'context': {}, 'benchmarks': [], 'pairs': [],\n"
        "           'pairs_withheld': []}, open(a[a.index('--out') + 1], 'w'))\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\n[ \"$1\" = -c ] && exit 0\nexec {sys.executable} \"$@\"\n")   # imports 'work'
    python.chmod(0o755)
    env = dict(os.environ, TRAINBENCH_TORCH_PEERS=str(peers), TRAINBENCH_PYTHON=str(python))
    p = subprocess.run([benchsuite, "--backend", "cpu,torch", "--filter", "attention/cpu/fused/", "--axis",
                        "attention.cpu_shape=1x2x7x16", "--axis", "attention.causal=causal", "--repetitions", "3",
                        "--min-time", "0.001"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    listed = json.loads(record.read_text())
    shapes = {b["problem"]["cpu_shape"] for b in listed["benchmarks"] if "cpu_shape" in b["problem"]}
    assert shapes == {"1x2x7x16"}, shapes
    assert any(b["name"].startswith("adamw/") for b in listed["benchmarks"]), "the filter is the script's to apply"
