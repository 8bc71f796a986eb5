"""scripts/run-page: one benchsuite run as a self-contained HTML page. Pages built from result files are read back
with html.parser: the claim says what the file holds, every pair of the file is on the forest plot's table with its
numbers, every image is an inline PNG with an alt text, nothing is fetched, a file missing parts still gives every
section, and bad input ends in one line with exit status 2, the last page left intact.

The fixtures: run_page_h100.json is results/nvidia-h100-80gb-hbm3_drv13000_cuda13000/20261126T112953Z_d8743f9e7295.json
(an H100 run with PyTorch's cross pairs, measured apart); run_page_cpu_quick.json is a 2-core CPU `benchsuite --quick`
run with PyTorch's rows (`benchsuite --quick --backend cpu,torch`, 2026-12-03, a 2-vCPU Intel Xeon VM, the whole run:
91 rows, 57 pairs, 24 withheld): trainbench's, PyTorch's and cross pairs, all interleaved, and pairs withheld for
disturbed rows."""

import base64
import copy
import json
import os

import pytest

from conftest import FIXTURES, run_script
from test_tune_page import PageReader
from trainbench.pages.html import significant
from trainbench.pages.run import main, run_page

pytestmark = pytest.mark.python_only

H100 = "run_page_h100.json"
CPU_QUICK = "run_page_cpu_quick.json"
RUNS = [H100, CPU_QUICK]
SECTION_IDS = ["claim", "pairs", "peak", "incorrect", "machine"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TORCH_BACKENDS = ("torch", "torch_cuda")
NOT_PASSED = ("incorrect", "unsupported", "failed")


def read_run(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


def assert_self_contained(text: str) -> PageReader:
    """Every section, inline PNGs with alt texts, and nothing that names an address or runs."""
    page = PageReader(text)
    assert [i for i in SECTION_IDS if i not in page.text_by_id] == []
    for image in page.images:
        assert image["alt"].strip(), "an image without an alt text"
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix)
        assert base64.b64decode(image["src"][len(prefix):], validate=True).startswith(PNG_SIGNATURE)
    lowered = text.lower()
    assert "http://" not in lowered and "https://" not in lowered
    assert "script" not in page.tags and "link" not in page.tags and "@import" not in lowered and "url(" not in lowered
    return page


def page_of(doc) -> PageReader:
    return assert_self_contained(run_page(doc, "run.json"))


def world_of(pair) -> str:
    """The pair's world from its two names' backends ("stage/backend/variant/problem")."""
    torch = [name.split("/")[1] in TORCH_BACKENDS for name in (pair["baseline"], pair["improved"])]
    return "PyTorch" if all(torch) else "PyTorch vs trainbench" if any(torch) else "trainbench C++"


def one_sentence(text: str) -> bool:
    return text.endswith(".") and ". " not in text


# ---- Every run fixture: the claim, the pairs, the ceilings, the machine ----

@pytest.mark.parametrize("name", RUNS)
def test_the_claim_sums_up_the_file(name):
    doc = read_run(name)
    claim = page_of(doc).text("claim")
    pairs = doc.get("pairs", [])
    faster = [p for p in pairs if p["ci_low"] > 1]
    rows = doc["benchmarks"]
    bad = [r for r in rows if r["disposition"] in NOT_PASSED]
    device = doc["context"]["devices"][0]["name"] if any(r["backend"] in ("cuda", "torch_cuda") for r in rows) \
        and doc["context"].get("devices") else doc["context"]["host"]["cpu_model"]
    assert claim.startswith(f"On {device}")
    assert f"{len(pairs)} pairs were judged" in claim
    assert f": {len(faster)} show{'s' if len(faster) == 1 else ''} a speedup beyond noise" in claim
    if faster:
        best = max(faster, key=lambda p: p["ratio"])
        assert f"the largest {best['ratio']:.2f}x" in claim
        assert f"CI {best['ci_low']:.2f}-{best['ci_high']:.2f}" in claim
    if bad:
        assert f"{len(bad)} of {len(rows)} rows were incorrect or skipped" in claim
    else:
        assert f"none of its {len(rows)} rows was incorrect or skipped" in claim
    assert one_sentence(claim), claim


@pytest.mark.parametrize("name", RUNS)
def test_every_pair_of_the_file_is_on_the_forest_plots_table(name):
    doc = read_run(name)
    page = page_of(doc)
    table = page.rows("pairs-table")
    assert len(table) == len(doc["pairs"])
    shown = sorted((r["stage"], r["ratio"], r["CI low"], r["CI high"], r["world"], r["ratio from"]) for r in table)
    expected = sorted((p["stage"], significant(p["ratio"]), significant(p["ci_low"]), significant(p["ci_high"]),
                       world_of(p), "file") for p in doc["pairs"])
    assert shown == expected
    for row, pair in zip(sorted(table, key=lambda r: (r["stage"], r["ratio"], r["CI low"])),
                         sorted(doc["pairs"], key=lambda p: (p["stage"], significant(p["ratio"]),
                                                             significant(p["ci_low"])))):
        assert row["pair"].endswith(pair["label"])
        # The problem both sides ran, or "baseline's -> improved's" where they differ (DDP's buckets: bucket_mb)
        *before, after = row["problem"].split(" -> ")
        assert pair["improved"].endswith(after) and all(pair["baseline"].endswith(b) for b in before)
        assert len(before) == (pair["baseline"].split("/", 3)[-1] != pair["improved"].split("/", 3)[-1])
        assert row["measured"] == (f"interleaved, {pair['rounds']} rounds" if pair.get("rounds") else "apart")
    forest = [i for i in page.images if i["alt"].startswith("Forest plot")]
    assert len(forest) == 1 and f"{len(doc['pairs'])} pairs" in forest[0]["alt"]


@pytest.mark.parametrize("name", RUNS)
def test_pytorchs_pairs_say_pytorch(name):
    doc = read_run(name)
    table = page_of(doc).rows("pairs-table")
    for row in table:
        if row["world"] != "trainbench C++":
            assert "PyTorch" in row["pair"], row
    assert {r["world"] for r in table} == {world_of(p) for p in doc["pairs"]}


@pytest.mark.parametrize("name", RUNS)
def test_the_peak_section_holds_every_rows_share_and_the_ceilings(name):
    doc = read_run(name)
    page = page_of(doc)
    peaks = doc["context"]["peaks"]
    scale = {"B/s": 1e9, "FLOP/s": 1e12}
    ceilings = {r["ceiling"]: r for r in page.rows("ceilings-table")}
    assert set(ceilings) == set(peaks)
    for key, peak in peaks.items():
        assert ceilings[key]["measured"] == significant(peak["value"] / scale[peak["unit"]])
        assert ceilings[key]["set by"] == peak["benchmark"]
    bound = [r for r in doc["benchmarks"] if r["disposition"] == "passed" and r.get("peak_key")]
    table = {r["row"]: r for r in page.rows("peak-table")}
    assert sorted(table) == sorted(r["name"] for r in bound)
    for row in bound:
        assert table[row["name"]]["% of peak"] == significant(row.get("pct_of_peak"))
        assert table[row["name"]]["ceiling"] == row["peak_key"]
        assert ("disturbed" in table[row["name"]]["note"]) == bool(row.get("disturbed"))
    with_share = [r for r in bound if "pct_of_peak" in r]
    bars = [i for i in page.images if i["alt"].startswith("Horizontal bars")]
    assert len(bars) == (1 if with_share else 0)
    if with_share:
        assert f"each of {len(with_share)} rows" in bars[0]["alt"]


@pytest.mark.parametrize("name", RUNS)
def test_the_machine_table_names_the_machine_build_and_flags(name):
    doc = read_run(name)
    context = doc["context"]
    machine = {r["key"]: r["value"] for r in page_of(doc).rows("machine-table")}
    assert machine["date"] == context["date"]
    assert machine["commit (trainbench.git_commit)"] == context["trainbench"]["git_commit"]
    assert machine["trainbench.build_type"] == context["trainbench"]["build_type"]
    assert machine["settings.repetitions"] == str(context["settings"]["repetitions"])
    assert machine["host.cpu_model"] == context["host"]["cpu_model"]
    assert "peaks" not in " ".join(machine), "the ceilings are the peak section's"


def test_the_h100_page_names_the_gpu_and_its_key():
    page = page_of(read_run(H100))
    machine = {r["key"]: r["value"] for r in page.rows("machine-table")}
    assert machine["machine"] == "NVIDIA H100 80GB HBM3"
    assert machine["machine key (derived, results/README.md)"] == "nvidia-h100-80gb-hbm3_drv13000_cuda13000"
    assert page.text("claim") == ("On NVIDIA H100 80GB HBM3, 4 pairs were judged (4 PyTorch vs trainbench): 0 show a "
                                  "speedup beyond noise (interval above 1), 4 a slowdown beyond noise; none of its "
                                  "25 rows was incorrect or skipped.")


def test_a_row_without_a_measured_ceiling_says_so():
    # The H100 run measured the bf16 GEMM's ceiling alone: its fp32 PyTorch rows have a peak_key and no share.
    page = page_of(read_run(H100))
    fp32 = [r for r in page.rows("peak-table") if r["ceiling"] == "cuda.gemm_fp32"]
    assert fp32 and all(r["% of peak"] == "-" and "measured no such ceiling" in r["note"] for r in fp32)


# ---- What the file lacks, and what did not pass ----

def test_an_incorrect_row_is_listed_with_its_message_and_never_shown_as_fast():
    doc = read_run(H100)
    row = next(r for r in doc["benchmarks"] if r["name"] == doc["pairs"][0]["improved"])
    for key in list(row):
        if key in ("samples_ns", "median_ns", "ci_low_ns", "ci_high_ns", "real_time", "cpu_time", "pct_of_peak",
                   "gb_per_s", "tflop_per_s"):
            del row[key]
    row.update(disposition="incorrect", reason="max error 0.5 above the tolerance 0.01", max_error=0.5)
    page = page_of(doc)
    assert page.rows("incorrect-table") == [{"row": row["name"], "world": "trainbench C++", "disposition": "incorrect",
                                             "message": row["reason"], "max error": significant(0.5)}]
    # Both cross pairs against it are withheld, and the row has no bar.
    assert len(page.rows("pairs-table")) == len(doc["pairs"]) - 2
    withheld = page.rows("pairs-withheld-table")
    assert len(withheld) == 2 and all(row["name"] in w["why"] and "incorrect" in w["why"] for w in withheld)
    assert row["name"] not in {r["row"] for r in page.rows("peak-table")}
    claim = page.text("claim")
    assert "2 pairs were judged" in claim and "2 pairs withheld" in claim
    assert "1 of 25 rows were incorrect or skipped (1 incorrect, 0 not supported, 0 failed)" in claim
    assert one_sentence(claim)


def test_unsupported_and_failed_rows_are_named_so():
    doc = read_run(H100)
    doc["benchmarks"].append({"name": "spmv/cuda/stencil/graph=random8", "stage": "spmv", "variant": "stencil",
                              "backend": "cuda", "disposition": "unsupported",
                              "reason": "a random graph has no stencil"})
    doc["benchmarks"].append({"name": "cg/torch_cuda/device_loop/rows=7", "stage": "cg", "variant": "device_loop",
                              "backend": "torch_cuda", "disposition": "failed", "reason": ""})
    rows = page_of(doc).rows("incorrect-table")
    assert [(r["world"], r["disposition"], r["message"]) for r in rows] == [
        ("trainbench C++", "not supported", "a random graph has no stencil"),
        ("PyTorch", "failed", "no reason recorded")]


def test_a_pair_without_a_ratio_gets_one_computed_and_labelled():
    doc = read_run(H100)
    pair = doc["pairs"][0]
    for key in ("ratio", "ci_low", "ci_high", "ci_level"):
        del pair[key]
    row = next(r for r in page_of(doc).rows("pairs-table") if r["ratio from"] != "file")
    assert row["ratio from"] == "computed: baseline_median_ns / improved_median_ns"
    assert row["ratio"] == significant(pair["baseline_median_ns"] / pair["improved_median_ns"])
    assert (row["CI low"], row["CI high"], row["verdict"]) == ("-", "-", "no interval")


def test_the_file_s_withheld_pairs_are_listed_with_why():
    doc = read_run(H100)
    doc["pairs_withheld"] = [{"stage": "gradnorm", "label": "gradnorm: fused vs per-tensor",
                              "baseline": "gradnorm/cpu/per_tensor/n=7", "improved": "gradnorm/cpu/fused/n=7",
                              "why": "gradnorm/cpu/fused/n=7 was disturbed: other processes used 54% of the CPUs"}]
    page = page_of(doc)
    assert [w["why"] for w in page.rows("pairs-withheld-table")] == [doc["pairs_withheld"][0]["why"]]
    assert "1 pair withheld" in page.text("claim")


def test_a_file_with_nothing_but_its_rows_still_has_every_section_saying_why():
    doc = read_run(H100)
    for key in ("pairs", "pairs_withheld"):
        del doc[key]
    del doc["context"]["peaks"]
    for row in doc["benchmarks"]:
        row.pop("pct_of_peak", None)
        row.pop("peak_key", None)
    page = page_of(doc)
    assert page.images == []
    assert "no pairs list" in page.text("pairs")
    assert "no measured ceiling" in page.text("peak") and "no row has a peak_key" in page.text("peak")
    assert "passed its check" in page.text("incorrect")
    assert page.text("claim").startswith("On NVIDIA H100 80GB HBM3, no pair was judged;")


def test_a_bare_cpu_run_without_devices_settings_or_rows():
    doc = {"schema": "trainbench-results/1", "benchmarks": [], "pairs": [],
           "context": {"host": {"cpu_model": "AMD EPYC 7B13", "cores": 2}}}
    page = page_of(doc)
    assert page.text("claim") == ("On AMD EPYC 7B13 (2 cores), no pair was judged; none of its 0 rows was incorrect "
                                  "or skipped.")
    assert "records no judged pair" in page.text("pairs")
    machine = {r["key"]: r["value"] for r in page.rows("machine-table")}
    assert machine["machine key (derived, results/README.md)"] == "amd-epyc-7b13_2c" and machine["date"] == "-"


def test_an_interrupted_run_says_so_in_its_claim():
    doc = read_run(H100)
    doc["context"]["interrupted"] = "SIGTERM"
    claim = page_of(doc).text("claim")
    assert claim.endswith("; the run was stopped early (SIGTERM).") and one_sentence(claim)


# ---- The command line: bad input, the atomic write ----

def run_main(capsys, *args):
    rc = main([str(a) for a in args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def changed(edit):
    """The H100 file's text with `edit(doc)` applied."""
    doc = read_run(H100)
    edit(doc)
    return json.dumps(doc)


def set_in(path, value):
    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


BAD_INPUTS = {
    "not JSON": ('{"schema": "trainbench-results/1", ', "not valid JSON"),
    "empty": ("", "empty file"),
    "another schema": (changed(set_in(["schema"], "trainbench-list/1")), "'schema' is 'trainbench-list/1'"),
    "a disposition unknown": (changed(set_in(["benchmarks", 3, "disposition"], "fast")), "'disposition' is 'fast'"),
    "pairs a string": (changed(set_in(["pairs"], "all of them")), "pairs: expected a list"),
    "a pair a number": (changed(set_in(["pairs", 1], 7)), "pairs[1]: expected a mapping"),
    "a ratio that is text": (changed(set_in(["pairs", 2, "ratio"], "fast")),
                             "pairs[2].ratio: expected a finite number"),
    "a negative interval": (changed(set_in(["pairs", 0, "ci_low"], -0.5)), "pairs[0].ci_low: expected a positive"),
    "a pair without its improved side": (changed(lambda doc: doc["pairs"][3].pop("improved")),
                                         "pairs[3].improved: missing"),
    "a share that is text": (changed(set_in(["benchmarks", 1, "pct_of_peak"], "a third")),
                             "benchmarks[1].pct_of_peak: expected a finite number"),
    "a ceiling without its value": (changed(lambda doc: doc["context"]["peaks"]["cuda.gemm_bf16"].pop("value")),
                                    "context.peaks.cuda.gemm_bf16.value: missing"),
    "peaks a list": (changed(set_in(["context", "peaks"], [1])), "context.peaks: expected a mapping"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_leaves_the_last_page(tmp_path, capsys, name):
    text, expected = BAD_INPUTS[name]
    run = tmp_path / "run.json"
    run.write_text(text)
    out = tmp_path / "run.html"
    out.write_text("the last good page")
    rc, stdout, stderr = run_main(capsys, run, "--out", out)
    assert rc == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("run-page: error: ") and expected in stderr, stderr
    assert "Traceback" not in stderr
    assert out.read_text() == "the last good page"
    assert sorted(os.listdir(tmp_path)) == ["run.html", "run.json"], "a temporary file was left behind"


def test_the_command_writes_the_page(tmp_path, capsys):
    out = tmp_path / "run.html"
    rc, stdout, stderr = run_main(capsys, os.path.join(FIXTURES, H100), "--out", out)
    assert (rc, stderr, stdout) == (0, "", f"run-page: wrote {out}\n")
    assert_self_contained(out.read_text())
    assert os.listdir(tmp_path) == ["run.html"]


def test_the_launcher_runs_and_bad_input_through_it_prints_no_traceback(tmp_path):
    p = run_script("run-page", os.path.join(FIXTURES, H100), "--out", tmp_path / "run.html")
    assert p.returncode == 0, p.stderr
    assert_self_contained((tmp_path / "run.html").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(BAD_INPUTS["a ratio that is text"][0])
    p = run_script("run-page", bad, "--out", tmp_path / "run.html")
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr


def test_a_missing_file_and_an_unwritable_page_are_one_line_each(tmp_path, capsys):
    rc, _, stderr = run_main(capsys, tmp_path / "absent.json", "--out", tmp_path / "run.html")
    assert rc == 2 and "cannot read" in stderr and stderr.count("\n") == 1, stderr
    folder = tmp_path / "run.html"
    folder.mkdir()  # --out names a folder: the rename over it fails
    rc, _, stderr = run_main(capsys, os.path.join(FIXTURES, H100), "--out", folder)
    assert rc == 2 and stderr.count("\n") == 1 and f"{folder}: cannot write the page" in stderr, stderr
    assert os.listdir(tmp_path) == ["run.html"] and os.listdir(folder) == []


def test_the_run_page_does_not_change_the_document_it_is_given():
    doc = read_run(H100)
    before = copy.deepcopy(doc)
    run_page(doc)
    assert doc == before


def test_in_a_stage_trainbenchs_pairs_come_first_then_pytorchs_then_the_cross_pairs():
    doc = read_run(H100)
    big = "shape=4x16x4096x128,causal={},dtype=bf16"
    names = {r["name"] for r in doc["benchmarks"]}
    torch_pair = {"stage": "attention", "label": "torch attention: SDPA flash vs SDPA", "kind": "timed",
                  "baseline": "attention/torch_cuda/sdpa/" + big.format("causal"),
                  "improved": "attention/torch_cuda/sdpa_flash/" + big.format("causal"),
                  "ratio": 0.59, "ci_low": 0.57, "ci_high": 0.61, "ci_level": 0.95, "rounds": 7}
    own_pair = {"stage": "attention", "label": "attention: fused, causal vs full", "kind": "timed",
                "baseline": "attention/cuda/fused/" + big.format("full"),
                "improved": "attention/cuda/fused/" + big.format("causal"),
                "ratio": 1.96, "ci_low": 1.9, "ci_high": 2.02, "ci_level": 0.95, "rounds": 7}
    assert {torch_pair["baseline"], torch_pair["improved"], own_pair["baseline"], own_pair["improved"]} <= names
    doc["pairs"] += [torch_pair, own_pair]
    page = page_of(doc)
    table = page.rows("pairs-table")
    assert [r["world"] for r in table] == ["trainbench C++", "PyTorch"] + ["PyTorch vs trainbench"] * 4
    assert table[1]["pair"] == "PyTorch: torch attention: SDPA flash vs SDPA"
    assert table[0]["problem"] == big.format("full") + " -> " + big.format("causal")
    assert table[1]["measured"] == "interleaved, 7 rounds" and table[1]["verdict"] == "slower beyond noise"
    assert table[0]["verdict"] == "faster beyond noise"
    claim = page.text("claim")
    assert "6 pairs were judged (1 trainbench C++, 1 PyTorch, 4 PyTorch vs trainbench): 1 shows a speedup beyond " \
           "noise (interval above 1), the largest 1.96x (attention: fused, causal vs full, " \
           f"{big.format('full')} -> {big.format('causal')}; 95% CI 1.90-2.02), 5 a slowdown beyond noise" in claim
