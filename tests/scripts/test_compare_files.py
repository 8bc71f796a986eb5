"""scripts/compare on two result files."""

import json

import synth
from conftest import by_name, run_script, scaled, write_json

PEAK, FUSED, PER_TENSOR, ATTN = synth.names()


def test_a_result_against_itself_is_same_and_exits_0(tmp_path, cli):
    path = write_json(tmp_path / "a.json", synth.make_run(1))
    p = run_script("compare", path, path)
    assert p.returncode == 0, p.stderr
    assert "no confirmed regression (4 SAME, 0 FASTER, 0 SLOWER, 0 INCONCLUSIVE)" in p.stdout
    rc, out, _ = cli("compare", path, path, "--format", "json")
    assert rc == 0
    assert {k: c["verdict"] for k, c in by_name(out).items()} == dict.fromkeys(synth.names(), "SAME")


def test_one_benchmark_30_percent_slower_is_an_unconfirmed_slower_and_exits_0(tmp_path, cli):
    # Two single runs cannot tell a change from the machine's drift: never CONFIRMED REGRESSION.
    doc = synth.make_run(1)
    base = write_json(tmp_path / "a.json", doc)
    new = write_json(tmp_path / "b.json", scaled(doc, 1.3, [PER_TENSOR]))
    p = run_script("compare", base, new)
    assert p.returncode == 0, p.stderr
    assert "no confirmed regression; 1 SLOWER? (unconfirmed) (3 SAME, 0 FASTER, 1 SLOWER, 0 INCONCLUSIVE)" in p.stdout
    assert "CONFIRMED REGRESSION" not in p.stdout
    line = next(line for line in p.stdout.splitlines() if line.startswith(PER_TENSOR))
    assert "+30.0%" in line and "SLOWER?" in line and "unconfirmed: two single runs" in line
    assert "scripts/compare --interleave OLD_BENCHSUITE NEW_BENCHSUITE" in p.stdout
    assert "scripts/nightly --confirm-with" in p.stdout
    rc, out, _ = cli("compare", base, new, "--format", "json")
    res = by_name(out)
    assert rc == 0 and json.loads(out)["exit_code"] == 0
    assert res[PER_TENSOR]["verdict"] == "SLOWER" and res[PER_TENSOR]["confirmed_regression"] is False
    assert res[PER_TENSOR]["unconfirmed_slower"] is True
    assert [res[k]["verdict"] for k in (PEAK, FUSED, ATTN)] == ["SAME"] * 3


def test_fail_on_unconfirmed_makes_an_unconfirmed_slower_exit_1(tmp_path, cli):
    doc = synth.make_run(1)
    base = write_json(tmp_path / "a.json", doc)
    new = write_json(tmp_path / "b.json", scaled(doc, 1.3, [PER_TENSOR]))
    p = run_script("compare", base, new, "--fail-on-unconfirmed")
    assert p.returncode == 1, p.stderr
    assert "SLOWER?" in p.stdout and "CONFIRMED REGRESSION" not in p.stdout
    rc, out, _ = cli("compare", base, new, "--fail-on-unconfirmed", "--format", "json")
    assert rc == 1 and json.loads(out)["exit_code"] == 1
    rc, _, _ = cli("compare", base, base, "--fail-on-unconfirmed")   # nothing slower: 0
    assert rc == 0


def test_a_history_folder_as_the_second_argument_says_which_argument_takes_it(tmp_path, cli):
    folder = tmp_path / "amd-epyc-7b13_2c"
    folder.mkdir()
    a = write_json(tmp_path / "a.json", synth.make_run(1))
    rc, out, err = cli("compare", a, folder)
    assert rc == 2 and out == ""
    assert "Is a directory" not in err
    assert f"NEW ({folder}) is a folder" in err and "a history folder" in err and "BASELINE, the first argument" in err
    assert f"compare {folder} {a}" in err


def test_independent_runs_of_the_same_code_are_same(cli, tmp_path):
    for seed in range(10):
        a = write_json(tmp_path / f"a{seed}.json", synth.make_run(seed))
        b = write_json(tmp_path / f"b{seed}.json", synth.make_run(seed + 100))
        rc, out, _ = cli("compare", a, b, "--format", "json")
        assert rc == 0
        assert {c["verdict"] for c in by_name(out).values()} <= {"SAME", "INCONCLUSIVE"}


def test_faster_is_not_a_failure(cli, tmp_path):
    doc = synth.make_run(1)
    rc, out, _ = cli("compare", write_json(tmp_path / "a.json", doc),
                     write_json(tmp_path / "b.json", scaled(doc, 0.6, ["adamw"])), "--format", "json")
    res = by_name(out)
    assert rc == 0
    assert (res[FUSED]["verdict"], res[PER_TENSOR]["verdict"], res[PEAK]["verdict"]) == ("FASTER", "FASTER", "SAME")


def test_threshold_per_stage(cli, tmp_path):
    doc = synth.make_run(1)
    a = write_json(tmp_path / "a.json", doc)
    b = write_json(tmp_path / "b.json", scaled(doc, 1.3, ["peak", "attention"]))
    rc, out, _ = cli("compare", a, b, "--threshold", "peak=40", "--format", "json")
    res = by_name(out)
    assert rc == 0
    assert (res[PEAK]["verdict"], res[PEAK]["threshold"], res[ATTN]["verdict"]) == ("SAME", 0.4, "SLOWER")
    rc, out, _ = cli("compare", a, b, "--threshold", "40", "--threshold", "attention=50%")
    assert rc == 0
    assert "threshold 50%" in out


def test_bad_threshold_is_bad_usage(cli, tmp_path):
    a = write_json(tmp_path / "a.json", synth.make_run(1))
    rc, _, err = cli("compare", a, a, "--threshold", "peak=fast")
    assert rc == 2
    assert "not a percentage: 'fast'" in err


def test_markdown_for_a_pull_request(cli, tmp_path):
    doc = synth.make_run(1)
    md_file = tmp_path / "comment.md"
    rc, out, _ = cli("compare", write_json(tmp_path / "a.json", doc),
                     write_json(tmp_path / "b.json", scaled(doc, 1.3, [PEAK])), "--format", "markdown",
                     "--markdown", md_file)
    assert rc == 0
    assert out.startswith("### trainbench nightly: no confirmed regression; 1 SLOWER? (unconfirmed)\n")
    assert f"| `{PEAK}` | 61" in out and "| SLOWER? | unconfirmed: two single runs |" in out
    assert "<details><summary>3 benchmarks SAME</summary>" in out
    assert md_file.read_text() == out


def test_rows_that_did_not_pass_are_shown_never_compared(cli, tmp_path):
    base = synth.make_run(1, dispositions={FUSED: ("failed", "out of memory")})
    new = scaled(synth.make_run(1, dispositions={PEAK: ("incorrect", "max error 0.1")}), 1.5)
    del new["benchmarks"][3]                                   # attention: gone from the new run
    rc, out, _ = cli("compare", write_json(tmp_path / "a.json", base), write_json(tmp_path / "b.json", new),
                     "--format", "json")
    res = by_name(out)
    assert rc == 0                                             # per_tensor is 50% slower: unconfirmed
    assert (res[PEAK]["status"], res[PEAK]["verdict"], res[PEAK]["disposition"]) == ("not-passed", None, "incorrect")
    assert res[PEAK]["reason"] == "max error 0.1"
    assert (res[FUSED]["status"], res[FUSED]["verdict"]) == ("new", None)
    assert (res[ATTN]["status"], res[ATTN]["verdict"]) == ("missing", None)
    assert res[PER_TENSOR]["verdict"] == "SLOWER"
    rc, out, _ = cli("compare", tmp_path / "a.json", tmp_path / "b.json")
    line = next(line for line in out.splitlines() if line.startswith(PEAK))
    assert "not compared" in line and "incorrect: max error 0.1 (no timing)" in line


def test_too_few_repetitions_are_inconclusive(cli, tmp_path):
    doc = synth.make_run(1, repetitions=3)
    a, b = write_json(tmp_path / "a.json", doc), write_json(tmp_path / "b.json", scaled(doc, 1.3))
    rc, out, _ = cli("compare", a, b, "--format", "json")
    assert rc == 0
    assert {c["verdict"] for c in by_name(out).values()} == {"INCONCLUSIVE"}
    assert by_name(out)[PEAK]["notes"] == ["too few samples (3 new, 3 baseline; need 5)"]


def test_a_slowdown_explained_by_the_clock_is_the_environment(cli, tmp_path):
    doc = synth.make_run(1, backend="cuda")
    a = write_json(tmp_path / "a.json", doc)
    throttled = write_json(tmp_path / "b.json", scaled(doc, 1980 / 1500, clock_mhz=1500))
    rc, out, _ = cli("compare", a, throttled, "--format", "json")
    res = by_name(out)
    assert rc == 0
    for c in res.values():
        assert (c["verdict"], c["confirmed_regression"], c["environment"]) == ("SLOWER", False, "SM clock 1980 -> 1500 MHz")
    worse = write_json(tmp_path / "c.json", scaled(scaled(doc, 1980 / 1500, clock_mhz=1500), 1.3, ["adamw"]))
    rc, out, _ = cli("compare", a, worse, "--format", "json")
    assert rc == 0
    res = by_name(out)
    peak, fused, per_tensor, attn = synth.names("cuda")
    assert all(res[k]["unconfirmed_slower"] and res[k]["environment"] is None for k in (fused, per_tensor))
    assert {res[k]["environment"] for k in (peak, attn)} == {"SM clock 1980 -> 1500 MHz"}


def test_cpu_clock_is_used_for_cpu_rows(cli, tmp_path):
    doc = synth.make_run(1)
    rc, out, _ = cli("compare", write_json(tmp_path / "a.json", doc),
                     write_json(tmp_path / "b.json", scaled(doc, 2450 / 2000, clock_mhz=2000)), "--format", "json")
    assert rc == 0
    assert {c["environment"] for c in by_name(out).values()} == {"CPU clock 2450 -> 2000 MHz"}


def test_runs_of_different_machines_are_not_compared(cli, tmp_path):
    a = write_json(tmp_path / "a.json", synth.make_run(1))
    b = write_json(tmp_path / "b.json", scaled(synth.make_run(1, cpu={"cpu_model": "Intel Xeon Platinum 8480+"}), 1.3,
                                                 ["adamw"]))
    rc, out, err = cli("compare", a, b)
    assert rc == 2 and out == ""
    assert "the runs are from different machines (amd-epyc-7b13_2c vs intel-xeon-platinum-8480_2c)" in err
    rc, out, _ = cli("compare", a, b, "--allow-machine-mismatch", "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["confirmed_regressions"] == 0
    assert {c["benchmark"]: c["verdict"] for c in doc["comparisons"]} == {PEAK: "SAME", FUSED: "SLOWER",
                                                                          PER_TENSOR: "SLOWER", ATTN: "SAME"}


def test_filter(cli, tmp_path):
    doc = synth.make_run(1)
    a, b = write_json(tmp_path / "a.json", doc), write_json(tmp_path / "b.json", scaled(doc, 1.3, [PEAK]))
    rc, out, _ = cli("compare", a, b, "--filter", "^adamw", "--format", "json")
    assert rc == 0 and sorted(by_name(out)) == sorted([FUSED, PER_TENSOR])
    rc, _, err = cli("compare", a, b, "--filter", "(")
    assert rc == 2 and "--filter is not a valid regular expression" in err
