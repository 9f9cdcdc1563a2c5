"""``jaxbsd train --model lm --dataset pystdlib``: train the character language model.

Called by :mod:`jaxbsd.cli.train`'s ``train`` command for ``--model lm`` (same flags: the settings
default to ``jaxbsd.training.RECIPES[("lm", "pystdlib")]``). It prints and records, next to the
training history, the bits per character of the model on the validation and test modules and
those of two baselines fitted on the train modules: add-one smoothed unigram and bigram models
(:func:`jaxbsd.evaluation.ngram_bpc`). ``--limit N`` keeps the first N characters of each split.
"""

from __future__ import annotations

import argparse
import sys
import time

__all__ = ["run_train_lm"]


def _machine() -> dict:
    import os
    import platform

    import flax
    import jax

    device = jax.devices()[0]
    return {"backend": device.platform, "device_kind": device.device_kind, "cpu_count": os.cpu_count(),
            "processor": platform.machine(), "jax": jax.__version__, "flax": flax.__version__}


def run_train_lm(args: argparse.Namespace) -> int:
    """Run ``jaxbsd train`` for the language model; returns the exit status."""
    from jaxbsd import data
    from jaxbsd.cli.args import show_progress, train_config_from_args
    from jaxbsd.io import provenance, write_json_atomic
    from jaxbsd.models import build_model, config_for_dataset, config_to_dict, count_params
    from jaxbsd.checkpoint import save_checkpoint
    from jaxbsd.evaluation import evaluate_lm, ngram_bpc
    from jaxbsd.training import train

    if args.model != "lm" or args.dataset not in data.TEXT_DATASETS:
        raise ValueError(f"--model lm trains on a text data set {list(data.TEXT_DATASETS)}, and a text data set "
                         f"needs --model lm; got --model {args.model} --dataset {args.dataset}")
    if args.teacher is not None:
        raise ValueError("--teacher is for DeiT distillation, not --model lm")
    cfg = train_config_from_args(args)  # validated by jaxbsd.cli.train.validate_train_args
    start = time.perf_counter()
    dataset = data.load_text_dataset(args.dataset, args.data_root, limit=args.limit)
    config = config_for_dataset("lm", dataset)
    model = build_model("lm", config, seed=cfg.seed)
    sizes = {split: len(dataset.split(split)) for split in data.TEXT_SPLITS}
    print(
        f"lm on {args.dataset}: {sizes['train']:,} train / {sizes['validation']:,} validation / "
        f"{sizes['test']:,} test characters ({', '.join(f'{len(m)} {s}' for s, m in dataset.modules.items())} "
        f"modules), {count_params(model):,} parameters",
        flush=True,
    )
    print(f"settings: {cfg}", flush=True)
    vocab = dataset.vocab.size
    baselines = {
        f"{kind}_{split}_bpc": ngram_bpc(dataset.train, dataset.split(split), order, vocab)
        for kind, order in (("unigram", 1), ("bigram", 2)) for split in ("validation", "test")
    }
    print("baselines (add-one, fitted on train): " + ", ".join(f"{k} {v:.4f}" for k, v in baselines.items()),
          flush=True)
    command = getattr(args, "command_line", None) or " ".join(["jaxbsd", *sys.argv[1:]])
    metadata = {
        "dataset": args.dataset,
        "data_root": args.data_root,
        "limit": args.limit,
        "command": command,
        "params": count_params(model),
        "train_config": cfg.to_dict(),
        "characters": sizes,
        "modules": {split: list(names) for split, names in dataset.modules.items()},
        "baselines": baselines,
    }

    def report(h):
        print(f"epoch {h['epoch']:3d}  {h['steps']} steps  loss {h['loss']:.4f}  train {h['train_bpc']:.4f} bpc  "
              f"validation {h['val_bpc']:.4f} bpc  {h['seconds']:.1f} s", flush=True)

    history = train(model, dataset, cfg, progress=show_progress(args), checkpoint=args.out, metadata=metadata,
                    on_epoch=report)
    train_seconds = time.perf_counter() - start
    val_bpc = history[-1]["val_bpc"]
    test_bpc = evaluate_lm(model, dataset.test, batch_size=cfg.eval_batch_size)
    wall = time.perf_counter() - start
    result = {"val_bpc": val_bpc, "test_bpc": test_bpc, "steps": sum(h["steps"] for h in history),
              "train_seconds": train_seconds, "wall_seconds": wall}
    print(f"test {test_bpc:.4f} bpc, validation {val_bpc:.4f} bpc (bigram {baselines['bigram_test_bpc']:.4f} / "
          f"{baselines['bigram_validation_bpc']:.4f}, unigram {baselines['unigram_test_bpc']:.4f} / "
          f"{baselines['unigram_validation_bpc']:.4f}) after {result['steps']} steps, {wall:.0f} s", flush=True)
    if args.out is not None:  # the final checkpoint also carries the test result
        save_checkpoint(args.out, model, {**metadata, "history": history, **result})
    if args.json is not None:
        write_json_atomic(args.json, {
            **metadata, "model": "lm", "config": config_to_dict(config), **cfg.to_dict(), "history": history,
            **result, "checkpoint": args.out, "machine": _machine(),
            "provenance": provenance(command, solver=False),
        })
    return 0
