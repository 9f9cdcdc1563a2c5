"""``jaxbsd compress``: the main job — train (if needed), compress block by block, report.

By default it runs on the embedded ``digits`` data set (scikit-learn's 8×8 digits): trains the
paper's ViT if no checkpoint is given, compresses it back-to-front with R-CMTF-BSD (cubic
B-splines, ν = 4, rank = embedding width, S = 128, or the ranks a ``--reduction`` budget
allows), fine-tunes after every step (kept only if the validation hold-out does not get worse),
prints a table (step, accuracy after decoupling and after fine-tuning, parameters, savings) and
writes the step records (JSON) and a PNG of the accuracy and parameter count per step.

Every argument, file and data set is checked before anything is written: a user error is one
line ``jaxbsd compress: error: ...`` (exit status 2) and leaves ``--out`` as it was. Rerun with
the same settings and ``--out``, it resumes after the last finished step (``--out/state``);
``--out`` holding the state of other settings is refused.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from jaxbsd.cli.args import (
    checkpoint_slot,
    existing_path,
    fraction,
    nonnegative_float,
    nonnegative_int,
    output_dir,
    positive_float,
    positive_int,
    show_progress,
)

__all__ = ["add_compress_command", "validate_compress_args", "plot_steps", "format_table"]

BASES = ("bspline", "polynomial", "relu")


def _basis(args):
    from jaxbsd.solver.bases import BSpline, Polynomial, ReLU

    if args.basis == "bspline":
        return BSpline(args.degree, args.dof)
    if args.basis == "polynomial":
        return Polynomial(args.degree)
    return ReLU(args.dof)


def validate_compress_args(args: argparse.Namespace):
    """Check ``jaxbsd compress``'s arguments before any file is read or written; return the
    :class:`~jaxbsd.compression.blockwise.CompressionConfig` they give.

    Value ranges are argparse's (the flags' types); this adds what needs several flags (the
    basis, the config) and the paths: ``--checkpoint`` and ``--data-root`` must exist, ``--out``
    must be a directory or not exist.

    Raises:
        ValueError: naming the flag or setting.
    """
    from jaxbsd.compression import blockwise as compress

    # The flags are the configuration's flat form (its saved identity): one table turns them into objects.
    config = compress.CompressionConfig.from_flat(**dict(
        method=args.method, basis=_basis(args), rank=args.rank, robust=not args.non_robust, lam=args.lam,
        max_iter=args.max_iter, restarts=args.restarts, num_samples=args.samples,
        finetune_epochs=args.finetune_epochs, lr=args.lr, seed=args.seed,
        reduction=args.reduction, allocation=args.allocation, val_fraction=args.val_fraction,
        refine_steps=args.refine_steps, refine_lr=args.refine_lr, refine_target=args.refine_target,
        refine_batch=args.refine_batch or None, warm_start=args.warm_start,
        distill_steps=args.distill_steps, distill_lr=args.distill_lr, distill_batch=args.distill_batch or None,
        distill_images=args.distill_images, distill_loss=args.distill_loss,
        distill_temperature=args.distill_temperature, distill_trainable=args.distill_trainable,
        distill_schedule=args.distill_schedule, distill_warmup=args.distill_warmup,
    ))
    existing_path("--checkpoint", args.checkpoint)
    existing_path("--data-root", args.data_root)
    output_dir("--out", args.out)
    return config


def _check_fits(model, dataset, args) -> None:
    """The ``--checkpoint``'s model must take ``--dataset``'s images and classes."""
    c = getattr(model, "config", None)
    have = tuple(getattr(c, name, None) for name in ("image_size", "channels", "num_classes"))
    want = (dataset.image_size, dataset.channels, dataset.num_classes)
    if None not in have and have != want:
        raise ValueError(
            f"--checkpoint {args.checkpoint} takes {have[0]}x{have[0]}x{have[1]} images in {have[2]} classes, "
            f"but --dataset {args.dataset} has {want[0]}x{want[0]}x{want[1]} images in {want[2]} classes"
        )


def format_table(steps: list[dict], acc_original: float, params_original: int) -> str:
    """The per-step table printed by the command."""
    lines = [
        f"{'step':<10}{'block':>6}{'acc CMTF %':>12}{'acc FT %':>10}{'params':>10}{'savings %':>11}{'Error(J)':>10}",
        f"{'original':<10}{'':>6}{'':>12}{100 * acc_original:>10.2f}{params_original:>10}{0.0:>11.2f}{'':>10}",
    ]
    for s in steps:
        err = f"{s['error_J']:.3f}" if "error_J" in s else "-"
        lines.append(
            f"{s['step']:<10}{s['block']:>6}{100 * s['acc_cmtf']:>12.2f}{100 * s['acc_ft']:>10.2f}"
            f"{s['params_model']:>10}{s['savings_model']:>11.2f}{err:>10}"
        )
    return "\n".join(lines)


def plot_steps(steps: list[dict], acc_original: float, path: pathlib.Path, title: str,
               params_original: int | None = None) -> None:
    """Accuracy after each decoupling (CMTF k) and fine-tuning (FT k) step, as a PNG, with the
    model's parameter count on a second axis (when ``params_original`` is given). A fine-tuning
    that was discarded (``finetune_kept`` false: validation fell, the weights before it were kept)
    is drawn as an open grey cross and labelled so; the legend, below the axes, states the final
    parameter count, so no text lies across a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    labels, values, discarded = ["original"], [100 * acc_original], []
    for s in steps:
        kept = s.get("finetune_kept", True)
        labels += [f"CMTF ({s['step']})", f"FT ({s['step']})" + ("" if kept else " discarded")]
        values += [100 * s["acc_cmtf"], 100 * s["acc_ft"]]
        if not kept:
            discarded.append(len(values) - 1)
    fig, ax = plt.subplots(figsize=(1.1 * len(labels) + 2, 3.8))
    ax.plot(range(len(values)), values, "-", color="tab:blue")
    ordinary = [i for i in range(len(values)) if i not in discarded]
    ax.plot(ordinary, [values[i] for i in ordinary], "o", color="tab:blue")
    handles = [Line2D([], [], color="tab:blue", marker="o", label="test accuracy")]
    if discarded:
        ax.plot(discarded, [values[i] for i in discarded], "X", mfc="white", mec="grey", ms=9)
        handles.append(Line2D([], [], ls="", marker="X", mfc="white", mec="grey", ms=9,
                              label="fine-tuning discarded (accuracy of the weights kept)"))
    ax.set_xticks(range(len(values)), labels, rotation=30, ha="right")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if params_original is not None:
        params = [params_original]
        for s in steps:
            params += [s["params_model"], s["params_model"]]
        twin = ax.twinx()
        twin.step(range(len(params)), params, "s--", color="tab:orange", where="post", alpha=0.8)
        twin.set_ylabel("parameters", color="tab:orange")
        twin.set_ylim(0, 1.05 * params_original)
        handles.append(Line2D([], [], color="tab:orange", ls="--", marker="s", label=(
            f"parameters: {params[-1]:,} at the end ({100 * (1 - params[-1] / params_original):.1f} % fewer)")))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=len(handles), fontsize=8,
              frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _run(args: argparse.Namespace) -> int:
    from jaxbsd import data, training
    from jaxbsd.checkpoint import load_checkpoint
    from jaxbsd.compression import blockwise as compress
    from jaxbsd.evaluation import evaluate
    from jaxbsd.io import write_json_atomic
    from jaxbsd.models import build_model, config_for_dataset, count_params

    config = validate_compress_args(args)
    start = time.perf_counter()
    out = pathlib.Path(args.out)
    # Everything is read and checked before anything is written: an error leaves --out as it was.
    if args.checkpoint:
        model, _ = load_checkpoint(args.checkpoint)
    dataset = data.load_dataset(args.dataset, args.data_root)
    if args.checkpoint:
        _check_fits(model, dataset, args)
    else:
        model = build_model(args.model, config_for_dataset(args.model, dataset), seed=args.seed)
        checkpoint_slot("--out", out / "trained")
    checkpoint_slot("--out", out / "compressed")
    try:  # a state of another run (other settings) in --out/state: refused before training
        compress.check_state(out / "state", model, order=args.order, config=config)
    except ValueError as err:
        raise ValueError(f"--out {args.out}: {err}") from err
    out.mkdir(parents=True, exist_ok=True)
    if args.checkpoint:
        print(f"loaded {args.checkpoint}", file=sys.stderr)
    else:
        print(f"training {args.model} on {args.dataset} for {args.train_epochs} epochs", file=sys.stderr)
        training.train(model, dataset, epochs=args.train_epochs, lr=args.train_lr, schedule="cosine",
                       warmup_epochs=2, seed=args.seed, progress=show_progress(args),
                       checkpoint=out / "trained", metadata={"dataset": args.dataset})
    acc_original = evaluate(model, dataset.test_images, dataset.test_labels)
    params_original = count_params(model)
    steps = compress.compress(model, dataset, order=args.order, config=config,
                              state_dir=out / "state", progress=show_progress(args))
    table = format_table(steps, acc_original, params_original)
    print(table)
    if steps and steps[-1].get("distill"):
        d = steps[-1]["distill"]
        print(f"{'distilled':<10}{'':>6}{'':>12}{100 * d['acc_after']:>10.2f}   (label-free, {d['steps']} steps on "
              f"{d['images']} images; held-out loss {d['loss_before']:.4g} -> {d['loss_after']:.4g})")
    ranks = sorted({s["rank"] for s in steps})
    rank_text = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
    budget = f", reduction {args.reduction} ({args.allocation})" if args.reduction is not None else ""
    title = f"{args.model} on {args.dataset}: {args.order}, {args.basis} ({rank_text}{budget})"
    plot_steps(steps, acc_original, out / "accuracy.png", title, params_original)
    exported = _export_and_verify(model, out / "compressed", dataset, args)
    payload = {
        "command": args.command_line,
        "dataset": args.dataset,
        "model": args.model,
        "order": args.order,
        "config": config.to_dict(),
        "acc_original": acc_original,
        "params_original": params_original,
        "steps": steps,
        "factored_checkpoint": exported,
        "wall_seconds": time.perf_counter() - start,
    }
    write_json_atomic(out / "compression.json", payload)
    print(f"wrote {out / 'compression.json'}, {out / 'accuracy.png'} and the factored checkpoint "
          f"{out / 'compressed'} ({payload['wall_seconds']:.0f} s)")
    return 0


def _export_and_verify(model, path: pathlib.Path, dataset, args) -> dict:
    """Save the compressed model in factored form (``jb.save_compressed``), reload it into a
    freshly built original model (``jb.load_compressed``) and check that the logits on the test
    images are bit-identical; raise if they are not."""
    import numpy as np

    from jaxbsd import checkpoint
    from jaxbsd.evaluation import predict
    from jaxbsd.models import build_model, config_for_dataset, count_params

    model.eval()
    checkpoint.save_compressed(path, model, metadata={"dataset": args.dataset, "command": args.command_line})
    fresh = build_model(args.model, config_for_dataset(args.model, dataset), seed=args.seed + 1)
    restored = checkpoint.load_compressed(path, fresh)
    images = dataset.test_images[:512]
    before, after = predict(model, images), predict(restored, images)
    if not np.array_equal(before, after):
        raise RuntimeError(f"{path}: the reloaded factored model's logits differ from the saved model's")
    print(f"factored checkpoint {path}: reloaded into a fresh {args.model}, logits bit-identical "
          f"on {len(images)} test images", file=sys.stderr)
    return {"path": str(path), "params": count_params(restored), "verified_images": int(len(images)),
            "logits_bit_identical": True}


#: Why this command's defaults differ from ``jb.compress_model``'s (shown by ``--help``; docs/cli.md says the same).
DEFAULTS_NOTE = (
    "Defaults: this command runs the paper's pipeline, as the committed results do: no warm start and no "
    "label-free refinement, and fine-tuning with labels after every block. jb.compress_model (Python, no "
    "labels) has both on by default instead: its warm start (a decoupling started from the pruned MLP) and "
    "jb.Refine() (300 Adam steps on minibatches of 512 tokens, consistent target). To get them here: "
    "--warm-start --refine-steps 300 (the --refine-* defaults are jb.Refine's)."
)


def add_compress_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``jaxbsd compress``."""
    from jaxbsd.data import DATASETS

    p = subparsers.add_parser("compress", help="train (if needed) and compress a transformer block by block",
                              description=__doc__.split("\n\n")[1], epilog=DEFAULTS_NOTE)
    p.add_argument("--model", default="vit", choices=("vit", "swin", "deit"), help="architecture")
    p.add_argument("--dataset", default="digits", choices=DATASETS, help="image data set")
    p.add_argument("--data-root", default=None,
                   help="file or directory holding the data set (default: under $JAXBSD_DATA)")
    p.add_argument("--checkpoint", default=None, help="a trained model (else it is trained first)")
    p.add_argument("--train-epochs", type=positive_int, default=40, help="training epochs without --checkpoint")
    p.add_argument("--train-lr", type=positive_float, default=1e-3, help="training learning rate without --checkpoint")
    p.add_argument("--order", default="back-to-front", choices=("back-to-front", "front-to-back", "bf", "fb"),
                   help="the order of the blocks (the paper's BF and FB)")
    p.add_argument("--method", default="bsd", choices=("bsd", "svd", "drone", "prune", "auto"),  # jaxbsd.compression.blockwise.METHODS
                   help="bsd (decoupling), svd/drone (low rank), prune (hidden units) or auto (deprecated: per "
                        "block the better of a decoupling warm-started from the pruned MLP and the pruned MLP); "
                        "baselines need --rank or --reduction")
    p.add_argument("--basis", default="bspline", choices=BASES, help="basis of the internal functions")
    p.add_argument("--degree", type=nonnegative_int, default=3, help="degree of the basis")
    p.add_argument("--dof", type=positive_int, default=4, help="coefficients per internal function (nu)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--rank", type=positive_int, default=None, help="default: the embedding width")
    size.add_argument("--reduction", type=fraction, default=None,
                   help="instead of --rank: remove this fraction of the model's parameters "
                        "(the compressed model keeps at most (1 - reduction) P)")
    p.add_argument("--allocation", default="uniform", choices=("uniform", "greedy"),
                   help="how --reduction is shared by the blocks (greedy: where the error falls fastest)")
    p.add_argument("--val-fraction", type=fraction, default=0.1,
                   help="training data held out to keep or discard each fine-tuning (0: always keep)")
    p.add_argument("--lam", type=nonnegative_float, default=0.25, help="lambda, the weight of the outputs in the fit")
    p.add_argument("--non-robust", action="store_true", help="plain CMTF (no normalization/Tikhonov)")
    p.add_argument("--samples", type=positive_int, default=128, help="sampling points S per block")
    p.add_argument("--max-iter", type=positive_int, default=300, help="solver sweeps")
    p.add_argument("--restarts", type=positive_int, default=1, help="random restarts of the solver")
    p.add_argument("--warm-start", action="store_true",
                   help="bsd: add a restart started from the block's MLP pruned to rank - 1 units "
                        "(jb.compress_model's default; off here, as in the paper)")
    p.add_argument("--refine-steps", type=nonnegative_int, default=0,
                   help="steps of label-free refinement of each replacement before fine-tuning (0: none; "
                        "jb.compress_model's default is 300)")
    p.add_argument("--refine-lr", type=positive_float, default=1e-3, help="refinement learning rate")
    p.add_argument("--refine-batch", type=nonnegative_int, default=512,
                   help="refinement tokens per step, drawn at random (0: all of them, full batch)")
    p.add_argument("--refine-target", default="consistent", choices=("consistent", "local"),
                   help="what refinement reproduces: the original model's MLP outputs (consistent) or the "
                        "original MLP on the current inputs (local)")
    p.add_argument("--distill-steps", type=nonnegative_int, default=0,
                   help="steps of label-free distillation of the whole model from the original after the last "
                        "step (0: none)")
    p.add_argument("--distill-lr", type=positive_float, default=1e-3, help="distillation learning rate (the peak)")
    p.add_argument("--distill-batch", type=nonnegative_int, default=64,
                   help="distillation images per step, drawn at random (0: all of them)")
    p.add_argument("--distill-images", type=positive_int, default=16384,
                   help="unlabeled training images distillation uses (20 %% held out to keep the best step)")
    p.add_argument("--distill-loss", default="kl", choices=("kl", "relative", "cosine"),
                   help="what distillation minimises on the logits: KL with a temperature, relative squared "
                        "error or cosine")
    p.add_argument("--distill-temperature", type=positive_float, default=2.0, help="the KL loss's temperature")
    p.add_argument("--distill-trainable", default="replaced", choices=("replaced", "replaced+norms", "all"),
                   help="which parameters distillation trains")
    p.add_argument("--distill-schedule", default="cosine", choices=("constant", "cosine"),
                   help="distillation learning-rate schedule (cosine: from --distill-lr down to 0)")
    p.add_argument("--distill-warmup", type=nonnegative_int, default=0,
                   help="steps of linear warm-up before the cosine schedule")
    p.add_argument("--finetune-epochs", type=nonnegative_int, default=2,
                   help="fine-tuning epochs (with labels) after each block (0: none)")
    p.add_argument("--lr", type=positive_float, default=1e-4, help="fine-tuning learning rate")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of training, sampling and restarts")
    p.add_argument("--out", default="runs/compress", help="output folder (results, state for resuming)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (none either when stderr is not a terminal, e.g. a log file)")
    p.set_defaults(func=_run)
