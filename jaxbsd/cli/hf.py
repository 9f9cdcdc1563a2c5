"""``jaxbsd compress-hf``: compress a Hugging Face checkpoint to a budget, with a fidelity report.

Reads any directory :func:`jaxbsd.models.from_pretrained` reads (sentence encoders ``bert``,
``roberta``, ``xlm-roberta``, ``distilbert``, ``mpnet``; causal LMs ``gpt2``, ``llama``, ``mistral``,
``qwen2``, ``qwen3``; image classifiers ``vit``, ``deit``), checks the budget (``--reduction`` of the
model's parameters, or ``--mlp-reduction`` of its MLPs'; only the MLPs shrink) before anything else,
draws the kind's calibration (:mod:`jaxbsd.cli.hf_tasks`: windows of text tokens, or images),
compresses every MLP (``compress_model(mlps=None)``) with ``--method``, and writes the compressed
model: a standard Hugging Face directory (``--out/model``, :func:`jaxbsd.models.save_pretrained`,
the input directory's other files copied through) where the result is still of its family
(MLPs of one width: ``prune``, and ``bsd`` on plain MLPs, whose decoupling is an MLP), else the
factored checkpoint of ``jb.save_compressed`` (``--out/compressed``, reloaded with
``jb.load_compressed`` into ``from_pretrained(MODEL_DIR)``). The fidelity report
(``--out/fidelity.json``) compares the compressed model with the original, label-free (encoders:
embedding agreement and retrieval; causal LMs: bits per token and next-token agreement; image
classifiers: top-1 agreement and KL divergence), names what calibration and evaluation were drawn
from, and says what each figure is measured on; the kept hidden units of a pruning go to
``--out/kept_units.json``.

Text (encoders, causal LMs): ``--calibration-text`` and ``--eval-text`` are UTF-8 files whose
paragraphs (blank-line separated) are the texts (a causal LM calibrates on the calibration file as
written, and its paragraphs keep their newlines and indentation); without them, the Python 3.11 documentation
(:func:`jaxbsd.data.docs_texts`: shipped with the package) gives its calibration files and its
evaluation files (split by file). Images (image classifiers): ``--images``, a data set name of
:mod:`jaxbsd.data` (read from ``$JAXBSD_DATA``; default ``cifar10``, or ``mnist`` for one channel),
an ``.npz`` of ``uint8`` images or a folder of image files. Errors are one line (exit status 2).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from jaxbsd.cli.args import existing_path, nonnegative_int, open_fraction, output_dir, positive_int
from jaxbsd.cli.hf_tasks import read_paragraphs
from jaxbsd.models.hub import supported_model_types

__all__ = ["add_compress_hf_command", "read_paragraphs", "DESCRIPTION", "DOMAIN_NOTE"]

METHODS = ("prune", "bsd", "auto", "svd", "drone")

#: ``compress-hf --help``'s description (plain text: the terminal shows no markup).
DESCRIPTION = (
    "Compress every MLP of a Hugging Face checkpoint (a sentence encoder, a causal LM or an image classifier) "
    "to a parameter budget, write the result (a Hugging Face directory for --method prune, else a jaxbsd "
    "checkpoint) and a fidelity report (fidelity.json: the compressed model against the original, without "
    "labels: embedding agreement for encoders, bits per token and next-token agreement for causal LMs, top-1 "
    "agreement and KL divergence for image classifiers). Without --calibration-text and --eval-text the texts "
    "are the Python 3.11 documentation, shipped with jaxbsd: English technical prose. A model calibrated there "
    "is measured there; for another domain give your own texts. Images come from --images (default: CIFAR-10, "
    "or MNIST for one channel, read from $JAXBSD_DATA).")

#: Printed (stderr) when no ``--calibration-text`` is given.
DOMAIN_NOTE = ("note: calibrating on the Python 3.11 documentation (English technical prose, shipped with "
               "jaxbsd); for your own domain pass --calibration-text FILE (UTF-8, paragraphs separated by "
               "blank lines), and --eval-text FILE to measure there")


def _say(args, message: str) -> None:
    if not args.no_progress:
        print(message, file=sys.stderr, flush=True)


def _budget(args, model, method) -> tuple[float, dict]:
    """``(reduction of the model, budget facts)`` from ``--reduction`` or ``--mlp-reduction``, checked
    from the MLPs' shapes alone (``ValueError`` naming the flag and the largest share that can be met)."""
    from jaxbsd.compression import budget
    from jaxbsd.compression.specs import spec_for
    from jaxbsd.models import count_params
    from flax import nnx

    paths = [".".join(map(str, p)) for p, m in nnx.iter_modules(model) if p and spec_for(m, "", None) is not None]
    sites = budget.priced_sites(model, paths)
    P, P_mlp = count_params(model), sum(s.params for s in sites)
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


#: What the per-MLP errors of the report (``report.mlps``) are measured on.
ERRORS = {"output_error": "per MLP: relative squared error |Y - Y'|^2 / |Y|^2 of the replacement's outputs against "
                          "the original MLP's on its calibration tokens (up to 8192, with the refinement's held-out "
                          "ones when refined); lower is better, 0 is the original",
          "refine.error_before, refine.error_after": "per MLP: the same error on the calibration tokens the "
                                                     "refinement set apart before the build (no fit saw them), "
                                                     "before and after refinement"}


def _write(args, model, model_dir, out, report) -> dict:
    """Write the model (Hugging Face layout where possible) and the kept units; what was written."""
    from jaxbsd import checkpoint, models
    from jaxbsd.io import write_json_atomic

    try:
        written = {"huggingface": str(models.save_pretrained(model, out / "model"))}
    except ValueError as err:
        checkpoint.save_compressed(out / "compressed", model, metadata={"command": args.command_line,
                                                                         "model_dir": str(model_dir)})
        written = {"save_compressed": str(out / "compressed"), "why_not_huggingface": str(err)}
    kept = {r.path: list(r.kept) for r in report.mlps if r.kept is not None}
    if kept:
        written["kept_units"] = str(write_json_atomic(out / "kept_units.json", kept))
    return written


def _run(args: argparse.Namespace) -> int:
    import jax

    import jaxbsd as jb
    from jaxbsd import models
    from jaxbsd.cli import hf_tasks
    from jaxbsd.io import write_json_atomic

    start = time.perf_counter()
    model_dir = existing_path("MODEL_DIR", args.model_dir)
    calib_file = existing_path("--calibration-text", args.calibration_text)
    eval_file = existing_path("--eval-text", args.eval_text)
    out = output_dir("--out", args.out)
    # Everything is read and checked before anything is written; the budget before the data.
    model = models.from_pretrained(model_dir)
    method = jb.get_method(args.method)
    reduction, sizes = _budget(args, model, method)
    P = sizes["params"]
    task = hf_tasks.task_for(args, model, model_dir, calib_file, eval_file, args.images)
    if task.text_default:
        print(DOMAIN_NOTE, file=sys.stderr, flush=True)
    original = models.from_pretrained(model_dir)
    _say(args, f"loaded {model_dir} ({type(model).__name__}, {P:,} parameters, {sizes['mlp_params']:,} in "
               f"{sizes['mlps']} MLPs); removing {reduction:.1%} of the model = "
               f"{reduction * P / sizes['mlp_params']:.1%} of the MLPs' parameters with {args.method}; "
               f"calibration: {task.summary}")
    refine = jb.Refine(steps=args.refine_steps) if args.refine_steps else None
    model, report = jb.compress_model(model, task.calibration, mlps=None, reduction=reduction, method=method,
                                      key=jax.random.key(args.seed), refine=refine,
                                      execution=jb.Execution(state_dir=out / "state", progress=not args.no_progress))
    eval_source = task.evaluation_facts["source"]
    _say(args, f"evaluating on {eval_source} ...")
    scores, reference, about = task.score(original, model)
    written = _write(args, model, model_dir, out, report)
    mlp_removed = (P - report.params_after) / sizes["mlp_params"]
    report_dict = report.to_dict()
    for r in report_dict["mlps"]:
        r.pop("kept", None)  # in kept_units.json
    payload = {"command": args.command_line, "model_dir": str(model_dir), "model_type": model_type(model_dir),
               "kind": task.kind, "method": args.method, "reduction_target": reduction,
               "reduction": report.reduction, "mlp_reduction": mlp_removed, "params_before": P,
               "params_after": report.params_after, "mlp_params_before": sizes["mlp_params"],
               "calibration": task.calibration_facts, "evaluation": task.evaluation_facts,
               "fidelity": scores, "fidelity_reference": reference, "fidelity_about": about, "errors_about": ERRORS,
               "written": written, "report": report_dict, "wall_seconds": time.perf_counter() - start}
    write_json_atomic(out / "fidelity.json", payload)
    line = ", ".join(f"{k} {v:.4f} (original {reference[k]:.4f})" for k, v in scores.items())
    where = written.get("huggingface") or written["save_compressed"]
    print(f"{P:,} -> {report.params_after:,} parameters: {report.reduction:.1%} of the model removed, "
          f"{mlp_removed:.1%} of its MLPs' parameters; on {eval_source}: {line}; "
          f"wrote {where} and {out / 'fidelity.json'} ({payload['wall_seconds']:.0f} s)")
    return 0


def model_type(model_dir: pathlib.Path) -> str | None:
    """``config.json``'s ``model_type`` of a checked model directory."""
    from jaxbsd.models.hub import open_checkpoint

    return open_checkpoint(model_dir)[1].get("model_type")


def add_compress_hf_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``jaxbsd compress-hf``."""
    p = subparsers.add_parser("compress-hf", help="compress a Hugging Face checkpoint (encoder, causal LM or image "
                              "classifier) to a budget", description=DESCRIPTION)
    p.add_argument("model_dir", metavar="MODEL_DIR", help="a Hugging Face model directory (config.json, "
                   f"model.safetensors) of a model_type jaxbsd reads: {', '.join(supported_model_types())}")
    p.add_argument("--method", default="prune", choices=METHODS,
                   help="prune (default: the result is still of its family, written in Hugging Face layout), bsd "
                        "(the decoupling that contains pruning: on plain MLPs an MLP again, written as prune's; gated "
                        "MLPs in the paper's basis), svd or drone (written with save_compressed); auto is deprecated")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--reduction", type=open_fraction, default=None,
                        help="remove this share of the whole model's parameters (only the MLPs shrink: 0.2 of "
                             "MiniLM removes 64%% of each MLP)")
    budget.add_argument("--mlp-reduction", type=open_fraction, default=None,
                        help="instead: remove this share of the MLPs' parameters (the study's axis)")
    p.add_argument("--refine-steps", type=nonnegative_int, default=300,
                   help="label-free refinement steps per MLP (0: none)")
    text = p.add_argument_group("text (encoders and causal LMs)")
    text.add_argument("--calibration-text", default=None,
                      help="UTF-8 text to calibrate on: encoders its paragraphs (separated by blank lines), causal "
                           "LMs the text as written (default: the Python docs' calibration files)")
    text.add_argument("--eval-text", "--text", dest="eval_text", default=None,
                      help="UTF-8 text (paragraphs separated by blank lines; causal LMs keep their whitespace) for "
                           "the fidelity report (default: the Python docs' evaluation files, with title -> section "
                           "pairs for encoders)")
    text.add_argument("--windows", type=positive_int, default=32, help="calibration windows")
    text.add_argument("--seq-len", type=positive_int, default=128,
                      help="tokens per calibration window (causal LMs: also the most tokens per evaluation text)")
    text.add_argument("--eval-texts", type=positive_int, default=256, help="texts (and title pairs) evaluated")
    images = p.add_argument_group("images (image classifiers)")
    images.add_argument("--images", default=None,
                        help="a data set of jaxbsd.data read from $JAXBSD_DATA (cifar10, mnist, usps, "
                             "fashion-mnist, svhn, digits: its training split calibrates, its test split "
                             "evaluates), an .npz of uint8 images (N, H, W[, C]) or a folder of image files (split "
                             "at random, seed --seed); default cifar10, or mnist for a one-channel model")
    images.add_argument("--calibration-images", type=positive_int, default=64, help="calibration images")
    images.add_argument("--eval-images", type=positive_int, default=512, help="evaluation images (at most)")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--out", default="runs/compress-hf", help="output folder (model, fidelity.json, state)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress: no line per MLP and no bars (bars are drawn only when stderr is a terminal)")
    p.set_defaults(func=_run)
