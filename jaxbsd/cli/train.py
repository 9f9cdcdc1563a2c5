"""``jaxbsd train``: train a ViT, Swin or DeiT on a data set (``--model lm``: :mod:`jaxbsd.cli.lm`).

The settings are a :class:`~jaxbsd.training.TrainConfig`: the project's recipe for the (model, data
set), with one flag per field (:func:`jaxbsd.cli.args.train_config_from_args`).
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxbsd.cli.args import (
    add_train_config_flags,
    checkpoint_slot,
    existing_path,
    output_file,
    positive_int,
    show_progress,
    train_config_from_args,
)

__all__ = ["add_train_command", "validate_train_args"]


def validate_train_args(args: argparse.Namespace):
    """Check ``jaxbsd train``'s arguments before any file is read or written; return the
    :class:`~jaxbsd.training.TrainConfig`.

    Raises:
        ValueError: a setting TrainConfig rejects, a missing ``--data-root`` or ``--teacher``,
            a ``--json`` that cannot be written, or an ``--out`` that holds something other
            than a jaxbsd checkpoint (the message names the flag).
    """
    cfg = train_config_from_args(args)
    existing_path("--data-root", args.data_root)
    existing_path("--teacher", args.teacher)
    output_file("--json", args.json)
    checkpoint_slot("--out", args.out)
    return cfg


def add_train_command(subparsers: argparse._SubParsersAction) -> None:
    """``jaxbsd train``: train a ViT, Swin or DeiT on a data set."""
    from jaxbsd.data import DATASETS, TEXT_DATASETS
    from jaxbsd.models import MODELS
    from jaxbsd.training import RECIPES

    recipes = ", ".join(f"{m}/{d}" for m, d in RECIPES)
    p = subparsers.add_parser(
        "train", help="train a vision transformer",
        description=(
            "Train a ViT, Swin or DeiT. Settings default to this project's recipe for the "
            f"(model, data set) ({recipes}; see jaxbsd.training.RECIPES), otherwise to the paper's "
            "(Adam, lr 1e-4, batch 128, 20 epochs); every flag overrides its setting."
        ),
    )
    p.add_argument("--model", required=True, choices=sorted(MODELS), help="architecture")
    p.add_argument("--dataset", required=True, choices=[*DATASETS, *TEXT_DATASETS],
                   help="image data set; pystdlib (text) for --model lm")
    p.add_argument("--data-root", default=None,
                   help="file or directory holding the data set (default: under $JAXBSD_DATA)")
    add_train_config_flags(p)
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N examples")
    p.add_argument("--out", default=None, help="checkpoint directory to write, updated every epoch")
    p.add_argument("--teacher", default=None, help="teacher checkpoint for DeiT hard distillation")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (none either when stderr is not a terminal, e.g. a log file)")
    p.add_argument("--json", default=None, help="also write the history and result to this JSON file")
    p.set_defaults(func=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    import time

    from jaxbsd import data
    from jaxbsd.models import build_model, config_for_dataset, config_to_dict, count_params
    from jaxbsd.checkpoint import load_checkpoint
    from jaxbsd.training import train

    cfg = validate_train_args(args)
    if args.model == "lm" or args.dataset in data.TEXT_DATASETS:  # the character language model
        from jaxbsd.cli.lm import run_train_lm

        return run_train_lm(args)
    start = time.perf_counter()
    # Reads, cheapest first, all before the first write (the checkpoint after epoch 1).
    teacher = None
    if args.teacher is not None:
        teacher, _ = load_checkpoint(args.teacher)
    dataset = data.load_dataset(args.dataset, args.data_root, seed=cfg.seed, limit=args.limit)
    overrides = {} if cfg.drop_path is None else {"drop_path": cfg.drop_path}
    config = config_for_dataset(args.model, dataset, **overrides)
    model = build_model(args.model, config, seed=cfg.seed)
    print(
        f"{args.model} on {args.dataset}: {dataset.train_images.shape[0]} train / "
        f"{dataset.test_images.shape[0]} test images, {count_params(model):,} parameters",
        flush=True,
    )
    print(f"settings: {cfg}", flush=True)
    metadata = {
        "dataset": args.dataset,
        "data_root": args.data_root,
        "command": getattr(args, "command_line", None) or " ".join(["jaxbsd", *sys.argv[1:]]),
        "teacher": args.teacher,
        "params": count_params(model),
        "train_config": cfg.to_dict(),
    }

    def report(h):
        print(
            f"epoch {h['epoch']:3d}  loss {h['loss']:.4f}  train_acc {h['train_acc']:.4f}  "
            f"test_acc {h['test_acc']:.4f}  {h['seconds']:.1f} s",
            flush=True,
        )

    history = train(model, dataset, cfg, teacher=teacher, progress=show_progress(args),
                    checkpoint=args.out, metadata=metadata, on_epoch=report)
    final = history[-1]["test_acc"]
    wall = time.perf_counter() - start
    print(f"final test accuracy {final:.4f} ({100 * final:.2f} %) after {cfg.epochs} epochs, {wall:.0f} s")
    if args.json is not None:
        with open(args.json, "w") as f:
            json.dump({**metadata, "config": config_to_dict(config), "model": args.model,
                       **{k: v for k, v in cfg.to_dict().items() if k != "drop_path"},
                       "drop_path": config.drop_path, "history": history,
                       "test_acc": final, "wall_seconds": wall, "checkpoint": args.out}, f, indent=1)
    return 0
