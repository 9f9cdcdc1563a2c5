"""Warm starts from a pruned MLP, restart selection by output error, and ``method="auto"``.

Oracles: scipy's B-spline design matrix with numpy least squares (the basis's approximation of
the activation, measured apart from jaxbsd), numpy least squares for the projected output bias,
the pruned MLP's own outputs, numpy's importance ranking and refit, per-restart output errors
evaluated with scipy splines, and two planted modules: one whose hidden units are zero except
``k`` (pruning is exact, a decoupling is not) and one that is an exact rank-2 cubic decoupling
(a decoupling is exact, two pruned units are not).
"""

import dataclasses
import math
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.interpolate import BSpline as ScipyBSpline
from scipy.special import erf

import importlib

import jaxbsd as jb
from flat_options import call_with
from jaxbsd.compression import baselines
from jaxbsd.solver import cmtf
from jaxbsd.compression import blockwise as compress
from jaxbsd.compression.methods import BSD, Auto, Built, Prune, warm_init
from jaxbsd.compression.sites import make_site, selection_tokens, site_jacobian
from jaxbsd.models import count_params
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.compression.methods.warm_start import choose_restart, decoupled_from_pruned

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_first_iterate_of_the_warm_start_is_the_pruned_mlp_up_to_the_spline_fit[4-3-1-tanh]",
    "test_first_iterate_of_the_warm_start_is_the_pruned_mlp_up_to_the_spline_fit[4-3-1-gelu]",
    "test_first_iterate_of_the_warm_start_is_the_pruned_mlp_up_to_the_spline_fit[2-3-0-gelu]",
    "test_first_iterate_of_the_warm_start_is_the_pruned_mlp_up_to_the_spline_fit[2-3-1-gelu]",
}


bsd_module = importlib.import_module("jaxbsd.compression.methods.bsd")  # where BSD.build calls decouple

NP_ACT = {"gelu": lambda z: 0.5 * z * (1 + erf(z / math.sqrt(2))), "tanh": np.tanh}


def random_pruned(m=5, k=4, n=3, act="gelu", seed=0):
    rng = np.random.default_rng(seed)
    K1, b1 = rng.normal(size=(m, k)), rng.normal(size=k) * 0.5
    K2, b2 = rng.normal(size=(k, n)), rng.normal(size=n) + 1.0  # a bias outside range(K2ᵀ) when k < n
    return baselines.PrunedMLP(*(jnp.asarray(a) for a in (K1, b1, K2, b2)), act), (K1, b1, K2, b2)


def spline_residual(u, knots, target, degree=3):
    """numpy least squares of scipy's B-spline design matrix at ``u``: the residual target − fit."""
    B = ScipyBSpline.design_matrix(u, knots, degree, extrapolate=True).toarray()
    coef, *_ = np.linalg.lstsq(B, target, rcond=None)
    return target - B @ coef



@pytest.mark.parametrize("act", ["gelu", "tanh"])
@pytest.mark.parametrize("k, n, extra", [(4, 3, 1), (2, 3, 0), (2, 3, 1)])
def test_first_iterate_of_the_warm_start_is_the_pruned_mlp_up_to_the_spline_fit(act, k, n, extra):
    """With the robust normalization, the warm state's model on the samples (R W1ᵀ after
    ``_normalize``) equals the pruned MLP's outputs plus exactly the basis's least-squares error
    of each g_i (scipy + numpy), plus, at rank k, the part of b2 outside range(K2ᵀ) (numpy)."""
    m, S = 5, 80
    pruned, (K1, b1, K2, b2) = random_pruned(m=m, k=k, n=n, act=act)
    basis = jb.BSpline(3, 6)
    X = np.random.default_rng(1).normal(size=(S, m))
    model = decoupled_from_pruned(pruned, jnp.asarray(X), basis, rank=k + extra)
    assert model.rank == k + extra
    Y = np.asarray(pruned(jnp.asarray(X)))
    np.testing.assert_allclose(Y, NP_ACT[act](X @ K1 + b1) @ K2 + b2, rtol=1e-6, atol=1e-9)  # the oracle itself

    expected = Y.copy()
    U = X @ np.asarray(model.W0).T
    for i in range(k):
        target = NP_ACT[act](U[:, i] + b1[i])
        if extra == 0:
            target = target + np.linalg.lstsq(K2.T, b2, rcond=None)[0][i]
        expected -= np.outer(spline_residual(U[:, i], np.asarray(model.knots[i]), target), K2[i])
    if extra == 0:  # the bias that range(K2ᵀ) cannot carry is lost
        c = np.linalg.lstsq(K2.T, b2, rcond=None)[0]
        expected += K2.T @ c - b2
        assert np.linalg.norm(K2.T @ c - b2) > 1e-3  # k < n: a real loss, so the test can tell
    else:  # the constant unit carries b2 exactly (a cubic spline holds constants)
        np.testing.assert_allclose(np.asarray(model.W1[:, k]), b2, rtol=1e-12)
    spline_error = np.linalg.norm(expected - Y)

    J, F = jb.solver.sample(pruned, jnp.asarray(X))
    config = jb.CMTFConfig(rank=k + extra, basis=basis, robust=True)
    state = cmtf._normalize(cmtf.warm_state(jb.solver.problem(J, F, jnp.asarray(X)), config, model), config.eps)
    np.testing.assert_allclose(np.linalg.norm(state.W0, axis=1), 1.0, rtol=1e-12)  # normalized
    described = np.asarray(state.R @ state.W1.T)
    np.testing.assert_allclose(described, expected, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(X))), expected, rtol=1e-8, atol=1e-9)
    assert spline_error > 1e-6  # GELU/tanh are no cubic: the approximation error is there and measured
    assert np.linalg.norm(described - Y) / np.linalg.norm(Y) < 0.2


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(rank=7), "rank"), (dict(X=np.zeros((80, 4))), "X"), (dict(X=np.zeros((3, 5))), "X"),
     (dict(pruned="mlp"), "pruned")],
)
def test_decoupled_from_pruned_rejects_bad_arguments(kwargs, match):
    pruned, _ = random_pruned()
    args = dict(pruned=pruned, X=np.random.default_rng(0).normal(size=(80, 5)), basis=jb.BSpline(3, 6))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        decoupled_from_pruned(args.pop("pruned"), jnp.asarray(args.pop("X")), args.pop("basis"), **args)


# ----------------------------------------------------------------------------- compress_model


class FFN(nnx.Module):
    def __init__(self, d, h, rngs, activation=lambda z: jax.nn.gelu(z, approximate=False)):
        self.up = nnx.Linear(d, h, rngs=rngs, param_dtype=jnp.float64)
        self.down = nnx.Linear(h, d, rngs=rngs, param_dtype=jnp.float64)
        self.activation = activation

    def __call__(self, x):
        return self.down(self.activation(self.up(x)))


class Net(nnx.Module):
    def __init__(self, rngs, d=6, h=16, **kw):
        self.layers = nnx.List([FFN(d, h, rngs, **kw) for _ in range(2)])

    def __call__(self, x):
        for ffn in self.layers:
            x = x + ffn(x)
        return x


PATHS = ["layers.0", "layers.1"]
SPEC = jb.MLPSpec(fc1="up", fc2="down", activation="gelu")
CONFIG = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=8)


def calib(seed=1, batch=12, tokens=8, d=6):
    return jax.random.normal(jax.random.key(seed), (batch, tokens, d), jnp.float64)


@pytest.mark.slow  # solves on the shared CPU: 40-60 s
def test_warm_start_passes_the_pruned_mlp_as_init(monkeypatch):
    """compress_model(method="bsd", warm_start=True) hands decouple the pruned MLP at rank − 1
    units plus the bias unit: its kept rows are numpy's top units by ‖V1[:, j]‖·RMS(h_j) and
    its output weights numpy's refit with an intercept (on the check tokens: all of them here)."""
    seen = []
    real = bsd_module.decouple

    def spy(*args, **kwargs):
        seen.append(kwargs.get("init"))
        return real(*args, **kwargs)

    monkeypatch.setattr(bsd_module, "decouple", spy)
    model, x, r = Net(nnx.Rngs(0)), calib(), 5
    X0 = np.asarray(x.reshape(-1, 6))  # the inputs of layers.0 (the last replaced, back to front)
    ffn = model.layers[0]
    K1, b1, K2, b2 = (np.asarray(a) for a in (ffn.up.kernel[...], ffn.up.bias[...], ffn.down.kernel[...],
                                              ffn.down.bias[...]))
    # refine=None: refinement would set its held-out tokens apart before the build, off the check tokens
    _, report = jb.compress_model(model, x, mlps=PATHS, ranks={p: r for p in PATHS}, mlp_specs=SPEC, key=jax.random.key(0), method=jb.get_method("bsd", contain=False, config=CONFIG, restarts=2, warm_start=True), refine=None)
    init = seen[-1]
    assert isinstance(init, jb.Decoupled) and init.rank == r
    hidden = NP_ACT["gelu"](X0 @ K1 + b1)
    kept = np.sort(np.argsort(-np.linalg.norm(K2, axis=1) * np.sqrt(np.mean(hidden ** 2, axis=0)))[: r - 1])
    np.testing.assert_allclose(np.asarray(init.W0[: r - 1]), K1[:, kept].T, rtol=1e-12)
    coef, *_ = np.linalg.lstsq(np.c_[hidden[:, kept], np.ones(len(X0))], hidden @ K2 + b2, rcond=None)
    np.testing.assert_allclose(np.asarray(init.W1[:, : r - 1]), coef[:-1].T, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(np.asarray(init.W1[:, r - 1]), coef[-1], rtol=1e-7, atol=1e-9)
    for rep in report.mlps:
        assert rep.restart_by_objective in (0, 1, 2) and rep.restart_warm == (rep.restart == 2)
        assert len(rep.auto or ()) == 0 and rep.selection == "output"  # the default


@pytest.mark.slow  # solves on the shared CPU: 40-60 s
def test_without_a_warm_start_compress_model_is_what_it_was(monkeypatch):
    """warm_start=False, selection="objective" (the defaults before issue 24): no init reaches
    the solver, and each MLP's replacement is the best-objective model of jb.decouple on the
    same samples and keys (the old code path)."""
    seen = []
    real = bsd_module.decouple

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(bsd_module, "decouple", spy)
    model = Net(nnx.Rngs(0))
    _, report = jb.compress_model(model, calib(), mlps=PATHS, ranks={p: 3 for p in PATHS}, mlp_specs=SPEC, key=jax.random.key(0), method=jb.get_method("bsd", contain=False, config=CONFIG, restarts=3, warm_start=False, selection="objective"), refine=None)  # the replacement as the solver built it
    assert all(kw.get("init") is None for _, kw in seen) and len(seen) == 2
    for (args, kwargs), rep in zip(seen, report.mlps):
        res = real(*args, **{**kwargs, "init": None})
        new = model.layers[int(rep.path[-1])]
        want = DecoupledMLP.from_decoupled(res.model)
        for name in ("W0", "W1", "coef", "knots"):
            np.testing.assert_array_equal(np.asarray(getattr(new, name)[...]), np.asarray(getattr(want, name)[...]))
        assert rep.error_J == float(res.error_J) and rep.error_F == float(res.error_F)
        assert rep.restart == rep.restart_by_objective == int(res.best_restart)
        assert rep.restart_warm is False and rep.selection == "objective" and rep.method == "bsd"


@pytest.mark.slow  # prunes and warm-started solves for every block of a model: 10-12 s
def test_by_default_bsd_warm_starts_every_prunable_mlp_and_says_why_not_elsewhere(monkeypatch):
    """compress_model(method="bsd") with no warm_start/selection: an MLP with a spec gets the
    pruned-MLP init (one restart more, kept by held-out output error); a module that cannot be
    pruned (no nnx.Linear children: dense Jacobian, no spec) runs its random restarts alone and
    the report gives the reason."""
    seen = {}
    real = bsd_module.decouple

    def spy(*args, **kwargs):
        seen[len(seen)] = kwargs.get("init")
        return real(*args, **kwargs)

    class Opaque(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.eye(6, dtype=jnp.float64) * 0.5)

        def __call__(self, x):
            return jnp.tanh(x @ self.w[...])

    monkeypatch.setattr(bsd_module, "decouple", spy)
    model = Net(nnx.Rngs(0))
    model.layers[0] = Opaque()
    _, report = jb.compress_model(model, calib(), mlps=PATHS, ranks={p: 3 for p in PATHS}, mlp_specs={"layers.1": SPEC}, key=jax.random.key(0), method=jb.get_method("bsd", contain=False, config=CONFIG, restarts=2))
    by_path = {r.path: r for r in report.mlps}
    assert [r.path for r in report.mlps] == ["layers.1", "layers.0"] and all(r.selection == "output" for r in report.mlps)
    assert isinstance(seen[0], jb.Decoupled) and seen[0].rank == 3 and by_path["layers.1"].warm_start_skipped is None
    assert by_path["layers.1"].restart in (0, 1, 2) and by_path["layers.1"].restart_warm == (by_path["layers.1"].restart == 2)
    assert seen[1] is None and by_path["layers.0"].restart in (0, 1) and by_path["layers.0"].restart_warm is False
    assert "MLPSpec" in by_path["layers.0"].warm_start_skipped


@pytest.mark.slow  # solves on the shared CPU: 40-60 s
def test_selection_by_output_picks_the_restart_with_the_lowest_held_out_error():
    """On a site with held-out tokens (more than the 8192 check tokens), selection="output"
    keeps the restart whose model has the lowest relative error on fit_X (each restart's model
    evaluated with scipy splines), "objective" the lowest training objective; both reported."""
    ffn = FFN(4, 10, nnx.Rngs(3))
    X_all = jax.random.normal(jax.random.key(4), (8292, 4), jnp.float64)
    site = make_site("ffn", ffn, jb.MLPSpec("up", "down", "gelu"), X_all, ffn(X_all), 60, jax.random.key(5))
    assert site.fit_X.shape[0] == 100 and selection_tokens(site)[2] == "held-out"
    config = jb.CMTFConfig(rank=2, basis=jb.BSpline(3, 4), max_iter=4)
    infos = {}
    for selection in ("objective", "output"):
        infos[selection] = BSD(config=config, restarts=4, warm_start=True,
                               selection=selection).build(site, 2, jax.random.key(7)).report()
    res = jb.decouple(*site_jacobian(site)[:1], site.F, site.X, config, key=jax.random.key(7), restarts=4,
                      init=warm_init(site, 2, config)[0])
    Xf, Yf = np.asarray(site.fit_X), np.asarray(site.fit_Y)
    errors = []
    for i in range(5):
        mdl = res.restart_model(i)
        U = Xf @ np.asarray(mdl.W0).T
        G = np.stack([ScipyBSpline(np.asarray(mdl.knots[j]), np.asarray(mdl.coef[j]), 3, extrapolate=True)(U[:, j])
                      for j in range(2)], axis=1)
        errors.append(np.sum((Yf - G @ np.asarray(mdl.W1).T) ** 2) / np.sum(Yf ** 2))
    errors = np.asarray(errors)
    np.testing.assert_allclose(infos["output"]["restart_output_errors"], errors, rtol=1e-8)
    assert infos["output"]["restart"] == int(np.argmin(errors)) == infos["objective"]["restart_by_output"]
    objective = np.asarray(res.restarts.objective)
    assert infos["objective"]["restart"] == int(np.argmin(objective)) == infos["output"]["restart_by_objective"]
    assert infos["output"]["output_error_heldout"] == pytest.approx(errors.min(), rel=1e-8)
    assert infos["output"]["restart_warm"] == (infos["output"]["restart"] == 4)


def test_choose_restart_never_picks_a_non_finite_restart():
    class Fake:
        best_restart = 1

    assert choose_restart(Fake(), "output", np.array([np.inf, 0.5, 0.2])) == 2
    assert choose_restart(Fake(), "output", np.array([np.inf, np.inf])) == 1
    assert choose_restart(Fake(), "objective", np.array([0.0, 0.5])) == 1
    with pytest.raises(ValueError, match="selection"):
        choose_restart(Fake(), "best", np.array([0.0]))


# ----------------------------------------------------------------------------- method="auto"


@pytest.mark.slow  # solves on the shared CPU: 40-60 s
def test_auto_keeps_the_pruned_mlp_when_only_k_units_are_alive():
    """Hidden units zero except k = 3 (zero fc1 columns and biases: GELU(0) = 0): the pruned MLP
    with >= 3 units is exact, a cubic spline decoupling of GELU is not, so auto keeps prune."""
    model = Net(nnx.Rngs(0))
    for ffn in model.layers:
        ffn.up.kernel[...] = ffn.up.kernel[...].at[:, 3:].set(0.0)
        ffn.up.bias[...] = ffn.up.bias[...].at[3:].set(0.0)
    x = calib()
    ref = np.asarray(model(x))
    model, report = jb.compress_model(model, x, mlps=PATHS, ranks={p: 3 for p in PATHS}, method=jb.get_method("auto", contain=False, config=CONFIG, restarts=2), mlp_specs=SPEC, key=jax.random.key(0))
    assert report.method == "auto"
    for rep in report.mlps:
        assert rep.method == "prune" and rep.auto["kept"] == "prune"
        assert rep.auto["prune"]["rank"] >= 3 and rep.auto["prune"]["params"] <= rep.auto["bsd"]["params"]
        assert rep.auto["prune"]["output_error"] < 1e-16 < 1e-6 < rep.auto["bsd"]["output_error"]
        assert "prune" in rep.auto["reason"] and isinstance(model.layers[int(rep.path[-1])], baselines.PrunedMLP)
    np.testing.assert_allclose(np.asarray(model(x)), ref, rtol=1e-9, atol=1e-9)  # exact, end to end


@pytest.mark.slow  # solves on the shared CPU: ~40 s
def test_auto_judged_by_the_model_records_the_end_to_end_error_of_what_it_kept():
    """``auto_judge="model"`` (the default): each candidate's recorded ``model_output_error`` is
    the model's relative squared output error on the calibration batch with it in place; so the one
    kept at the last step gives the compressed model's error, recomputed here from its outputs."""
    model = Net(nnx.Rngs(0))
    x = calib()
    ref = np.asarray(model(x))
    model, report = jb.compress_model(model, x, mlps=PATHS, reduction=0.3, method=jb.get_method("auto", contain=False, config=CONFIG), mlp_specs=SPEC, key=jax.random.key(0))
    for rep in report.mlps:
        errs = rep.auto["bsd"]["model_output_error"], rep.auto["prune"]["model_output_error"]
        assert rep.auto["judge"] == "model" and "model output error" in rep.auto["reason"]
        assert rep.method == ("bsd" if errs[0] < errs[1] else "prune")
    last = report.mlps[-1]
    end_to_end = np.sum((np.asarray(model(x)) - ref) ** 2) / np.sum(ref ** 2)
    np.testing.assert_allclose(last.auto[last.method]["model_output_error"], end_to_end, rtol=1e-9)


def test_auto_keeps_the_candidate_its_judge_prefers_over_the_block_error(monkeypatch):
    """The decision rule of ``Auto.build``: with a ``judge`` its scores decide (here against the
    block error, which prefers pruning), a non-finite decoupling score loses, and without a judge
    the block error decides. The candidates are stand-ins, so no solve runs."""
    bsd, pruned = nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Linear(2, 3, rngs=nnx.Rngs(0))

    stand_in = lambda module, error: Built(module, error_J=None, error_F=None, jacobian="dense",  # noqa: E731
                                           output_error=error, seconds=0.0)
    monkeypatch.setattr(BSD, "build", lambda self, site, rank, key, **kw: stand_in(bsd, 0.5))
    monkeypatch.setattr(Prune, "build", lambda self, site, rank, key, **kw: stand_in(pruned, 0.1))
    config = jb.CMTFConfig(rank=2, basis=jb.BSpline(3, 4), max_iter=5)
    auto = Auto(bsd=BSD(config=config))
    by_block = auto.build(None, (2, 3), jax.random.key(1)).report()
    assert by_block["auto"]["kept"] == by_block["method"] == "prune" and by_block["auto"]["judge"] == "block"
    judged = auto.build(None, (2, 3), jax.random.key(1), judge=lambda m: 0.0 if m is bsd else 1.0).report()
    assert judged["auto"]["kept"] == judged["method"] == "bsd" and judged["auto"]["judge"] == "model"
    assert (judged["auto"]["bsd"]["model_output_error"], judged["auto"]["prune"]["model_output_error"]) == (0.0, 1.0)
    assert judged["auto"]["bsd"]["params"] == 6 and judged["auto"]["prune"]["params"] == 9
    for nan_bsd, nan_prune, kept in [(True, False, "prune"), (False, True, "bsd"), (True, True, "prune")]:
        scores = {id(bsd): float("nan") if nan_bsd else 2.0, id(pruned): float("nan") if nan_prune else 1.0}
        info = auto.build(None, (2, 3), jax.random.key(1), judge=lambda m: scores[id(m)]).report()
        assert info["auto"]["kept"] == kept, (nan_bsd, nan_prune)


@pytest.mark.slow  # solves on the shared CPU: 40-60 s
def test_auto_keeps_the_decoupling_when_the_block_is_an_exact_rank_2_decoupling():
    """A cubic-activation MLP whose 8 units share 2 input directions (and, per direction, one
    output vector) is an exact rank-2 cubic decoupling; at the same parameters (2 units) pruning cannot represent it, so auto keeps bsd."""
    cube = lambda z: z ** 3  # noqa: E731
    ffn = FFN(6, 8, nnx.Rngs(2), activation=cube)
    rng = np.random.default_rng(0)
    d = rng.normal(size=(6, 2)) / math.sqrt(6)
    ffn.up.kernel[...] = jnp.asarray(np.repeat(d, 4, axis=1) * rng.uniform(0.5, 1.5, size=8))
    ffn.up.bias[...] = jnp.asarray(rng.normal(size=8))
    # The units of one direction share their output vector: the block is v_1 c_1(u_1) + v_2 c_2(u_2)
    # with cubics c_d (sums of 4 shifted cubes), rank 2; two kept units (a u + b)³ cannot make c_d.
    ffn.down.kernel[...] = jnp.asarray(np.repeat(rng.normal(size=(2, 6)), 4, axis=0))
    ffn.down.bias[...] = jnp.zeros(6)

    class One(nnx.Module):
        def __init__(self):
            self.ffn = ffn

        def __call__(self, x):
            return self.ffn(x)

    model, x = One(), calib(batch=16)
    spec = jb.MLPSpec("up", "down", cube)
    config = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=300, tol=1e-14)
    model, report = jb.compress_model(model, x, mlps=["ffn"], ranks={"ffn": 2}, method=jb.get_method("auto", config=config, restarts=4), mlp_specs=spec, key=jax.random.key(0))
    rep = report.mlps[0]
    site = make_site("ffn", ffn, spec, x.reshape(-1, 6), ffn(x.reshape(-1, 6)), None, jax.random.key(0))
    assert Auto(bsd=BSD(config)).check_rank(site, 2)[1] == 2  # ν = 4
    assert rep.method == "bsd" and rep.auto["kept"] == "bsd" and rep.rank == 2
    assert rep.auto["bsd"]["output_error"] < 1e-8 < 1e-3 < rep.auto["prune"]["output_error"]
    assert rep.selection == "output" and rep.restart is not None


@pytest.mark.slow  # two solves and prunes on the shared CPU: ~80 s
def test_auto_meets_the_budget_with_both_candidates_in_one_share():
    model = Net(nnx.Rngs(0))
    P = count_params(model)
    reduction = 0.4
    model, report = jb.compress_model(model, calib(), mlps=PATHS, reduction=reduction, method=jb.get_method("auto", contain=False, config=CONFIG), mlp_specs=SPEC, key=jax.random.key(0))
    assert report.params_after == count_params(model) <= (1 - reduction) * P
    budget = math.floor((1 - reduction) * P) - (P - 2 * count_params(FFN(6, 16, nnx.Rngs(0))))
    costs = [max(r.auto["bsd"]["params"], r.auto["prune"]["params"]) for r in report.mlps]
    assert sum(costs) <= budget
    for r in report.mlps:
        r_b, k = r.auto["bsd"]["rank"], r.auto["prune"]["rank"]
        assert r.params_after == r.auto[r.method]["params"]
        # Both are the largest of their kind within one share f·P_i: they differ by less than a step.
        assert abs(r.auto["bsd"]["params"] - r.auto["prune"]["params"]) < max(6 + 6 + 4, 6 + 1 + 6)
        assert r_b * 16 == r.auto["bsd"]["params"] and k * 7 + 6 * (k + 1) == r.auto["prune"]["params"]


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(allocation="greedy"), "allocation"), (dict(warm_start=False), "warm_start"),
     (dict(method="svd", warm_start=True), "warm_start"), (dict(selection="best"), "selection"),
     (dict(auto_judge="logits"), "auto_judge"),
     # options the method would ignore are refused, naming them
     (dict(method="prune"), "^config=.*method 'prune' does not use it"),
     (dict(method="prune", config=None, restarts=2), "^restarts=2: method 'prune'"),
     (dict(method="svd", config=None, selection="objective"), "^selection='objective': method 'svd'"),
     (dict(method="drone", config=None, auto_judge="block"), "^auto_judge='block': method 'drone'"),
     (dict(method="bsd", auto_judge="block"), "^auto_judge='block': method 'bsd'"),
     (dict(mlp_specs=None, mlps=["layers.0"]), "mlp_specs"), (dict(reduction=0.99), "reduction")],
)
def test_auto_bad_arguments_raise(kwargs, match):
    args = dict(mlps=PATHS, reduction=0.3, method="auto", config=CONFIG, mlp_specs=SPEC, key=jax.random.key(0))
    args.update(kwargs)

    class Opaque(nnx.Module):  # no nnx.Linear children: no spec can be found
        def __init__(self):
            self.w = nnx.Param(jnp.eye(6))

        def __call__(self, x):
            return jnp.tanh(x @ self.w[...])

    model = Net(nnx.Rngs(0))
    if args["mlp_specs"] is None:
        model.layers[0] = Opaque()
    with pytest.raises(ValueError, match=match):
        jb.compress_model(model, calib(), **call_with(args))


def test_the_cli_and_compress_accept_auto():
    from jaxbsd.cli import build_parser

    assert build_parser().parse_args(["compress", "--method", "auto", "--reduction", "0.3"]).method == "auto"
    auto = compress.CompressionConfig(method="auto").method
    assert isinstance(auto, Auto) and auto.judge == "model" and auto.bsd.selection == "output"
    with pytest.raises(ValueError, match="allocation"):
        compress.CompressionConfig(method="auto", reduction=0.3, allocation="greedy")
    with pytest.raises(ValueError, match="judge"):
        compress.CompressionConfig(method=Auto(judge="logits"))
    # Run ids (and resumable states) of runs saved before auto_judge existed stay valid: only
    # "auto" records it, and only when it differs from the old rule ("block").
    assert "auto_judge" not in compress.CompressionConfig(method="bsd").to_dict()
    assert "auto_judge" not in compress.CompressionConfig(method=Auto(judge="block")).to_dict()
    assert compress.CompressionConfig(method="auto").to_dict()["auto_judge"] == "model"
    assert compress.CompressionConfig.from_flat(method="auto", auto_judge="block").method.judge == "block"
    assert compress.CompressionConfig.from_dict({"method": "auto"}).method.judge == "block"  # saved before it existed


@pytest.mark.parametrize("entry", ["get_method", "Auto", "CompressionConfig", "from_flat", "compress_model"])
def test_auto_is_deprecated_at_every_entry_and_the_warning_names_the_callers_line(entry):
    """Issue 58: ``bsd`` contains pruning, so ``auto`` warns (a FutureWarning, shown to users by
    default) wherever one is made, attributed to the line that asked for it, not to jaxbsd's
    internals; ``bsd`` and ``prune`` do not warn. The deprecated method still runs as before."""
    calls = {
        "get_method": lambda: jb.get_method("auto"),
        "Auto": lambda: jb.Auto(judge="block"),
        "CompressionConfig": lambda: compress.CompressionConfig(method="auto"),
        "from_flat": lambda: compress.CompressionConfig.from_flat(method="auto", auto_judge="block"),
        "compress_model": lambda: jb.compress_model(Net(nnx.Rngs(0)), calib(), mlps=PATHS, reduction=0.3,
                                                    method="auto", mlp_specs=SPEC, refine=None,
                                                    key=jax.random.key(0)),
    }
    with pytest.warns(FutureWarning, match=r"method 'auto' is deprecated.*method='bsd'") as record:
        out = calls[entry]()
    ours = [w for w in record if issubclass(w.category, FutureWarning) and "'auto' is deprecated" in str(w.message)]
    assert ours and all(w.filename == __file__ for w in ours), [(w.filename, w.lineno) for w in ours]
    if entry == "compress_model":
        _, report = out
        assert all(r.auto is not None and r.method in ("bsd", "prune") for r in report.mlps)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        jb.get_method("bsd"), jb.get_method("prune"), compress.CompressionConfig(method="bsd")


def test_importing_jaxbsd_warns_about_nothing():
    """The deprecation fires where an ``auto`` is asked for, never at import (no module-level ``Auto``)."""
    done = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", "import jaxbsd, jaxbsd.cli"],
                          capture_output=True, text=True, cwd=pathlib.Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow  # two compress() runs with checkpointed state: minutes on the shared CPU
def test_compress_with_auto_meets_the_budget_records_the_choice_and_resumes(tmp_path):
    from jaxbsd.data import Dataset
    from jaxbsd.models import ViTConfig, build_model

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 144).astype(np.int32)
    images = rng.normal(size=(144, 8, 8, 1)).astype(np.float32)
    ds = Dataset("toy", images[:96], labels[:96], images[96:], labels[96:], 10)
    vit = lambda: build_model("vit", ViTConfig(image_size=8, channels=1, patch_size=4, dim=8, depth=2,  # noqa: E731
                                               num_heads=2, mlp_dim=16), seed=0)
    paper = compress.PAPER_BSD
    bsd = dataclasses.replace(paper, config=dataclasses.replace(paper.config, max_iter=5), restarts=2,
                              warm_start=None, selection="output")
    config = compress.CompressionConfig(method=Auto(bsd=bsd), reduction=0.2, num_samples=16, capture_images=16,
                                        finetune_epochs=0)
    model = vit()
    P = count_params(model)
    steps = compress.compress(model, ds, order="bf", config=config, state_dir=tmp_path / "s", progress=False)
    assert count_params(model) == steps[-1]["params_model"] <= 0.8 * P
    for s in steps:
        assert s["method"] == s["auto"]["kept"] in ("bsd", "prune") and s["auto"]["judge"] == "model"
        assert s["params_mlp_new"] == s["auto"][s["method"]]["params"]
        errs = s["auto"]["bsd"]["model_output_error"], s["auto"]["prune"]["model_output_error"]
        assert s["method"] == ("bsd" if errs[0] < errs[1] else "prune")
        assert s["output_error"] == s["auto"][s["method"]]["output_error"]
    # The judge's images are held out from the step's calibration images.
    pool = compress.validation_split(ds, config.val_fraction, config.seed)[0].train_images.shape[0]
    for step in (1, 2):
        judge = compress.judge_indices(pool, 16, config.judge_images, 0, step)
        assert not set(judge) & set(compress.capture_indices(pool, 16, 0, step))
        assert len(judge) == min(config.judge_images, pool - 16)
    again = vit()
    steps2 = compress.compress(again, ds, order="bf", config=config, state_dir=tmp_path / "s", progress=False)
    assert [s["method"] for s in steps2] == [s["method"] for s in steps]
    x = jnp.asarray(ds.test_images[:8])
    np.testing.assert_array_equal(np.asarray(again(x)), np.asarray(model(x)))
