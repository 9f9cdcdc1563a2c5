"""Structured pruning of MLP hidden units (``method="prune"``) against independent oracles.

Oracles: a planted MLP whose dropped units contribute exactly nothing (pruning must then be
exact), ``numpy.linalg.lstsq`` with an intercept column for the refit, a numpy computation of
the importance ``‖V1[:, j]‖ · RMS(h_j)``, the closed-form parameter count, and a save/load
round trip that must be bit-identical.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import erf

import jaxbsd as jb
from jaxbsd.compression import baselines
from jaxbsd.compression import blockwise as compress
from jaxbsd.compression.methods import Prune
from jaxbsd.compression.sites import make_site
from jaxbsd.data import Dataset
from jaxbsd.models import ViTConfig, build_model, count_params

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_prune_refits_on_calibration_tokens_outside_the_check_set[20-held-out]",
}


NP_ACT = {
    "gelu": lambda z: 0.5 * z * (1 + erf(z / math.sqrt(2))),
    "relu": lambda z: np.maximum(z, 0),
    "tanh": np.tanh,
}


def random_mlp(m=5, H=12, n=4, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(m, H)).astype(dtype), rng.normal(size=H).astype(dtype) * 0.5,
            rng.normal(size=(H, n)).astype(dtype), rng.normal(size=n).astype(dtype))


def np_mlp(K1, b1, K2, b2, act, X):
    return NP_ACT[act](X @ K1 + b1) @ K2 + b2


@pytest.mark.parametrize("act", ["gelu", "relu", "tanh"])
@pytest.mark.parametrize("seed", [0, 1])
def test_pruning_a_planted_mlp_is_exact(act, seed):
    """Units with a zero output column (V1[:, j] = 0) or a zero activation (h(0) = 0 with a
    zero fc1 column and bias) add nothing: keeping the others reproduces the MLP everywhere,
    and the refit recovers the original output weights and bias."""
    K1, b1, K2, b2 = random_mlp(seed=seed)
    rng = np.random.default_rng(seed + 10)
    dead = rng.choice(12, 5, replace=False)
    K2[dead[:3]] = 0.0                    # zero output columns
    K1[:, dead[3:]], b1[dead[3:]] = 0.0, 0.0  # zero activations
    live = np.setdiff1d(np.arange(12), dead)
    X = rng.normal(size=(200, 5))
    module, res = baselines.prune_mlp(jnp.asarray(K1), jnp.asarray(b1), jnp.asarray(K2), jnp.asarray(b2), act,
                                      len(live), jnp.asarray(X))
    np.testing.assert_array_equal(res.kept, live)
    assert np.all(res.importance[dead] == 0) and np.all(res.importance[live] > 0)
    np.testing.assert_allclose(res.K2, K2[live], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(res.b2, b2, rtol=1e-9, atol=1e-9)
    X_new = rng.normal(size=(50, 5)) * 2  # also off the calibration tokens
    np.testing.assert_allclose(np.asarray(module(jnp.asarray(X_new))), np_mlp(K1, b1, K2, b2, act, X_new),
                               rtol=1e-10, atol=1e-10)
    assert count_params(module) == baselines.pruned_mlp_params(5, len(live), 4)


@pytest.mark.parametrize("k", [1, 4, 9])
def test_refit_equals_numpy_lstsq_with_an_intercept_and_ranking_matches_numpy(k):
    K1, b1, K2, b2 = random_mlp(m=6, H=10, n=3, seed=3)
    rng = np.random.default_rng(4)
    X = rng.normal(size=(80, 6)) * 1.5 + 0.7  # a mean offset: the intercept matters
    Y = np_mlp(K1, b1, K2, b2, "gelu", X) + 0.1 * rng.normal(size=(80, 3))  # any target
    res = baselines.prune_weights(jnp.asarray(K1), jnp.asarray(b1), jnp.asarray(K2), jnp.asarray(b2), "gelu", k,
                                  jnp.asarray(X), jnp.asarray(Y))
    hidden = NP_ACT["gelu"](X @ K1 + b1)
    score = np.linalg.norm(K2, axis=1) * np.sqrt(np.mean(hidden ** 2, axis=0))
    np.testing.assert_allclose(res.importance, score, rtol=1e-12)
    np.testing.assert_array_equal(res.kept, np.sort(np.argsort(-score)[:k]))
    design = np.c_[hidden[:, res.kept], np.ones(80)]
    coef, *_ = np.linalg.lstsq(design, Y, rcond=None)
    np.testing.assert_allclose(res.K2, coef[:-1], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(res.b2, coef[-1], rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(res.K1, K1[:, res.kept])
    np.testing.assert_array_equal(res.b1, b1[res.kept])


@pytest.mark.parametrize("gated", [False, True])
def test_the_normal_equations_refit_equals_lstsq_over_several_token_chunks(gated, monkeypatch):
    """More tokens than one chunk of the Gram accumulation, a real spread of unit scales: the refit
    (normal equations, not the SVD: ``lstsq`` is made to fail) equals ``numpy.linalg.lstsq`` with
    an intercept column (two-layer MLP) or without (gated MLP without biases) to 1e-6 relative."""
    rng = np.random.default_rng(7)
    m, H, n, k, N = 8, 40, 5, 30, 5000
    X = rng.normal(size=(N, m)) + 0.3
    if gated:
        Kg, Ku, Kd = rng.normal(size=(m, H)), rng.normal(size=(m, H)) * rng.uniform(0.1, 3, H), rng.normal(size=(H, n))
        hidden = (X @ Kg) / (1 + np.exp(-(X @ Kg))) * (X @ Ku)
        Y = hidden @ Kd + 0.1 * rng.normal(size=(N, n))
    else:
        K1, b1, K2, b2 = random_mlp(m=m, H=H, n=n, seed=8)
        K1 *= rng.uniform(0.1, 3, H)
        hidden = NP_ACT["gelu"](X @ K1 + b1)
        Y = hidden @ K2 + b2 + 0.1 * rng.normal(size=(N, n))
    as_j = lambda *a: [None if x is None else jnp.asarray(x) for x in a]  # noqa: E731
    first = (baselines.prune_gated_weights(*as_j(Kg, None, Ku, None, Kd, None), "silu", k, jnp.asarray(X), jnp.asarray(Y))
             if gated else baselines.prune_weights(*as_j(K1, b1, K2, b2), "gelu", k, jnp.asarray(X), jnp.asarray(Y)))
    design = hidden[:, first.kept] if gated else np.c_[hidden[:, first.kept], np.ones(N)]
    coef, *_ = np.linalg.lstsq(design, Y, rcond=None)

    def refused(*args, **kwargs):
        raise AssertionError("the well-conditioned refit took the SVD path")

    monkeypatch.setattr(np.linalg, "lstsq", refused)
    res = (baselines.prune_gated_weights(*as_j(Kg, None, Ku, None, Kd, None), "silu", k, jnp.asarray(X), jnp.asarray(Y))
           if gated else baselines.prune_weights(*as_j(K1, b1, K2, b2), "gelu", k, jnp.asarray(X), jnp.asarray(Y)))
    W = res.Kd if gated else res.K2
    scale = np.abs(coef).max()
    assert np.abs(W - coef[:k]).max() <= 1e-6 * scale
    if not gated:
        assert np.abs(res.b2 - coef[-1]).max() <= 1e-6 * scale


def test_a_rank_deficient_refit_is_the_minimum_norm_least_squares():
    """Two kept units equal on every token (a duplicated unit): the normal equations are singular,
    and the refit is ``lstsq``'s minimum-norm solution, which splits the weight between the two."""
    K1, b1, K2, b2 = random_mlp(m=6, H=10, n=3, seed=5)
    K1[:, 1], b1[1] = K1[:, 0], b1[0]
    rng = np.random.default_rng(6)
    X = rng.normal(size=(300, 6))
    Y = np_mlp(K1, b1, K2, b2, "gelu", X)
    res = baselines.prune_weights(jnp.asarray(K1), jnp.asarray(b1), jnp.asarray(K2), jnp.asarray(b2), "gelu", 10,
                                  jnp.asarray(X), jnp.asarray(Y))
    hidden = NP_ACT["gelu"](X @ K1 + b1)
    centred = hidden - hidden.mean(axis=0)
    coef, *_ = np.linalg.lstsq(centred, Y - Y.mean(axis=0), rcond=None)
    np.testing.assert_allclose(res.K2, coef, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(res.K2[0], res.K2[1], rtol=1e-8)


def test_the_pruned_module_keeps_the_dtype_of_the_weights():
    K1, b1, K2, b2 = random_mlp(seed=5, dtype=np.float32)
    X = np.random.default_rng(6).normal(size=(64, 5)).astype(np.float32)
    module, res = baselines.prune_mlp(*(jnp.asarray(a) for a in (K1, b1, K2, b2)), "relu", 6, jnp.asarray(X))
    leaves = jax.tree.leaves(nnx.state(module, nnx.Param))
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.float32)}
    assert res.K2.dtype == np.float32 and module.rank == module.hidden == 6


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(k=0), "k must"),
        (dict(k=13), "k must"),
        (dict(k=2.0), "k must"),
        (dict(X=np.zeros((40, 4))), "X must have shape"),
        (dict(X=np.zeros((5, 5)), k=5), "at least 6 tokens"),
        (dict(X=np.full((40, 5), np.nan)), "X must be finite"),
        (dict(Y=np.zeros((40, 3))), "Y must have shape"),
        (dict(Y=np.full((40, 4), np.inf)), "finite"),
        (dict(b1=np.zeros(11)), "b1"),
    ],
)
def test_bad_inputs_raise_value_error(change, match):
    K1, b1, K2, b2 = random_mlp()
    args = dict(K1=K1, b1=b1, K2=K2, b2=b2, activation="gelu", k=4,
                X=np.random.default_rng(0).normal(size=(40, 5)), Y=None)
    args.update(change)
    args = {a: jnp.asarray(v) if isinstance(v, np.ndarray) else v for a, v in args.items()}
    with pytest.raises(ValueError, match=match):
        baselines.prune_weights(**args)


# ----------------------------------------------------------------------------- compress_model


class FFN(nnx.Module):  # the README's "Compress your own NNX model" example
    def __init__(self, d, h, rngs):
        self.up, self.down = nnx.Linear(d, h, rngs=rngs), nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x), approximate=False))


class Net(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Linear(6, 16, rngs=rngs)
        self.layers = nnx.List([FFN(16, 64, rngs) for _ in range(3)])
        self.head = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        x = self.embed(x)
        for ffn in self.layers:
            x = x + ffn(x)
        return self.head(x.mean(axis=-2))


PATHS = ["layers.0", "layers.1", "layers.2"]
SPEC = jb.MLPSpec(fc1="up", fc2="down", activation="gelu")


@pytest.mark.slow  # the README example runs in tests/test_specs.py; prune's budget in test_engine.py, its round trip in
# test_gated_compress.py (default run)
def test_readme_example_with_prune_meets_the_budget_and_round_trips(tmp_path):
    reduction = 0.3
    model = Net(nnx.Rngs(0))
    P = count_params(model)
    x_calib = jax.random.normal(jax.random.key(1), (32, 8, 6))
    model, report = jb.compress_model(model, x_calib, mlps=PATHS, reduction=reduction, method="prune",
                                      mlp_specs=SPEC, key=jax.random.key(0))
    assert report.method == "prune" and count_params(model) == report.params_after <= (1 - reduction) * P
    budget = math.floor((1 - reduction) * P) - (P - 3 * count_params(FFN(16, 64, nnx.Rngs(0))))
    ks = [r.rank for r in report.mlps]
    assert len(set(ks)) == 1  # three MLPs of one shape: the uniform allocation keeps k units each
    k = ks[0]
    assert 3 * (k * 17 + 16 * (k + 1)) <= budget < 3 * ((k + 1) * 17 + 16 * (k + 2))  # the largest k that fits
    for r in report.mlps:
        new = model.layers[int(r.path.split(".")[1])]
        assert isinstance(new, baselines.PrunedMLP) and new.hidden == k
        assert r.params_after == count_params(new) == k * 17 + 16 * (k + 1)
        assert r.kept is not None and len(r.kept) == k and list(r.kept) == sorted(set(r.kept))
        assert 0 <= r.output_error < 1 and np.isfinite(r.error_J) and r.jacobian == "structured"
        assert r.fit_tokens == "check"  # 256 tokens, all of them check tokens: the error is in-sample
    logits = nnx.jit(lambda m, x: m(x))(model, x_calib)
    jb.save_compressed(tmp_path / "ckpt", model)
    restored = jb.load_compressed(tmp_path / "ckpt", Net(nnx.Rngs(7)))
    np.testing.assert_array_equal(np.asarray(nnx.jit(lambda m, x: m(x))(restored, x_calib)), np.asarray(logits))
    assert count_params(restored) == count_params(model)


def test_prune_keeps_the_output_error_below_dropping_units_without_refit():
    """The refit is a least-squares optimum over the kept units' output weights, so on the
    tokens it was fitted on it cannot do worse than keeping the original weights."""
    model = Net(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (32, 8, 6))
    ffn = model.layers[0]
    X = np.asarray(model.embed(x).reshape(-1, 16), np.float64)  # the inputs of layers.0
    K1, b1, K2, b2 = (np.asarray(a, np.float64) for a in (ffn.up.kernel[...], ffn.up.bias[...],
                                                           ffn.down.kernel[...], ffn.down.bias[...]))
    res = baselines.prune_weights(*(jnp.asarray(a) for a in (K1, b1, K2, b2)), "gelu", 20, jnp.asarray(X))
    Y = np_mlp(K1, b1, K2, b2, "gelu", X)
    hid = NP_ACT["gelu"](X @ K1 + b1)[:, res.kept]
    refit = np.linalg.norm(hid @ res.K2 + res.b2 - Y)
    no_refit = np.linalg.norm(hid @ K2[res.kept] + b2 - Y)
    assert refit < no_refit


@pytest.fixture(scope="module")
def big_site():
    """An MLP site with 8292 calibration tokens, built once for both cases below."""
    ffn = FFN(16, 64, nnx.Rngs(3))
    X_all = jax.random.normal(jax.random.key(4), (8292, 16), jnp.float64)
    site = make_site("ffn", ffn, SPEC, X_all, ffn(X_all), None, jax.random.key(5))
    assert site.check_X.shape[0] == 8192 and site.fit_X.shape[0] == 100

    def rows(A):
        return {tuple(r) for r in np.asarray(A).tolist()}

    assert not rows(site.fit_X) & rows(site.check_X) and len(rows(site.fit_X) | rows(site.check_X)) == 8292
    return ffn, site


@pytest.mark.parametrize("k, fit", [(20, "held-out"), (30, "check")])
def test_prune_refits_on_calibration_tokens_outside_the_check_set(k, fit, big_site):
    """With more calibration tokens than the 8192 check tokens, pruning refits on the others
    (when there are >= 4 (k + 1) of them), so its reported output error is held out."""
    ffn, site = big_site
    built = Prune().build(site, k, jax.random.key(0))
    module = built.module
    assert built.pruning.fit_tokens == fit
    X, Y = (site.fit_X, site.fit_Y) if fit == "held-out" else (site.check_X, site.check_Y)
    X, Y = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    K1, b1, K2 = (np.asarray(a, np.float64) for a in (ffn.up.kernel[...], ffn.up.bias[...], ffn.down.kernel[...]))
    hidden = NP_ACT["gelu"](X @ K1 + b1)
    kept = np.sort(np.argsort(-np.linalg.norm(K2, axis=1) * np.sqrt(np.mean(hidden ** 2, axis=0)))[:k])
    assert list(built.pruning.kept) == kept.tolist()
    coef, *_ = np.linalg.lstsq(np.c_[hidden[:, kept], np.ones(len(X))], Y, rcond=None)
    np.testing.assert_allclose(np.asarray(module.fc2.kernel[...]), coef[:-1], rtol=2e-4, atol=2e-5)  # float32 module
    Xc, Yc = np.asarray(site.check_X, np.float64), np.asarray(site.check_Y, np.float64)
    pred = NP_ACT["gelu"](Xc @ K1[:, kept] + b1[kept]) @ coef[:-1] + coef[-1]
    assert built.output_error == pytest.approx(np.sum((Yc - pred) ** 2) / np.sum(Yc ** 2), rel=1e-3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(reduction=None, ranks={"layers.0": 65, "layers.1": 2, "layers.2": 2}), "ranks"),  # > H
        (dict(mlp_specs="up"), "mlp_specs"),  # not a spec (with none, the spec is found)
        (dict(reduction=0.999), "reduction"),
    ],
)
def test_prune_bad_arguments_raise(kwargs, match):
    args = dict(mlps=PATHS, reduction=0.3, method="prune", mlp_specs=SPEC, key=jax.random.key(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        jb.compress_model(Net(nnx.Rngs(0)), jax.random.normal(jax.random.key(1), (32, 8, 6)), **args)


def test_prune_with_fewer_tokens_than_coefficients_refits_towards_the_original_weights():
    """8 calibration tokens and 21 coefficients per output: the plain refit is not determined.
    Pruning then refits with a pull towards the original output weights (numpy's solve of
    ``min ‖H_k W + 1 bᵀ − Y‖² + λ ‖W − K2[kept]‖²``, ``λ = 0.01 ‖H_k − mean‖² / k``) and says so in
    the report; a warm start, which must not be regularized, still needs the tokens (``calibration``)."""
    model, x, k = Net(nnx.Rngs(0)), jax.random.normal(jax.random.key(1), (2, 4, 6)), 20
    h = model.embed(x)
    for ffn in model.layers[:2]:
        h = h + ffn(h)
    X = np.asarray(h.reshape(-1, 16), np.float64)  # the inputs of layers.2 (replaced first, back to front)
    ffn = model.layers[2]
    K1, b1, K2, b2 = (np.asarray(a, np.float64) for a in (ffn.up.kernel[...], ffn.up.bias[...],
                                                           ffn.down.kernel[...], ffn.down.bias[...]))
    # refine=None: refinement would set a fifth of the 8 tokens apart (its held-out error) before the refit
    model, report = jb.compress_model(model, x, mlps=PATHS, ranks={p: k for p in PATHS}, method="prune",
                                      mlp_specs=SPEC, key=jax.random.key(0), refine=None)
    rep = {r.path: r for r in report.mlps}["layers.2"]
    assert "regularized" in rep.notes and "8 calibration tokens < 21 coefficients" in rep.notes
    hidden = NP_ACT["gelu"](X @ K1 + b1)
    kept = np.sort(np.argsort(-np.linalg.norm(K2, axis=1) * np.sqrt(np.mean(hidden ** 2, axis=0)))[:k])
    assert list(rep.kept) == kept.tolist()
    Y = hidden @ K2 + b2
    Hc, Yc = hidden[:, kept] - hidden[:, kept].mean(0), Y - Y.mean(0)
    lam = 1e-2 * np.sum(Hc ** 2) / k
    W = np.linalg.solve(Hc.T @ Hc + lam * np.eye(k), Hc.T @ Yc + lam * K2[kept])
    new = model.layers[2]
    np.testing.assert_allclose(np.asarray(new.fc2.kernel[...]), W, rtol=2e-4, atol=2e-5)  # float32 module
    np.testing.assert_allclose(np.asarray(new.fc2.bias[...]), Y.mean(0) - hidden[:, kept].mean(0) @ W,
                               rtol=2e-4, atol=2e-5)
    with pytest.raises(ValueError, match="calibration"):
        jb.compress_model(Net(nnx.Rngs(0)), x, mlps=PATHS, ranks={p: k + 1 for p in PATHS}, method=jb.get_method("bsd", warm_start=True, contain=False), mlp_specs=SPEC, key=jax.random.key(0))


# ----------------------------------------------------------------------------- compress (jaxbsd models)


def tiny_dataset(n_train=96, n_test=48, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n_train + n_test).astype(np.int32)
    images = rng.normal(size=(n_train + n_test, 8, 8, 1)).astype(np.float32)
    return Dataset("toy", images[:n_train], labels[:n_train], images[n_train:], labels[n_train:], 10)


def tiny_vit(seed=0):
    return build_model("vit", ViTConfig(image_size=8, channels=1, patch_size=4, dim=8, depth=3, num_heads=2,
                                        mlp_dim=16), seed=seed)


@pytest.mark.slow  # two compress() runs with checkpointed state: minutes on the shared CPU
def test_compress_with_prune_meets_the_budget_and_resumes(tmp_path):
    ds = tiny_dataset()
    config = compress.CompressionConfig(method="prune", reduction=0.25, num_samples=16, capture_images=16,
                                        finetune_epochs=0)
    model = tiny_vit()
    P = count_params(model)
    steps = compress.compress(model, ds, order="bf", config=config, state_dir=tmp_path / "s", progress=False)
    assert count_params(model) == steps[-1]["params_model"] <= 0.75 * P
    assert all(isinstance(b.mlp, baselines.PrunedMLP) for b in model.blocks)
    for s in steps:
        assert s["params_mlp_new"] == baselines.pruned_mlp_params(8, s["rank"], 8) and len(s["kept"]) == s["rank"]
    # a finished run resumes from its state: the placeholders take the stored weights
    again = tiny_vit()
    steps2 = compress.compress(again, ds, order="bf", config=config, state_dir=tmp_path / "s", progress=False)
    assert [s["rank"] for s in steps2] == [s["rank"] for s in steps]
    images = jnp.asarray(ds.test_images[:8])
    np.testing.assert_array_equal(np.asarray(again(images)), np.asarray(model(images)))


def test_the_cli_offers_every_method():
    from jaxbsd.cli import build_parser

    for method in compress.METHODS:
        assert build_parser().parse_args(["compress", "--method", method, "--reduction", "0.3"]).method == method
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compress", "--method", "pruning"])
