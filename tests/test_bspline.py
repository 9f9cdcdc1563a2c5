"""B-spline evaluation against scipy's BSpline, finite differences and jax autodiff."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import BSpline as ScipyBSpline

from jaxbsd.solver import bspline

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_derivative_matches_finite_differences_and_autodiff[5]",
    "test_solver_design_matrices_match_scipy[5]",
    "test_evaluate_matches_scipy_spline[5]",
    # the default run keeps degrees 0, 1 and 3 of the scipy oracles (the indicator, the hat, the paper's cubic)
    "test_design_matrix_matches_scipy[2]", "test_design_matrix_matches_scipy[4]",
    "test_solver_design_matrices_match_scipy[2]", "test_solver_design_matrices_match_scipy[4]",
    "test_evaluate_matches_scipy_spline[2]", "test_evaluate_matches_scipy_spline[4]",
}


DEGREES = [0, 1, 2, 3, 4, 5]
DERIVATIVES = [0, 1, 2]


def random_knots(rng, dof, degree, lo=-1.0, hi=2.0):
    inner = np.sort(rng.uniform(lo, hi, dof - degree - 1))
    return np.r_[[lo] * (degree + 1), inner, [hi] * (degree + 1)]


def scipy_design(x, t, degree, derivative):
    dof = len(t) - degree - 1
    return np.stack(
        [ScipyBSpline(t, np.eye(dof)[j], degree, extrapolate=True)(x, nu=derivative) for j in range(dof)],
        axis=1,
    )


# Everything runs under jit: un-jitted jnp code compiles one tiny program per primitive and shape,
# which made this file slow. Eager execution is checked once, in test_jit_matches_eager.
design_jit = jax.jit(bspline.design_matrix, static_argnums=(2, 3))


@partial(jax.jit, static_argnames="degree")
def _design_all(x, t, degree):
    """The design matrices of every derivative in ``DERIVATIVES`` (one compile per shape and degree)."""
    return tuple(bspline.design_matrix(x, t, degree, q) for q in DERIVATIVES)


@partial(jax.jit, static_argnames="degree")
def _evaluate_all(x, t, c, degree):
    return tuple(bspline.evaluate(x, t, c, degree, q) for q in DERIVATIVES)


@pytest.mark.parametrize("degree", DEGREES)
def test_design_matrix_matches_scipy(degree):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        dof = degree + 1 + int(rng.integers(0, 5))
        t = random_knots(rng, dof, degree)
        # inside, exactly at every knot, and outside the range on both sides
        x = np.r_[rng.uniform(-1, 2, 40), t, rng.uniform(-3, -1, 5), rng.uniform(2, 4, 5)]
        for derivative, ours in zip(DERIVATIVES, _design_all(jnp.asarray(x), jnp.asarray(t), degree)):
            ours = np.asarray(ours)
            ref = scipy_design(x, t, degree, derivative)
            scale = max(1.0, np.abs(ref).max())
            np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9 * scale, err_msg=f"q={derivative}")


@pytest.mark.parametrize("degree", DEGREES)
def test_solver_design_matrices_match_scipy(degree):
    """The solver's per-column Cox–de Boor (values and first derivatives together), including
    repeated interior knots and points outside the range, against scipy."""
    for seed in range(3):
        rng = np.random.default_rng(10 + seed)
        dof = degree + 1 + int(rng.integers(0, 6))
        t = random_knots(rng, dof, degree)
        if dof - degree - 1 >= 2:
            t[degree + 2] = t[degree + 1]  # a repeated interior knot
        x = np.r_[rng.uniform(-1, 2, 40), t, rng.uniform(-3, -1, 5), rng.uniform(2, 4, 5)]
        B, dB = jax.jit(bspline.design_matrices, static_argnums=2)(jnp.asarray(x), jnp.asarray(t), degree)
        for ours, derivative in ((B, 0), (dB, 1)):
            ref = scipy_design(x, t, degree, derivative)
            scale = max(1.0, np.abs(ref).max())
            np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-9, atol=1e-9 * scale, err_msg=f"q={derivative}")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_sort_floats_is_numpy_sort(dtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal((4, 300)) * 10.0 ** rng.integers(-30, 30, (4, 300)),
                        np.array([[0.0, -0.0, 5e-324 if dtype == jnp.float64 else 1e-45, -1.0, np.inf, -np.inf]] * 4)], 1)
    x = x.astype(dtype)
    np.testing.assert_array_equal(np.asarray(jax.jit(bspline.sort_floats)(jnp.asarray(x))), np.sort(x, axis=-1))


@pytest.mark.parametrize("degree", DEGREES)
def test_evaluate_matches_scipy_spline(degree):
    rng = np.random.default_rng(degree)
    dof = degree + 4
    t = random_knots(rng, dof, degree)
    c = rng.normal(size=dof)
    x = np.r_[rng.uniform(-2, 3, 60), t]
    for derivative, ours in zip(DERIVATIVES, _evaluate_all(jnp.asarray(x), jnp.asarray(t), jnp.asarray(c), degree)):
        ours = np.asarray(ours)
        ref = ScipyBSpline(t, c, degree, extrapolate=True)(x, nu=derivative)
        np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9 * max(1.0, np.abs(ref).max()))


@partial(jax.jit, static_argnames="degree")
def _derivative_checks(x, t, c, degree):
    """Central differences, the derivative column and autodiff of the value, in one program."""
    s = lambda z: bspline.evaluate(z, t, c, degree)  # noqa: E731
    h = 1e-6
    fd = (s(x + h) - s(x - h)) / (2 * h)
    return fd, bspline.evaluate(x, t, c, degree, derivative=1), jax.vmap(jax.grad(s))(x)


@pytest.mark.parametrize("degree", [1, 2, 3, 5])
def test_derivative_matches_finite_differences_and_autodiff(degree):
    rng = np.random.default_rng(3)
    dof = degree + 5
    t = jnp.asarray(random_knots(rng, dof, degree))
    c = jnp.asarray(rng.normal(size=dof))
    # avoid kinks at knots for the finite differences; include extrapolated points
    x = jnp.asarray(np.r_[rng.uniform(-1.5, 2.5, 30)])
    fd, exact, grad = _derivative_checks(x, t, c, degree)
    np.testing.assert_allclose(exact, fd, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, exact, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("degree", DEGREES)
def test_partition_of_unity_inside_and_polynomial_continuation_outside(degree):
    rng = np.random.default_rng(4)
    t = jnp.asarray(random_knots(rng, degree + 3, degree))
    x_in = np.linspace(-1.0, 2.0, 101)  # includes both boundaries
    x_out = np.array([-5.0, -1.5, 2.5, 7.0])
    B_all = np.asarray(design_jit(jnp.asarray(np.r_[x_in, x_out]), t, degree, 0))  # one program for both
    B, B_out = B_all[: len(x_in)], B_all[len(x_in) :]
    np.testing.assert_allclose(B.sum(axis=1), 1.0, atol=1e-12)
    # Extrapolation continues the boundary pieces: the sum of all B-splines is the constant 1
    # there as well, and individual functions are not zeroed.
    np.testing.assert_allclose(B_out.sum(axis=1), 1.0, atol=1e-9)
    if degree > 0:
        assert np.all(np.abs(np.asarray(B_out)).max(axis=1) > 0.5)


@pytest.mark.parametrize("dof,degree", [(4, 3), (7, 3), (11, 10), (11, 1), (5, 0)])
def test_quantile_knots_structure(dof, degree):
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=97))
    t = np.asarray(jax.jit(bspline.quantile_knots, static_argnums=(1, 2))(x, dof, degree))
    assert t.shape == (dof + degree + 1,)
    assert np.all(np.diff(t) >= 0)
    np.testing.assert_array_equal(t[: degree + 1], float(x.min()))
    np.testing.assert_array_equal(t[dof:], float(x.max()))
    interior = t[degree + 1 : dof]
    assert np.all(np.isin(interior, np.asarray(x)))  # snapped to samples
    levels = np.arange(1, dof - degree) / (dof - degree)
    q = np.quantile(np.asarray(x), levels)
    xs = np.sort(np.asarray(x))
    for knot, target in zip(interior, q):  # the nearest sample to each quantile
        assert abs(knot - target) <= np.min(np.abs(xs - target)) + 1e-15


@jax.jit
def _degenerate_basis(x):
    """Knots and the degree-3 design matrices q = 0, 1, 2; all three cases share one shape, one compile."""
    t = bspline.quantile_knots(x, 6, 3)
    return t, tuple(bspline.design_matrix(x, t, 3, q) for q in (0, 1, 2))


@pytest.mark.parametrize("x", [np.zeros(20), np.full(20, 3e7), np.r_[np.zeros(19), 1e-300]])
def test_degenerate_samples_give_a_usable_finite_basis(x):
    t, designs = _degenerate_basis(jnp.asarray(x))
    assert t[-1] > t[0]
    for B in designs:
        assert np.all(np.isfinite(np.asarray(B)))
    np.testing.assert_allclose(np.asarray(designs[0]).sum(axis=1), 1.0, atol=1e-9)


@jax.jit
def _repeated_knots(x, t, c):
    values = tuple(bspline.evaluate(x, t, c, 3, q) for q in (0, 1))
    grads = jax.grad(lambda tt, cc: bspline.evaluate(x, tt, cc, 3).sum(), argnums=(0, 1))(t, c)
    return values, grads


def test_repeated_knots_stay_finite_with_finite_gradients():
    t = jnp.array([0.0, 0, 0, 0, 0.5, 0.5, 0.5, 1, 1, 1, 1])  # triple interior knot
    c = jnp.arange(7.0)
    x = jnp.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.5])
    values, grads = _repeated_knots(x, t, c)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in values)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)
    np.testing.assert_allclose(values[0], ScipyBSpline(np.asarray(t), np.asarray(c), 3)(np.asarray(x)), atol=1e-12)


def test_jit_matches_eager():
    rng = np.random.default_rng(6)
    t = jnp.asarray(random_knots(rng, 8, 3))
    x = jnp.asarray(rng.uniform(-2, 3, 50))
    eager = bspline.design_matrix(x, t, 3, 1)
    jitted = jax.jit(bspline.design_matrix, static_argnums=(2, 3))(x, t, 3, 1)
    np.testing.assert_allclose(eager, jitted, rtol=1e-14, atol=1e-14)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="dof"):
        bspline.quantile_knots(jnp.arange(10.0), 3, 3)
    with pytest.raises(ValueError, match="degree"):
        bspline.quantile_knots(jnp.arange(10.0), 3, -1)
    with pytest.raises(ValueError, match="knots"):
        bspline.design_matrix(jnp.arange(3.0), jnp.zeros(5), 3)
