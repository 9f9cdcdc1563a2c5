"""Label-free distillation of the whole compressed model: how close to the original it gets.

The protocol of ``training_free.py`` / ``refine_ablation.py --study main`` (a trained model, every MLP
replaced back to front at a whole-model reduction ρ, 256 calibration images per block and seed,
nothing trained with labels; the method refined as the study names it, e.g. ``prune-ref300``), then
the whole compressed model distilled from the original (:class:`jaxbsd.Distill`: Adam on the replaced
MLPs' parameters, minibatches of 64 images, 20 % of the images held out and the best step on them
kept) on ``--images`` unlabeled training images (:func:`jaxbsd.compression.blockwise.distill_indices`,
the draw ``jaxbsd.compress`` makes; their labels are never read). Variants:

* ``kl``: the original's logits, KL divergence at temperature 2;
* ``kl+blocks`` (ViT): the logits as ``kl``, plus every block's output tokens (relative squared
  error per block, averaged over the blocks; TinyBERT-style intermediate targets).

Each unit records the test accuracy after refinement alone (the same compression, the same seed:
the pairing) and after distillation, the held-out loss before and after, and where the error
remains: every block's relative output error against the original's on 512 test images, before and
after distillation. The summary gives per (method, variant, ρ) the mean over seeds, the gap to the
original and the paired verdict of distillation against refinement alone.

Usage::

    python experiments/distill.py                           # ViT/Fashion-MNIST, ρ = 0.5, 3 seeds, 16,384 images
    python experiments/distill.py --model deit              # DeiT/USPS (its whole training split, 7,291 images)
    python experiments/distill.py --seeds 1 --images 1024   # an ablation: its own result file (_n1024)
    python experiments/distill.py --quick                   # CI: DeiT/USPS, 2 blocks, 1 seed, ~2 min

Writes ``<out>/distill_<model>_<dataset>.json`` (``distill_quick`` in quick mode), resuming unit by
unit: every (method, ρ, seed) compression is one resumable state under
``<out>/state/<prefix>/<protocol>/compress/``, shared by the variants, and every distillation unit
is saved (``unit.json``) once finished.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxbsd as jb
from jaxbsd.compression import blockwise
from jaxbsd.compression.distill import DISTILL_STREAM, per_leaf_loss, distill_model, teacher_outputs
from jaxbsd.data import load_dataset
from jaxbsd.evaluation import evaluate
from jaxbsd.checkpoint import load_checkpoint

import compression_study
from checkout import RESULTS, ROOT, enable_compilation_cache, rel_path
from output import Timer, command_line, machine, write_json
from refinement import Refinement, Setting
from trained import checkpoint_key, load_or_train, subset
from units import knob_suffix as shared_knob_suffix, protocol_key, resume_unit, save_unit
from verdicts import mean_std, paired_verdict

VARIANTS = ("kl", "kl+blocks")
# The headline recipe, from the probes (seed 0 of ViT/Fashion-MNIST at rho = 0.5, refined pruning): KL +
# blocks on 4,096 images, 3,000 steps at a constant 3e-4 kept its last step (still falling) at a gap of
# 1.19 points; 16,384 images, 6,000 steps, a cosine schedule from 1e-3: 0.74. The ablations vary it.
FULL = dict(model="vit", dataset="fashion-mnist", budgets=(0.5,), methods=(Setting("prune", Refinement(300)),), variants=("kl+blocks",),
            seeds=3, images=16384, steps=6000, learning_rate=1e-3, batch=64, epochs=0, train_subset=None,
            test_subset=None, blocks=None, max_iter=300, val_fraction=0.0, trainable="replaced",
            schedule="cosine", warmup=0)
QUICK = dict(FULL, model="deit", dataset="usps", budgets=(0.2,), methods=(Setting("prune", Refinement(20)),), variants=("kl",), seeds=1,
             images=128, steps=20, test_subset=300, blocks=2, max_iter=10, capture_images=64)
ERROR_IMAGES = 512


def logits_and_blocks(model, images):
    """A ViT's or DeiT's logits and every block's output tokens, in one forward pass (its
    ``__call__`` unrolled; DeiT: the mean of its class and distillation heads, as it predicts)."""
    x, blocks = model.embed(images), []
    for block in model.blocks:
        x = block(x)
        blocks.append(x)
    x = model.norm(x)
    logits = model.head(x[:, 0])
    if getattr(model, "distilled", False):
        logits = 0.5 * (logits + model.head_dist(x[:, 1]))
    return logits, tuple(blocks)


def kl_and_blocks(outputs, targets):
    """KL at T = 2 on the logits plus the blocks' relative squared errors, averaged over the blocks."""
    blocks = [per_leaf_loss("relative", 1.0, o, t) for o, t in zip(outputs[1], targets[1])]
    return per_leaf_loss("kl", 2.0, outputs[0], targets[0]) + sum(blocks) / len(blocks)


#: The distillation knobs a run may change from the full plan: each non-default one names its
#: units and its result file (``--lr 1e-3`` -> ``_lr10``), so an ablation never overwrites the headline.
KNOBS = ("images", "steps", "learning_rate", "trainable", "schedule", "warmup", "variants")


def knob_suffix(plan: dict, sep: str, skip: tuple = ()) -> str:
    """``sep``-joined tags of the knobs of ``plan`` that differ from :data:`FULL` (``""`` if none)."""
    return shared_knob_suffix(plan, FULL, KNOBS, sep, skip)


def distill_config(variant: str, plan: dict) -> jb.Distill:
    common_kw = dict(steps=plan["steps"], learning_rate=plan["learning_rate"], batch_size=plan["batch"],
                     trainable=plan["trainable"], schedule=plan["schedule"], warmup=plan["warmup"])
    if variant == "kl":
        return jb.Distill(loss="kl", temperature=2.0, **common_kw)
    return jb.Distill(loss=kl_and_blocks, forward=logits_and_blocks, **common_kw)


def block_errors(model, original, images) -> list[float]:
    """Every block's relative squared output error against the original's on ``images``."""
    errs = []
    for i in range(1, len(model.blocks) + 1):
        out = np.asarray(model.block_input(images, i), np.float64)
        ref = np.asarray(original.block_input(images, i), np.float64)
        errs.append(float(np.sum((out - ref) ** 2) / np.sum(ref ** 2)))
    return errs


def run_unit(setting: Setting, variant, reduction, seed, *, plan, args, model_path, data, order, protocol_dir, log) -> dict:
    config = compression_study.unit_config(setting, reduction, seed, plan, args)
    method = setting.name
    distill = distill_config(variant, plan)
    rho = f"rho{int(round(1000 * reduction)):04d}-seed{seed}"
    name = f"{method}-dist-{variant}-n{plan['images']}{knob_suffix(plan, '-', skip=('images', 'variants'))}-{rho}"
    state = protocol_dir / name
    tag = json.dumps({"config": config.to_dict(), "order": list(order), "distill": distill.to_dict(),
                      "images": plan["images"]}, sort_keys=True)
    if (done := resume_unit(state, tag, name, log)) is not None:
        return done
    timer = Timer()
    original = load_checkpoint(model_path)[0]
    model = load_checkpoint(model_path)[0]
    images = jnp.asarray(data.train_images[blockwise.distill_indices(data.train_images.shape[0], plan["images"], seed)])
    targets = teacher_outputs(original, images, distill.forward)  # before any replacement
    compress_state = protocol_dir / "compress" / f"{method}-{rho}"  # shared by the variants (resumed)
    steps = blockwise.compress(model, data, order=order, config=config, state_dir=compress_state, progress=False)
    seconds_compress = timer()
    probe = jnp.asarray(data.test_images[:ERROR_IMAGES])
    errors_before = block_errors(model, original, probe)
    paths = [f"blocks.{b}.mlp" for b in order]
    info = distill_model(model, images, targets, paths, distill, jax.random.fold_in(jax.random.key(seed),
                                                                                       DISTILL_STREAM))
    accuracy = 100 * evaluate(model, data.test_images, data.test_labels)
    record = {
        "method": method, "variant": variant, "reduction": reduction, "seed": seed, "status": "ok",
        "images": int(images.shape[0]), "config": config.to_dict(), "distill": info,
        "accuracy_refined": 100 * steps[-1]["acc_ft"], "accuracy": accuracy,
        "params": int(steps[-1]["params_model"]), "params_original": int(steps[-1]["params_original"]),
        "block_errors_refined": errors_before, "block_errors_distilled": block_errors(model, original, probe),
        "seconds_compress": seconds_compress, "seconds_distill": info["seconds"], "seconds": timer(),
        "machine": machine(), "state_dir": rel_path(state),
    }
    save_unit(state / "unit.json", tag, record)
    log(f"  {name}: {record['accuracy_refined']:.2f} % refined -> {accuracy:.2f} % distilled (held-out loss "
        f"{info['loss_before']:.4g} -> {info['loss_after']:.4g}, step {info['steps_kept']}), {timer():.0f} s")
    return record


def summarize(units: list[dict], acc_original: float) -> list[dict]:
    rows = []
    keys = dict.fromkeys((u["method"], u["variant"], u["reduction"]) for u in units)
    for method, variant, reduction in keys:
        us = sorted((u for u in units if (u["method"], u["variant"], u["reduction"]) == (method, variant, reduction)),
                    key=lambda u: u["seed"])
        mean, std = mean_std([u["accuracy"] for u in us])
        ref_mean, ref_std = mean_std([u["accuracy_refined"] for u in us])
        verdict = paired_verdict([u["accuracy"] for u in us], [u["accuracy_refined"] for u in us],
                                        better="distillation raises accuracy", worse="distillation lowers accuracy")
        rows.append({"method": method, "variant": variant, "reduction": reduction, "seeds": [u["seed"] for u in us],
                     "accuracy_mean": mean, "accuracy_std": std, "accuracy_refined_mean": ref_mean,
                     "accuracy_refined_std": ref_std, "gap_to_original": acc_original - mean,
                     "gap_refined_to_original": acc_original - ref_mean, "verdict_vs_refined": verdict,
                     "block_errors_refined_mean": np.mean([u["block_errors_refined"] for u in us], 0).tolist(),
                     "block_errors_distilled_mean": np.mean([u["block_errors_distilled"] for u in us], 0).tolist(),
                     "seconds_distill_mean": float(np.mean([u["seconds_distill"] for u in us]))})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size (DeiT/USPS, 2 blocks, 1 seed, 20 steps)")
    parser.add_argument("--model", choices=("vit", "deit"), default=None, help="default vit")
    parser.add_argument("--dataset", default=None, help="default fashion-mnist (deit: usps)")
    parser.add_argument("--budgets", type=float, nargs="+", default=None)
    parser.add_argument("--methods", nargs="+", type=Setting.parse, default=None,
                        help="study method names (default prune-ref300)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--images", type=int, default=None, help=f"unlabeled training images (default {FULL['images']:,})")
    parser.add_argument("--steps", type=int, default=None, help=f"distillation steps (default {FULL['steps']:,})")
    parser.add_argument("--lr", type=float, default=None, dest="learning_rate",
                        help=f"distillation learning rate (default {FULL['learning_rate']:g})")
    parser.add_argument("--trainable", choices=("replaced", "replaced+norms", "all"), default=None,
                        help="what distillation trains (default: the replaced MLPs)")
    parser.add_argument("--schedule", choices=("constant", "cosine"), default=None,
                        help=f"the learning-rate schedule (default {FULL['schedule']})")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps of the cosine schedule")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    if args.model is not None:
        plan["model"], plan["dataset"] = args.model, args.dataset or ("usps" if args.model == "deit" else "fashion-mnist")
    elif args.dataset is not None:
        plan["dataset"] = args.dataset
    for key in ("budgets", "methods", "variants", "seeds", "images", "steps", "learning_rate", "trainable", "schedule",
                "warmup"):
        if (value := getattr(args, key)) is not None:
            plan[key] = tuple(value) if isinstance(value, list) else value
    # compression_study.unit_config's options: the studies' B-spline settings, S = max(128, 2r)
    args.degree, args.dof, args.samples = 3, 4, None
    kind, name = plan["model"], plan["dataset"]
    prefix = "distill_quick" if args.quick else f"distill_{kind}_{name}"
    stem = prefix  # the units' state (compressions shared by every setting)
    if not args.quick:
        prefix += knob_suffix(plan, "_")  # an ablation: its own result file
    command = command_line("distill.py", argv)
    enable_compilation_cache()
    timer = Timer()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    quick_dir = args.out / "checkpoints" if args.quick else None
    model, model_info = load_or_train(kind, name, quick_dir=quick_dir, log=log)
    data = subset(load_dataset(name), train=plan["train_subset"], test=plan["test_subset"], seed=args.seed)
    model_path = pathlib.Path(model_info["checkpoint"])
    model_path = model_path if model_path.is_absolute() else ROOT / model_path
    order = list(blockwise.block_order("back-to-front", len(model.blocks)))[: plan["blocks"] or None]
    acc_original = 100 * evaluate(model, data.test_images, data.test_labels)
    protocol = {"model": kind, "dataset": name, "checkpoint": checkpoint_key(model_info["checkpoint"]),
                "train": plan["train_subset"], "test": plan["test_subset"], "data_seed": args.seed, "order": order}
    key = protocol_key(protocol)
    protocol_dir = args.out / "state" / stem / f"protocol-{key}"
    log(f"{kind}/{name}: test accuracy {acc_original:.2f} % on {data.test_images.shape[0]} images; blocks {order}")
    units = [run_unit(setting, variant, reduction, seed, plan=plan, args=args, model_path=model_path, data=data,
                      order=order, protocol_dir=protocol_dir, log=log)
             for reduction in plan["budgets"] for setting in plan["methods"] for variant in plan["variants"]
             for seed in range(args.seed, args.seed + plan["seeds"])]
    rows = summarize(units, acc_original)
    for r in rows:
        print(f"{r['method']} + distillation ({r['variant']}, {plan['images']} images) at rho = {r['reduction']}: "
              f"{r['accuracy_mean']:.2f} ± {r['accuracy_std']:.2f} % (refined alone {r['accuracy_refined_mean']:.2f} %; "
              f"original {acc_original:.2f} %, gap {r['gap_to_original']:.2f} points; seeds {r['seeds']}; "
              f"{r['verdict_vs_refined']['verdict']})")
    payload = {
        "command": command, "mode": "quick" if args.quick else "full",
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
        "protocol": (f"{kind}/{name}: the training-free protocol (every MLP of blocks {order} back to front at "
                     "whole-model reduction rho, 256 calibration images per block and seed, nothing trained with "
                     f"labels), then distillation on {units[0]['images'] if units else plan['images']} unlabeled training images (20 % held out, "
                     f"best step kept), {plan['steps']} Adam steps of {plan['batch']} images at lr "
                     f"{plan['learning_rate']} ({plan['schedule']} schedule"
                     f"{', warm-up ' + str(plan['warmup']) if plan['warmup'] else ''}), training "
                     f"{plan['trainable']} parameters"),
        "protocol_key": key, "model": model_info, "accuracy_original": acc_original,
        "test_images": int(data.test_images.shape[0]), "train_images": int(data.train_images.shape[0]),
        "blocks": order, "rows": rows, "runs": units,
        "machines": sorted({u["machine"] for u in units if u.get("machine")}), "wall_seconds": timer(),
    }
    out = write_json(args.out / f"{prefix}.json", payload)
    print(f"wrote {out} ({timer():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
