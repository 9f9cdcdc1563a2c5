"""The ``jaxbsd`` console command.

Subcommands register themselves on the parser from :func:`build_parser`; to add one::

    parser = build_parser()
    sub = parser.subcommands.add_parser("compress", help="...")
    sub.add_argument(...)
    sub.set_defaults(func=run_compress)   # func(args) -> exit status

``main`` dispatches to ``args.func``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

__all__ = ["build_parser", "main", "add_train_command", "SUBCOMMANDS"]

#: Functions ``f(subparsers)`` that add one subcommand each; extend to add commands.
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def add_train_command(subparsers: argparse._SubParsersAction) -> None:
    """``jaxbsd train``: train a ViT, Swin or DeiT on a data set."""
    from jaxbsd.models import MODELS

    p = subparsers.add_parser(
        "train", help="train a vision transformer",
        description="Train a ViT, Swin or DeiT with Adam (paper defaults: lr 1e-4, batch 128).",
    )
    p.add_argument("--model", required=True, choices=sorted(MODELS), help="architecture")
    p.add_argument("--dataset", required=True,
                   help="digits, fashion-mnist, mnist, usps, cifar10 or svhn")
    p.add_argument("--data-root", default=None, help="file or directory holding the data set")
    p.add_argument("--epochs", type=_positive_int, default=20)
    p.add_argument("--lr", type=_positive_float, default=1e-4, help="peak learning rate")
    p.add_argument("--schedule", choices=("constant", "cosine"), default="constant")
    p.add_argument("--warmup-epochs", type=float, default=0.0, help="cosine warm-up length")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW decay (0: Adam, paper)")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--shift", type=int, default=0,
                   help="augment with random translations of up to this many pixels (0: none, paper)")
    p.add_argument("--drop-path", type=float, default=None, help="override the stochastic-depth rate")
    p.add_argument("--batch-size", type=_positive_int, default=128)
    p.add_argument("--seed", type=int, default=0, help="initialisation, shuffling and split seed")
    p.add_argument("--limit", type=_positive_int, default=None, help="use only the first N examples")
    p.add_argument("--out", default=None, help="checkpoint file to write (.npz), updated every epoch")
    p.add_argument("--teacher", default=None, help="teacher checkpoint for DeiT hard distillation")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", default=None, help="also write the history and result to this JSON file")
    p.set_defaults(func=_run_train)


SUBCOMMANDS.append(add_train_command)

from jaxbsd.cli_compress import add_compress_command  # noqa: E402  (the main job)

SUBCOMMANDS.append(add_compress_command)


def _run_train(args: argparse.Namespace) -> int:
    import time

    from jaxbsd import data
    from jaxbsd.models import build_model, config_for_dataset, config_to_dict, count_params
    from jaxbsd.train import load_checkpoint, train

    start = time.perf_counter()
    dataset = data.load_dataset(args.dataset, args.data_root, seed=args.seed, limit=args.limit)
    overrides = {} if args.drop_path is None else {"drop_path": args.drop_path}
    config = config_for_dataset(args.model, dataset, **overrides)
    model = build_model(args.model, config, seed=args.seed)
    teacher = None
    if args.teacher is not None:
        teacher, _ = load_checkpoint(args.teacher)
    print(
        f"{args.model} on {args.dataset}: {dataset.train_images.shape[0]} train / "
        f"{dataset.test_images.shape[0]} test images, {count_params(model):,} parameters",
        flush=True,
    )
    metadata = {
        "dataset": args.dataset,
        "data_root": args.data_root,
        "command": getattr(args, "command_line", None) or " ".join(["jaxbsd", *sys.argv[1:]]),
        "teacher": args.teacher,
        "params": count_params(model),
    }
    def report(h):
        print(
            f"epoch {h['epoch']:3d}  loss {h['loss']:.4f}  train_acc {h['train_acc']:.4f}  "
            f"test_acc {h['test_acc']:.4f}  {h['seconds']:.1f} s",
            flush=True,
        )

    history = train(
        model, dataset, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
        teacher=teacher, schedule=args.schedule, warmup_epochs=args.warmup_epochs,
        weight_decay=args.weight_decay, label_smoothing=args.label_smoothing, shift=args.shift,
        progress=not args.no_progress, checkpoint=args.out, metadata=metadata, on_epoch=report,
    )
    final = history[-1]["test_acc"]
    wall = time.perf_counter() - start
    print(f"final test accuracy {final:.4f} ({100 * final:.2f} %) after {args.epochs} epochs, {wall:.0f} s")
    if args.json is not None:
        with open(args.json, "w") as f:
            json.dump({**metadata, "config": config_to_dict(config), "model": args.model,
                       "epochs": args.epochs, "lr": args.lr, "schedule": args.schedule,
                       "batch_size": args.batch_size, "seed": args.seed, "weight_decay": args.weight_decay,
                       "label_smoothing": args.label_smoothing, "shift": args.shift,
                       "drop_path": config.drop_path, "history": history,
                       "test_acc": final, "wall_seconds": wall, "checkpoint": args.out}, f, indent=1)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``jaxbsd`` parser; ``parser.subcommands`` is its subparsers action, for extension."""
    parser = argparse.ArgumentParser(
        prog="jaxbsd", description="B-spline decoupling (R-CMTF-BSD) and transformer MLP compression",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.subcommands = subparsers
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the subcommand; returns its status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = " ".join(["jaxbsd", *argv])
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
