"""An entry's candidate on two ranks of torch.distributed (gloo on the CPU), in two processes of this test: DDP with
each switch value passes the first-step check against one process on both ranks' samples, no_sync on and off alike;
a loss that depends on the split (batch norm) is named by it; static_graph with no_sync is refused before it runs.
Without torch these tests skip."""

import os
import socket

import pytest

from conftest import REPO

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

ENTRIES = os.path.join(REPO, "tests", "scripts", "entries")
RANKED = os.path.join(ENTRIES, "ranked_data.py")
CANDIDATES = [{"no_sync": "on"}, {"no_sync": "off"}, {"bucket_mb": "5", "gradient_as_bucket_view": "on"},
              {"bucket_mb": "100"}, {"static_graph": "on", "no_sync": "off"},
              {"parallel": "fsdp", "no_sync": "on"}, {"parallel": "fsdp", "no_sync": "off"},
              {"parallel": "fsdp_no_reshard", "no_sync": "on"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, spec, accumulation, results, optimizer="per_tensor", candidates=None):
    import sys
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from trainbench.pytorch import distributed as td
    from trainbench.pytorch import entry as te
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    cpu = torch.device("cpu")
    td.join(cpu)
    try:
        said = []
        for switches in candidates or CANDIDATES:
            e = te.build_entry(spec, 4, cpu, rank=rank, world_size=world)
            stream = te.cycle(e.batches)
            micro = [next(stream) for _ in range(accumulation)]
            _, why = td.replicate_checked(e, cpu, switches, micro, optimizer)
            said.append(why)
        results.put((rank, said))
    finally:
        dist.destroy_process_group()


def run_ranks(spec, accumulation=2, world=2, optimizer="per_tensor", candidates=None):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, spec, accumulation, results, optimizer, candidates)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in range(world))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    return got


@pytest.mark.python_only
def test_ddp_candidates_pass_the_first_step_check_against_one_process():
    got = run_ranks(f"{RANKED}:loader")
    for rank, said in got.items():
        assert said == [None] * len(CANDIDATES), (rank, said)


@pytest.mark.python_only
def test_fsdp2_over_repeated_blocks_with_adamw_and_clipping_passes_the_check():
    """FSDP2's shards gathered for the comparison, AdamW's and the clipping's norms over sharded gradients."""
    got = run_ranks(f"{RANKED}:blocks", optimizer="foreach")
    for rank, said in got.items():
        assert said == [None] * len(CANDIDATES), (rank, said)


@pytest.mark.python_only
def test_a_lightning_module_on_two_ranks_passes_the_check_with_ddp_and_fsdp2():
    """Its training_step runs inside DDP's and FSDP2's forward (distributed.with_loss), though it calls its layers,
    not its own forward."""
    pytest.importorskip("lightning")
    candidates = [{"no_sync": "on"}, {"parallel": "fsdp", "no_sync": "on"}]
    got = run_ranks(os.path.join(REPO, "tuner", "entries", "lightning_module.py") + ":build", candidates=candidates,
                    optimizer="foreach")
    for rank, said in got.items():
        assert said == [None] * len(candidates), (rank, said)


@pytest.mark.python_only
def test_fsdp2_shards_each_repeated_block():
    import sys
    sys.path.insert(0, ENTRIES)
    from ranked_data import Blocks
    from trainbench.pytorch import distributed as td
    model = Blocks(depth=4)
    assert td.repeated_blocks(model) == list(model.blocks)
    assert td.repeated_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2))) == [], "no blocks: the whole model alone"


@pytest.mark.python_only
def test_a_loss_that_depends_on_the_split_over_ranks_is_named():
    got = run_ranks(f"{RANKED}:batch_norm", accumulation=1)
    for rank, said in got.items():
        for why in said:
            assert why and "depends on the split over ranks" in why and "one process on the 2 ranks' samples" in why, \
                (rank, why)


@pytest.mark.python_only
def test_static_graph_with_no_sync_is_refused_with_the_reason():
    from trainbench.pytorch import distributed as td
    said = td.refusal({"static_graph": "on", "no_sync": "on"})
    assert said and "no_sync=on" in said and "static_graph=on" in said
    assert td.refusal({"static_graph": "on"}) is None, "no_sync is off unless a candidate turns it on"
    assert td.refusal({"no_sync": "on"}) is None
    said = td.refusal({"parallel": "fsdp", "bucket_mb": "5"})
    assert said == "bucket_mb=5 is DDP's; parallel=fsdp shards the model with FSDP2 instead", said
    assert td.refusal({"parallel": "fsdp", "bucket_mb": "25", "no_sync": "on"}) is None, "DDP's defaults are no choice"



# ---- the worker of an entry as torchrun starts it: rank 0 speaks, every rank runs the candidate -----------------
def ranked_worker(spec, ranks=2):
    """scripts/torch-step --serve under `python -m torch.distributed.run --standalone --nproc-per-node RANKS`, over
    pipes as autotune runs it (a group even of one rank, as autotune --ranks 1 --launcher starts it)."""
    from conftest import TorchWorker
    return TorchWorker({"kind": "entry", "entry": spec, "backend": "cpu", "distributed": True},
                       launcher=("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)))


@pytest.mark.python_only
def test_the_worker_under_torchrun_opens_checks_and_times_a_candidate_on_every_rank():
    with ranked_worker(f"{RANKED}:loader") as w:
        assert w.hello["ranks"] == 2
        for switches in ({"no_sync": "on"}, {"no_sync": "off", "bucket_mb": "5"}):
            said = w.request("open", candidate={"global_batch": 16, "micro_batch": 4, "switches": switches})
            assert said["disposition"] == "passed" and said["checked"], said
            timed = w.request("time", calls=3)
            assert timed["seconds"] > 0 and len(timed["rank_seconds"]) == 2, timed
            assert timed["seconds"] == max(timed["rank_seconds"]), "the slowest rank's"
            assert w.request("counters")["peak_bytes"] > 0
            assert w.request("close", failed=False)["restart"] is False
        said = w.request("open", candidate={"global_batch": 12, "micro_batch": 4, "switches": {}})
        assert said["disposition"] == "error" and "not micro-batches of 4 on 2 ranks" in said["reason"], said
        w.request("close", failed=True)
        assert w.close() == 0, "every rank ends when the conversation does"


@pytest.mark.python_only
def test_a_group_of_one_rank_runs_ddp_and_fsdp2_as_several_would():
    """autotune --ranks 1 --launcher torchrun: what a one-GPU machine checks of the ranks' path (NCCL there)."""
    with ranked_worker(f"{RANKED}:blocks", ranks=1) as w:
        assert w.hello["ranks"] == 1
        for switches in ({"parallel": "ddp", "no_sync": "on"}, {"parallel": "fsdp"}):
            said = w.request("open", candidate={"global_batch": 8, "micro_batch": 4, "switches": switches})
            assert said["disposition"] == "passed" and said["checked"], said
            assert w.request("time", calls=2)["rank_seconds"][0] > 0
            w.request("close", failed=False)
        assert w.close() == 0


@pytest.mark.python_only
def test_a_rank_split_dependent_candidate_is_incorrect_as_a_group():
    with ranked_worker(f"{RANKED}:batch_norm") as w:
        said = w.request("open", candidate={"global_batch": 8, "micro_batch": 4, "switches": {}})
        assert said["disposition"] == "incorrect" and said["reason"].startswith("rank 0: the first step of 2 ranks"), said
        assert w.close() == 0


# ---- autotune --entry --ranks: the C++ side starts the worker under torchrun -----------------------------------------
EXAMPLE = os.path.join(REPO, "tuner", "entries", "my_train.py")


def autotune_or_skip():
    from conftest import built_tool
    autotune = built_tool("TRAINBENCH_AUTOTUNE", "tuner", "autotune")
    if autotune is None:
        pytest.skip("autotune is not built")
    return autotune


@pytest.mark.parametrize("extra, said", [
    (["--batch", "63"], "--ranks 2: the global batch 63 is not a multiple of the ranks"),
    (["--predict", "--batch", "65"], "--ranks 2: the global batch 65 is not a multiple of the ranks"),
    (["--mpirun", "mpirun -n"], "--mpirun launches the native step's ranks; an entry's ranks start under torchrun "
                                "(--launcher 'torchrun ...')"),
    (["--launcher", "mpirun -n 2"], "--launcher 'mpirun -n 2': an entry's ranks start under torchrun ('torchrun ARGS', "
                                    "run as the tune's python -m torch.distributed.run ARGS)"),
    (["--launcher", "torchrun --nnodes 1:2"], "--launcher: --nnodes 1:2 is not a count (autotune needs a fixed number)"),
    (["--launcher", "torchrun --nnodes 3"], "--launcher: --ranks 2 is not the same number of ranks on each of 3 nodes"),
    (["--launcher", "torchrun --nproc-per-node 3"], "--launcher: --nproc-per-node 3 on 1 node is not --ranks 2"),
    (["--predict", "--launcher", "torchrun"], "--launcher starts the ranks a tune measures; --predict tunes one process "
                                              "and starts its probes itself"),
])
def test_bad_ranks_of_an_entry_are_one_line_and_exit_2(extra, said):
    import subprocess
    done = subprocess.run([autotune_or_skip(), "--gpu", "cpu", "--entry", f"{EXAMPLE}:build", "--ranks", "2", *extra],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == f"autotune: {said}", done.stderr


# torchrun's own rendezvous as --launcher gives it (what --standalone sets up, spelled out): one node, c10d
LAUNCHER = "torchrun --nnodes 1 --rdzv-backend c10d --rdzv-endpoint localhost:0"


def test_an_entry_tuned_on_two_ranks_says_its_ranks_and_how_they_start(tmp_path):
    """A short tune of the README's example on 2 gloo ranks started as --launcher says: DDP's no_sync searched, the
    global batch every rank's together, the samples/s of both ranks, and how to start them."""
    import subprocess
    import yaml
    out = tmp_path / "ranks.yaml"
    done = subprocess.run([autotune_or_skip(), "--gpu", "cpu", "--entry", f"{EXAMPLE}:build", "--ranks", "2", "--batch", "64",
                           "--launcher", LAUNCHER, "--switches", "no_sync", "--budget", "40", "--trial-seconds", "1",
                           "--race-rounds", "2",
                           "--journal", str(tmp_path / "j.jsonl"), "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    t = yaml.safe_load(out.read_text())["trainbench_autotune"]
    chosen = t["chosen"]
    assert chosen["ranks"] == 2 and chosen["global_batch"] == 64 and chosen["per_rank_batch"] == 32, chosen
    assert chosen["switches"]["no_sync"] in ("on", "off"), chosen
    assert t["executor"]["launcher"] == LAUNCHER + " --nproc-per-node 2", t["executor"]
    assert t["measured"]["samples_per_s"] > 0
    assert "x 2 ranks" in done.stderr
    waited = t["measured"]["communication"]  # the choice's step profiled on both ranks
    assert 0 <= waited["exposed_seconds"] <= waited["communication_seconds"] and 0 <= waited["share"] <= 1, waited
    assert len(waited["rank_shares"]) == 2 and waited["share"] == max(waited["rank_shares"]), waited
    assert "of its time for communication" in done.stderr


def processes_marked(mark: str) -> list:
    """The processes (pids) whose environment holds TRAINBENCH_TEST_MARK=mark: what a tune started, ranks included."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"TRAINBENCH_TEST_MARK={mark}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_rank_that_aborts_and_a_rank_that_hangs_each_cost_one_candidate_and_leave_nothing_running(tmp_path):
    """The last of 2 ranks aborts (optimizer=foreach) or hangs (sync=async) while the other waits for it: each is
    one failed trial (the abort named by the rank that failed, from torchrun's summary; the hang stopped by the
    watchdog), the group is started again after each, the tune chooses, and no process of it is left. The
    entry's batches are the same on both ranks: the tune warns of that, once."""
    import json
    import subprocess
    import uuid
    mark = uuid.uuid4().hex
    out = tmp_path / "faulty.json"
    done = subprocess.run([autotune_or_skip(), "--gpu", "cpu", "--entry", f"{os.path.join(ENTRIES, 'faulty.py')}:one_rank",
                           "--ranks", "2", "--batch", "32", "--switches", "optimizer,sync", "--budget", "200",
                           "--trial-seconds", "1", "--race-rounds", "2", "--format", "json",
                           "--journal", str(tmp_path / "j.jsonl"), "--out", str(out)],
                          capture_output=True, text=True, timeout=400, env=dict(os.environ, TRAINBENCH_TEST_MARK=mark))
    assert done.returncode == 0, done.stderr
    assert processes_marked(mark) == [], "a rank or torchrun outlived the tune"
    t = json.loads(out.read_text())["trainbench_autotune"]
    assert t["chosen"] is not None
    failed = {(f["config"].split("optimizer=")[1].split()[0], f["class"]): f["message"] for f in t["failed_trials"]}
    crash = next(m for (opt, cls), m in failed.items() if opt == "foreach" and cls == "error")
    assert crash.startswith("rank 1 of the torchrun group crashed: killed by signal 6"), crash
    assert any(cls == "timeout" and "sync=async" in f["config"] for f in t["failed_trials"]
               for cls in [f["class"]]), t["failed_trials"]
    worker = t["executor"]["worker"]
    lost = [f for f in t["failed_trials"] if f["class"] == "timeout" or "killed by signal 6" in f["message"]]
    assert worker["restarts"] == len(lost) >= 2, (worker, t["failed_trials"])
    warnings = [line for line in done.stderr.splitlines() if line.startswith("autotune: warning: ")]
    assert len(warnings) == 1 and "the same on every rank" in warnings[0], warnings


TINY_GPT2 = "hf:gpt2?n_layer=2&n_embd=32&n_head=2&vocab_size=256&n_positions=64&seq_len=16"


def test_a_small_gpt2_tuned_on_two_ranks_runs_ddp_and_fsdp2_candidates_that_pass_the_check(tmp_path):
    """hf:gpt2 (2 blocks) on 2 gloo ranks, every parallel and no_sync value at micro-batch 4: DDP and FSDP2
    candidates (each block sharded, with and without resharding after the forward), skipping the reduction of the
    first micro-batch or not, pass the first-step check against one process and are measured; the choice, written
    as TrainingArguments, a Lightning config and an Accelerate config, loads in each."""
    import json
    import subprocess
    import yaml
    transformers = pytest.importorskip("transformers")
    out, journal = tmp_path / "gpt2.yaml", tmp_path / "j.jsonl"
    # Every combination at one micro-batch (accumulation 2), so that each parallel value runs however loaded the
    # machine is
    done = subprocess.run([autotune_or_skip(), "--gpu", "cpu", "--entry", TINY_GPT2, "--ranks", "2", "--batch", "16",
                           "--micro-batch", "4", "--switches", "parallel,no_sync", "--strategy", "grid", "--budget", "120",
                           "--trial-seconds", "1", "--race-rounds", "0", "--journal", str(journal), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    trials = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    passed = {(t["candidate"]["switches"]["parallel"], t["candidate"]["switches"]["no_sync"]) for t in trials
              if t.get("result", {}).get("class") == "ok"}
    assert passed == {(p, n) for p in ("ddp", "fsdp", "fsdp_no_reshard") for n in ("on", "off")}, \
        [(t["key"], t.get("result", {}).get("class")) for t in trials]
    chosen = yaml.safe_load(out.read_text())["trainbench_autotune"]["chosen"]
    assert chosen["ranks"] == 2 and chosen["global_batch"] == 16, chosen
    assert chosen["switches"]["parallel"] in ("ddp", "fsdp", "fsdp_no_reshard"), chosen
    # The choice as each framework reads it (autotune --from), loaded where it is read
    from test_entry_formats import from_file, lightning_trainer
    with open(from_file(str(out), "hf", tmp_path)) as f:
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, **json.load(f))
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 2)
    assert bool(args.fsdp) == chosen["switches"]["parallel"].startswith("fsdp"), (args.fsdp, chosen)
    pytest.importorskip("lightning")
    _, trainer = lightning_trainer(from_file(str(out), "lightning", tmp_path))
    assert trainer.num_devices == 2 and trainer.accumulate_grad_batches == 2
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    assert load_config_from_file(from_file(str(out), "accelerate", tmp_path)).num_processes == 2


@pytest.mark.python_only
def test_a_pytorch_without_the_ranks_backend_is_one_line(monkeypatch):
    """No gloo on the CPU (no NCCL on GPUs): the worker's start refuses it in a line that names the missing backend,
    which autotune relays (exit 2) before any trial."""
    from trainbench.errors import UsageError
    from trainbench.pytorch import distributed as td
    assert td.backend_missing(torch.device("cpu")) is None
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    said = td.backend_missing(torch.device("cpu"))
    assert said and "has no gloo" in said and "is_gloo_available() is False" in said, said
    with pytest.raises(UsageError, match="has no gloo"):
        td.join(torch.device("cpu"))
