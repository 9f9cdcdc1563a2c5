"""Property-based tests (hypothesis): bases and solver stay finite and well-shaped on bad data.

Shapes are kept fixed per test where possible so that jax compiles once and hypothesis can
try many values quickly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.interpolate import BSpline as ScipyBSpline

import jaxbsd as jb
from jaxbsd.solver import bspline

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
design_jit = jax.jit(bspline.design_matrix, static_argnums=(2, 3))
knots_jit = jax.jit(bspline.quantile_knots, static_argnums=(1, 2))


def _sample(f, X):
    """``jb.solver.sample(f, X)`` as one compiled program (run eagerly, each of its ops compiles on its own)."""
    return jax.jit(lambda X: jb.solver.sample(f, X))(X)


@st.composite
def clamped_knots(draw):
    """Degree, and a clamped knot vector with repeated interior knots and a scale."""
    degree = draw(st.integers(0, 5))
    n_distinct = draw(st.integers(0, 4))
    interior = []
    for value in sorted(draw(st.lists(st.floats(0.01, 0.99), min_size=n_distinct, max_size=n_distinct))):
        interior += [value] * draw(st.integers(1, max(1, degree)))  # multiplicity <= d keeps continuity
    scale = draw(st.sampled_from([1e-8, 1e-3, 1.0, 1e3, 1e8]))
    shift = draw(st.sampled_from([0.0, -5.0, 1e4]))
    t = np.r_[[0.0] * (degree + 1), interior, [1.0] * (degree + 1)] * scale + shift * scale
    return degree, t, scale, shift


@pytest.mark.slow  # every knot count and degree compiles anew; tests/test_bspline.py's scipy oracles, repeated
# knots and partition of unity run in the default run
@SETTINGS
@given(clamped_knots(), st.integers(0, 2), st.data())
def test_design_matrix_is_finite_and_a_partition_of_unity(spec, derivative, data):
    degree, t, scale, shift = spec
    inside = np.asarray(data.draw(st.lists(st.floats(0, 1), min_size=8, max_size=8)))
    outside = np.asarray(data.draw(st.lists(st.floats(-100, 100), min_size=4, max_size=4)))
    # samples exactly at the knots too
    x = np.r_[inside, outside, np.resize(t / scale - shift, 4)] * scale + shift * scale
    B = np.asarray(design_jit(jnp.asarray(x), jnp.asarray(t), degree, derivative))
    assert B.shape == (16, len(t) - degree - 1)
    assert np.all(np.isfinite(B))
    if derivative == 0:
        within = (x >= t[0]) & (x <= t[-1])
        np.testing.assert_allclose(B[within].sum(axis=1), 1.0, atol=1e-8)
        ref = np.stack([ScipyBSpline(t, np.eye(B.shape[1])[j], degree)(x) for j in range(B.shape[1])], 1)
        np.testing.assert_allclose(B[within], ref[within], atol=1e-7)


@pytest.mark.slow  # the default run's degenerate samples: tests/test_bspline.py (quantile knots, a usable basis)
@SETTINGS
@given(
    st.sampled_from([1e-8, 1.0, 1e8]),
    st.sampled_from(["constant", "two_values", "duplicates", "normal"]),
    st.sampled_from([(4, 3), (7, 3), (5, 1), (11, 10)]),
    st.integers(0, 2**31 - 1),
)
def test_quantile_knots_on_degenerate_samples(scale, kind, dof_degree, seed):
    dof, degree = dof_degree
    rng = np.random.default_rng(seed)
    x = {
        "constant": np.full(24, 3.0),
        "two_values": rng.choice([-1.0, 2.0], 24),
        "duplicates": np.repeat(rng.normal(size=6), 4),
        "normal": rng.normal(size=24),
    }[kind] * scale
    t = np.asarray(knots_jit(jnp.asarray(x), dof, degree))
    assert t.shape == (dof + degree + 1,)
    assert np.all(np.isfinite(t)) and np.all(np.diff(t) >= 0) and t[-1] > t[0]
    for q in (0, 1):
        B = np.asarray(design_jit(jnp.asarray(x), jnp.asarray(t), degree, q))
        assert np.all(np.isfinite(B))
    np.testing.assert_allclose(np.asarray(design_jit(jnp.asarray(x), jnp.asarray(t), degree, 0)).sum(1), 1.0, atol=1e-8)


@st.composite
def problems(draw):
    m = draw(st.integers(1, 4))
    n = draw(st.integers(1, 3))
    rank = draw(st.integers(1, 6))  # may exceed m and n
    basis = draw(st.sampled_from([jb.BSpline(3, 5), jb.BSpline(1, 4), jb.Polynomial(3), jb.ReLU(3)]))
    S = basis.num_coef + draw(st.integers(0, 3))  # S barely >= dof
    kind = draw(st.sampled_from(["smooth", "duplicates", "constant_input", "zero_output"]))
    scale = draw(st.sampled_from([1e-8, 1.0, 1e8]))
    robust = draw(st.booleans())
    seed = draw(st.integers(0, 1000))
    return m, n, rank, basis, S, kind, scale, robust, seed


@pytest.mark.slow  # every example compiles a new solve: run in CI's slow step
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_solver_never_returns_nan(spec):
    m, n, rank, basis, S, kind, scale, robust, seed = spec
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(S, m)) * scale
    if kind == "duplicates":
        X[1::2] = X[::2][: X[1::2].shape[0]]
    if kind == "constant_input":
        X[:] = 0.5 * scale
    A = rng.normal(size=(n, m))

    def f(x):
        y = jnp.tanh(jnp.asarray(A) @ x / scale)
        return y * 0.0 if kind == "zero_output" else y

    J, F = jb.solver.sample(f, jnp.asarray(X))
    config = jb.CMTFConfig(rank=rank, basis=basis, robust=robust, max_iter=8, lam=0.25)
    res = jb.decouple(J, F, jnp.asarray(X), config, key=jax.random.key(seed), restarts=2)
    for leaf in jax.tree_util.tree_leaves(res):
        assert np.all(np.isfinite(np.asarray(leaf)))
    assert res.model(jnp.asarray(X)).shape == (S, n)
    assert int(res.status) in {s.value for s in jb.Status}


class NaNBasis(jb.BSpline):
    """A broken basis: its design matrices are NaN, so the very first sweep is non-finite
    (the initial state only fits knots and stays finite)."""

    def design(self, u, knots):
        B, dB = super().design(u, knots)
        return B * jnp.nan, dB * jnp.nan


def test_nonfinite_sweeps_are_reported_and_the_best_finite_iterate_returned():
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(30, 3)))
    J, F = _sample(lambda x: jnp.stack([jnp.tanh(x[0]), x[1] * x[2]]), X)
    config = jb.CMTFConfig(rank=3, basis=NaNBasis(3, 5), max_iter=20)
    res = jb.decouple(J, F, X, config, key=jax.random.key(0), restarts=2)
    assert int(res.status) == jb.Status.NONFINITE
    assert np.all(np.asarray(res.restarts.iterations) == 1)
    for leaf in jax.tree_util.tree_leaves(res):
        assert np.all(np.isfinite(np.asarray(leaf)))


def test_data_whose_norm_overflows_is_rejected():
    X = np.ones((30, 3), np.float32)
    J = np.full((30, 2, 3), 1e19, np.float32)  # finite entries, but ‖J‖² overflows float32
    with pytest.raises(ValueError, match="J is too large for float32"):
        jb.decouple(J, np.ones((30, 2), np.float32), X, jb.CMTFConfig(rank=2), key=jax.random.key(0))


@pytest.mark.slow  # its solves compile programs of their own; the finite-sweep tests above stay
def test_dead_ranks_are_counted():
    """A rank-1 function fitted at rank 3 without robustness: report, don't crash."""
    rng = np.random.default_rng(1)
    X = jnp.asarray(rng.normal(size=(40, 2)))
    J, F = _sample(lambda x: jnp.stack([jnp.sin(x[0])]), X)
    config = jb.CMTFConfig(rank=3, basis=jb.BSpline(3, 5), max_iter=50)
    res = jb.decouple(J, F, X, config, key=jax.random.key(0), restarts=2)
    assert res.restarts.dead_ranks.shape == (2,)
    model = res.model
    expected = int(np.sum((np.linalg.norm(model.W0, axis=1) <= config.eps) | (np.linalg.norm(model.W1, axis=0) <= config.eps)))
    assert int(res.dead_ranks) == expected


@pytest.mark.slow  # a pytest subprocess compiling with XLA's default options: ~40 s on 2 cores
@pytest.mark.default_compiler
def test_bit_identical_across_runs_and_with_the_jitted_single_restart():
    rng = np.random.default_rng(2)
    X = jnp.asarray(rng.uniform(-1, 1, size=(50, 3)))
    J, F = _sample(lambda x: jnp.stack([jnp.sin(x[0] + x[1]), x[2] ** 2]), X)
    config = jb.CMTFConfig(rank=2, basis=jb.BSpline(3, 5), max_iter=30)
    a = jb.decouple(J, F, X, config, key=jax.random.key(3), restarts=1)
    b = jb.decouple(J, F, X, config, key=jax.random.key(3), restarts=1)
    key = jax.random.split(jax.random.key(3), 1)[0]
    single = jax.jit(jb.solver.solve)(key, jb.solver.Problem(jb.solver.DenseJacobian(J), F, X), config)
    for x, y, z in zip(jax.tree_util.tree_leaves(a.restarts), jax.tree_util.tree_leaves(b.restarts),
                       jax.tree_util.tree_leaves(single)):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x[0], z)
