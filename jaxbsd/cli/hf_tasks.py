"""What ``jaxbsd compress-hf`` calibrates and evaluates each kind of Hugging Face model on.

:func:`task_for` reads the calibration and evaluation data of a loaded model and returns a
:class:`Task`: the calibration (``compress_model``'s second argument), what it and the evaluation
were drawn from, and ``score(original, compressed) -> (figures, the original's values, what each
figure is)``, label-free:

* sentence encoders (``bert``, ``roberta``, ``xlm-roberta``, ``distilbert``, ``mpnet``): windows of
  the text's tokens framed by ``[CLS]`` … ``[SEP]``; the embeddings' agreement with the original's
  (mean cosine, neighbour overlap) and, on the docs, title -> section recall;
* causal LMs (``gpt2``, ``llama``, ``mistral``, ``qwen2``, ``qwen3``): windows of the text's token ids
  (the calibration text as written, tokenized whole by the checkpoint's ``tokenizer.json``, no special
  tokens); on the evaluation texts (paragraphs with their whitespace, one row each,
  the tokenizer's special tokens included, cut to ``--seq-len``, right-padded) bits per token against
  the original's and next-token agreement with it;
* image classifiers (``vit``, ``deit``): ``--images`` (a data set of :mod:`jaxbsd.data` read from
  ``$JAXBSD_DATA``, an ``.npz`` of ``uint8`` images, or a folder of image files; default ``cifar10``
  for RGB models, ``mnist`` for grey ones) through the model's ``preprocessor_config.json``; top-1
  agreement and the KL divergence to the original's logits.

Text: ``--calibration-text`` / ``--eval-text`` paragraphs (:func:`read_paragraphs`), else the Python
3.11 documentation shipped with the package (:func:`jaxbsd.data.docs_texts`), split by file.
Every problem is a ``ValueError`` naming the flag or file.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

__all__ = ["Task", "task_for", "model_kind", "read_paragraphs", "DOCS", "IMAGE_SUFFIXES"]

DOCS = "the Python 3.11 documentation"

#: Files of an ``--images`` folder that are read (with Pillow), found recursively.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


@dataclasses.dataclass
class Task:
    """One model's calibration and evaluation.

    Attributes:
      kind: ``"encoder"``, ``"decoder"`` or ``"vision"``.
      calibration: ``compress_model``'s calibration (model inputs, or ``f(model)`` running the forward pass).
      calibration_facts: the report's ``calibration`` entry (source, counts).
      evaluation_facts: the report's ``evaluation`` entry.
      score: ``score(original, compressed) -> (figures, the original's figures, what each figure is)``.
      summary: what the calibration is, for the progress line.
      text_default: whether the calibration is the shipped docs text (the command then says so).
    """

    kind: str
    calibration: Any
    calibration_facts: dict
    evaluation_facts: dict
    score: Callable
    summary: str
    text_default: bool = False


def _read_text(flag: str, path: pathlib.Path) -> str:
    """A UTF-8 text file's text (``ValueError`` naming ``flag``)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{flag} {path}: cannot read ({err}); expected UTF-8 text") from err


def read_paragraphs(flag: str, path: pathlib.Path, *, keep_whitespace: bool = False) -> list[str]:
    """The blank-line (``"\\n\\n"``) separated paragraphs of a UTF-8 text file (``ValueError`` naming ``flag``):
    each with its whitespace collapsed to single spaces, or with ``keep_whitespace`` as written (newlines
    and indentation kept; only the newlines that begin or end it dropped). Empty paragraphs are left out."""
    text = _read_text(flag, path)
    pieces = text.split("\n\n")
    paragraphs = [p.strip("\n") if keep_whitespace else " ".join(p.split()) for p in pieces if p.strip()]
    if not paragraphs:
        raise ValueError(f"{flag} {path}: no text")
    return paragraphs


def model_kind(model) -> str:
    """``"encoder"``, ``"decoder"`` or ``"vision"`` for a model of :func:`jaxbsd.models.from_pretrained`."""
    from jaxbsd.models import Encoder, ViT, gpt2, llama

    if isinstance(model, Encoder):
        return "encoder"
    if isinstance(model, (gpt2.GPT2, llama.Llama)):
        return "decoder"
    if isinstance(model, ViT):  # DeiT too
        return "vision"
    raise ValueError(f"compress-hf reads sentence encoders, causal LMs and image classifiers, got {type(model).__name__}")


def task_for(args, model, model_dir: pathlib.Path, calib_file, eval_file, images) -> Task:
    """The :class:`Task` of ``model`` (read from ``model_dir``) for the command's ``args``; the
    text files and ``--images`` as checked paths or names (None: the defaults)."""
    kind = model_kind(model)
    if kind != "vision" and images is not None:
        raise ValueError(f"--images: {model_dir} holds a {type(model).__name__}, which reads text; give "
                         "--calibration-text / --eval-text instead")
    if kind == "vision":
        for flag, given in (("--calibration-text", calib_file), ("--eval-text", eval_file)):
            if given is not None:
                raise ValueError(f"{flag}: {model_dir} holds an image classifier; give --images instead")
        return _vision_task(args, model, images)
    if kind == "decoder":
        return _decoder_task(args, model, model_dir, calib_file, eval_file)
    return _encoder_task(args, model, calib_file, eval_file)


# ----------------------------------------------------------------------------- text


def _texts(args, calib_file, eval_file, *, min_eval: int, stream: bool = False):
    """``(calibration texts, evaluation passages, pairs, calibration source, evaluation source)``.

    With ``stream`` (causal LMs) the calibration is one text, as written: the ``--calibration-text`` file
    whole, or the docs' calibration passages joined by blank lines; ``--eval-text`` paragraphs keep their
    whitespace. Otherwise (encoders) every text is a paragraph with its whitespace collapsed."""
    import numpy as np

    from jaxbsd import data

    docs = None
    if calib_file is None or eval_file is None:
        try:
            docs = data.docs_texts()
        except (FileNotFoundError, ValueError) as err:
            missing = "--calibration-text" if calib_file is None else "--eval-text"
            raise ValueError(f"{missing}: no default text ({err}); pass {missing} FILE") from err
    if calib_file is None:
        calibration = docs.passages("calibration")
        calibration = "\n\n".join(calibration) if stream else calibration
    elif stream:
        calibration = _read_text("--calibration-text", calib_file)
        if not calibration.strip():
            raise ValueError(f"--calibration-text {calib_file}: no text")
    else:
        calibration = read_paragraphs("--calibration-text", calib_file)
    calib_source = str(calib_file) if calib_file is not None else f"{DOCS}, calibration files"
    pairs = []
    if eval_file is not None:
        passages = read_paragraphs("--eval-text", eval_file, keep_whitespace=stream)[: args.eval_texts]
        eval_source = str(eval_file)
        if len(passages) < min_eval:
            raise ValueError(f"--eval-text {eval_file}: {len(passages)} paragraph(s); the fidelity report needs "
                             f"at least {min_eval}")
    else:
        rng = np.random.default_rng(0)
        all_passages, all_pairs = docs.passages("evaluation"), docs.pairs("evaluation")
        picked = np.sort(rng.choice(len(all_passages), min(args.eval_texts, len(all_passages)), replace=False))
        passages = [all_passages[i] for i in picked]
        pairs = [all_pairs[i] for i in np.sort(rng.choice(len(all_pairs), min(args.eval_texts, len(all_pairs)),
                                                          replace=False))]
        eval_source = f"{DOCS}, evaluation files (never seen in calibration)"
    return calibration, passages, pairs, calib_source, eval_source


def _encoder_task(args, encoder, calib_file, eval_file) -> Task:
    import numpy as np

    from jaxbsd.models import bert as B

    calibration, passages, pairs, calib_source, eval_source = _texts(args, calib_file, eval_file, min_eval=2)
    seq_len = min(args.seq_len, encoder.max_seq_length)
    try:
        ids = B.calibration_windows(encoder, calibration, seq_len, args.windows, seed=args.seed)
    except ValueError as err:
        raise ValueError(f"--calibration-text: {err}") from err
    mask = np.ones_like(ids)
    return Task("encoder", lambda m: m(ids, mask),
                {"source": calib_source, "texts": len(calibration), "windows": args.windows,
                 "tokens_per_window": int(seq_len), "tokens": int(ids.size)},
                {"source": eval_source, "texts": len(passages), "tokens": int(encoder.tokenize(passages)[1].sum()),
                 "pairs": len(pairs)},
                lambda original, compressed: _encoder_scores(original, compressed, passages, pairs),
                f"{args.windows} windows of {seq_len} tokens", text_default=calib_file is None)


def _encoder_scores(original, encoder, passages, pairs) -> tuple[dict, dict, dict]:
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


def _tokenizer(model_dir: pathlib.Path, vocab_size: int):
    """The checkpoint's ``tokenizer.json`` (no padding, no truncation), checked against the vocabulary."""
    from tokenizers import Tokenizer

    file = model_dir / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{model_dir}: no tokenizer.json; compress-hf tokenizes the calibration and evaluation "
                         "text with the checkpoint's tokenizer.json (the tokenizers library's format)")
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # noqa: BLE001 — tokenizers raises its own exception type on a bad file
        raise ValueError(f"{file}: cannot read the tokenizer ({err})") from err
    tok.no_padding()
    tok.no_truncation()
    if tok.get_vocab_size(with_added_tokens=True) > vocab_size:
        raise ValueError(f"{file}: the tokenizer has {tok.get_vocab_size(with_added_tokens=True)} tokens, more than "
                         f"the model's vocab_size {vocab_size}")
    return tok


def _decoder_limits(model) -> tuple[int, int]:
    """``(longest input the model takes, vocab_size)`` of a GPT-2 or a Llama-family model."""
    c = model.config
    longest = getattr(c, "n_positions", None) or c.max_position_embeddings
    window = getattr(c, "sliding_window", None)
    return (min(longest, window) if window else longest), c.vocab_size


def _decoder_task(args, model, model_dir, calib_file, eval_file) -> Task:
    import numpy as np

    longest, vocab_size = _decoder_limits(model)
    tok = _tokenizer(model_dir, vocab_size)
    calibration, passages, _, calib_source, eval_source = _texts(args, calib_file, eval_file, min_eval=1,
                                                                 stream=True)
    seq_len = min(args.seq_len, longest)
    stream = np.asarray(tok.encode(calibration, add_special_tokens=False).ids, np.int32)
    n = stream.size // seq_len
    if n < args.windows:
        raise ValueError(f"--calibration-text: {stream.size} tokens give {n} windows of {seq_len}; --windows "
                         f"{args.windows} requested")
    pick = np.sort(np.random.default_rng(args.seed).choice(n, args.windows, replace=False))
    windows = stream[: n * seq_len].reshape(n, seq_len)[pick]
    rows = [np.asarray(e.ids[:seq_len], np.int32) for e in tok.encode_batch(passages)]
    rows = [r for r in rows if r.size >= 2]  # a row scores its tokens after the first
    if not rows:
        raise ValueError("--eval-text: no text of two tokens or more")
    ids = np.zeros((len(rows), max(r.size for r in rows)), np.int32)
    mask = np.zeros(ids.shape, np.int32)
    for i, r in enumerate(rows):
        ids[i, :r.size], mask[i, :r.size] = r, 1
    return Task("decoder", windows,
                {"source": calib_source, "characters": len(calibration), "stream_tokens": int(stream.size),
                 "windows": args.windows, "tokens_per_window": int(seq_len), "tokens": int(windows.size)},
                {"source": eval_source, "texts": len(rows), "tokens": int(mask.sum()),
                 "predicted_tokens": int(mask[:, 1:].sum()), "tokens_per_text_at_most": int(seq_len)},
                lambda original, compressed: _decoder_scores(original, compressed, ids, mask),
                f"{args.windows} windows of {seq_len} tokens", text_default=calib_file is None)


def _decoder_scores(original, model, ids, mask) -> tuple[dict, dict, dict]:
    from jaxbsd.evaluation import bits_per_token, next_token_agreement

    n, targets = len(ids), int(mask[:, 1:].sum())
    scores = {"bits_per_token": bits_per_token(model, ids, mask),
              "next_token_agreement": next_token_agreement(model, original, ids, mask)}
    reference = {"bits_per_token": bits_per_token(original, ids, mask), "next_token_agreement": 1.0}
    about = {"bits_per_token": f"mean -log2 p(next token) over the {targets} tokens after the first of the {n} "
                               "evaluation texts (each a row, cut to --seq-len); the reference is the original's, "
                               "lower is better",
             "next_token_agreement": f"share of the {int(mask.sum())} real positions of the {n} evaluation texts "
                                     "where the compressed model's most likely next token is the original's; 1 is "
                                     "the original, higher is better"}
    return scores, reference, about


# ----------------------------------------------------------------------------- images


def _as_channels(images, channels: int, where: str):
    """``uint8 (N, H, W, C)`` with the model's ``channels``: grey repeated to RGB, RGB to grey as Pillow's
    ``convert("L")`` weighs it (ITU-R 601-2); anything else refused naming ``where``."""
    import numpy as np

    have = images.shape[-1]
    if have == channels:
        return images
    if have == 1 and channels == 3:
        return np.repeat(images, 3, axis=-1)
    if have == 3 and channels == 1:
        grey = (images[..., :1] * 299.0 + images[..., 1:2] * 587.0 + images[..., 2:] * 114.0) / 1000.0
        return np.clip(np.round(grey), 0, 255).astype(np.uint8)
    raise ValueError(f"{where}: images with {have} channels; the model takes {channels}")


def _as_uint8(array, where: str):
    """``(N, H, W[, C])`` ``uint8``, or floats in [0, 1] scaled to it, as ``uint8 (N, H, W, C)``."""
    import numpy as np

    a = np.asarray(array)
    if a.ndim == 3:
        a = a[..., None]
    if a.ndim != 4 or len(a) == 0:
        raise ValueError(f"{where}: expected images (N, H, W) or (N, H, W, C), got shape {a.shape}")
    if a.dtype == np.uint8:
        return a
    if np.issubdtype(a.dtype, np.floating) and np.isfinite(a).all() and a.min() >= 0 and a.max() <= 1:
        return np.round(a * 255).astype(np.uint8)
    raise ValueError(f"{where}: expected uint8 images or floats in [0, 1], got {a.dtype}")


def _read_npz(path: pathlib.Path):
    import numpy as np

    try:
        with np.load(path) as f:
            keys = list(f.keys())
            if "images" not in keys and len(keys) != 1:
                raise ValueError(f"--images {path}: expected an array 'images' (or a single array), found {keys}")
            return _as_uint8(f["images" if "images" in keys else keys[0]], f"--images {path}")
    except (OSError, EOFError) as err:
        raise ValueError(f"--images {path}: cannot read the .npz ({err})") from err


def _read_folder(path: pathlib.Path, channels: int) -> list:
    """Every image file under ``path`` (sorted) as ``uint8 (H, W, C)`` in the model's mode."""
    import numpy as np
    from PIL import Image

    files = sorted(f for f in path.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())
    if not files:
        raise ValueError(f"--images {path}: no image files ({', '.join(IMAGE_SUFFIXES)})")
    out = []
    for f in files:
        try:
            with Image.open(f) as im:
                a = np.asarray(im.convert("RGB" if channels == 3 else "L"))
        except OSError as err:
            raise ValueError(f"--images {f}: cannot read the image ({err})") from err
        out.append(a if a.ndim == 3 else a[..., None])
    return out


def _split(pool, args, where: str):
    """``(calibration, evaluation)`` of a pool of images: a seeded permutation, calibration first."""
    import numpy as np

    if len(pool) < args.calibration_images + 1:
        raise ValueError(f"{where}: {len(pool)} images; --calibration-images {args.calibration_images} and at least "
                         "one evaluation image are needed")
    order = np.random.default_rng(args.seed).permutation(len(pool))
    cal = order[: args.calibration_images]
    ev = order[args.calibration_images: args.calibration_images + args.eval_images]
    return [pool[i] for i in cal], [pool[i] for i in ev]


def _dataset_images(name: str, args, channels: int, given: bool):
    """``(calibration, evaluation, source)`` from data set ``name``'s train and test splits."""
    import numpy as np

    from jaxbsd import data

    try:
        ds = data.load_dataset(name, normalize=False)
    except (FileNotFoundError, ValueError) as err:
        what = f"--images {name}" if given else f"--images: the default data set {name!r}"
        raise ValueError(f"{what} cannot be read ({' '.join(str(err).split())}); pass --images with a data set "
                         f"name ({', '.join(data.DATASETS)}, read from ${data.DATA_ENV}), an .npz of images or a "
                         "folder of image files") from err
    rng = np.random.default_rng(args.seed)
    if len(ds.train_images) < args.calibration_images:
        raise ValueError(f"--calibration-images {args.calibration_images}: {name} has {len(ds.train_images)} "
                         "training images")
    cal = rng.choice(len(ds.train_images), args.calibration_images, replace=False)
    ev = np.sort(rng.choice(len(ds.test_images), min(args.eval_images, len(ds.test_images)), replace=False))
    where = f"--images {name}"
    return (_as_channels(_as_uint8(ds.train_images[np.sort(cal)], where), channels, where),
            _as_channels(_as_uint8(ds.test_images[ev], where), channels, where),
            {"calibration": f"{name}, training split", "evaluation": f"{name}, test split"})


def _images(args, model, images):
    """``(calibration, evaluation, sources)``: raw ``uint8`` images (arrays or lists of ``(H, W, C)``)."""
    from jaxbsd import data

    channels = model.config.channels
    if images is None or str(images) in data.DATASETS:
        name = str(images) if images is not None else ("cifar10" if channels == 3 else "mnist")
        return _dataset_images(name, args, channels, images is not None)
    path = pathlib.Path(images)
    if not path.exists():
        raise ValueError(f"--images {images}: no such file or directory, nor a data set name "
                         f"({', '.join(data.DATASETS)})")
    where = f"--images {path}"
    if path.is_dir():
        pool = _read_folder(path, channels)
    elif path.suffix == ".npz":
        pool = list(_as_channels(_read_npz(path), channels, where))
    else:
        raise ValueError(f"{where}: expected a data set name, an .npz file or a folder of image files")
    cal, ev = _split(pool, args, where)
    return cal, ev, {"calibration": f"{path} (seed {args.seed})", "evaluation": f"{path}, the other images"}


def _preprocess(model, images):
    """Model inputs ``(N, size, size, C)`` float32 and what was done: the model's
    ``preprocessor_config.json``, else ``ViTImageProcessor``'s defaults at the model's image size (mean and
    std 0.5 for each of the model's channels)."""
    import numpy as np

    from jaxbsd.models.vit.preprocessing import ImageProcessor

    processor = getattr(model, "image_processor", None)
    how = "the checkpoint's preprocessor_config.json"
    if processor is None:
        size, half = model.config.image_size, [0.5] * model.config.channels
        processor = ImageProcessor.from_config({"size": {"height": size, "width": size}, "image_mean": half,
                                                "image_std": half})
        how = (f"no preprocessor_config.json: ViTImageProcessor's defaults (bilinear resize to {size}x{size}, "
               "rescale 1/255, mean 0.5, std 0.5)")
    return np.concatenate([processor(np.asarray(im)[None]) for im in images]), how


def _vision_task(args, model, images) -> Task:
    cal_raw, eval_raw, sources = _images(args, model, images)
    calibration, how = _preprocess(model, cal_raw)
    evaluation, _ = _preprocess(model, eval_raw)
    return Task("vision", calibration,
                {"source": sources["calibration"], "images": len(calibration), "preprocessing": how},
                {"source": sources["evaluation"], "images": len(evaluation)},
                lambda original, compressed: _vision_scores(original, compressed, evaluation),
                f"{len(calibration)} images of {sources['calibration']}")


def _vision_scores(original, model, images) -> tuple[dict, dict, dict]:
    from jaxbsd.evaluation import classifier_agreement

    out = classifier_agreement(original, model, images, batch_size=min(256, len(images)))
    n = out["images"]
    scores = {k: out[k] for k in ("top1_agreement", "mean_kl", "max_kl")}
    reference = {"top1_agreement": 1.0, "mean_kl": 0.0, "max_kl": 0.0}
    about = {"top1_agreement": f"share of the {n} evaluation images whose most likely class is the original's; 1 "
                               "is the original, higher is better",
             "mean_kl": f"KL(original || compressed) of the class distributions (softmax of the logits), in nats, "
                        f"averaged over the {n} evaluation images; 0 is the original, lower is better",
             "max_kl": "the same KL on the evaluation image where it is largest; lower is better"}
    return scores, reference, about
