"""The trained models the studies compress, and the data subsets they use.

* :func:`load_or_train` — a trained model from ``checkpoints/<kind>-<dataset>``, or trained with
  the exact command recorded in ``experiments/results/training.json`` (else the recipe table
  ``jaxbsd.train.RECIPES``) and cached there; :func:`training_command`, :func:`train_from_args`;
* :func:`checkpoint_key` — how a checkpoint path enters the studies' protocol keys and unit tags
  (committed state spells ``checkpoints/<name>`` as ``checkpoints/<name>.npz``);
* :func:`subset` — a seeded random subset of a data set's splits, keeping its normalization.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shlex

import numpy as np

from jaxbsd.data import Dataset
from jaxbsd.io import read_json

from checkout import CHECKPOINTS, ROOT, TRAINING_JSON, rel_path

__all__ = ["subset", "training_command", "MODEL_OVERRIDES", "load_or_train", "checkpoint_key", "train_from_args"]


def subset(dataset: Dataset, train: int | None = None, test: int | None = None, seed: int = 0) -> Dataset:
    """A seeded random subset of the splits, keeping the full set's normalization.

    (``load_dataset(limit=...)`` would renormalize with the subset's statistics, which a model
    trained on the full split never saw.)
    """
    rng = np.random.default_rng(seed)

    def pick(images, labels, n):
        if n is None or n >= images.shape[0]:
            return images, labels
        idx = np.sort(rng.choice(images.shape[0], n, replace=False))
        return images[idx], labels[idx]

    tr_x, tr_y = pick(dataset.train_images, dataset.train_labels, train)
    te_x, te_y = pick(dataset.test_images, dataset.test_labels, test)
    return dataclasses.replace(dataset, train_images=tr_x, train_labels=tr_y, test_images=te_x, test_labels=te_y)


def training_command(kind: str, dataset: str) -> tuple[list[str], str]:
    """``jaxbsd train`` arguments (without ``--out``/``--json``) for ``kind`` on ``dataset``,
    and where they come from: the run recorded in ``training.json``, else ``jaxbsd.train.RECIPES``."""
    if TRAINING_JSON.exists():
        for run in read_json(TRAINING_JSON).get("runs", []):
            if run.get("model") == kind and run.get("dataset") == dataset and run.get("command"):
                args = shlex.split(run["command"])[1:]  # drop the program name
                keep, skip = [], False
                for a in args:
                    if skip:
                        skip = False
                        continue
                    if a in ("--out", "--json"):
                        skip = True
                        continue
                    if a.startswith(("--out=", "--json=")):
                        continue
                    keep.append(a)
                if "--teacher" in keep:
                    i = keep.index("--teacher") + 1
                    keep[i] = _renamed(keep[i])
                return keep, f"{TRAINING_JSON.relative_to(ROOT)}: {run['command']}"
    from jaxbsd.training import RECIPES

    if (kind, dataset) not in RECIPES:
        raise ValueError(f"no training recipe for {kind} on {dataset}; pass --checkpoint")
    extra = RECIPES[(kind, dataset)].cli_args()  # spelled out, so the recorded command says it all
    return ["train", "--model", kind, "--dataset", dataset, *extra, "--no-progress"], "jaxbsd.train.RECIPES"


#: Model config overrides where the library has no preset: Swin's patch is image_size // 8,
#: which 28×28 images do not allow; patch 7 gives a 4×4 token grid (one 4×4 window, then 2×2).
MODEL_OVERRIDES = {("swin", "fashion-mnist"): {"patch_size": 7}, ("swin", "mnist"): {"patch_size": 7}}


def load_or_train(kind: str, dataset: str, *, checkpoint: str | os.PathLike | None = None,
                  quick_dir: str | os.PathLike | None = None, quick_epochs: int = 2,
                  quick_limit: int = 2000, log=print):
    """A trained ``kind`` model for ``dataset`` and a dict describing where it came from.

    Order: ``checkpoint`` if given; else ``checkpoints/<kind>-<dataset>`` if it exists; else
    * with ``quick_dir`` (CI): train ``quick_epochs`` on ``quick_limit`` training images (no
      teacher) and cache the weak model as ``<quick_dir>/<kind>-<dataset>-quick``;
    * otherwise train with the recorded ``jaxbsd train`` command (``training.json``, else the
      recipe table jaxbsd.train.RECIPES), writing ``checkpoints/<kind>-<dataset>`` once it has finished.
    """
    from jaxbsd.checkpoint import load_checkpoint

    if checkpoint is not None:
        path = pathlib.Path(checkpoint)
        model, meta = load_checkpoint(path)
        return model, {"checkpoint": str(path), "trained_now": False, "command": meta.get("command")}
    path = CHECKPOINTS / f"{kind}-{dataset}"
    if path.exists():
        model, meta = load_checkpoint(path)
        return model, {"checkpoint": rel_path(path), "trained_now": False, "command": meta.get("command")}
    args, source = training_command(kind, dataset)
    overrides = MODEL_OVERRIDES.get((kind, dataset), {})
    if quick_dir is not None:
        quick = pathlib.Path(quick_dir) / f"{kind}-{dataset}-quick"
        if not quick.exists():
            args = _set_option(args, "--epochs", str(quick_epochs))
            args = _set_option(args, "--warmup-epochs", "0")
            if "--teacher" in args:  # the teacher may be missing in CI: train without one
                i = args.index("--teacher")
                del args[i:i + 2]
            log(f"[quick] training {kind} on {quick_limit} {dataset} images: jaxbsd {' '.join(args)}")
            train_from_args(args, quick, overrides=overrides, train_limit=quick_limit, log=log)
        model, meta = load_checkpoint(quick)
        return model, {"checkpoint": str(quick), "trained_now": True, "quick": True,
                       "command": meta.get("command"), "recipe": source, "config_overrides": overrides}
    if "--teacher" in args:
        teacher = pathlib.Path(args[args.index("--teacher") + 1])
        if not (ROOT / teacher).exists() and not teacher.exists():
            t_kind, t_data = teacher.stem.split("-", 1)
            load_or_train(t_kind, t_data, log=log)
    log(f"training {kind} on {dataset} ({source}): jaxbsd {' '.join(args)}"
        + (f" with config overrides {overrides}" if overrides else ""))
    train_from_args(args, path, overrides=overrides, log=log)
    model, meta = load_checkpoint(path)
    return model, {"checkpoint": rel_path(path), "trained_now": True, "command": meta.get("command"),
                   "recipe": source, "config_overrides": overrides}


#: The trained models' old spelling ``checkpoints/<kind>-<dataset>.npz`` (same weights): recorded
#: commands (``training.json``) and the keys of committed study state (``experiments/results/state``)
#: spell them so.
_OLD_NAME = re.compile(r"checkpoints/([\w-]+)\.npz")


def checkpoint_key(path: str | os.PathLike) -> str:
    """How ``path`` (as :func:`load_or_train` records it) enters protocol keys and resume tags:
    ``checkpoints/<kind>-<dataset>`` keeps its old spelling ``checkpoints/<kind>-<dataset>.npz``,
    so the studies find the units they finished before the rename; other paths are unchanged."""
    path = str(path)
    return f"{path}.npz" if re.fullmatch(r"checkpoints/[\w-]+", path) else path


def _renamed(path: str) -> str:
    """A checkpoint path from a recorded command, as the checkpoint is named now."""
    match = _OLD_NAME.fullmatch(path)
    return f"checkpoints/{match.group(1)}" if match else path


def _set_option(args: list[str], name: str, value: str) -> list[str]:
    args = list(args)
    if name in args:
        args[args.index(name) + 1] = value
    else:
        args += [name, value]
    return args


def train_from_args(args: list[str], path: pathlib.Path, *, overrides: dict | None = None,
                    train_limit: int | None = None, log=print) -> pathlib.Path:
    """What ``jaxbsd train <args> --out <path>`` does, plus model-config ``overrides`` and a
    random ``train_limit`` subset that keeps the full split's normalization; the checkpoint
    appears only once training has finished (training writes ``<path>.partial`` each epoch)."""
    from jaxbsd import cli, data
    from jaxbsd.models import build_model, config_for_dataset, count_params
    from jaxbsd.checkpoint import load_checkpoint
    from jaxbsd.training import train

    ns = cli.build_parser().parse_args(args)
    cfg = cli.train_config_from_args(ns)
    dataset = data.load_dataset(ns.dataset, ns.data_root, seed=cfg.seed, limit=ns.limit)
    if train_limit is not None:
        dataset = subset(dataset, train=train_limit, seed=cfg.seed)
    over = dict(overrides or {})
    if cfg.drop_path is not None:
        over["drop_path"] = cfg.drop_path
    model = build_model(ns.model, config_for_dataset(ns.model, dataset, **over), seed=cfg.seed)
    teacher = None
    if ns.teacher:
        teacher_path = pathlib.Path(ns.teacher)
        teacher, _ = load_checkpoint(teacher_path if teacher_path.is_absolute() else ROOT / teacher_path)
    command = "jaxbsd " + " ".join(args)
    metadata = {"dataset": ns.dataset, "data_root": ns.data_root, "command": command, "teacher": ns.teacher,
                "params": count_params(model), "train_config": cfg.to_dict(), "config_overrides": overrides or {},
                "train_limit": train_limit, "written_by": "experiments/trained.py train_from_args"}
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")

    def report(h):
        log(f"  epoch {h['epoch']:3d}  loss {h['loss']:.4f}  test_acc {h['test_acc']:.4f}  {h['seconds']:.1f} s")

    train(model, dataset, cfg, teacher=teacher, progress=False, checkpoint=partial, metadata=metadata,
          on_epoch=report)
    os.replace(partial, path)
    return path

