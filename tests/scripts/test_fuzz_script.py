"""scripts/fuzz against a stand-in for libFuzzer's targets (fixtures/fake_fuzz_target): what it prints per target
(executions, the corpus before and after, the coverage), a finding's saved input and its exit code, a target that does
not start, --merge into a corpus folder, and bad usage. No clang build is needed: the fake answers as a target would."""

import os
import shutil

import pytest

from conftest import FIXTURES, run_script

pytestmark = pytest.mark.python_only


def fake_build(tmp_path, *targets):
    """A build folder as scripts/fuzz expects one: a CMakeCache.txt and tests/fuzz/TARGET programs (the fake)."""
    build = tmp_path / "build-fuzz"
    (build / "tests" / "fuzz").mkdir(parents=True)
    (build / "CMakeCache.txt").write_text("# fake\n")
    for target in targets:
        shutil.copy(os.path.join(FIXTURES, "fake_fuzz_target"), build / "tests" / "fuzz" / target)
    return build


def corpora(tmp_path, target, files=3):
    root = tmp_path / "corpus"
    (root / target).mkdir(parents=True)
    for k in range(files):
        (root / target / f"seed_{k}").write_text(f"seed {k}\n")
    return root


def test_a_clean_run_says_executions_corpus_and_coverage_and_leaves_the_corpus_alone(tmp_path):
    build, root = fake_build(tmp_path, "fuzz_journal"), corpora(tmp_path, "fuzz_journal")
    r = run_script("fuzz", build, "fuzz_journal", "--seconds", "1", "--corpus", root, env={"FAKE_FUZZ_MODE": "clean"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fuzz_journal: 5000 executions (2500/s)" in r.stdout
    assert "corpus 3 -> 4 inputs, cov 150 ft 320, peak 60 MB: no finding" in r.stdout
    assert sorted(os.listdir(root / "fuzz_journal")) == ["seed_0", "seed_1", "seed_2"], "the run works on a copy"
    assert (build / "fuzz-logs" / "fuzz_journal.log").read_text().startswith("INFO: Seed")


def test_a_finding_prints_what_it_is_and_the_saved_input_and_exits_1(tmp_path):
    build, root = fake_build(tmp_path, "fuzz_workload_yaml"), corpora(tmp_path, "fuzz_workload_yaml")
    r = run_script("fuzz", build, "fuzz_workload_yaml", "--seconds", "1", "--corpus", root,
                   env={"FAKE_FUZZ_MODE": "crash"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FINDING: fuzz finding: parse_workload: nlohmann" in r.stdout
    saved = build / "fuzz-findings" / "fuzz_workload_yaml" / "crash-0123456789abcdef"
    assert f"input: {saved}" in r.stdout and saved.read_bytes() == b"name: caf\xe9\n"
    assert "1 of 1 targets found something" in r.stdout


def test_a_target_that_does_not_start_fails_and_says_why(tmp_path):
    build, root = fake_build(tmp_path, "fuzz_journal"), corpora(tmp_path, "fuzz_journal")
    r = run_script("fuzz", build, "fuzz_journal", "--seconds", "1", "--corpus", root,
                   env={"FAKE_FUZZ_MODE": "no-start"})
    assert r.returncode == 1
    assert "libFuzzer did not start: ParseDictionaryFile: error in line 3" in r.stdout


def test_merge_adds_the_new_inputs_to_the_corpus_folder(tmp_path):
    build, root = fake_build(tmp_path, "fuzz_journal"), corpora(tmp_path, "fuzz_journal")
    r = run_script("fuzz", build, "fuzz_journal", "--seconds", "1", "--corpus", root, "--merge",
                   env={"FAKE_FUZZ_MODE": "clean"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"merged into {root / 'fuzz_journal'}: 1 inputs (10 bytes)" in r.stdout
    assert (root / "fuzz_journal" / "found-by-the-fake").read_text() == "new input\n"


@pytest.mark.parametrize("args, said", [
    (["{tmp}/nowhere"], "is not a CMake build folder"),
    (["{build}", "fuzz_nothing"], "no fuzz target fuzz_nothing (targets: fuzz_allreduce_probe"),
    (["{build}", "fuzz_journal"], "fuzz_journal not built in"),
    (["{build}", "--seconds", "0"], "--seconds 0: give at least 1"),
    (["{build}", "--corpus", "{tmp}/none"], "no such folder"),
])
def test_bad_usage_is_one_line_and_exit_2(tmp_path, args, said):
    build = fake_build(tmp_path)
    r = run_script("fuzz", *[a.format(tmp=tmp_path, build=build) for a in args])
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
