"""`autotune --from TUNED.yaml --format FMT`: a tuned file of an entry on 2 ranks written again as each framework's
settings, without running anything, and each loaded where its framework reads it: TrainingArguments(**json), a
Lightning Trainer from the YAML's trainer section (its strategy built from class_path and init_args, as LightningCLI
builds it), Accelerate's own config loader and launch-argument check, and one real `accelerate launch` on 2 CPU
processes. The fixture is the YAML `autotune --gpu cpu --entry tuner/entries/my_train.py:build --ranks 2 --batch 64
--switches no_sync --budget 40 --trial-seconds 1 --race-rounds 2` wrote (DDP); the test makes FSDP2 and one-process
copies of it. Skips without torch, transformers, lightning or accelerate."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import FIXTURES, built_tool

yaml = pytest.importorskip("yaml")
pytest.importorskip("torch")

TUNED_DDP = os.path.join(FIXTURES, "tuned_entry_ranks2_ddp.yaml")


def autotune_or_skip():
    autotune = built_tool("TRAINBENCH_AUTOTUNE", "tuner", "autotune")
    if autotune is None:
        pytest.skip("autotune is not built")
    return autotune


def tuned_copy(tmp_path, name, edit):
    """The fixture with `edit` applied to its trainbench_autotune document, written to tmp_path/name."""
    with open(TUNED_DDP) as f:
        doc = yaml.safe_load(f)
    edit(doc["trainbench_autotune"])
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def as_fsdp(t, parallel="fsdp"):
    # One rank's 32 samples as 16 x 2, sharded; the micro-batch before the last skips the reduce-scatter.
    t["chosen"].update(micro_batch=16, accumulation=2)
    t["chosen"]["switches"].update(parallel=parallel, no_sync="on")


def as_one_process(t):
    del t["ranks"]
    for key in ("ranks", "per_rank_batch", "batch_split", "launch"):
        t["chosen"].pop(key, None)
    t["chosen"]["global_batch"] = 32
    for switch in ("parallel", "no_sync", "bucket_mb", "gradient_as_bucket_view", "static_graph"):
        t["chosen"]["switches"].pop(switch, None)


def from_file(tuned, fmt, tmp_path):
    out = tmp_path / f"out.{fmt}"
    done = subprocess.run([autotune_or_skip(), "--from", tuned, "--format", fmt, "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return str(out)


def test_the_fixture_says_how_to_launch_the_ranks():
    with open(TUNED_DDP) as f:
        chosen = yaml.safe_load(f)["trainbench_autotune"]["chosen"]
    assert chosen["launch"] == "torchrun --standalone --nproc-per-node 2 YOUR_TRAINING_SCRIPT.py"
    assert chosen["batch_split"] == "global batch 64 = micro-batch 32 x accumulation 1 x 2 ranks"


@pytest.mark.parametrize("variant", ["ddp", "fsdp", "fsdp_no_reshard", "one_process"])
def test_hf_loads_in_training_arguments(tmp_path, variant):
    transformers = pytest.importorskip("transformers")
    edits = {"ddp": lambda t: None, "fsdp": as_fsdp, "fsdp_no_reshard": lambda t: as_fsdp(t, "fsdp_no_reshard"),
             "one_process": as_one_process}
    with open(from_file(tuned_copy(tmp_path, "tuned.yaml", edits[variant]), "hf", tmp_path)) as f:
        keywords = json.load(f)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, **keywords)
    assert args.max_grad_norm == 1.0  # my_train.py's entry clips at TrainingArguments' default
    if variant == "ddp":
        assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (32, 1)
        assert args.ddp_bucket_cap_mb == 25 and args.ddp_static_graph is False
        assert args.ddp_find_unused_parameters is False
        assert not args.fsdp
    elif variant.startswith("fsdp"):
        assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (16, 2)
        assert args.fsdp_plugin_args["fsdp_version"] == 2
        assert args.fsdp_plugin_args["reshard_after_forward"] is (variant == "fsdp")
        assert args.ddp_bucket_cap_mb is None
    else:
        assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (32, 1)
        assert args.ddp_bucket_cap_mb is None and not args.fsdp


def with_loader(workers):
    """The choice with the DataLoader's switches (a tune of a loader-fed entry): `workers` worker processes."""
    def edit(t):
        as_one_process(t)
        t["chosen"]["switches"].update(num_workers=str(workers), prefetch_factor="4", persistent_workers="on",
                                       cpu_threads="left")
        t["chosen"]["dataloader"] = {"num_workers": workers, "prefetch_factor": 4 if workers else None,
                                     "persistent_workers": bool(workers), "pin_memory": False,
                                     "cpu_threads": 1 if workers else 2}
    return edit


@pytest.mark.parametrize("workers", [2, 0])
def test_the_loaders_switches_load_in_training_arguments_and_are_said_where_trainers_have_no_key(tmp_path, workers):
    transformers = pytest.importorskip("transformers")
    tuned = tuned_copy(tmp_path, "tuned.yaml", with_loader(workers))
    with open(from_file(tuned, "hf", tmp_path)) as f:
        keywords = json.load(f)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, **keywords)
    assert args.dataloader_num_workers == workers
    assert args.dataloader_prefetch_factor == (4 if workers else None)
    assert args.dataloader_persistent_workers is bool(workers)
    assert "dataloader_prefetch_factor" in keywords or not workers  # refused by TrainingArguments without workers
    formats = ["lightning", "accelerate"]
    for fmt in formats:
        text = open(from_file(tuned, fmt, tmp_path)).read()
        expected = (f"DataLoader(..., num_workers={workers}, prefetch_factor=4, persistent_workers=True, "
                    "pin_memory=False)" if workers else "DataLoader(..., num_workers=0, pin_memory=False)")
        assert expected in text and "not Trainer settings" in text, text
        assert ("torch.set_num_threads(1)" in text) is bool(workers), text


def lightning_trainer(config_path):
    """lightning.pytorch.Trainer(**cfg["trainer"]), the strategy built from its class_path and init_args."""
    import importlib
    from lightning.pytorch import Trainer
    with open(config_path) as f:
        cfg = yaml.safe_load(f)
    trainer_cfg = dict(cfg["trainer"])
    strategy = trainer_cfg.get("strategy")
    if isinstance(strategy, dict):
        module, _, name = strategy["class_path"].rpartition(".")
        trainer_cfg["strategy"] = getattr(importlib.import_module(module), name)(**strategy.get("init_args", {}))
    trainer_cfg["accelerator"] = "cpu"
    return cfg, Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **trainer_cfg)


@pytest.mark.parametrize("variant", ["ddp", "fsdp", "one_process"])
def test_lightning_builds_a_trainer(tmp_path, variant):
    pytest.importorskip("lightning")
    edits = {"ddp": lambda t: None, "fsdp": as_fsdp, "one_process": as_one_process}
    path = from_file(tuned_copy(tmp_path, "tuned.yaml", edits[variant]), "lightning", tmp_path)
    cfg, trainer = lightning_trainer(path)
    strategy = type(trainer.strategy).__name__
    if variant == "one_process":
        assert trainer.num_devices == 1 and cfg["data"]["batch_size"] == 32
        return
    assert trainer.num_devices == 2
    if variant == "ddp":
        assert strategy == "DDPStrategy"
        assert trainer.strategy._ddp_kwargs == {"bucket_cap_mb": 25, "gradient_as_bucket_view": False,
                                                "static_graph": False}
        assert (cfg["data"]["batch_size"], trainer.accumulate_grad_batches) == (32, 1)
    else:
        assert strategy == "ModelParallelStrategy"  # Lightning's FSDP2; the module's configure_model shards
        assert (cfg["data"]["batch_size"], trainer.accumulate_grad_batches) == (16, 2)
        assert "reshard_after_forward=True" in open(path).read()


@pytest.mark.parametrize("variant", ["ddp", "fsdp_no_reshard", "one_process"])
def test_accelerate_reads_the_config_file(tmp_path, variant):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    edits = {"ddp": lambda t: None, "fsdp_no_reshard": lambda t: as_fsdp(t, "fsdp_no_reshard"),
             "one_process": as_one_process}
    path = from_file(tuned_copy(tmp_path, "tuned.yaml", edits[variant]), "accelerate", tmp_path)
    config = load_config_from_file(path)  # refuses a key its ClusterConfig does not have
    expected = {"ddp": ("MULTI_CPU", 2), "fsdp_no_reshard": ("FSDP", 2), "one_process": ("NO", 1)}[variant]
    assert (config.distributed_type.value, config.num_processes) == expected
    assert config.use_cpu and config.num_machines == 1 and config.mixed_precision == "no"
    # What `accelerate launch --config_file F` makes of it, without launching.
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", path, "train.py"]))
    assert args.num_processes == expected[1]
    if variant == "fsdp_no_reshard":
        assert args.use_fsdp and str(args.fsdp_version) == "2"
        assert str(args.fsdp_reshard_after_forward).lower() == "false"
    if variant == "ddp":
        text = open(path).read()
        assert "DistributedDataParallelKwargs(bucket_cap_mb=25" in text and "mpirun_hostfile" in text


def test_accelerate_launches_two_cpu_processes_from_the_config(tmp_path):
    """The MULTI_CPU config under `accelerate launch`, with the hostfile its comment names: both ranks join."""
    pytest.importorskip("accelerate")
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    if accelerate is None or shutil.which("mpirun") is None:
        pytest.skip("accelerate launch or mpirun is not installed")
    path = from_file(TUNED_DDP, "accelerate", tmp_path)
    (tmp_path / "hosts").write_text("localhost slots=2\n")
    script = tmp_path / "tiny.py"
    script.write_text("import sys\n"
                      "from accelerate import Accelerator\n"
                      "a = Accelerator()\n"
                      "with open(f'{sys.argv[1]}/rank{a.process_index}', 'w') as f:\n"
                      "    f.write(f'{a.distributed_type.value} {a.num_processes}')\n")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    done = subprocess.run([accelerate, "launch", "--config_file", path, "--mpirun_hostfile", str(tmp_path / "hosts"),
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in (0, 1):  # each process says what it joined in a file of its own (their stdout interleaves)
        assert (tmp_path / f"rank{rank}").read_text() == "MULTI_CPU 2", done.stderr[-2000:]


def test_from_refuses_options_that_run_trials_and_bad_files(tmp_path):
    autotune = autotune_or_skip()
    for extra, said in [(["--from", TUNED_DDP, "--format", "hf", "--ranks", "2"], "leave out --ranks"),
                        (["--from", str(tmp_path / "none.yaml"), "--format", "hf"], "not a configuration autotune wrote")]:
        done = subprocess.run([autotune] + extra, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert done.stdout == ""
