"""The character language model: shapes, causality, the gated MLP and rotary positions against
numpy, registry and checkpoints, training, n-gram baselines, and ``jaxbsd train --model lm``."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import pathlib
import shlex

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbsd import cli, data
from jaxbsd.models import (
    LM,
    GatedMLP,
    LMConfig,
    build_model,
    capture,
    config_for_dataset,
    count_params,
    mlp_inputs,
    model_kind,
)
from jaxbsd.models.lm import rotary_embedding
from jaxbsd.checkpoint import load_checkpoint, read_checkpoint_header, save_checkpoint
from jaxbsd.evaluation import evaluate_lm, lm_windows_loss, ngram_bpc
from jaxbsd.training import RECIPES, TrainConfig, train, train_lm

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_forward_shapes[True-1]",
}


ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = LMConfig.tiny()
forward = nnx.jit(lambda model, x: model(x))


def _tokens(shape, vocab=TINY.vocab_size, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, shape), jnp.int32)


def _silu(x):
    return x / (1 + np.exp(-x))


def _gelu(x):
    from scipy.special import erf

    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


# --- the model --------------------------------------------------------------------------------


@pytest.mark.parametrize("tie, length", [(True, 1), (False, 16)])
def test_forward_shapes(tie, length):
    model = build_model("lm", dataclasses.replace(TINY, tie_embeddings=tie))
    logits = forward(model, _tokens((3, length)))
    assert logits.shape == (3, length, TINY.vocab_size) and logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()
    assert model.block_input(_tokens((3, length)), 1).shape == (3, length, TINY.dim)
    # untied adds exactly a vocab x dim head
    tied = count_params(build_model("lm", TINY))
    assert count_params(model) - tied == (0 if tie else TINY.vocab_size * TINY.dim)


def test_param_count_matches_the_architecture():
    c = LMConfig.pystdlib()
    per_block = 4 * c.dim * c.dim + 3 * c.dim * c.mlp_dim + 2 * c.dim  # qkv+proj, gated MLP, 2 RMSNorm
    expected = c.vocab_size * c.dim + c.depth * per_block + c.dim  # embedding (tied head), final norm
    model = nnx.eval_shape(lambda: build_model("lm", c))
    assert count_params(model) == expected == 865_664


@pytest.mark.parametrize("bad", [np.zeros((2, 17), np.int32), np.zeros((2, 0), np.int32),
                                 np.zeros((2, 4), np.float32), np.zeros((4,), np.int32)])
def test_bad_tokens_are_refused(bad):
    with pytest.raises(ValueError, match="tokens"):
        build_model("lm", TINY)(jnp.asarray(bad))


@pytest.mark.parametrize("field, value", [("num_heads", 3), ("num_heads", 16), ("activation", "swish"),
                                          ("dim", 0), ("mlp_bias", 1), ("rope_base", 1.0), ("norm_eps", -1.0)])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        LMConfig.tiny(**{field: value})


@pytest.mark.parametrize("t", [0, 5, 15])
def test_causal_output_at_t_ignores_later_tokens(t):
    model = build_model("lm", TINY, seed=1)
    tokens = _tokens((2, 16), seed=2)
    later = np.asarray(tokens).copy()
    later[:, t + 1 :] = (later[:, t + 1 :] + 1 + np.arange(16 - t - 1)) % TINY.vocab_size
    a, b = np.asarray(forward(model, tokens)), np.asarray(forward(model, jnp.asarray(later)))
    np.testing.assert_allclose(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    if t < 15:  # and the perturbation does reach the later outputs
        assert np.abs(a[:, t + 1 :] - b[:, t + 1 :]).max() > 1e-3
    # changing token t itself changes the output at t
    at_t = np.asarray(tokens).copy()
    at_t[:, t] = (at_t[:, t] + 1) % TINY.vocab_size
    assert np.abs(np.asarray(forward(model, jnp.asarray(at_t)))[:, t] - a[:, t]).max() > 1e-4


def test_prefix_run_equals_full_run():
    """A causal model gives the same logits on a prefix as on the full sequence."""
    model = build_model("lm", TINY, seed=3)
    tokens = _tokens((2, 16), seed=4)
    full = np.asarray(forward(model, tokens))
    np.testing.assert_allclose(np.asarray(forward(model, tokens[:, :9])), full[:, :9], atol=1e-6)


@pytest.mark.parametrize("activation, h", [("silu", _silu), ("gelu", _gelu)])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp_equals_numpy(activation, h, bias):
    mlp = GatedMLP(6, 10, activation=activation, use_bias=bias, rngs=nnx.Rngs(0))
    assert {"gate_proj", "up_proj", "down_proj"} <= set(vars(mlp))
    for name in ("gate_proj", "up_proj", "down_proj"):
        layer = getattr(mlp, name)
        assert isinstance(layer, nnx.Linear) and (layer.bias is None) == (not bias)
        if bias:  # nonzero biases so they are tested
            layer.bias[...] = jax.random.normal(jax.random.key(len(name)), layer.bias[...].shape, jnp.float32)
    x = np.random.default_rng(0).normal(size=(4, 3, 6)).astype(np.float32)
    G, U, D = (np.asarray(getattr(mlp, n).kernel[...], np.float64) for n in ("gate_proj", "up_proj", "down_proj"))
    bg, bu, bd = ((np.asarray(getattr(mlp, n).bias[...], np.float64) if bias else 0.0)
                  for n in ("gate_proj", "up_proj", "down_proj"))
    x64 = x.astype(np.float64)
    expected = (h(x64 @ G + bg) * (x64 @ U + bu)) @ D + bd
    np.testing.assert_allclose(np.asarray(mlp(jnp.asarray(x))), expected, rtol=1e-4, atol=1e-5)


def test_rotary_is_a_rotation_by_relative_position():
    """<rot(q, s), rot(k, t)> = <q, R((t − s)θ) k> per pair, against explicit 2×2 rotations."""
    rng = np.random.default_rng(0)
    hd, T = 8, 6
    q = rng.normal(size=(1, T, 1, hd))
    k = rng.normal(size=(1, T, 1, hd))
    rq, rk = np.asarray(rotary_embedding(jnp.asarray(q), 100.0)), np.asarray(rotary_embedding(jnp.asarray(k), 100.0))
    theta = 100.0 ** (-2 * np.arange(hd // 2) / hd)
    for s in range(T):
        for t in range(T):
            # pair i = (feature i, feature i + hd/2): rotating both by their angle leaves the
            # angle difference (t − s)θ_i
            a1, a2 = q[0, s, 0, : hd // 2], q[0, s, 0, hd // 2 :]
            b1, b2 = k[0, t, 0, : hd // 2], k[0, t, 0, hd // 2 :]
            phi = (t - s) * theta
            expected = np.sum(a1 * (b1 * np.cos(phi) - b2 * np.sin(phi)) + a2 * (b1 * np.sin(phi) + b2 * np.cos(phi)))
            assert np.dot(rq[0, s, 0], rk[0, t, 0]) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    # position 0 is not rotated; norms are kept
    np.testing.assert_allclose(rq[:, 0], q[:, 0], atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-12)


def test_blocks_chain_to_the_output_and_mlp_input_is_what_the_mlp_sees():
    model = build_model("lm", TINY, seed=5)
    tokens = _tokens((2, 8), seed=6)  # the (2, 8) of the eager tests below: their primitives compile once
    x = model.embed_tokens(tokens)
    for i, block in enumerate(model.blocks):
        np.testing.assert_allclose(np.asarray(model.block_input(tokens, i)), np.asarray(x), atol=1e-6)
        mid = block.attention_residual(x)
        np.testing.assert_allclose(np.asarray(block.mlp_input(x)), np.asarray(block.norm2(mid)), atol=1e-6)
        x = mid + block.mlp(block.mlp_input(x))
    logits = np.asarray(model.norm(x)) @ np.asarray(model.embed.embedding[...]).T  # tied head
    np.testing.assert_allclose(np.asarray(model(tokens)), logits, rtol=1e-5, atol=1e-5)


def test_capture_hooks_work_on_token_ids():
    """``mlp_inputs``/``capture`` (the vision models' Jacobian capture) take (B, T) ids for the LM:
    the tokens are block.mlp_input of block_input, and J is the gated MLP's Jacobian."""
    model = build_model("lm", TINY, seed=14)
    tokens = _tokens((3, 8), seed=15)
    X = mlp_inputs(model, tokens, 1, batch_size=2)
    expected = model.blocks[1].mlp_input(model.block_input(tokens, 1))
    np.testing.assert_allclose(np.asarray(X), np.asarray(expected), atol=1e-6)
    Xs, J, F = capture(model, tokens, 1, 5, key=jax.random.key(0))
    mlp = model.blocks[1].mlp
    np.testing.assert_allclose(np.asarray(F), np.asarray(mlp(Xs)), atol=1e-6)
    np.testing.assert_allclose(np.asarray(J[2]), np.asarray(jax.jacrev(mlp)(Xs[2])), atol=1e-6)
    with pytest.raises(ValueError, match="images"):
        mlp_inputs(model, jnp.zeros((3, 8)), 1)  # float "tokens"


def test_mlp_surgery_is_assignment():
    """``model.blocks[i].mlp = other`` changes the model as the new module says (here: a zero MLP
    makes that block's MLP branch vanish)."""
    model = build_model("lm", TINY, seed=7)
    tokens = _tokens((2, 8), seed=8)
    before = np.asarray(model(tokens))
    zero = GatedMLP(TINY.dim, TINY.mlp_dim, rngs=nnx.Rngs(0))
    zero.down_proj.kernel[...] = jnp.zeros_like(zero.down_proj.kernel[...])
    model.blocks[1].mlp = zero
    after = np.asarray(model(tokens))
    x = model.block_input(tokens, 1)
    x = model.blocks[1].attention_residual(x)  # the block is now attention only
    np.testing.assert_allclose(after, np.asarray(model.logits(model.norm(x))), rtol=1e-5, atol=1e-5)
    assert np.abs(after - before).max() > 1e-4


def test_registry_and_checkpoint_round_trip(tmp_path):
    model = build_model("lm", LMConfig.tiny(tie_embeddings=False), seed=9)
    assert model_kind(model) == "lm" and isinstance(model, LM)
    path = save_checkpoint(tmp_path / "lm-ckpt", model, {"note": "x"})
    header = read_checkpoint_header(path)
    assert header["kind"] == "lm" and header["config"]["tie_embeddings"] is False
    loaded, meta = load_checkpoint(path)  # rebuilt from the stored kind and config
    tokens = _tokens((2, 8), seed=10)
    assert isinstance(loaded, LM) and meta == {"note": "x"}
    np.testing.assert_array_equal(np.asarray(loaded(tokens)), np.asarray(model(tokens)))
    assert build_model("lm", header["config"]).config == model.config  # a dict config works too


def test_config_for_dataset():
    assert config_for_dataset("lm", "pystdlib") == LMConfig.pystdlib(vocab_size=data.CharVocab().size)
    assert config_for_dataset("lm", "pystdlib", depth=2).depth == 2
    with pytest.raises(ValueError, match="pystdlib"):
        config_for_dataset("lm", "mnist")


# --- losses, baselines, training --------------------------------------------------------------


def test_windows_loss_is_the_mean_negative_log_likelihood():
    model = build_model("lm", TINY, seed=11)
    windows = _tokens((2, 9), seed=12)
    logp = np.asarray(jax.nn.log_softmax(model(windows[:, :-1]).astype(jnp.float64), axis=-1))
    nll = -np.take_along_axis(logp, np.asarray(windows[:, 1:])[..., None], axis=-1)[..., 0]
    assert float(lm_windows_loss(model, windows)) == pytest.approx(nll.mean(), rel=1e-5)
    mask = np.random.default_rng(0).random((2, 8)) < 0.5
    assert float(lm_windows_loss(model, windows, jnp.asarray(mask))) == pytest.approx(nll[mask].mean(), rel=1e-5)


@pytest.mark.parametrize("n, stride", [(40, None), (40, 5), (10, None), (17, 16)])
def test_evaluate_lm_scores_each_character_once(n, stride):
    """The bpc is the mean −log₂ p over the masked targets of the eval windows (numpy oracle),
    and those are the n − 1 characters after the first."""
    model = build_model("lm", TINY, seed=13)
    ids = np.asarray(_tokens((n,), seed=14)[...])
    bpc = evaluate_lm(model, ids, stride=stride, batch_size=3)
    windows, mask = data.eval_windows(ids, TINY.context, stride)
    # the model's logits through the jitted forward (one compile per window count, not one per primitive),
    # the log-softmax in numpy
    logits = np.asarray(forward(model, jnp.asarray(windows[:, :-1], jnp.int32)), np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, windows[:, 1:, None].astype(np.int64), -1)[..., 0]
    assert bpc == pytest.approx(nll[mask].mean() / math.log(2), rel=1e-5)
    assert mask.sum() == n - 1


def _ngram_oracle(train_ids, eval_ids, order, V):
    from collections import Counter

    if order == 1:
        c = Counter(train_ids.tolist())
        return -np.mean([math.log2((c[b] + 1) / (len(train_ids) + V)) for b in eval_ids[1:]])
    pairs = Counter(zip(train_ids[:-1].tolist(), train_ids[1:].tolist(), strict=True))
    first = Counter(train_ids[:-1].tolist())
    return -np.mean([math.log2((pairs[(a, b)] + 1) / (first[a] + V)) for a, b in zip(eval_ids[:-1], eval_ids[1:])])


@pytest.mark.parametrize("order", [1, 2])
def test_ngram_bpc_against_counting(order):
    rng = np.random.default_rng(order)
    train_ids, eval_ids = rng.integers(0, 7, 300), rng.integers(0, 7, 50)
    eval_ids[:3] = 8  # an id never seen in training: smoothing keeps it finite
    assert ngram_bpc(train_ids, eval_ids, order, 9) == pytest.approx(_ngram_oracle(train_ids, eval_ids, order, 9), rel=1e-12)


def test_ngram_baselines_order():
    """On text with structure the bigram beats the unigram, which beats the uniform code."""
    vocab = data.CharVocab()
    text = "def f(x):\n    return x + 1\n\n" * 40
    ids = vocab.encode(text)
    uni, bi = ngram_bpc(ids, ids, 1, vocab.size), ngram_bpc(ids, ids, 2, vocab.size)
    assert bi < uni < math.log2(vocab.size)
    with pytest.raises(ValueError, match="order"):
        ngram_bpc(ids, ids, 3, vocab.size)


def _text_dataset(text_train, text_val, vocab=None):
    vocab = vocab or data.CharVocab()
    return data.TextDataset(name="pystdlib", vocab=vocab, train=vocab.encode(text_train),
                            validation=vocab.encode(text_val), test=vocab.encode(text_val),
                            modules={"train": ("a",), "validation": ("b",), "test": ("b",)})


def test_a_few_training_steps_decrease_the_loss():
    config = LMConfig.tiny(vocab_size=98)
    dataset = _text_dataset("for i in range(10):\n    print(i)\n" * 30, "for j in range(3):\n    print(j)\n" * 4)
    model = build_model("lm", config, seed=0)
    before = evaluate_lm(model, dataset.validation)
    history = train_lm(model, dataset, TrainConfig(epochs=3, lr=1e-2, batch_size=8), progress=False)
    after = evaluate_lm(model, dataset.validation)
    assert history[-1]["loss"] < history[0]["loss"] and after < before - 1.0
    assert [h["epoch"] for h in history] == [1, 2, 3] and history[-1]["val_bpc"] == pytest.approx(after)
    # train() hands a text data set to train_lm; the same seed gives the same parameters
    again = build_model("lm", config, seed=0)
    train(again, dataset, TrainConfig(epochs=3, lr=1e-2, batch_size=8), progress=False)
    assert evaluate_lm(again, dataset.validation) == pytest.approx(after, rel=1e-6)


def test_steps_stops_inside_an_epoch_and_image_settings_are_refused():
    config = LMConfig.tiny(vocab_size=98)
    dataset = _text_dataset("abcdefgh" * 200, "abcdefgh" * 10)
    model = build_model("lm", config)
    history = train_lm(model, dataset, TrainConfig(epochs=5, steps=7, batch_size=4), progress=False)
    # 1600 characters, 16-character windows: 99 windows, 24 steps an epoch; 7 steps end epoch 1
    assert [h["steps"] for h in history] == [7]
    for field, value in (("shift", 1), ("label_smoothing", 0.1), ("drop_path", 0.1)):
        with pytest.raises(ValueError, match=field):
            train_lm(model, dataset, TrainConfig(epochs=1, **{field: value}), progress=False)
    with pytest.raises(ValueError, match="vocab_size"):
        train_lm(build_model("lm", LMConfig.tiny()), dataset, TrainConfig(epochs=1), progress=False)
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)


# --- the command line ----------------------------------------------------------------------------


def _write_corpus(path, modules):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for name, body in modules:
            f.write(f"# ==== {name}.py ====\n{body}")
    return path


def _small_corpus(tmp_path):
    # enough modules that every split gets some (module_split hashes the names)
    names = [f"mod{i}" for i in range(40)]
    bodies = [f"def f{i}(x):\n    return x * {i} + {i % 3}\n\n" * 20 for i in range(40)]
    path = _write_corpus(tmp_path / "corpus.txt.gz", list(zip(names, bodies, strict=True)))
    splits = {data.module_split(n) for n in names}
    assert splits == set(data.TEXT_SPLITS)
    return path


def test_cli_trains_the_lm_end_to_end(tmp_path, monkeypatch):
    """``jaxbsd train --model lm --dataset pystdlib`` on a small corpus, with a tiny model (the
    preset swapped for LMConfig.tiny): JSON with bpc, baselines and provenance, a checkpoint that
    rebuilds the model."""
    monkeypatch.setattr(LMConfig, "pystdlib", classmethod(lambda cls, **kw: cls.tiny(**kw)))
    corpus = _small_corpus(tmp_path)
    out, result = tmp_path / "lm-ckpt", tmp_path / "result.json"
    argv = ["train", "--model", "lm", "--dataset", "pystdlib", "--data-root", str(corpus), "--limit", "2000",
            "--epochs", "1", "--steps", "6", "--batch-size", "4", "--no-progress", "--out", str(out),
            "--json", str(result)]
    assert cli.main(argv) == 0
    record = json.loads(result.read_text())
    assert record["model"] == "lm" and record["steps"] == 6 and record["characters"]["train"] == 2000
    assert record["provenance"]["command"] == "jaxbsd " + " ".join(argv)
    for key in ("test_bpc", "val_bpc", "unigram_test_bpc", "bigram_test_bpc"):
        value = record.get(key, record["baselines"].get(key))
        assert 0 < value < 10, key
    model, meta = load_checkpoint(out)
    assert isinstance(model, LM) and model.config == LMConfig.tiny(vocab_size=98)
    assert meta["test_bpc"] == pytest.approx(record["test_bpc"])
    ds = data.load_text_dataset("pystdlib", corpus, limit=2000)
    assert evaluate_lm(model, ds.test, batch_size=64) == pytest.approx(record["test_bpc"], rel=1e-6)


@pytest.mark.parametrize("argv", [
    ["--model", "vit", "--dataset", "pystdlib"],
    ["--model", "lm", "--dataset", "digits"],
    ["--model", "lm", "--dataset", "pystdlib", "--shift", "-1"],
])
def test_cli_refuses_mixed_kinds(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxbsd train: error:"), err


# --- the recorded run ------------------------------------------------------------------------------

RESULT = ROOT / "experiments" / "results" / "training_lm_pystdlib.json"


@pytest.mark.skipif(not RESULT.exists(), reason="no recorded LM run")
def test_recorded_run_is_the_recipe_and_beats_the_baselines():
    record = json.loads(RESULT.read_text())
    args = cli.build_parser().parse_args(shlex.split(record["command"])[1:])
    assert cli.train_config_from_args(args) == RECIPES[("lm", "pystdlib")]
    assert record["train_config"] == RECIPES[("lm", "pystdlib")].to_dict()
    assert record["config"] == {**LMConfig.pystdlib().__dict__}
    base = record["baselines"]
    assert base["bigram_test_bpc"] < base["unigram_test_bpc"]
    assert record["test_bpc"] < base["bigram_test_bpc"] - 0.5 and record["val_bpc"] < base["bigram_validation_bpc"] - 0.5
    assert record["provenance"]["sources_dirty"] is False
    header = read_checkpoint_header(ROOT / record["checkpoint"])
    assert header["kind"] == "lm" and header["config"] == record["config"]
    assert header["metadata"]["test_bpc"] == record["test_bpc"]
