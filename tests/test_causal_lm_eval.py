"""Bits per token and next-token agreement (jaxbsd.evaluation.causal_lm) against a brute-force numpy oracle.

The oracle takes the logits of one forward pass over all rows at full length (a causal model's logits
at a real position do not depend on the padding after it) and computes −log₂ softmax and argmax position by
position in float64 numpy, looping over each row's real length: the batching, the padded last batch, the
masks and the shifting of targets are the code's, not the oracle's.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from jaxbsd.evaluation import bits_per_token, next_token_agreement
from jaxbsd.models.llama import Llama, LlamaConfig

CONFIG = LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=8, max_position_embeddings=16)


@pytest.fixture(scope="module")
def models():
    model = Llama(CONFIG, rngs=nnx.Rngs(0))
    other = Llama(CONFIG, rngs=nnx.Rngs(1))
    for m in (model, other):  # larger weights than the init, so predictions are sharp and differ
        for _, p in nnx.iter_graph(m):
            if isinstance(p, nnx.Param) and p.ndim == 2:
                p.set_value(p[...] * 20)
    return model, other


def _data():
    ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (5, 7))
    lengths = [7, 4, 1, 7, 2]  # row 2 has no target; five rows in batches of 2: the last one padded
    mask = (np.arange(7)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    return ids, mask, lengths


def _logits(model, ids):
    return np.asarray(nnx.jit(lambda m, x: m(x))(model, ids), np.float64)


def test_bits_per_token_matches_numpy(models):
    model, _ = models
    ids, mask, lengths = _data()
    nats, count = 0.0, 0
    for row, logits, n in zip(ids, _logits(model, ids), lengths):
        for t in range(n - 1):
            z = logits[t] - logits[t].max()
            nats -= z[row[t + 1]] - np.log(np.exp(z).sum())
            count += 1
    expected = nats / count / np.log(2)
    assert abs(bits_per_token(model, ids, mask, batch_size=2) - expected) <= 1e-5 * expected
    full = bits_per_token(model, ids, batch_size=4)  # no mask: every target
    assert abs(full - expected) > 1e-3


def test_next_token_agreement_matches_numpy(models):
    model, other = models
    ids, mask, lengths = _data()
    ours, theirs = _logits(model, ids), _logits(other, ids)
    same = [ours[i, :n].argmax(-1) == theirs[i, :n].argmax(-1) for i, n in enumerate(lengths)]
    expected = np.concatenate(same).mean()
    assert 0 < expected < 1
    assert next_token_agreement(model, other, ids, mask, batch_size=2) == pytest.approx(expected, abs=1e-12)
    assert next_token_agreement(model, model, ids, mask) == 1.0


@pytest.mark.parametrize("mask, message", [
    (np.array([[0, 1, 1]]), "padding must be on the right"),
    (np.array([[1, 2, 0]]), "0 \\(padding\\) and 1"),
    (np.ones((1, 2)), "mask must have the shape of ids"),
])
def test_bad_masks_are_refused(models, mask, message):
    with pytest.raises(ValueError, match=message):
        bits_per_token(models[0], np.zeros((1, 3), np.int32), mask)
    with pytest.raises(ValueError, match=message):
        next_token_agreement(models[0], models[1], np.zeros((1, 3), np.int32), mask)


def test_no_real_target_is_refused(models):
    with pytest.raises(ValueError, match="no real target"):
        bits_per_token(models[0], np.zeros((2, 3), np.int32), np.array([[1, 0, 0], [0, 0, 0]]))
