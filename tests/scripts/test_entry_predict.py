"""`autotune --entry ... --ranks N --predict` on the CPU: one rank's share tuned in one process, the gradients'
all-reduce measured by torch.distributed (gloo) on 2 ranks under torchrun (scripts/trainbench/pytorch/
allreduce_probe.py), and, 2 ranks being at hand, the predicted configuration run on them with its error reported.

As in test_ranks.py, the error's size is not checked: two wall-clock times taken at different moments on a shared
2-core machine, and on the CPU the one process has both cores while each rank has one. What holds under any load is:
the model's parts add up, the all-reduce term is the probe's, the check run was made and its error computed from it.
Without torch these tests skip; the autotune run needs a build (ctest entry_predict_pytest passes it in)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SCRIPTS, built_tool

from trainbench.pytorch.allreduce_probe import buckets_from_end

EXAMPLE = os.path.join(REPO, "tuner", "entries", "my_train.py")
TORCH_STEP = os.path.join(SCRIPTS, "torch-step")


def test_buckets_run_from_the_end_as_ddp_fills_them():
    per_bucket = (1 << 20) // 4 // 4  # fp32 values in a quarter of a MB
    buckets = buckets_from_end(1000003, 0.25)
    assert buckets[0] == (1000003 - per_bucket, per_bucket), "the last parameters' gradients first"
    assert buckets[-1] == (0, 1000003 % per_bucket) and len(buckets) == 1000003 // per_bucket + 1
    assert all(begin + length == previous for (begin, length), (previous, _) in zip(buckets[1:], buckets))
    assert buckets_from_end(7, 25) == [(0, 7)]
    assert buckets_from_end(1, 1e-9) == [(0, 1)], "at least one value a bucket"


def test_the_probe_refuses_a_bad_request_and_a_lone_process():
    for request in ("not json", '{"elements": 0}', '{"bucket_mb": 25}'):
        done = subprocess.run([sys.executable, TORCH_STEP, "--allreduce-probe", request], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and "a bad request" in done.stderr, done.stderr
    alone = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, TORCH_STEP, "--allreduce-probe", '{"elements": 8}'], capture_output=True,
                          text=True, timeout=60, env=alone)
    assert done.returncode == 2 and "under python -m torch.distributed.run" in done.stderr, done.stderr


def test_the_probe_on_two_gloo_ranks_prints_one_line_from_rank_0():
    pytest.importorskip("torch")
    request = {"elements": 100003, "bucket_mb": 0.1, "repeats": 3, "backend": "cpu"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           TORCH_STEP, "--allreduce-probe", json.dumps(request)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout
    said = json.loads(lines[0])
    assert said["ranks"] == 2 and said["library"] == "gloo" and said["seconds"] > 0 and said["torch"], said


def autotune_or_skip():
    pytest.importorskip("torch")
    autotune = built_tool("TRAINBENCH_AUTOTUNE", "tuner", "autotune")
    if autotune is None:
        pytest.skip("autotune is not built")
    return autotune


@pytest.mark.parametrize("extra, said", [
    ([], "--predict needs --ranks N with N >= 2"),
    (["--ranks", "1"], "--predict needs --ranks N with N >= 2"),
    (["--ranks", "2", "--batch", "63"], "--ranks 2: the global batch 63 is not a multiple of the ranks"),
])
def test_bad_predict_of_an_entry_is_one_line_and_exit_2(extra, said):
    done = subprocess.run([autotune_or_skip(), "--gpu", "cpu", "--entry", f"{EXAMPLE}:build", "--predict", *extra],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == f"autotune: {said}", done.stderr


def test_two_ranks_predicted_from_one_process_and_checked_on_two(tmp_path):
    out = tmp_path / "predicted.json"
    done = subprocess.run([autotune_or_skip(), "--gpu", "cpu", "--entry", f"{EXAMPLE}:build", "--ranks", "2",
                           "--predict", "--batch", "64", "--switches", "none", "--budget", "50", "--trial-seconds", "1",
                           "--race-rounds", "0", "--format", "json", "--journal", str(tmp_path / "j.jsonl"),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    t = json.loads(out.read_text())["trainbench_autotune"]
    p = t["prediction"]
    assert p["ranks"] == 2 and p["global_batch"] == 64 and p["compute_measured_in"] == "one process", p
    assert "in one process" in p["note"] and "in one process" in t["measured"]["of"]
    assert p["allreduce_measured"]["ranks"] == 2 and p["allreduce_measured"]["library"] == "gloo", p
    # step(N) = compute(G/N samples) + allreduce(N); with N = R = 2 the all-reduce is the probe's own time.
    assert p["step_seconds"] == pytest.approx(p["compute_seconds"] + p["allreduce_seconds"], rel=1e-9)
    assert p["samples_per_s"] == pytest.approx(p["global_batch"] / p["step_seconds"], rel=1e-9)
    assert p["allreduce_seconds"] == pytest.approx(p["allreduce_measured"]["seconds"], rel=1e-9)
    assert p["config"]["micro_batch"] * p["config"]["accumulation"] * p["ranks"] == p["global_batch"]
    assert p["config"]["no_sync"] == ("on" if p["config"]["accumulation"] > 1 else "off")
    # 2 <= --probe-ranks: the predicted configuration ran on 2 real ranks, the error is against that run.
    v = p["validation"]
    assert v["measured_samples_per_s"] > 0
    assert v["error"] == pytest.approx(p["samples_per_s"] / v["measured_samples_per_s"] - 1, rel=1e-9, abs=1e-12)
    assert t["chosen"]["ranks"] == 2 and t["chosen"]["per_rank_batch"] == 32
    assert "torch.distributed (torchrun)" in done.stderr and "tuned in one process" in done.stderr
    assert "autotune: --predict on 2 ranks: predicted " in done.stderr and ", error " in done.stderr, done.stderr
    print(f"--entry --predict on 2 ranks: predicted {p['samples_per_s']:.0f} samples/s, measured "
          f"{v['measured_samples_per_s']:.0f}, error {v['error']:+.1%}")
