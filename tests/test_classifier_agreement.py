"""Label-free fidelity of a compressed image classifier (jaxbsd.evaluation.classifier).

Oracle: a brute-force loop in plain Python (math.exp, one row and one class at a time).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxbsd.evaluation import agreement, classifier_agreement
from jaxbsd.models import ViTConfig, build_model


def brute_force(ref, comp):
    kls, same = [], 0
    for r, c in zip(ref.tolist(), comp.tolist()):
        zr, zc = sum(math.exp(v) for v in r), sum(math.exp(v) for v in c)
        p, q = [math.exp(v) / zr for v in r], [math.exp(v) / zc for v in c]
        kls.append(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q)))
        same += r.index(max(r)) == c.index(max(c))
    return same / len(kls), sum(kls) / len(kls), max(kls)


def test_agreement_matches_a_brute_force_loop():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((40, 7)) * 3
    comp = ref + rng.standard_normal((40, 7))
    got = agreement(ref, comp)
    top1, mean_kl, max_kl = brute_force(ref, comp)
    assert got["top1_agreement"] == top1 and 0 < top1 < 1
    assert got["mean_kl"] == pytest.approx(mean_kl, rel=1e-12) and got["max_kl"] == pytest.approx(max_kl, rel=1e-12)
    same = agreement(ref, ref)
    assert same == {"top1_agreement": 1.0, "mean_kl": 0.0, "max_kl": 0.0}


def test_classifier_agreement_runs_both_models_in_padded_batches():
    a, b = build_model("vit", ViTConfig.tiny(), seed=0), build_model("vit", ViTConfig.tiny(), seed=1)
    x = np.random.default_rng(0).standard_normal((5, 8, 8, 1)).astype(np.float32)
    got = classifier_agreement(a, b, x, batch_size=2)
    top1, mean_kl, _ = brute_force(np.asarray(a(x), np.float64), np.asarray(b(x), np.float64))
    assert got["images"] == 5 and got["top1_agreement"] == top1
    assert got["mean_kl"] == pytest.approx(mean_kl, rel=1e-4)


def test_bad_logits_are_refused_by_name():
    with pytest.raises(ValueError, match="compressed must have the shape"):
        agreement(np.zeros((3, 2)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="reference: the logits are not all finite"):
        agreement(np.full((1, 2), np.nan), np.zeros((1, 2)))
