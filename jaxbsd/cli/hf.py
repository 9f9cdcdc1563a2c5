"""``jaxbsd compress-hf``: compress a Hugging Face BERT directory to a budget, with a fidelity report.

Reads a BERT-family sentence encoder (``config.json``, ``model.safetensors``, ``tokenizer.json``,
the sentence-transformers files) with :func:`jaxbsd.models.bert.from_pretrained`, checks the budget
(``--reduction`` of the model's parameters, or ``--mlp-reduction`` of its MLPs'; only the MLPs
shrink) before anything else, draws calibration windows of real text, compresses every MLP
(``compress_model(mlps=None)``) with ``--method``, and writes the compressed model: a standard Hugging
Face directory (``--out/model``, the input directory's other files copied through) where the result
is still a BERT (uniformly pruned MLPs), else the factored checkpoint of ``jb.save_compressed``
(``--out/compressed``, reloaded with ``jb.load_compressed`` into ``from_pretrained(MODEL_DIR)``).
The fidelity report (``--out/fidelity.json``) compares compressed and original embeddings (mean
cosine, top-10 neighbour overlap and, on the docs, title → section recall@1/@10), names the texts
of calibration and evaluation, and says what each figure is measured on; the kept hidden units
of a pruning go to ``--out/kept_units.json``.

Text: ``--calibration-text`` and ``--eval-text`` are UTF-8 files whose paragraphs (blank-line
separated) are the texts; without them, the Python 3.11 documentation (:func:`jaxbsd.data.docs_texts`:
shipped with the package) gives its calibration files and its evaluation files (split by file).
Errors are one line (exit status 2).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from jaxbsd.cli.args import existing_path, nonnegative_int, open_fraction, output_dir, positive_int

__all__ = ["add_compress_hf_command", "read_paragraphs", "DESCRIPTION", "DOMAIN_NOTE"]

METHODS = ("prune", "bsd", "auto", "svd", "drone")

#: ``compress-hf --help``'s description (plain text: the terminal shows no markup).
DESCRIPTION = (
    "Compress every MLP of a Hugging Face BERT directory (a sentence encoder) to a parameter budget, "
    "write the result (a Hugging Face directory for --method prune, else a jaxbsd checkpoint) and a "
    "fidelity report (fidelity.json: agreement of the compressed embeddings with the original's). "
    "Without --calibration-text and --eval-text the texts are the Python 3.11 documentation, shipped "
    "with jaxbsd: English technical prose. A model calibrated there is measured there; for another "
    "domain give your own texts.")

#: Printed (stderr) when no ``--calibration-text`` is given.
DOMAIN_NOTE = ("note: calibrating on the Python 3.11 documentation (English technical prose, shipped with "
               "jaxbsd); for your own domain pass --calibration-text FILE (UTF-8, paragraphs separated by "
               "blank lines), and --eval-text FILE to measure there")

DOCS = "the Python 3.11 documentation"


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


def _budget(args, encoder, method) -> tuple[float, dict]:
    """``(reduction of the model, budget facts)`` from ``--reduction`` or ``--mlp-reduction``, checked
    from the MLPs' shapes alone (``ValueError`` naming the flag and the largest share that can be met)."""
    from jaxbsd.compression import budget
    from jaxbsd.compression.specs import spec_for
    from jaxbsd.models import count_params
    from flax import nnx

    paths = [".".join(map(str, p)) for p, m in nnx.iter_modules(encoder) if p and spec_for(m, "", None) is not None]
    sites = budget.priced_sites(encoder, paths)
    P, P_mlp = count_params(encoder), sum(s.params for s in sites)
    flag = "--reduction" if args.reduction is not None else "--mlp-reduction"
    reduction = args.reduction if args.reduction is not None else args.mlp_reduction * P_mlp / P
    limit = budget.largest_reduction(method, sites, P)
    if reduction > limit:
        most = int(1e4 * limit) / 1e4
        most_mlp = int(1e4 * limit * P / P_mlp) / 1e4
        raise ValueError(f"{flag} {getattr(args, flag[2:].replace('-', '_'))}: method {method.name!r} compresses "
                         f"only the {len(sites)} MLPs ({P_mlp:,} of the model's {P:,} parameters); even at their "
                         f"smallest (rank 1) they cannot remove more than --reduction {most} of the model "
                         f"(--mlp-reduction {most_mlp} of the MLPs)")
    return reduction, {"params": P, "mlp_params": P_mlp, "mlps": len(sites)}


def _texts(args, calib_file, eval_file):
    """``(calibration texts, evaluation passages, pairs, calibration source, evaluation source)``."""
    import numpy as np

    from jaxbsd import data

    docs = None
    if calib_file is None or eval_file is None:
        try:
            docs = data.docs_texts()
        except (FileNotFoundError, ValueError) as err:
            missing = "--calibration-text" if calib_file is None else "--eval-text"
            raise ValueError(f"{missing}: no default text ({err}); pass {missing} FILE") from err
    calibration = (read_paragraphs("--calibration-text", calib_file) if calib_file is not None
                   else docs.passages("calibration"))
    calib_source = str(calib_file) if calib_file is not None else f"{DOCS}, calibration files"
    pairs = []
    if eval_file is not None:
        passages = read_paragraphs("--eval-text", eval_file)[: args.eval_texts]
        eval_source = str(eval_file)
        if len(passages) < 2:
            raise ValueError(f"--eval-text {eval_file}: {len(passages)} paragraph(s); the fidelity report needs "
                             "at least 2")
    else:
        rng = np.random.default_rng(0)
        all_passages, all_pairs = docs.passages("evaluation"), docs.pairs("evaluation")
        passages = [all_passages[i] for i in np.sort(rng.choice(len(all_passages), min(args.eval_texts,
                                                                                    len(all_passages)), replace=False))]
        pairs = [all_pairs[i] for i in np.sort(rng.choice(len(all_pairs), min(args.eval_texts, len(all_pairs)),
                                                          replace=False))]
        eval_source = f"{DOCS}, evaluation files (never seen in calibration)"
    return calibration, passages, pairs, calib_source, eval_source


def _scores(original, encoder, passages, pairs) -> tuple[dict, dict, dict]:
    """``(figures, the original's values, what each figure is)`` of the fidelity report."""
    import jaxbsd as jb
    from jaxbsd import evaluation

    ref = evaluation.embed_eval_set(original, passages, pairs)
    new = evaluation.embed_eval_set(encoder, passages, pairs)
    k = min(10, len(passages) - 1)
    n = len(passages)
    scores = {"mean_cosine": float(jb.solver.metrics.mean_cosine(ref["passages"], new["passages"])),
              f"neighbour_overlap@{k}": float(jb.solver.metrics.neighbour_overlap(ref["passages"], new["passages"],
                                                                                   k=k))}
    reference = {"mean_cosine": 1.0, f"neighbour_overlap@{k}": 1.0}
    about = {"mean_cosine": f"cosine between the compressed and the original embedding of each of the {n} "
                            "evaluation texts, averaged; 1 is the original, higher is better",
             f"neighbour_overlap@{k}": f"share of each evaluation text's {k} nearest texts (among the {n}) that "
                                       "both encoders agree on; 1 is the original, higher is better"}
    if pairs:
        both = evaluation.fidelity(ref, new)
        for cut in (1, 10):
            name = f"recall@{cut}"
            scores[name], reference[name] = both[name], both[f"reference_{name}"]
            about[name] = (f"title -> section retrieval on the {len(pairs)} (heading, first paragraph) pairs drawn "
                           f"(seed 0) from the evaluation files: share of headings whose own section is among the "
                           f"{cut} nearest; the reference is the original's on the same pairs (other pairs give "
                           "other values), higher is better")
    return scores, reference, about


#: What the per-MLP errors of the report (``report.mlps``) are measured on.
ERRORS = {"output_error": "per MLP: relative squared error |Y - Y'|^2 / |Y|^2 of the replacement's outputs against "
                          "the original MLP's on its calibration tokens (up to 8192, with the refinement's held-out "
                          "ones when refined); lower is better, 0 is the original",
          "refine.error_before, refine.error_after": "per MLP: the same error on the calibration tokens the "
                                                     "refinement set apart before the build (no fit saw them), "
                                                     "before and after refinement"}


def _write(args, encoder, model_dir, out, report) -> dict:
    """Write the model (Hugging Face layout where possible) and the kept units; what was written."""
    from jaxbsd import checkpoint
    from jaxbsd.io import write_json_atomic
    from jaxbsd.models import bert as B

    try:
        written = {"huggingface": str(B.save_pretrained(encoder, out / "model"))}
    except ValueError as err:
        checkpoint.save_compressed(out / "compressed", encoder, metadata={"command": args.command_line,
                                                                           "model_dir": str(model_dir)})
        written = {"save_compressed": str(out / "compressed"), "why_not_huggingface": str(err)}
    kept = {r.path: list(r.kept) for r in report.mlps if r.kept is not None}
    if kept:
        written["kept_units"] = str(write_json_atomic(out / "kept_units.json", kept))
    return written


def _run(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    import jaxbsd as jb
    from jaxbsd.io import write_json_atomic
    from jaxbsd.models import bert as B

    start = time.perf_counter()
    model_dir = existing_path("MODEL_DIR", args.model_dir)
    calib_file = existing_path("--calibration-text", args.calibration_text)
    eval_file = existing_path("--eval-text", args.eval_text)
    out = output_dir("--out", args.out)
    # Everything is read and checked before anything is written; the budget before the texts.
    encoder = B.from_pretrained(model_dir)
    method = jb.get_method(args.method)
    reduction, sizes = _budget(args, encoder, method)
    P = sizes["params"]
    calibration, passages, pairs, calib_source, eval_source = _texts(args, calib_file, eval_file)
    if calib_file is None:
        print(DOMAIN_NOTE, file=sys.stderr, flush=True)
    original = B.from_pretrained(model_dir)
    seq_len = min(args.seq_len, encoder.max_seq_length)
    try:
        ids = B.calibration_windows(encoder, calibration, seq_len, args.windows, seed=args.seed)
    except ValueError as err:
        raise ValueError(f"--calibration-text: {err}") from err
    mask = np.ones_like(ids)
    _say(args, f"loaded {model_dir} ({P:,} parameters, {sizes['mlp_params']:,} in {sizes['mlps']} MLPs); "
               f"removing {reduction:.1%} of the model = {reduction * P / sizes['mlp_params']:.1%} of the MLPs' "
               f"parameters with {args.method}; calibration: {args.windows} windows of {seq_len} tokens")
    refine = jb.Refine(steps=args.refine_steps) if args.refine_steps else None
    encoder, report = jb.compress_model(encoder, lambda m: m(ids, mask), mlps=None, reduction=reduction,
                                        method=method, key=jax.random.key(args.seed), refine=refine,
                                        execution=jb.Execution(state_dir=out / "state",
                                                               progress=not args.no_progress))
    _say(args, f"evaluating on {len(passages)} texts of {eval_source} ...")
    scores, reference, about = _scores(original, encoder, passages, pairs)
    written = _write(args, encoder, model_dir, out, report)
    mlp_removed = (P - report.params_after) / sizes["mlp_params"]
    eval_tokens = int(original.tokenize(passages)[1].sum())
    report_dict = report.to_dict()
    for r in report_dict["mlps"]:
        r.pop("kept", None)  # in kept_units.json
    payload = {"command": args.command_line, "model_dir": str(model_dir), "method": args.method,
               "reduction_target": reduction, "reduction": report.reduction, "mlp_reduction": mlp_removed,
               "params_before": P, "params_after": report.params_after, "mlp_params_before": sizes["mlp_params"],
               "calibration": {"source": calib_source, "texts": len(calibration), "windows": args.windows,
                               "tokens_per_window": int(seq_len), "tokens": int(ids.size)},
               "evaluation": {"source": eval_source, "texts": len(passages), "tokens": eval_tokens,
                              "pairs": len(pairs)},
               "fidelity": scores, "fidelity_reference": reference, "fidelity_about": about, "errors_about": ERRORS,
               "written": written, "report": report_dict, "wall_seconds": time.perf_counter() - start}
    write_json_atomic(out / "fidelity.json", payload)
    line = ", ".join(f"{k} {v:.4f} (original {reference[k]:.4f})" for k, v in scores.items())
    where = written.get("huggingface") or written["save_compressed"]
    print(f"{P:,} -> {report.params_after:,} parameters: {report.reduction:.1%} of the model removed, "
          f"{mlp_removed:.1%} of its MLPs' parameters; on {len(passages)} texts of {eval_source}: {line}; "
          f"wrote {where} and {out / 'fidelity.json'} ({payload['wall_seconds']:.0f} s)")
    return 0


def add_compress_hf_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``jaxbsd compress-hf``."""
    p = subparsers.add_parser("compress-hf", help="compress a Hugging Face BERT directory to a budget",
                              description=DESCRIPTION)
    p.add_argument("model_dir", metavar="MODEL_DIR", help="a Hugging Face BERT directory")
    p.add_argument("--method", default="prune", choices=METHODS,
                   help="prune (default: the result is still a BERT, written in Hugging Face layout), bsd, auto, "
                        "svd or drone (written with save_compressed)")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--reduction", type=open_fraction, default=None,
                        help="remove this share of the whole model's parameters (only the MLPs shrink: 0.2 of "
                             "MiniLM removes 64%% of each MLP)")
    budget.add_argument("--mlp-reduction", type=open_fraction, default=None,
                        help="instead: remove this share of the MLPs' parameters (the study's axis)")
    p.add_argument("--refine-steps", type=nonnegative_int, default=300,
                   help="label-free refinement steps per MLP (0: none)")
    p.add_argument("--calibration-text", default=None,
                   help="UTF-8 text (paragraphs separated by blank lines) to calibrate on (default: the Python "
                        "docs' calibration files)")
    p.add_argument("--eval-text", "--text", dest="eval_text", default=None,
                   help="UTF-8 text (paragraphs separated by blank lines) for the fidelity report (default: the "
                        "Python docs' evaluation files, with title -> section pairs)")
    p.add_argument("--windows", type=positive_int, default=32, help="calibration windows")
    p.add_argument("--seq-len", type=positive_int, default=128, help="tokens per calibration window")
    p.add_argument("--eval-texts", type=positive_int, default=256, help="texts (and title pairs) evaluated")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--out", default="runs/compress-hf", help="output folder (model, fidelity.json, state)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress: no line per MLP and no bars (bars are drawn only when stderr is a terminal)")
    p.set_defaults(func=_run)
