"""``jaxbsd compress-hf``: compress a Hugging Face BERT directory to a budget, with a fidelity report.

Reads a BERT-family sentence encoder (``config.json``, ``model.safetensors``, ``tokenizer.json``,
the sentence-transformers files) with :func:`jaxbsd.models.bert.from_pretrained`, draws calibration
windows of real text, compresses every MLP (``compress_model(mlps=None)``) to ``--reduction`` of the
model's parameters with ``--method``, and writes the compressed model: a standard Hugging Face
directory (``--out/model``) where the result is still a BERT (uniformly pruned MLPs), else the
factored checkpoint of ``jb.save_compressed`` (``--out/compressed``, reloaded with
``jb.load_compressed`` into ``from_pretrained(MODEL_DIR)``). The fidelity report (``--out/fidelity.json``)
compares compressed and original embeddings: mean cosine, top-10 neighbour overlap and, on the
bundled Python docs, title → section recall@1/@10.

Text: ``--calibration-text`` and ``--text`` are UTF-8 files whose paragraphs (blank-line separated)
are the texts; without them, the bundled Python 3.11 docs corpus (``$JAXBSD_DATA``) gives its
calibration files and its evaluation files (split by file). Errors are one line (exit status 2).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from jaxbsd.cli.args import existing_path, fraction, nonnegative_int, output_dir, positive_int

__all__ = ["add_compress_hf_command", "read_paragraphs"]

METHODS = ("prune", "bsd", "auto", "svd", "drone")


def read_paragraphs(flag: str, path: pathlib.Path) -> list[str]:
    """The blank-line separated paragraphs of a UTF-8 text file (``ValueError`` naming ``flag``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{flag} {path}: cannot read ({err}); expected UTF-8 text") from err
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    paragraphs = [p for p in paragraphs if p]
    if not paragraphs:
        raise ValueError(f"{flag} {path}: no text")
    return paragraphs


def _say(args, message: str) -> None:
    if not args.no_progress:
        print(message, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    import jaxbsd as jb
    from jaxbsd import checkpoint, data, evaluation
    from jaxbsd.io import write_json_atomic
    from jaxbsd.models import bert as B
    from jaxbsd.models import count_params

    start = time.perf_counter()
    model_dir = existing_path("MODEL_DIR", args.model_dir)
    calib_file = existing_path("--calibration-text", args.calibration_text)
    text_file = existing_path("--text", args.text)
    out = output_dir("--out", args.out)
    # Everything is read and checked before anything is written.
    encoder = B.from_pretrained(model_dir)
    original = B.from_pretrained(model_dir)
    pairs = []
    if calib_file is None or text_file is None:
        corpus = data.load_docs_corpus()
    calibration = (read_paragraphs("--calibration-text", calib_file) if calib_file is not None
                   else corpus.passages("calibration"))
    if text_file is not None:
        passages = read_paragraphs("--text", text_file)[: args.eval_texts]
        source = str(text_file)
    else:
        rng = np.random.default_rng(0)
        all_passages, all_pairs = corpus.passages("evaluation"), corpus.pairs("evaluation")
        passages = [all_passages[i] for i in np.sort(rng.choice(len(all_passages), min(args.eval_texts,
                                                                                    len(all_passages)), replace=False))]
        pairs = [all_pairs[i] for i in np.sort(rng.choice(len(all_pairs), min(args.eval_texts, len(all_pairs)),
                                                          replace=False))]
        source = "the Python 3.11 docs, evaluation files"
    if len(passages) < 2:
        raise ValueError(f"--text {args.text}: {len(passages)} paragraph(s); the fidelity report needs at least 2")
    seq_len = min(args.seq_len, encoder.max_seq_length)
    try:
        ids = B.calibration_windows(encoder, calibration, seq_len, args.windows, seed=args.seed)
    except ValueError as err:
        raise ValueError(f"--calibration-text: {err}") from err
    mask = np.ones_like(ids)
    P = count_params(encoder)
    _say(args, f"loaded {model_dir} ({P:,} parameters); calibration: {args.windows} windows of {seq_len} tokens")

    _say(args, f"compressing every MLP with {args.method} to a reduction of {args.reduction} ...")
    refine = jb.Refine(steps=args.refine_steps) if args.refine_steps else None
    encoder, report = jb.compress_model(encoder, lambda m: m(ids, mask), mlps=None, reduction=args.reduction,
                                        method=args.method, key=jax.random.key(args.seed), refine=refine,
                                        execution=jb.Execution(state_dir=out / "state"))
    for r in report.mlps:
        _say(args, f"  {r.path}: {r.method} rank {r.rank}, output error {r.output_error:.3g} ({r.seconds:.1f} s)")

    _say(args, f"evaluating on {len(passages)} texts of {source} ...")
    ref = evaluation.embed_eval_set(original, passages, pairs)
    new = evaluation.embed_eval_set(encoder, passages, pairs)
    k = min(10, len(passages) - 1)
    scores = {"mean_cosine": float(jb.solver.metrics.mean_cosine(ref["passages"], new["passages"])),
              f"neighbour_overlap@{k}": float(jb.solver.metrics.neighbour_overlap(ref["passages"], new["passages"], k=k))}
    if pairs:
        scores.update({key: v for key, v in evaluation.fidelity(ref, new).items() if "recall" in key})

    try:
        written = {"huggingface": str(B.save_pretrained(encoder, out / "model"))}
    except ValueError as err:
        checkpoint.save_compressed(out / "compressed", encoder, metadata={"command": args.command_line,
                                                                           "model_dir": str(model_dir)})
        written = {"save_compressed": str(out / "compressed"), "why_not_huggingface": str(err)}
    payload = {"command": args.command_line, "model_dir": str(model_dir), "method": args.method,
               "reduction_target": args.reduction, "reduction": report.reduction, "params_before": P,
               "params_after": report.params_after, "evaluation": source, "eval_texts": len(passages),
               "eval_pairs": len(pairs), "fidelity": scores, "written": written, "report": report.to_dict(),
               "wall_seconds": time.perf_counter() - start}
    write_json_atomic(out / "fidelity.json", payload)
    line = ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
    where = written.get("huggingface") or written["save_compressed"]
    print(f"{P:,} -> {report.params_after:,} parameters (reduction {report.reduction:.3f}); {line}; wrote {where} "
          f"and {out / 'fidelity.json'} ({payload['wall_seconds']:.0f} s)")
    return 0


def add_compress_hf_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``jaxbsd compress-hf``."""
    p = subparsers.add_parser("compress-hf", help="compress a Hugging Face BERT directory to a budget",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("model_dir", metavar="MODEL_DIR", help="a Hugging Face BERT directory")
    p.add_argument("--method", default="prune", choices=METHODS,
                   help="prune (default: the result is still a BERT, written in Hugging Face layout), bsd, auto, "
                        "svd or drone (written with save_compressed)")
    p.add_argument("--reduction", type=fraction, required=True,
                   help="remove this fraction of the model's parameters (from its MLPs)")
    p.add_argument("--refine-steps", type=nonnegative_int, default=300,
                   help="label-free refinement steps per MLP (0: none)")
    p.add_argument("--calibration-text", default=None, help="UTF-8 text for calibration (default: the docs corpus)")
    p.add_argument("--text", default=None, help="UTF-8 text for the fidelity report (default: the docs corpus)")
    p.add_argument("--windows", type=positive_int, default=32, help="calibration windows")
    p.add_argument("--seq-len", type=positive_int, default=128, help="tokens per calibration window")
    p.add_argument("--eval-texts", type=positive_int, default=256, help="texts (and title pairs) evaluated")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--out", default="runs/compress-hf", help="output folder (model, fidelity.json, state)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_run)
