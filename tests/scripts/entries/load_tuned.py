"""Loads what `autotune --entry ... --format hf|lightning` wrote where the user would: `load_tuned.py hf FILE`
builds TrainingArguments(**json); `load_tuned.py lightning FILE ENTRY.py` builds a Lightning Trainer(**trainer)
and fits the entry's LightningModule at the tuned batch size for two steps. Exit 0 when it loads."""
import importlib.util
import json
import sys
import tempfile


def main(kind, path, *rest):
    if kind == "hf":
        from transformers import TrainingArguments
        with open(path) as f:
            keys = json.load(f)
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(output_dir=out, use_cpu=True, **keys)
        print(f"TrainingArguments: per_device_train_batch_size={args.per_device_train_batch_size}, "
              f"gradient_accumulation_steps={args.gradient_accumulation_steps}, optim={args.optim}")
        return 0
    import yaml
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    with open(path) as f:
        config = yaml.safe_load(f)
    spec = importlib.util.spec_from_file_location("entry", rest[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as out:
        trainer = pl.Trainer(default_root_dir=out, accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, **config["trainer"])
        trainer.fit(module.build(config["data"]["batch_size"], "cpu"))
    print(f"Trainer: accumulate_grad_batches={trainer.accumulate_grad_batches}, batch_size={config['data']['batch_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
