"""The ``jaxbsd`` console command.

Subcommands register themselves on the parser from :func:`build_parser`; to add one::

    parser = build_parser()
    sub = parser.subcommands.add_parser("compress", help="...")
    sub.add_argument(...)
    sub.set_defaults(func=run_compress)   # func(args) -> exit status

``main`` dispatches to ``args.func``. A subcommand validates its arguments before it reads or
writes any file (see :mod:`jaxbsd.cli_args`). User errors are one line on stderr,
``jaxbsd <command>: error: <message>``, with exit status 2 and no traceback: argparse's own
checks, and any ``ValueError`` or ``OSError`` (the library's boundary errors: bad settings,
missing or corrupt files and data) raised by the subcommand. ``--debug`` also prints the
traceback. Any other exception is a bug: it propagates with its traceback (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Sequence

from jaxbsd.cli_args import CLIParser, checkpoint_slot, existing_path, one_line, output_file, positive_int

__all__ = ["build_parser", "main", "add_train_command", "train_config_from_args", "validate_train_args",
           "SUBCOMMANDS", "USER_ERRORS"]

#: Functions ``f(subparsers)`` that add one subcommand each; extend to add commands.
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


#: Exceptions that are the user's to fix: the library raises these at its boundaries with a
#: message naming the argument or file. ``main`` prints them as one ``error:`` line (exit 2).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)


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


def validate_train_args(args: argparse.Namespace):
    """Check ``jaxbsd train``'s arguments before any file is read or written; return the
    :class:`~jaxbsd.train.TrainConfig`.

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
    p.add_argument("--dataset", required=True, choices=[*DATASETS, *TEXT_DATASETS],
                   help="image data set; pystdlib (text) for --model lm")
    p.add_argument("--data-root", default=None,
                   help="file or directory holding the data set (default: under $JAXBSD_DATA)")
    _train_config_flags(p)
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N examples")
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

    cfg = validate_train_args(args)
    if args.model == "lm" or args.dataset in data.TEXT_DATASETS:  # the character language model
        from jaxbsd.cli_lm import run_train_lm

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
    parser = CLIParser(
        prog="jaxbsd", description="B-spline decoupling (R-CMTF-BSD) and transformer MLP compression",
    )
    parser.add_argument("--debug", action="store_true", help="on an error, also print the traceback")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.subcommands = subparsers
    for add in SUBCOMMANDS:
        add(subparsers)
    for sub in subparsers.choices.values():  # also after the command: jaxbsd train --debug ...
        try:
            sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="on an error, also print the traceback")
        except argparse.ArgumentError:  # the command defines its own --debug
            pass
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the subcommand; returns its status.

    A user error (argparse's checks, or a ``USER_ERRORS`` exception from the subcommand) prints
    ``jaxbsd <command>: error: <message>`` on stderr and raises ``SystemExit(2)``; with
    ``--debug`` the traceback comes first. Other exceptions propagate unchanged.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    command = parser.subcommands.choices[args.command]
    if unknown:  # named after the command they were given to, like every other error
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.command_line = " ".join(["jaxbsd", *argv])
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as err:
        if args.debug:
            traceback.print_exc()
        command.error(one_line(err) or type(err).__name__)
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        command.exit(130, f"{command.prog}: interrupted\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
