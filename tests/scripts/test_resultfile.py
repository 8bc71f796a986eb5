"""Result files: machine key, validation with clear errors, storage names."""

import copy
import json

import pytest

import synth
from conftest import run_script, write_json
from trainbench.tracking.resultfile import ResultFileError, load_run, parse_run, stored_name


def test_machine_key_gpu_and_cpu():
    assert parse_run(synth.make_run(1, backend="cuda"), "g.json").machine_key == synth.GPU_KEY
    assert parse_run(synth.make_run(1), "c.json").machine_key == synth.CPU_KEY


def test_machine_key_follows_driver_runtime_and_cpu():
    gpu = parse_run(synth.make_run(1, backend="cuda", gpu={"driver": 13010}), "g.json")
    assert gpu.machine_key == "nvidia-h100-80gb-hbm3_drv13010_cuda13000"
    cpu = parse_run(synth.make_run(1, cpu={"cpu_model": "Intel(R) Xeon(R) CPU @ 2.20GHz", "cores": 4}), "c.json")
    assert cpu.machine_key == "intel-r-xeon-r-cpu-2.20ghz_4c"


def test_unavailable_cuda_rows_on_a_machine_without_gpu_make_a_cpu_run():
    doc = synth.make_run(1)
    gpu_row = synth.make_run(1, backend="cuda")["benchmarks"][0]
    for k in [k for k in gpu_row if k.endswith(("_ns", "_time")) or k in ("noisy", "max_error")]:
        del gpu_row[k]
    gpu_row.update(disposition="unsupported", reason="no usable CUDA device")
    doc["benchmarks"].append(gpu_row)
    run = parse_run(doc, "x.json")
    assert run.machine_key == synth.CPU_KEY
    assert run.rows["peak/cuda/triad/n=33554432"].disposition == "unsupported"


def test_stored_name_is_utc_timestamp_and_commit():
    run = parse_run(synth.make_run(1, day=3, commit="ABC1234"), "x.json")
    assert stored_name(run) == "20261004T030000Z_abc1234.json"


def test_rows_not_passed_need_no_timing_and_extra_aggregates_are_skipped():
    doc = synth.make_run(1, dispositions={synth.names()[0]: ("unsupported", "no BLAS")})
    mean_row = copy.deepcopy(doc["benchmarks"][1])
    mean_row["aggregate_name"] = "mean"
    doc["benchmarks"].append(mean_row)
    run = parse_run(doc, "x.json")
    row = run.rows[synth.names()[0]]
    assert (row.disposition, row.reason, row.samples, row.median) == ("unsupported", "no BLAS", None, None)
    assert len(run.rows) == 4


def _drop_samples(d):
    del d["benchmarks"][0]["samples_ns"]


def _negative_sample(d):
    d["benchmarks"][1]["samples_ns"][3] = -5.0


def _string_sample(d):
    d["benchmarks"][1]["samples_ns"][0] = "fast"


def _bad_disposition(d):
    d["benchmarks"][0]["disposition"] = "ok"


def _duplicate(d):
    d["benchmarks"].append(copy.deepcopy(d["benchmarks"][0]))


def _no_name(d):
    del d["benchmarks"][2]["name"]


def _no_host(d):
    del d["context"]["host"]


def _cuda_without_device(d):
    d["benchmarks"][0]["backend"] = "cuda"


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="trainbench-results/0"), "'schema' is 'trainbench-results/0', expected 'trainbench-results/1'"),
    (lambda d: d.pop("benchmarks"), "no 'benchmarks' list"),
    (lambda d: d.pop("context"), "no 'context' object"),
    (_drop_samples, "benchmarks[0] (peak/cpu/triad/n=33554432): a passed row needs a non-empty 'samples_ns' list"),
    (_negative_sample, "'samples_ns' must hold positive finite numbers, found -5.0"),
    (_string_sample, "'samples_ns' must hold positive finite numbers, found 'fast'"),
    (_bad_disposition, "'disposition' is 'ok', expected one of passed, incorrect, unsupported, failed"),
    (_duplicate, "benchmark 'peak/cpu/triad/n=33554432' appears twice"),
    (_no_name, "benchmarks[2] has no 'name'"),
    (_no_host, "context.host.cpu_model and context.host.cores are needed for the machine key"),
    (_cuda_without_device, "has passed cuda rows but context.devices is empty"),
])
def test_malformed_documents_name_the_problem(tmp_path, mutate, message):
    doc = synth.make_run(1)
    mutate(doc)
    path = write_json(tmp_path / "bad.json", doc)
    with pytest.raises(ResultFileError) as e:
        load_run(path)
    assert str(e.value).startswith(path + ": ")
    assert message in str(e.value)


@pytest.mark.parametrize("content, message", [
    ("", "empty file"),
    ('{"schema": "trainbench-results/1", "benchmarks": [', "not valid JSON (Expecting value at line 1, column 51)"),
    ("[1, 2]", "top level is not a JSON object"),
])
def test_unreadable_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ResultFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_run(str(path))


def test_compare_on_a_malformed_file_exits_2_with_one_line(tmp_path):
    good = write_json(tmp_path / "good.json", synth.make_run(1))
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "trainbench-results/1"')
    p = run_script("compare", good, bad)
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1
    assert p.stderr.startswith(f"compare: error: {bad}: not valid JSON")


def test_compare_on_a_missing_file_exits_2(tmp_path, cli):
    good = write_json(tmp_path / "good.json", synth.make_run(1))
    rc, out, err = cli("compare", good, tmp_path / "nope.json")
    assert rc == 2
    assert err == f"compare: error: {tmp_path / 'nope.json'}: cannot read (No such file or directory)\n"


def test_result_round_trips_through_json():
    doc = synth.make_run(5, backend="cuda")
    run = parse_run(json.loads(json.dumps(doc)), "x.json")
    row = run.rows["peak/cuda/triad/n=33554432"]
    assert run.clock_mhz(row) == 1980.0
    assert row.median == pytest.approx(row.raw["median_ns"])
