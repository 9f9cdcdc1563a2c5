"""Label-free fidelity of a compressed sentence encoder against its original.

:func:`embed_eval_set` embeds the held-out passages and (title, section) pairs with one encoder;
:func:`fidelity` compares two such sets: embedding agreement (mean cosine, neighbour overlap) and
title → section retrieval recall of each encoder.
"""

from __future__ import annotations

import numpy as np

from jaxbsd.solver import metrics
from jaxbsd.models.bert import Encoder

__all__ = ["embed_eval_set", "fidelity"]


def embed_eval_set(encoder: Encoder, passages, pairs, *, batch_size: int = 64) -> dict[str, np.ndarray]:
    """The embeddings a fidelity evaluation needs: ``{"passages": (N, d), "titles": (Q, d),
    "sections": (Q, d)}`` for ``passages`` (N texts) and ``pairs`` (Q ``(title, section text)``)."""
    pairs = list(pairs)
    return {"passages": encoder.encode(list(passages), batch_size=batch_size),
            "titles": encoder.encode([t for t, _ in pairs], batch_size=batch_size),
            "sections": encoder.encode([d for _, d in pairs], batch_size=batch_size)}


def fidelity(reference: dict[str, np.ndarray], compressed: dict[str, np.ndarray], *, k: int = 10) -> dict[str, float]:
    """Label-free fidelity of a compressed encoder against the original, from :func:`embed_eval_set`
    of both on the same texts:

    * ``mean_cosine``: mean cosine between compressed and original embeddings of the passages;
    * ``neighbour_overlap``: mean share of each passage's ``k`` nearest passages both agree on;
    * ``recall@1``, ``recall@10``: title → section retrieval with the compressed encoder (queries and
      documents both embedded by it), and ``reference_recall@1``/``@10`` with the original.
    """
    out = {"mean_cosine": float(metrics.mean_cosine(reference["passages"], compressed["passages"])),
           "neighbour_overlap": float(metrics.neighbour_overlap(reference["passages"], compressed["passages"], k=k))}
    for prefix, emb in (("", compressed), ("reference_", reference)):
        for cut, value in metrics.retrieval_recall(emb["titles"], emb["sections"], ks=(1, 10)).items():
            out[f"{prefix}recall@{cut}"] = value
    return out
