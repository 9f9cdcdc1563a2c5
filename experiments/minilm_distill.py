"""Label-free distillation of the compressed all-MiniLM-L6-v2, paired with refinement alone.

The compression is the real-model study's refined unit (``experiments/minilm.py``: every MLP back to
front at a share ``s`` of the six MLPs' parameters removed, refined, 32 calibration windows of 128
tokens per seed), resumed from that study's state where it is on this machine (the call and its
state directory are the study's), recomputed otherwise. The compressed encoder is then trained
towards the original encoder's outputs on ``distill_windows`` further windows of the calibration
files (another draw than the calibration's; the evaluation files are never read), through
:func:`jaxbsd.compression.distill.distill_model` with a batch (``{"ids", "mask"}``) and a
``forward``, so each step runs ``batch`` windows:

* ``emb``: the sentence embedding (mean pooling, normalized), cosine loss;
* ``emb+layers``: that, plus every layer's output tokens (relative squared error per layer,
  averaged over the layers; TinyBERT-style intermediate targets).

With ``--lengths mixed`` half the distillation windows are cut short (a length drawn log-uniformly
from 4 tokens up, closed by ``[SEP]``, padded and masked; the layers' targets are zero on padding),
as the evaluation embeds titles of a few tokens and passages of every length. With ``--lengths
passages`` the inputs are the calibration files' passages themselves (4,294; their own lengths, a
median near 50 tokens as the evaluation's, cut at 128; ``--windows`` then counts passages).

The evaluation is the study's (256 held-out passages, 300 title → section pairs of the evaluation
files; mean cosine to the original's embeddings, top-10 neighbour overlap, recall@1/@10), for the
refined model and the distilled one: the pairing. Where the error remains: every layer's relative
output error against the original's, and the embedding's ``1 − cos``, on 64 windows of the
evaluation files, before and after distillation.

Usage::

    python experiments/minilm_distill.py            # s = 0.8, refined pruning and auto, seed 0
    python experiments/minilm_distill.py --quick    # CI: s = 0.9, pruning, tiny data, 10 steps
    python experiments/minilm_distill.py --methods prune --trainable all --steps 2000
                                                    # an ablation: minilm_distill_s2000_all.json
    python experiments/minilm_distill.py --methods prune --trainable all --steps 2000 --lr 1e-3 --lengths mixed
                                                    # minilm_distill_s2000_lr10_all_mixed.json
    python experiments/minilm_distill.py --methods prune --trainable all --steps 2000 --lr 1e-3 --lengths passages \
        --windows 4294                              # minilm_distill_n4294_s2000_lr10_all_passages.json

Writes ``<out>/minilm_distill.json`` (``minilm_distill_quick.json``), resuming unit by unit
(``<out>/state/minilm_distill/<unit>/unit.json``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


from checkout import RESULTS, enable_compilation_cache
from output import Timer, command_line, machine, write_json
from units import knob_suffix as shared_knob_suffix, resume_unit, save_unit
import minilm as study

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression.distill import DISTILL_STREAM, per_leaf_loss, distill_model, teacher_outputs
from jaxbsd.data import load_docs_corpus, minilm_dir
from jaxbsd import evaluation
from jaxbsd.models import bert as B
from jaxbsd.models import count_params

VARIANTS = ("emb", "emb+layers")
FULL = dict(shares=(0.8,), methods=("prune", "auto"), variants=("emb+layers",), seeds=1, windows=32, seq_len=128,
            max_iter=300, eval_passages=256, eval_pairs=300, distill_windows=1024, steps=1000, batch=16,
            learning_rate=3e-4, schedule="cosine", trainable="replaced", error_windows=64, lengths="full")
QUICK = dict(FULL, shares=(0.9,), methods=("prune",), windows=4, seq_len=32, max_iter=5, eval_passages=16,
             eval_pairs=16, distill_windows=24, steps=10, batch=8, error_windows=4)
#: The distillation knobs a run may change from FULL: each non-default one names its units and its
#: result file (``--trainable all --steps 2000`` -> ``minilm_distill_s2000_all.json``), so an
#: ablation never overwrites the headline.
KNOBS = ("distill_windows", "steps", "learning_rate", "trainable", "lengths", "variants")
LENGTHS = ("full", "mixed", "passages")


def knob_suffix(plan: dict, sep: str, base: dict = FULL, skip: tuple = ()) -> str:
    """``sep``-joined tags of the knobs of ``plan`` that differ from ``base`` (``""`` if none), but
    those in ``skip``."""
    return shared_knob_suffix(plan, base, KNOBS, sep, skip)


def embedding_and_layers(encoder: B.Encoder, batch: dict):
    """The encoder's sentence embeddings and every layer's output tokens, in one pass (its
    ``__call__`` unrolled)."""
    ids, mask = batch["ids"], batch["mask"]
    x = encoder.bert.embeddings(ids, jnp.zeros_like(ids))
    layers, keep = [], mask[..., None].astype(x.dtype)
    for layer in encoder.bert.layers:
        x = layer(x, mask)
        layers.append(x * keep)  # a padding token's output is no target (exact for unpadded windows)
    return encoder.sentence_embedding(x, mask), tuple(layers)


def mixed_lengths(windows: np.ndarray, sep_id: int, pad_id: int, seed: int, share: float = 0.5,
                  shortest: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, mask)``, both ``(N, T)``: ``windows`` (unpadded ``[CLS] … [SEP]``) with a ``share`` of
    them cut to a length drawn log-uniformly in ``[shortest, T)``, closed by ``[SEP]`` and padded.
    The evaluation embeds titles of a few tokens and passages of every length, where full windows
    alone never show the encoder a padded or short input."""
    ids, mask = windows.copy(), np.ones_like(windows)
    rng = np.random.default_rng(seed)
    for i in np.flatnonzero(rng.random(len(ids)) < share):
        n = int(np.exp(rng.uniform(np.log(shortest), np.log(ids.shape[1]))))
        ids[i, n - 1], ids[i, n:], mask[i, n:] = sep_id, pad_id, 0
    return ids, mask


def calibration_passages(encoder: B.Encoder, texts, seq_len: int, count: int, *,
                         seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, mask)``, both ``(count, seq_len)``: ``count`` of ``texts`` drawn at random (``seed``)
    without replacement, each tokenized as the encoder embeds a text (``[CLS] … [SEP]``), cut to
    ``seq_len`` tokens (the last one ``[SEP]``, as the tokenizer truncates), padded and masked. The
    passages of the calibration files have the evaluation's own lengths (a median near 50 tokens),
    where windows of the concatenated text are all ``seq_len`` long."""
    if not 1 <= count <= len(texts):
        raise ValueError(f"count: {len(texts)} passages, {count} requested")
    pick = np.sort(np.random.default_rng(seed).choice(len(texts), count, replace=False))
    ids, mask, _ = encoder.tokenize([texts[i] for i in pick])
    lengths = mask.sum(1)
    ids, mask = ids[:, :seq_len], mask[:, :seq_len]
    if ids.shape[1] < seq_len:
        pad = ((0, 0), (0, seq_len - ids.shape[1]))
        ids = np.pad(ids, pad, constant_values=encoder.bert.config.pad_token_id)
        mask = np.pad(mask, pad)
    ids[lengths > seq_len, -1] = encoder.tokenizer.token_to_id("[SEP]")
    return ids, mask


def layer_errors(model: B.Encoder, original: B.Encoder, ids: np.ndarray) -> list[float]:
    """Every layer's relative squared output error against the original's (``‖y − y₀‖² / ‖y₀‖²``
    over the tokens of ``ids (N, T)``, unpadded windows), then the sentence embedding's ``1 − cos``
    (mean over the windows): where the compressed encoder's error remains."""
    batch = {"ids": jnp.asarray(ids), "mask": jnp.ones(ids.shape, jnp.int32)}
    (emb, layers), (emb0, layers0) = embedding_and_layers(model, batch), embedding_and_layers(original, batch)
    errs = [float(jnp.sum((a - b) ** 2) / jnp.sum(b ** 2)) for a, b in zip(layers, layers0)]
    cos = jnp.sum(emb * emb0, -1) / (jnp.linalg.norm(emb, axis=-1) * jnp.linalg.norm(emb0, axis=-1))
    return errs + [float(jnp.mean(1 - cos))]


def embedding_only(encoder: B.Encoder, batch: dict):
    return encoder(batch["ids"], batch["mask"])


def loss_emb_and_layers(outputs, targets):
    """``1 − cos`` of the embeddings plus the layers' relative squared errors, averaged over the layers."""
    layers = [per_leaf_loss("relative", 1.0, o, t) for o, t in zip(outputs[1], targets[1])]
    return per_leaf_loss("cosine", 1.0, outputs[0], targets[0]) + sum(layers) / len(layers)


def distill_config(variant: str, plan: dict) -> jb.Distill:
    kw = dict(steps=plan["steps"], learning_rate=plan["learning_rate"], batch_size=plan["batch"],
              schedule=plan["schedule"], trainable=plan["trainable"])
    if variant == "emb":
        return jb.Distill(loss="cosine", forward=embedding_only, **kw)
    return jb.Distill(loss=loss_emb_and_layers, forward=embedding_and_layers, **kw)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--shares", nargs="+", type=float)
    parser.add_argument("--methods", nargs="+", choices=study.METHODS)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS)
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--windows", type=int, dest="distill_windows", help="unlabeled windows distilled on")
    parser.add_argument("--lr", type=float, dest="learning_rate")
    parser.add_argument("--trainable", choices=("replaced", "replaced+norms", "all"))
    parser.add_argument("--lengths", choices=LENGTHS, help="distill on full windows (default), half of them cut short, or the calibration files' passages "
                        "as they are (their own lengths, cut at 128 tokens; --windows then counts passages)")
    args = parser.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    for name in ("shares", "methods", "variants", "seeds", "steps", "distill_windows", "learning_rate", "trainable",
                 "lengths"):
        if (value := getattr(args, name)) is not None:
            plan[name] = tuple(value) if isinstance(value, list) else value
    command = command_line("minilm_distill.py", argv)
    enable_compilation_cache()
    out = pathlib.Path(args.out)
    stem = "minilm_distill_quick" if args.quick else "minilm_distill"
    base = QUICK if args.quick else FULL
    result_stem = stem + knob_suffix(plan, "_", base)  # an ablation: its own result file
    study_stem = "minilm_quick" if args.quick else "minilm"
    state_root = out / "state" / stem
    state_root.mkdir(parents=True, exist_ok=True)
    wall = Timer()

    def log(msg):
        print(msg, flush=True)

    model_dir = minilm_dir()
    original = B.from_pretrained(model_dir)
    P = count_params(original)
    P_mlp = sum(count_params(original.bert.layers[i].mlp) for i in range(6))
    corpus = load_docs_corpus()
    passages, pairs = study.evaluation_set(corpus, plan)
    calibration_texts = corpus.passages("calibration")
    # Where the error remains: unpadded windows of the evaluation files (never distilled on).
    error_ids = B.calibration_windows(original, corpus.passages("evaluation"), plan["seq_len"], plan["error_windows"],
                                      seed=0)
    reference, tag_eval = study.reference_embeddings(original, passages, pairs,
                                                     out / "state" / study_stem / "reference.npz", log)

    records = []
    for share in plan["shares"]:
        for method in plan["methods"]:
            for seed in range(plan["seeds"]):
                rho = share * P_mlp / P
                ids = B.calibration_windows(original, calibration_texts, plan["seq_len"], plan["windows"], seed=seed)
                mask = np.ones_like(ids)
                # the study's refined unit, resumed from its state directory when it is here
                run_dir = out / "state" / study_stem / f"{method}-ref_s{share}_seed{seed}" / "run"
                compressed, report = None, None
                for variant in plan["variants"]:
                    name = f"{method}-ref-dist-{variant}{knob_suffix(plan, '-', base, ('variants',))}_s{share}_seed{seed}"
                    config = distill_config(variant, plan)
                    tag = json.dumps({"method": method, "share": share, "seed": seed, "study": [
                        plan["windows"], plan["seq_len"], plan["max_iter"], tag_eval],
                        "distill": config.to_dict(), "distill_windows": plan["distill_windows"],
                        # a knob later than the first runs: in the tag only where it is not the default
                        **({"lengths": plan["lengths"]} if plan["lengths"] != "full" else {})}, sort_keys=True)
                    if (kept := resume_unit(state_root / name, tag, name, log)) is not None:
                        records.append(kept)
                        continue
                    timer = Timer()
                    if compressed is None:
                        compressed, report = jb.compress_model(
                            B.from_pretrained(model_dir), lambda m: m(ids, mask), mlps=None, reduction=rho,
                            method=study.method_object(method, {}, {}, plan["max_iter"]), key=jax.random.key(seed),
                            refine=jb.Refine(), execution=jb.Execution(state_dir=run_dir))
                        refined_scores = evaluation.fidelity(reference, evaluation.embed_eval_set(compressed, passages, pairs))
                        refined_errors = layer_errors(compressed, original, error_ids)
                    seconds_compress = timer()
                    model = nnx.clone(compressed)  # each variant from the same refined model
                    if plan["lengths"] == "passages":
                        windows, mask = calibration_passages(original, calibration_texts, plan["seq_len"],
                                                             plan["distill_windows"], seed=10_000 + seed)
                    else:
                        windows = B.calibration_windows(original, calibration_texts, plan["seq_len"],
                                                        plan["distill_windows"], seed=10_000 + seed)
                        mask = np.ones_like(windows)
                    if plan["lengths"] == "mixed":
                        tok = original.tokenizer
                        windows, mask = mixed_lengths(windows, tok.token_to_id("[SEP]"), tok.token_to_id("[PAD]"),
                                                      seed=20_000 + seed)
                    batch = {"ids": jnp.asarray(windows), "mask": jnp.asarray(mask, jnp.int32)}
                    targets = teacher_outputs(original, batch, config.forward, batch_size=512)  # not one pass: gigabytes
                    info = distill_model(model, batch, targets, [r.path for r in report.mlps], config,
                                         jax.random.fold_in(jax.random.key(seed), DISTILL_STREAM))
                    scores = evaluation.fidelity(reference, evaluation.embed_eval_set(model, passages, pairs))
                    record = dict(method=method, variant=variant, share=share, seed=seed, rho=rho,
                                  params=report.params_after, refined=refined_scores, distilled=scores, distill=info,
                                  # per layer (6), then the embedding's 1 - cos, on the error windows
                                  layer_errors_refined=refined_errors,
                                  layer_errors_distilled=layer_errors(model, original, error_ids),
                                  trainable=plan["trainable"], learning_rate=plan["learning_rate"],
                                  lengths=plan["lengths"],
                                  distill_windows=int(windows.shape[0]), seconds_compress=seconds_compress,
                                  seconds_distill=info["seconds"], seconds=timer(), machine=machine())
                    save_unit(state_root / name / "unit.json", tag, record)
                    records.append(record)
                    log(f"  {name}: cos {refined_scores['mean_cosine']:.4f} refined -> {scores['mean_cosine']:.4f} "
                        f"distilled, R@10 {refined_scores['recall@10']:.3f} -> {scores['recall@10']:.3f} (held-out "
                        f"loss {info['loss_before']:.4g} -> {info['loss_after']:.4g}, step {info['steps_kept']}), "
                        f"{timer():.0f} s")
    write_json(out / f"{result_stem}.json", {
        "command": command, "plan": plan, "params": P, "params_mlp": P_mlp, "runs": records,
        "reference_recall@10": records[0]["distilled"]["reference_recall@10"] if records else None,
        "wall_seconds": wall(), "machines": sorted({r["machine"] for r in records})})
    log(f"wrote {out / (result_stem + '.json')} ({len(records)} units, {wall():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
