"""scripts/torch-peers: the rows of a listing it measures, the samples it writes, the command line
without torch; the generators against the C++ stages' (kernels/runtime/random.h and the stages' own), the
watching for other load on synthetic /proc ticks; the cases' checks on the CPU and, where torch sees a GPU,
the measured path. What benchsuite makes of the samples (summaries, pairs) is tests/test_cli.cpp's.

fixtures/benchsuite_list_cpu_quick.json is `benchsuite --backend cpu,torch --list --format json --quick`
trimmed to adamw, gradnorm, attention, spmv, cg and collate (stages with their axes and CPU variants' ids and
axes), with its "constants" and "torch" rows. The C++ figures below (parameter-set
and CSR digests, orders, coefficients) were printed by kernels/adamw/param_set.cpp, kernels/spmv/laplacian.cpp
and kernels/runtime/random.h compiled into a small program.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO, run_script, write_json
from trainbench_tracking import torch_generators as gen
from trainbench_tracking import torch_peers as tp
from trainbench_tracking import torch_watch as watch


def listing(name="benchsuite_list_cpu_quick.json"):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


@pytest.fixture(autouse=True)
def generator_constants():
    """The constants the generators and checks take from a listing (benchsuite's, recorded in the fixture)."""
    gen.use_constants(listing()["constants"])


def live_tool(env_name, *relative):
    """A built trainbench tool: $env_name, else the repository's build; None when neither exists."""
    path = os.environ.get(env_name) or os.path.join(REPO, *relative)
    return path if os.access(path, os.X_OK) else None


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


# ---- generators (the C++ stages' own) -------------------------------------------------------------
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
    sizes = gen.param_set_sizes(total, tensors)
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
    row_ptr, col, val = gen.laplacian_csr(graph, n)
    assert (row_ptr.dtype, col.dtype, val.dtype) == (np.int32, np.int32, np.float64)
    assert val.size == nnz and _fnv(row_ptr, col) == digest
    assert float(np.sum(val * ((np.arange(val.size) % 7) + 1))) == pytest.approx(weighted_sum, abs=1e-6)


def test_laplacian_is_symmetric_with_unit_row_sums():
    import numpy as np
    for graph in ("ring8", "random8", "grid3d", "ring5"):
        row_ptr, col, val = gen.laplacian_csr(graph, 300)
        dense = np.zeros((300, 300))
        rows = np.repeat(np.arange(300), np.diff(row_ptr))
        dense[rows, col] = val
        assert np.array_equal(dense, dense.T), graph
        assert np.allclose(dense.sum(axis=1), 1.0), graph   # A = I + alpha L and L's rows sum to 0
        assert all(np.all(np.diff(col[row_ptr[i]:row_ptr[i + 1]]) > 0) for i in range(300)), graph


def test_epoch_order_and_launch_window_are_the_stages():
    order = gen.epoch_order(32768, True)
    assert order[:8] == [24747, 20818, 843, 3064, 2779, 16162, 26614, 29777]
    assert order[-4:] == [22422, 4695, 32440, 22602] and sorted(order) == list(range(32768))
    assert gen.epoch_order(5, False) == [0, 1, 2, 3, 4]
    window = gen.launch_window(64, 12)
    assert len(window) == 768
    # weights are 1 - a, a the stage's coefficients 0.570969999, 0.571370602, 0.505604744
    assert [round(1 - w, 9) for _, _, w in window[:3]] == [0.570969999, 0.571370602, 0.505604744]
    assert [(d, s) for d, s, _ in window[:5]] == [(0, 1), (1, 2), (2, 3), (3, 0), (0, 1)]
    assert all(d != s and 0 < w <= 0.5 for d, s, w in window)


# ---- other load (benches/harness.cpp check_disturbance) ------------------------------------------------------
def test_others_share_is_the_other_processes_part_of_all_cpu_time():
    before = watch.CpuTicks(busy=100, total=1000, own=20, valid=True)
    # 500 busy ticks in a window of 1000, 200 of them this process's (its torch threads included)
    assert watch.others_share(before, watch.CpuTicks(600, 2000, 220, True)) == pytest.approx(0.3)
    assert watch.others_share(before, watch.CpuTicks(600, 2000, 700, True)) == 0.0     # own ticks sampled high
    assert watch.others_share(before, watch.CpuTicks(1200, 1100, 20, True)) == 1.0     # clamped
    assert watch.others_share(watch.CpuTicks(), watch.CpuTicks(600, 2000, 220, True)) == -1.0   # a read failed
    assert watch.others_share(before, watch.CpuTicks(600, 2000, 220)) == -1.0
    assert watch.others_share(before, watch.CpuTicks(104, 1007, 20, True)) == -1.0     # 7 ticks: too short to tell
    assert watch.others_share(before, watch.CpuTicks(104, 1008, 20, True)) == pytest.approx(0.5)


def test_read_cpu_ticks_reads_proc_stat_and_the_processs_own_time(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 1 5 100 4 2 3 6 0 0\ncpu0 5 0 2 50 2 1 1 3 0 0\n")
    own = tmp_path / "self_stat"
    fields = ["S"] + [str(f) for f in range(4, 14)] + ["7", "9"] + ["0"] * 30   # fields 3.., utime 7, stime 9
    own.write_text("1234 (a (b) c) " + " ".join(fields) + "\n")
    assert watch.read_cpu_ticks(str(stat), str(own)) == watch.CpuTicks(busy=27, total=131, own=16, valid=True)
    assert not watch.read_cpu_ticks(str(tmp_path / "missing"), str(own)).valid
    stat.write_text("intr 1 2 3\n")
    assert not watch.read_cpu_ticks(str(stat), str(own)).valid
    live = watch.read_cpu_ticks()
    assert live.valid and 0 <= live.busy <= live.total


def test_throttled_share_goes_by_the_disturbing_clock_reasons():
    assert watch.throttled_share(None, 0) == -1.0 and watch.throttled_share(0, None) == -1.0
    assert watch.throttled_share(0x1, 0x4) == 0.0   # idle, software power cap: no disturbance
    assert watch.throttled_share(0x20, 0x0) == 1.0 and watch.throttled_share(0x4, 0x40) == 1.0


def share_sequence(window, retakes):
    """A Watch whose first window (two reads) saw `window` and whose n-th retake saw retakes(n)."""
    reads = iter(range(10 ** 6))
    return watch.Watch(lambda: next(reads), lambda a, b: window if a == 0 else retakes((a - 2) // 2), 0.25)


def test_a_disturbed_window_takes_each_sample_again_up_to_three_times():
    taken = iter(range(1, 10 ** 6))
    samples, seen = watch.take_watched(lambda: float(next(taken)), 3, share_sequence(0.1, lambda n: 1.0))
    assert samples == [1.0, 2.0, 3.0] and seen == watch.Watched(0.1, False, 0)   # clean: no retake
    samples, seen = watch.take_watched(lambda: 5.0, 3, share_sequence(-1.0, lambda n: 1.0))
    assert seen == watch.Watched(-1.0, False, 0)                                  # unknown: as clean
    # loaded, then the first sample's second attempt and every later first attempt clean: one extra
    taken = iter(range(1, 10 ** 6))
    samples, seen = watch.take_watched(lambda: float(next(taken)), 3, share_sequence(0.9, lambda n: 0.5 if n == 0 else 0.1))
    assert samples == [5.0, 6.0, 7.0] and seen == watch.Watched(0.1, False, 4)
    # loaded throughout: three attempts each, the last kept, the row disturbed
    taken = iter(range(1, 10 ** 6))
    samples, seen = watch.take_watched(lambda: float(next(taken)), 3, share_sequence(0.9, lambda n: 0.6))
    assert samples == [6.0, 9.0, 12.0] and seen == watch.Watched(0.6, True, 9)
    assert watch.take_watched(lambda: 1.0, 2, None) == ([1.0, 1.0], watch.Watched())   # unwatched


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
    b, drawn = gen.cg_rhs_sequence(n, drift)
    assert b.shape == (17, n) and tuple(drawn[1:4]) == drifts
    assert [float(v) for v in b[0, :5]] == [gen.uniform_at(41, i) for i in range(5)]   # b_0 bit for bit
    t, i = np.arange(17)[:, None], np.arange(n)[None, :]
    # the norms are summed in another order than the C++'s: the same to ~1e-15 of the total
    assert float((b * ((31 * t + i) % 97)).sum()) == pytest.approx(weighted, rel=1e-13)


@pytest.mark.parametrize("steps", sorted(HOSTSYNC_SUMS))
def test_hostsync_reference_is_the_stages(steps):
    pytest.importorskip("numpy")
    assert gen.hostsync_metric_sums(steps, 4096) == pytest.approx(HOSTSYNC_SUMS[steps], rel=1e-13)



# ---- the cases on the CPU -----------------------------------------------------------------------------------
def cpu_case(stage, variant, problem, monkeypatch):
    """The case of (stage, variant) on `problem`, on the CPU (GPU patterns included: their logic runs anywhere)."""
    torch_case = pytest.importorskip("trainbench_tracking.torch_case")
    from trainbench_tracking.torch_cases import CASES
    monkeypatch.setattr(torch_case, "DEVICE", torch_case.torch.device("cpu"))
    env = torch_case.Env()
    env.enter(stage)
    return torch_case, CASES[stage](tp.Bench("", stage, variant, "", problem, "cpu/" + variant), env)


CG_PROBLEM = {"graph": "ring8", "rows": "65536", "alpha": "0.5", "drift": "1e-6"}
HOSTSYNC_PROBLEM = {"steps": "50", "elements": "4096"}


def test_naive_attention_on_the_cpu_declines_what_would_not_fit(monkeypatch):
    """The CUDA problem 4x16x4096x128 holds 4 GiB of fp32 scores: on the CPU the naive peer is unsupported
    there, before anything is allocated; the CPU variants' largest quick problem runs."""
    torch_case, case = cpu_case("attention", "naive", {"cpu_shape": "1x8x1024x64", "causal": "causal", "dtype": "fp32"},
                                monkeypatch)
    assert case.q.shape == (1, 8, 1024, 64) and case.q.dtype == torch_case.torch.float32 and case.causal
    verdict = case.check()
    assert verdict.ok, verdict.detail
    from trainbench_tracking.torch_cases import CASES
    big = tp.Bench("", "attention", "naive", "", {"shape": "4x16x4096x128", "causal": "causal", "dtype": "fp32"},
                   "cuda/naive")
    outcome = torch_case.run_bench(CASES["attention"], big, 1, 0.001)
    assert outcome.disposition == "unsupported" and "4 GiB" in outcome.reason


def test_gradnorm_peers_on_the_cpu_match_the_fp64_reference(monkeypatch):
    """clip_grad_norm_ (foreach=False, foreach=True, and with .item()) against the norm and clip written out in
    fp64, on a 2M-parameter set of the stage's shape; a wrong max_norm is caught; repeated calls keep clipping
    in place, as the stage's do; bf16 is unsupported."""
    small = {"params": "2000000", "tensors": "200", "dtype": "fp32"}
    for variant in ("per_tensor", "foreach", "foreach_item"):
        torch_case, case = cpu_case("gradnorm", variant, small, monkeypatch)
        assert len(case.params) == 200 and sum(q.grad.numel() for q in case.params) == 2000000
        verdict = case.check()
        assert verdict.ok, (variant, verdict.detail)
        norm = case.call()
        assert abs(float(norm) - 1.0) < 1e-4   # about max_norm after the first clip
    torch = torch_case.torch
    _, wrong = cpu_case("gradnorm", "foreach", small, monkeypatch)
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
def test_cg_peers_pass_and_take_the_stages_decisions(variant, monkeypatch):
    _, case = cpu_case("cg", variant, CG_PROBLEM, monkeypatch)
    verdict = case.check()
    assert verdict.ok, verdict.detail
    counters = case.counters()
    assert (counters["skip_rate"], counters["iterations_per_solve"]) == CG_DECISIONS[variant]
    reads = counters["reads_per_solve"]
    # .item() every iteration, or once per block of 8 (and once for the gate)
    assert reads > 20 if variant == "host_checked" else reads <= 3 if variant.startswith("device_loop") else True
    case.call()   # a timed call repeats the window from the cache
    assert case.check().ok


def test_a_cg_that_solves_the_wrong_system_is_incorrect(monkeypatch):
    _, case = cpu_case("cg", "host_checked_warm", dict(CG_PROBLEM, drift="2e-6"), monkeypatch)
    case.b[1:] = case.b[:-1].clone()   # every solve a step behind: the solver's copy, not the check's
    verdict = case.check()
    assert not verdict.ok and "step 1 (solved): true relative residual" in verdict.detail


@pytest.mark.parametrize("variant", ["no_reads", "item_every_step", "sync_every_n", "metrics_separate",
                                     "metrics_batched"])
def test_hostsync_peers_pass_their_checks_on_the_cpu(variant, monkeypatch):
    _, case = cpu_case("hostsync", variant, HOSTSYNC_PROBLEM, monkeypatch)
    verdict = case.check()
    assert verdict.ok, verdict.detail
    case.call()   # the running sums go on growing; what the host read follows them
    if variant in ("sync_every_n", "metrics_batched", "metrics_separate"):
        assert case.host[0] == pytest.approx(2 * gen.hostsync_metric_sums(50, 4096)[0], rel=1e-5)


def test_a_hostsync_loss_off_by_a_little_is_incorrect(monkeypatch):
    _, case = cpu_case("hostsync", "metrics_batched", dict(HOSTSYNC_PROBLEM, steps="5"), monkeypatch)
    case.targets.mul_(1.001)
    verdict = case.check()
    assert not verdict.ok and "device running sums after 5 steps" in verdict.detail


def test_hostsync_async_pinned_is_a_gpu_pattern(monkeypatch):
    torch_case = pytest.importorskip("trainbench_tracking.torch_case")
    with pytest.raises(torch_case.Unsupported, match="a GPU pattern"):
        cpu_case("hostsync", "async_pinned", dict(HOSTSYNC_PROBLEM, steps="5"), monkeypatch)


def fake_cpu_ticks(load):
    """A read_cpu_ticks under which other processes used load(n) of the CPUs between reads n and n + 1
    (100 ticks each, none of them this process's)."""
    reads = {"n": 0, "busy": 0, "total": 0}

    def read():
        ticks = watch.CpuTicks(reads["busy"], reads["total"], 0, True)
        reads["busy"] += round(100 * load(reads["n"]))
        reads["total"] += 100
        reads["n"] += 1
        return ticks
    return read




@pytest.mark.parametrize("load, retaken, disturbed, share", [
    (lambda n: 0.9 if n == 0 else 0.0, 3, False, 0.0),   # loaded while the samples were first taken, then not
    (lambda n: 0.6, 9, True, 0.6),                       # loaded throughout: three attempts per sample
])
def test_a_cpu_row_under_load_takes_its_samples_again(monkeypatch, load, retaken, disturbed, share):
    torch_case, _ = cpu_case("spmv", "csr", {"graph": "ring8", "rows": "1000"}, monkeypatch)
    from trainbench_tracking.torch_cases import CASES
    monkeypatch.setattr(torch_case, "read_cpu_ticks", fake_cpu_ticks(load))
    bench = tp.Bench("spmv/torch/csr/graph=ring8,rows=1000", "spmv", "csr", "graph=ring8,rows=1000",
                     {"graph": "ring8", "rows": "1000"}, "cpu/csr")
    outcome = torch_case.run_bench(CASES["spmv"], bench, 3, 0.001)
    assert outcome.disposition == "passed", outcome.reason
    assert (outcome.retaken, outcome.disturbed, outcome.others_share) == (retaken, disturbed, pytest.approx(share))
    assert len(outcome.samples_ns) == 3 and outcome.throttled_share == -1.0
    record = tp.samples_record(bench, outcome)
    assert (record["retaken"], record["disturbed"], record["others_share"]) == (retaken, disturbed, pytest.approx(share))


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
                        write_json(tmp_path / "list.json", json.loads(listed.stdout)), "--quick",
                        "--repetitions", "3", "--min-time", "0.002", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 74
    assert {r["disposition"] for r in rows} <= {"passed", "unsupported"}, \
        [(r["stage"], r["variant"], r["reason"]) for r in rows if r["disposition"] != "passed"]
