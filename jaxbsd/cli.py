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

__all__ = ["build_parser", "main", "add_train_command", "train_config_from_args", "SUBCOMMANDS"]

#: Functions ``f(subparsers)`` that add one subcommand each; extend to add commands.
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


_FLAG_TYPES = {"int": int, "float": float, "str": str, "float | None": float, "int | None": int}


def _train_config_flags(p: argparse.ArgumentParser) -> None:
    """One ``--flag`` per :class:`jaxbsd.train.TrainConfig` field, with no argparse default:
    a flag left out keeps the (model, data set) recipe's value, and TrainConfig validates."""
    import dataclasses

    from jaxbsd.train import TrainConfig

    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        extra = {"choices": f.metadata["choices"]} if "choices" in f.metadata else {}
        p.add_argument(
            f"--{f.name.replace('_', '-')}", dest=f.name, type=_FLAG_TYPES[kind], default=argparse.SUPPRESS,
            help=f"{f.metadata['help']} (default: the recipe's, else {getattr(defaults, f.name)})", **extra,
        )


def train_config_from_args(args: argparse.Namespace):
    """The :class:`~jaxbsd.train.TrainConfig` of parsed ``jaxbsd train`` arguments: the recipe
    for ``args.model`` on ``args.dataset`` (``TrainConfig.recipe``), with the flags given.

    Raises:
        ValueError: a flag value TrainConfig rejects (the message names it).
    """
    import dataclasses

    from jaxbsd.train import TrainConfig

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    return TrainConfig.recipe(args.model, args.dataset).replace(**given)


def add_train_command(subparsers: argparse._SubParsersAction) -> None:
    """``jaxbsd train``: train a ViT, Swin or DeiT on a data set."""
    from jaxbsd.models import MODELS
    from jaxbsd.train import RECIPES

    recipes = ", ".join(f"{m}/{d}" for m, d in RECIPES)
    p = subparsers.add_parser(
        "train", help="train a vision transformer",
        description=(
            "Train a ViT, Swin or DeiT. Settings default to this project's recipe for the "
            f"(model, data set) ({recipes}; see jaxbsd.train.RECIPES), otherwise to the paper's "
            "(Adam, lr 1e-4, batch 128, 20 epochs); every flag overrides its setting."
        ),
    )
    p.add_argument("--model", required=True, choices=sorted(MODELS), help="architecture")
    p.add_argument("--dataset", required=True,
                   help="digits, fashion-mnist, mnist, usps, cifar10 or svhn; pystdlib (text) for --model lm")
    p.add_argument("--data-root", default=None,
                   help="file or directory holding the data set (default: under $JAXBSD_DATA)")
    _train_config_flags(p)
    p.add_argument("--limit", type=_positive_int, default=None, help="use only the first N examples")
    p.add_argument("--out", default=None, help="checkpoint directory to write, updated every epoch")
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

    if args.model == "lm" or args.dataset in data.TEXT_DATASETS:  # the character language model
        from jaxbsd.cli_lm import run_train_lm

        return run_train_lm(args)
    try:
        cfg = train_config_from_args(args)
    except ValueError as e:
        print(f"jaxbsd train: error: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    dataset = data.load_dataset(args.dataset, args.data_root, seed=cfg.seed, limit=args.limit)
    overrides = {} if cfg.drop_path is None else {"drop_path": cfg.drop_path}
    config = config_for_dataset(args.model, dataset, **overrides)
    model = build_model(args.model, config, seed=cfg.seed)
    teacher = None
    if args.teacher is not None:
        teacher, _ = load_checkpoint(args.teacher)
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

    history = train(model, dataset, cfg, teacher=teacher, progress=not args.no_progress,
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
