"""The refinement stage: one jitted loop per replacement structure, never worse on held-out tokens.

Oracles: the held-out error a refinement reports is recomputed here in numpy from the returned
module and the same split; the structure and parameter count of every replacement are compared
with an unrefined run; the compile count is read from the loop's trace counter.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression import refine as refine_mod
from jaxbsd.models import count_params

FAST = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=15, tol=1e-8)


class FFN(nnx.Module):
    def __init__(self, d, h, rngs):
        self.inp, self.out = nnx.Linear(d, h, rngs=rngs), nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.gelu(self.inp(x)))


class Net(nnx.Module):
    def __init__(self, d, h, depth, rngs):
        self.ffns = nnx.List([FFN(d, h, rngs) for _ in range(depth)])

    def __call__(self, x):
        for ffn in self.ffns:
            x = x + ffn(x)
        return x


def _calibration(d, seed=0):
    return jax.random.normal(jax.random.key(seed), (12, 8, d), jnp.float32)


@pytest.mark.parametrize("method", ["svd", "prune", *(pytest.param(m, marks=pytest.mark.slow)
                                                      for m in ("bsd", "drone", "auto"))])
def test_refining_never_raises_the_heldout_error_and_keeps_structure_and_budget(method):
    d, h = 12, 32
    x = _calibration(d)
    paths = ["ffns.0", "ffns.1"]
    kw = dict(mlps=paths, reduction=0.4, method=method, key=jax.random.key(1),
              config=None if method in ("svd", "drone", "prune") else FAST)
    plain, plain_report = jb.compress_model(Net(d, h, 2, nnx.Rngs(0)), x, refine=None, **kw)
    refined, report = jb.compress_model(Net(d, h, 2, nnx.Rngs(0)), x, refine=jb.Refine(steps=40), **kw)
    assert report.params_after == plain_report.params_after <= (1 - 0.4) * report.params_before
    for r, p in zip(report.mlps, plain_report.mlps):
        assert r.refine is not None and p.refine is None
        assert r.refine["error_after"] <= r.refine["error_before"]
        # the report describes the module returned: output_error refined, the built one beside it
        assert r.refine["output_error_built"] == p.output_error
        assert 0 <= r.refine["steps_kept"] <= 40
        module = jb.compression.get_submodule(refined, r.path)
        # the same kind of replacement (auto may keep the other candidate once both are refined)
        if method != "auto":
            assert type(module) is type(jb.compression.get_submodule(plain, p.path))
            assert r.rank == p.rank
    assert np.all(np.isfinite(np.asarray(refined(x))))


@pytest.mark.parametrize("batch_size", [None, 32])
def test_the_reported_heldout_error_is_that_of_the_returned_module(batch_size):
    d, h, k = 10, 24, 6
    rngs = nnx.Rngs(3)
    ffn = FFN(d, h, rngs)
    X = jax.random.normal(jax.random.key(4), (200, d), jnp.float32)
    Y = ffn(X)
    pruned, _ = jb.baselines.prune_mlp(ffn.inp.kernel[...], ffn.inp.bias[...], ffn.out.kernel[...],
                                       ffn.out.bias[...], "gelu", k, X[:50], Y[:50])
    config = jb.Refine(steps=60, learning_rate=3e-3, holdout=0.25, batch_size=batch_size)
    key = jax.random.key(9)
    refined, info = refine_mod.refine_module(pruned, X, Y, config, key)
    # the same split: a permutation of the tokens, the first quarter held out
    order = np.asarray(jax.random.permutation(key, X.shape[0]))
    held = order[: info["tokens_heldout"]]
    assert info["tokens_heldout"] == 50 and info["tokens_train"] == 150

    def rel(module):
        out, ref = np.asarray(module(X[held]), np.float64), np.asarray(Y[held], np.float64)
        return np.sum((out - ref) ** 2) / np.sum(ref ** 2)

    np.testing.assert_allclose(info["error_before"], rel(pruned), rtol=1e-4)
    np.testing.assert_allclose(info["error_after"], rel(refined), rtol=1e-4)
    assert info["error_after"] < 0.9 * info["error_before"]  # fitted on 50 tokens only: room to improve
    assert isinstance(refined, jb.baselines.PrunedMLP) and count_params(refined) == count_params(pruned)
    # the module given is not changed
    np.testing.assert_array_equal(np.asarray(pruned(X)), np.asarray(pruned(X)))


def test_a_diverging_refinement_keeps_the_replacement_as_built():
    d, h = 10, 24
    ffn = FFN(d, h, nnx.Rngs(5))
    X = jax.random.normal(jax.random.key(6), (120, d), jnp.float32)
    refined, info = refine_mod.refine_module(ffn, X, ffn(X) * 1.0, jb.Refine(steps=20, learning_rate=1e4),
                                             jax.random.key(0))
    assert info["steps_kept"] == 0 and info["error_after"] == info["error_before"]
    np.testing.assert_array_equal(np.asarray(refined(X)), np.asarray(ffn(X)))


def test_the_loop_compiles_once_for_mlps_of_one_shape():
    d, h = 13, 29  # a shape no other test uses: the first compile of this structure happens here
    x = _calibration(d, seed=2)
    before = refine_mod.trace_count()
    _, report = jb.compress_model(Net(d, h, 3, nnx.Rngs(0)), x, mlps=["ffns.0", "ffns.1", "ffns.2"], reduction=0.3,
                                  method="prune", key=jax.random.key(0), refine=jb.Refine(steps=10))
    assert len(report.mlps) == 3 and all(r.refine for r in report.mlps)
    assert refine_mod.trace_count() - before == 1


@pytest.mark.parametrize("steps, batch_size, eval_every, evaluations, batch", [
    (60, 32, None, 12, 32),     # 150 training tokens in batches of 32: an epoch is 5 steps
    (61, 32, None, 13, 32),     # ... and the last step is always evaluated
    (60, 32, 7, 9, 32),         # every 7th step (7, 14, ..., 56) and the last
    (20, None, None, 20, 150),  # full batch: every step
    (20, 500, None, 20, 150),   # a batch of at least the training tokens is the full batch
])
def test_minibatches_are_evaluated_on_schedule_and_never_raise_the_heldout_error(
        steps, batch_size, eval_every, evaluations, batch):
    d, h = 10, 24
    ffn = FFN(d, h, nnx.Rngs(7))
    X = jax.random.normal(jax.random.key(8), (200, d), jnp.float32)
    Y = ffn(X)
    pruned, _ = jb.baselines.prune_mlp(ffn.inp.kernel[...], ffn.inp.bias[...], ffn.out.kernel[...],
                                       ffn.out.bias[...], "gelu", 6, X[:40], Y[:40])
    config = jb.Refine(steps=steps, learning_rate=3e-3, holdout=0.25, batch_size=batch_size, eval_every=eval_every)
    _, info = refine_mod.refine_module(pruned, X, Y, config, jax.random.key(1))
    assert info["evaluations"] == evaluations and info["batch_size"] == batch
    assert info["error_after"] < 0.9 * info["error_before"]
    every = eval_every or -(-150 // batch)
    # the step kept is one that was evaluated
    assert info["steps_kept"] % every == 0 or info["steps_kept"] == steps


def test_minibatch_steps_draw_every_training_token():
    """Over 40 steps of 16 tokens from 60 every training token is drawn at least once: a target far
    off on any one of them changes the refined module (same key, so the same draws otherwise)."""
    d, h = 6, 12
    ffn = FFN(d, h, nnx.Rngs(0))
    X = jax.random.normal(jax.random.key(2), (80, d), jnp.float32)
    key = jax.random.key(3)
    order = np.asarray(jax.random.permutation(key, 80))  # the split: the first 20 held out
    config = jb.Refine(steps=40, learning_rate=1e-2, holdout=0.25, batch_size=16, eval_every=1)
    Y = np.asarray(ffn(X)) + 0.1

    def params(module):
        return np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(nnx.state(module, nnx.Param))])

    base, info = refine_mod.refine_module(ffn, X, Y, config, key)
    assert info["steps_kept"] > 0
    for i in (order[20], order[45], order[79]):
        Y_off = Y.copy()
        Y_off[i] += 1e3
        moved, _ = refine_mod.refine_module(ffn, X, Y_off, config, key)
        assert not np.allclose(params(moved), params(base))


@pytest.mark.parametrize("bad", [dict(steps=-1), dict(learning_rate=0.0), dict(holdout=1.0), dict(target="labels"),
                                 dict(batch_size=0), dict(eval_every=0), dict(batch_size=2.5)])
def test_bad_settings_name_refine(bad):
    with pytest.raises(ValueError, match="refine"):
        jb.Refine(**bad)


def test_compress_model_refines_by_default_and_none_turns_it_off():
    d, h = 12, 32
    x = _calibration(d, seed=4)
    kw = dict(mlps=["ffns.0"], reduction=0.4, method="prune", key=jax.random.key(1))
    default_model, default = jb.compress_model(Net(d, h, 1, nnx.Rngs(0)), x, **kw)
    explicit_model, explicit = jb.compress_model(Net(d, h, 1, nnx.Rngs(0)), x, refine=jb.Refine(), **kw)
    off_model, off = jb.compress_model(Net(d, h, 1, nnx.Rngs(0)), x, refine=None, **kw)
    assert default.mlps[0].refine == {**explicit.mlps[0].refine, "seconds": default.mlps[0].refine["seconds"]}
    np.testing.assert_array_equal(np.asarray(default_model(x)), np.asarray(explicit_model(x)))
    assert off.mlps[0].refine is None
    # the output error reported is that of the module returned (on the 96 calibration tokens)
    tokens = x.reshape(-1, d)
    for model, report in ((default_model, default), (off_model, off)):
        ffn, original = model.ffns[0], Net(d, h, 1, nnx.Rngs(0)).ffns[0]
        out, ref = np.asarray(ffn(tokens), np.float64), np.asarray(original(tokens), np.float64)
        np.testing.assert_allclose(report.mlps[0].output_error, np.sum((out - ref) ** 2) / np.sum(ref ** 2), rtol=1e-4)


def test_compress_model_checks_refine():
    with pytest.raises(ValueError, match="refine"):
        jb.compress_model(Net(8, 16, 1, nnx.Rngs(0)), _calibration(8), mlps=["ffns.0"], reduction=0.3,
                          method="prune", key=jax.random.key(0), refine=300)


def test_consistent_target_follows_the_original_model_where_inputs_drift():
    """Front to back, the second MLP's inputs change once the first is replaced: the "consistent"
    target is the original model's output of the second MLP, the "local" one its output on the
    drifted inputs; the two refinements then differ, and at the first MLP they coincide."""
    d, h = 12, 32
    x = _calibration(d, seed=5)
    runs = {}
    for target in ("local", "consistent"):
        _, report = jb.compress_model(Net(d, h, 2, nnx.Rngs(0)), x, mlps=["ffns.0", "ffns.1"], reduction=0.5,
                                      method="prune", order="front-to-back", key=jax.random.key(0),
                                      refine=jb.Refine(steps=30, target=target))
        runs[target] = report.mlps
    assert runs["local"][0].refine["error_after"] == runs["consistent"][0].refine["error_after"]
    assert runs["local"][1].refine["error_before"] != runs["consistent"][1].refine["error_before"]


@pytest.mark.parametrize("batch, eval_every", [(None, 1), (16, 4)])
def test_the_loop_lowers_for_gpus_as_one_device_loop(batch, eval_every):
    """Exported for CUDA (lowered here, on the CPU), the whole refinement is one device-side loop
    (the scan's ``stablehlo.while``), the held-out pass a ``case`` inside it: no host round trip
    per step on an accelerator."""
    import re

    d, h = 6, 12
    ffn = FFN(d, h, nnx.Rngs(0))
    X = jax.random.normal(jax.random.key(2), (80, d), jnp.float32)
    graphdef, params, rest = nnx.split(ffn, nnx.Param, ...)

    def loop(params, X, Y):
        return refine_mod._refine_loop(graphdef, params, rest, X[20:], Y[20:], X[:20], Y[:20], jnp.float32(1e-3),
                                       jax.random.key(0), steps=12, batch=batch, eval_every=eval_every)

    text = jax.export.export(jax.jit(loop), platforms=("cuda",))(params, X, ffn(X)).mlir_module()
    assert len(re.findall(r"stablehlo\.while", text)) == 1
    assert (len(re.findall(r"stablehlo\.case", text)) >= 1) == (eval_every > 1)
