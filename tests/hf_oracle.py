"""Test helpers for the Hugging Face families (tests/test_hf_*.py): the tiny ``transformers`` models
the tests build and save, the edits that break a saved directory, and the comparisons they make.

The oracle side (:func:`tiny_model`, :func:`randomize`, :func:`save`, the edits and
:func:`assert_rel_close`) imports no jaxbsd; :func:`prune_all` and :func:`assert_refused` are the
jaxbsd side the tests share. torch and ``transformers`` are imported where used, so a test module
that skips without them (``pytest.importorskip``) can still import this one.
"""

from __future__ import annotations

import itertools
import json
import pathlib

import numpy as np
import pytest


# ----------------------------------------------------------------------------- tiny transformers models


def randomize(model, seed: int = 1, scale: float = 0.3, *, bias: float | None = None, norms: bool = False) -> None:
    """Redraw every parameter of the torch ``model`` in place, in ``named_parameters`` order from one
    generator seeded ``seed`` (random init leaves biases 0 and norm weights 1, which hide a swapped
    tensor): ``N(0, scale²)``; where ``bias`` is given, ``N(0, bias²)`` for the parameters named
    ``…bias``; where ``norms``, ``U(0.5, 1.5)`` for the other parameters of norm layers (a name with
    ``norm`` or ``.ln_``)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if bias is not None and name.endswith("bias"):
                p.copy_(bias * torch.randn(p.shape, generator=gen))
            elif norms and ("norm" in name or ".ln_" in name):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=gen))


def tiny_model(make, seed: int | None = 1, **redraw):
    """``make()`` (a ``transformers`` model) built after ``torch.manual_seed(0)``, in eval mode, with
    every parameter redrawn by :func:`randomize` (``seed``, ``redraw``) unless ``seed`` is None."""
    import torch

    torch.manual_seed(0)
    model = make().eval()
    if seed is not None:
        randomize(model, seed, **redraw)
    return model


def save(model, path: pathlib.Path, *edits) -> pathlib.Path:
    """``model.save_pretrained(path)`` as safetensors, then each ``edit(path)`` in turn; returns ``path``."""
    model.save_pretrained(path, safe_serialization=True)
    for edit in edits:
        edit(path)
    return path


# ----------------------------------------------------------------------------- edits of a saved directory


def edit_config(**fields):
    """An edit setting ``fields`` in ``config.json`` (a field given None is removed)."""
    def edit(path):
        data = {**json.loads((path / "config.json").read_text()), **fields}
        (path / "config.json").write_text(json.dumps({k: v for k, v in data.items()
                                                      if not (k in fields and v is None)}))
    return edit


def edit_tensors(change):
    """An edit calling ``change(tensors)`` on the ``{name: numpy array}`` of ``model.safetensors`` and
    writing them back."""
    def edit(path):
        from safetensors.numpy import load_file, save_file

        tensors = load_file(str(path / "model.safetensors"))
        change(tensors)
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return edit


def only_pytorch_bin(path: pathlib.Path) -> None:
    """An edit leaving the weights as ``pytorch_model.bin`` only (the name of a pickle checkpoint)."""
    (path / "model.safetensors").rename(path / "pytorch_model.bin")


# ----------------------------------------------------------------------------- comparisons


def assert_rel_close(ours, ref, mask=None, rel: float = 1e-5) -> None:
    """``max |ours - ref| / max |ref| <= rel``, over the real tokens (``mask`` 1) where ``mask`` is given."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    if mask is not None:
        real = np.asarray(mask).astype(bool)
        ours, ref = ours[real], ref[real]
    err = np.max(np.abs(ours - ref)) / np.max(np.abs(ref))
    assert err <= rel, err


def assert_refused(path: pathlib.Path, match: str) -> None:
    """``jaxbsd.models.from_pretrained(path)`` raises a one-line ``ValueError`` matching ``match`` and
    naming ``path``."""
    from jaxbsd import models

    with pytest.raises(ValueError, match=match) as err:
        models.from_pretrained(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- jaxbsd models


def prune_all(blocks, widths, seed: int = 0) -> None:
    """Each ``block.mlp`` of ``blocks`` pruned by the pruning baseline (the one ``compress_model``'s
    ``"prune"`` runs) to its width: ``widths`` one int for all, or one per block; the calibration
    tokens are 100 standard-normal rows a block, drawn in turn from one generator seeded ``seed``."""
    from jaxbsd.compression.baselines import prune_mlp

    rng = np.random.default_rng(seed)
    for block, width in zip(blocks, itertools.repeat(widths) if isinstance(widths, int) else widths):
        m = block.mlp
        tokens = rng.standard_normal((100, m.dim)).astype(np.float32)
        block.mlp, _ = prune_mlp(m.fc1.kernel[...], m.fc1.bias[...], m.fc2.kernel[...], m.fc2.bias[...],
                                 m.activation, width, tokens)
