"""Warm starts: a restart that begins from a given decoupled model, beside the random ones."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import BSpline as ScipyBSpline

import jaxbsd as jb
from jaxbsd.solver import bspline, cmtf

BASIS = jb.BSpline(3, 4)  # clamped cubic without interior knots: any cubic polynomial exactly
_call = jax.jit(lambda mdl, x: mdl(x))  # one compiled model evaluation instead of many eager ops


def _sample(f, X):
    """``jb.solver.sample(f, X)`` as one compiled program (run eagerly, each of its ops compiles on its own)."""
    return jax.jit(lambda X: jb.solver.sample(f, X))(X)


@functools.cache  # built once per session: every test reads the same (immutable) planted problem
def planted(seed=11, m=4, n=3, S=96):
    """f(x) = W1 g(W0 x) with cubic g, and its exact decoupled model (coefficients fitted by
    numpy least squares on the design matrix at the samples: exact for a cubic)."""
    k0, k1, k2 = jax.random.split(jax.random.key(seed), 3)
    W0 = np.asarray(jax.random.normal(k0, (2, m))) / np.sqrt(m)
    W1 = np.asarray(jax.random.normal(k1, (n, 2)))
    g = [lambda u: u**3 - u, lambda u: 0.5 * u**2 + 1.0]
    X = np.asarray(jax.random.uniform(k2, (S, m), minval=-1.0, maxval=1.0))
    J, F = _sample(lambda x: jnp.asarray(W1) @ jnp.stack([g[0](jnp.asarray(W0)[0] @ x), g[1](jnp.asarray(W0)[1] @ x)]), X)
    U = W0 @ X.T
    # each one compiled program (eager, every op of the knot placement and the recursion compiles on its own)
    knots = np.asarray(jax.jit(jax.vmap(lambda u: bspline.quantile_knots(u, BASIS.dof, BASIS.degree)))(jnp.asarray(U)))
    design = jax.jit(bspline.design_matrix, static_argnums=2)
    coef = np.stack([np.linalg.lstsq(np.asarray(design(jnp.asarray(u), jnp.asarray(t), 3)), gi(u),
                                     rcond=None)[0] for u, t, gi in zip(U, knots, g)])
    model = jb.Decoupled(W0=jnp.asarray(W0), W1=jnp.asarray(W1), coef=jnp.asarray(coef), knots=jnp.asarray(knots),
                         basis=BASIS)
    return J, F, jnp.asarray(X), model, g


def test_warm_state_holds_the_models_internal_functions_at_the_samples():
    """G and R are g_i' and g_i at u = X W0ᵀ: checked against scipy's BSpline (an independent
    evaluation) and against the planted functions themselves."""
    J, F, X, model, g = planted()
    config = jb.CMTFConfig(rank=2, basis=BASIS)
    state = jax.jit(cmtf.warm_state)(jb.solver.problem(J, F, X), config, model)  # one compile, not one per op
    U = np.asarray(model.W0) @ np.asarray(X).T
    for i in range(2):
        spline = ScipyBSpline(np.asarray(model.knots[i]), np.asarray(model.coef[i]), 3, extrapolate=True)
        np.testing.assert_allclose(np.asarray(state.R[:, i]), spline(U[i]), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(state.G[:, i]), spline.derivative()(U[i]), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(state.R[:, i]), g[i](U[i]), rtol=1e-9, atol=1e-10)
    for name in ("W0", "W1", "coef", "knots"):
        np.testing.assert_array_equal(np.asarray(getattr(state, name)), np.asarray(getattr(model, name)))


@pytest.mark.parametrize("robust", [pytest.param(True, marks=pytest.mark.slow), False])
def test_a_warm_start_from_the_exact_decoupling_is_exact_and_wins(robust):
    """Started at the planted decoupling, the warm restart's first iterate already fits 𝒥 and
    F to rounding (the robust normalization only rescales factors), and it is the one kept."""
    J, F, X, model, _ = planted()
    config = jb.CMTFConfig(rank=2, basis=BASIS, robust=robust, max_iter=3, mu_w=0.0 if robust else 1e-4)
    config = config.replace(mu_w=1e-12, mu_c=1e-12) if robust else config
    res = jb.decouple(J, F, X, config, key=jax.random.key(0), restarts=2, init=model)
    assert res.restarts.objective.shape == (3,)
    assert int(res.best_restart) == 2
    assert float(res.restarts.history_J[2, 0]) < 1e-12 and float(res.error_J) < 1e-12
    assert float(res.error_F) < 1e-12
    np.testing.assert_allclose(np.asarray(_call(res.model, X)), np.asarray(F), rtol=1e-6, atol=1e-8)


@pytest.mark.slow  # the exact warm start's case stays in the default run
def test_a_warm_start_is_kept_when_no_sweep_improves_on_it():
    """Heavy Tikhonov pulls every sweep away from the planted decoupling, so the warm restart's
    best iterate must be its initial state: the exact model, with its exact errors."""
    J, F, X, model, _ = planted()
    config = jb.CMTFConfig(rank=2, basis=BASIS, robust=True, max_iter=3, mu_w=10.0, mu_c=10.0)
    res = jb.decouple(J, F, X, config, key=jax.random.key(0), restarts=1, init=model)
    assert float(res.restarts.history_J[1, 0]) > 1e-3  # the sweeps did move away from it
    assert int(res.best_restart) == 1
    assert float(res.error_J) < 1e-12 and float(res.error_F) < 1e-12
    np.testing.assert_allclose(np.asarray(_call(res.model, X)), np.asarray(F), rtol=1e-9, atol=1e-10)


@pytest.mark.slow  # a pytest subprocess compiling with XLA's default options: ~30 s on 2 cores
@pytest.mark.default_compiler  # bit-identity of two compiled programs (2 and 3 restarts)
@pytest.mark.parametrize("batch", ["vmap", "map"])
def test_random_restarts_are_unchanged_by_a_warm_start(batch):
    J, F, X, model, _ = planted()
    config = jb.CMTFConfig(rank=2, basis=BASIS, max_iter=6)
    plain = jb.decouple(J, F, X, config, key=jax.random.key(3), restarts=2, batch=batch)
    warm = jb.decouple(J, F, X, config, key=jax.random.key(3), restarts=2, batch=batch, init=model)
    for a, b in zip(jax.tree_util.tree_leaves(plain.restarts), jax.tree_util.tree_leaves(warm.restarts)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[:2])


def test_the_warm_start_alone_is_the_warm_restart_beside_random_ones():
    """``restarts=0`` with ``init`` runs the warm start's loop alone: every leaf of its one
    restart equals the warm restart (index 1) of ``restarts=1``, and that restart is the result."""
    J, F, X, model, _ = planted()
    config = jb.CMTFConfig(rank=2, basis=BASIS, max_iter=4, mu_w=1.0, mu_c=1.0)  # sweeps that move away
    both = jb.decouple(J, F, X, config, key=jax.random.key(5), restarts=1, init=model)
    alone = jb.decouple(J, F, X, config, key=jax.random.key(5), restarts=0, init=model)
    assert alone.restarts.objective.shape == (1,) and int(alone.best_restart) == 0
    for a, b in zip(jax.tree_util.tree_leaves(alone.restarts), jax.tree_util.tree_leaves(both.restarts)):
        np.testing.assert_array_equal(np.asarray(a)[0], np.asarray(b)[1])
    np.testing.assert_array_equal(np.asarray(alone.model.W0), np.asarray(both.restart_model(1).W0))
    with pytest.raises(ValueError, match=r"restarts must be an int >= 1 \(or 0 with init"):
        jb.decouple(J, F, X, config, key=jax.random.key(5), restarts=0)


def test_solve_takes_the_warm_state():
    J, F, X, model, _ = planted()
    problem = jb.solver.problem(J, F, X)
    config = jb.CMTFConfig(rank=2, basis=BASIS, max_iter=2)
    run = jax.jit(lambda s: cmtf.solve(jax.random.key(0), problem, config, init=s))(cmtf.warm_state(problem, config, model))
    assert float(run.history_J[0]) < 1e-12


@pytest.mark.parametrize("change, match", [
    (dict(basis=jb.BSpline(3, 6)), "basis"),
    (dict(W0=jnp.zeros((3, 4))), r"init.W0 must have shape \(2, 4\)"),
    (dict(coef=jnp.full((2, 4), jnp.nan)), "init.coef contains non-finite"),
])
def test_bad_warm_start_is_refused(change, match):
    J, F, X, model, _ = planted()
    import dataclasses

    with pytest.raises(ValueError, match=match):
        jb.decouple(J, F, X, jb.CMTFConfig(rank=2, basis=BASIS), key=jax.random.key(0),
                    init=dataclasses.replace(model, **change))
    with pytest.raises(ValueError, match="init must be a jaxbsd.Decoupled"):
        jb.decouple(J, F, X, jb.CMTFConfig(rank=2, basis=BASIS), key=jax.random.key(0), init=(model.W0, model.W1))
