"""Distillation against compression: the time of the whole-model distillation stage beside the
compression it follows, on the studies' trained models.

Issue 43's cost row. The compression is ``jb.compress_model`` at ρ = 0.5 on 256 unlabeled training
images with its defaults but for the basis (``method="bsd"`` in the paper's basis, ``contain=False``, as
the benchmark was first run: 300 sweeps, the warm start, the restart chosen on held-out tokens;
``jb.Refine()`` on every replacement), every block's MLP, back to front. Two
distillations (:class:`jb.Distill`, the replaced MLPs' parameters, 20 % of the images held out,
minibatches of 64 images) are timed on it: the defaults, 300 steps on 16,384 images of a cosine from
1e-3, KL on the logits at T = 2 (short: run twice, to show the compilation's share), and the distillation study's headline recipe
(``experiments/distill.py``'s ``FULL``, its own loss and forward: KL on the logits plus every block's
output tokens, 6,000 steps, a cosine schedule from 1e-3) on 16,384 images, or as many as the
training split has beside the calibration (DeiT/USPS: 7,035). Each distillation starts from a copy of
the same compressed model and its targets (the original's outputs, computed once; their seconds are
reported apart). Models: the ViT/Fashion-MNIST and DeiT/USPS of the studies (``checkpoints/``), in
float32. The compression and the headline are each timed once, cold (the first run in the process,
compilation included: what a user's run pays), the compression once more, compiled. There is no
bound: the ratios are stated.
The test accuracy of the compressed and the distilled model (one seed, no label read by either) is
recorded beside the times as a preview, not as evidence (the study's units are the evidence).

Usage::

    python benchmarks/distill.py                 # writes benchmarks/distill.json
    python benchmarks/distill.py --quick         # CI: the ViT, fewer steps and repeats, to a scratch file
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("JAXBSD_DATA", str(HERE.parents[1] / "shared" / "data"))

from benchmarks.common import Row, format_table, write_rows  # noqa: E402  (enables x64 first)

sys.path.insert(0, str(HERE.parent / "experiments"))
import distill as study  # noqa: E402  (experiments/distill.py: the headline recipe, its loss and forward)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxbsd as jb  # noqa: E402
from jaxbsd.compression.distill import DISTILL_STREAM, distill_model, teacher_outputs  # noqa: E402
from jaxbsd.data import load_dataset  # noqa: E402
from jaxbsd.checkpoint import load_checkpoint  # noqa: E402
from jaxbsd.evaluation import evaluate  # noqa: E402

#: (name, checkpoint, data set)
MODELS = (("ViT/Fashion-MNIST", "checkpoints/vit-fashion-mnist", "fashion-mnist"),
          ("DeiT/USPS", "checkpoints/deit-usps", "usps"))
#: (label, variant of experiments/distill.py, steps, images, learning rate, schedule)
#: The first row is what ``jaxbsd compress --distill-steps 300`` runs with its defaults (jb.Distill's
#: optimizer, 16,384 images, KL on the logits).
SETTINGS = (("the defaults: 300 steps, 16,384 images, KL", "kl", 300, 16384, 1e-3, "cosine"),
            ("the headline recipe: KL + blocks, 6,000 steps, 16,384 images", "kl+blocks", study.FULL["steps"],
             study.FULL["images"], study.FULL["learning_rate"], study.FULL["schedule"]))
QUICK_SETTINGS = (("30 steps, 256 images, KL", "kl", 30, 256, 3e-4, "constant"),
                  ("20 steps, 256 images, KL + blocks (the headline's loss)", "kl+blocks", 20, 256, 1e-3, "cosine"))
REDUCTION, CALIBRATION = 0.5, 256


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(name: str, checkpoint: str, dataset: str, settings) -> list[Row]:
    original, _ = load_checkpoint(HERE.parent / checkpoint)
    data = load_dataset(dataset)
    rng = np.random.default_rng(0)
    pool = rng.permutation(data.train_images.shape[0])
    calibration = jnp.asarray(data.train_images[pool[:CALIBRATION]])
    paths = [f"blocks.{i}.mlp" for i in range(len(original.blocks))]
    # nnx.merge of one split shares its Variables: every run gets a deep copy (nnx.clone) instead
    fresh = lambda: nnx.clone(original)  # noqa: E731
    key = jax.random.key(0)
    compressed = {}

    def compress():
        model, report = jb.compress_model(fresh(), calibration, mlps=paths, reduction=REDUCTION, key=key,
                                          method=jb.get_method("bsd", contain=False))
        jax.block_until_ready(nnx.state(model))
        compressed["model"], compressed["report"] = model, report

    # Cold: the first run of each in this process, compilation included, as a user's run pays it.
    t_compress = {"cold": _timed(compress)}
    pristine = nnx.clone(compressed["model"])  # every distillation starts from this compressed model
    infos, t_distill = {}, {}
    for i, (label, variant, steps, n, learning_rate, schedule) in enumerate(settings):
        # unlabeled, apart from the calibration (as many as there are, up to n)
        images = jnp.asarray(data.train_images[pool[CALIBRATION:CALIBRATION + n]])
        config = study.distill_config(variant, dict(study.FULL, steps=steps, learning_rate=learning_rate,
                                                    schedule=schedule))
        start = time.perf_counter()
        targets = teacher_outputs(fresh(), images, config.forward)
        seconds_targets = time.perf_counter() - start

        def distill(label=label, images=images, targets=targets, config=config):
            model = nnx.clone(pristine)
            infos[label] = distill_model(model, images, targets, paths, config, jax.random.fold_in(key, DISTILL_STREAM))
            infos[label]["model"], infos[label]["seconds_targets"] = model, seconds_targets
            infos[label]["config"], infos[label]["images"] = config, int(images.shape[0])
            jax.block_until_ready(nnx.state(model))

        t_distill[label] = {"cold": _timed(distill)}
        if i == 0:  # the short setting once more, compiled: the compilation's share
            t_distill[label]["warm"] = _timed(distill)
    t_compress["warm"] = _timed(compress)
    acc = lambda m: 100 * evaluate(m, data.test_images, data.test_labels, 1000)  # noqa: E731
    acc_original, acc_compressed = acc(fresh()), acc(compressed["model"])
    rows = []
    for label, _, steps, _, _, _ in settings:
        info = {k: v for k, v in infos[label].items() if k not in ("model", "config", "images")}
        ratio = t_distill[label]["cold"] / t_compress["cold"]
        rows.append(Row(
            name=f"distillation ({label}) / compression, {name} (rho = {REDUCTION}, every MLP)",
            ours=t_distill[label]["cold"], reference=t_compress["cold"], ratio=ratio, target="", passed=None,
            note="ratio = distill / compress, each one cold run (compilation included); no bound",
            ratio_min=min(t_distill[label].values()) / min(t_compress.values()),
            details={"distill_seconds": t_distill[label], "compress_seconds": t_compress,
                     "settings": infos[label]["config"].to_dict(), "images": infos[label]["images"],
                     "calibration_images": CALIBRATION, "report": info,
                     "seconds_per_step": info["seconds"] / steps,
                     "accuracy_original": acc_original, "accuracy_compressed": acc_compressed,
                     "accuracy_distilled": acc(infos[label]["model"]),
                     "params": [compressed["report"].params_before, compressed["report"].params_after]}))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    models, settings = (MODELS[:1], QUICK_SETTINGS) if args.quick else (MODELS, SETTINGS)
    rows = [row for m in models for row in measure(*m, settings=settings)]
    print(format_table(rows))
    for r in rows:
        d = r.details
        print(f"{r.name}: {r.ratio:.2f}x; accuracy original {d['accuracy_original']:.2f} %, compressed "
              f"{d['accuracy_compressed']:.2f} %, distilled {d['accuracy_distilled']:.2f} % "
              f"(held-out loss {d['report']['loss_before']:.4g} -> {d['report']['loss_after']:.4g}, "
              f"step {d['report']['steps_kept']})")
    out = args.out or (pathlib.Path("/tmp/distill_quick.json") if args.quick else HERE / "distill.json")
    command = "python benchmarks/distill.py" + (" --quick" if args.quick else "")
    write_rows(out, command, args.quick, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
