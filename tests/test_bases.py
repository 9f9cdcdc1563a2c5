"""The three bases: shared interface, the paper's Lemmas 2 and 3, polynomial and ReLU oracles."""

import json
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbsd as jb
from jaxbsd.solver import bspline

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_lemma3_spline_without_interior_knots_spans_the_polynomials[10]",
}


BASES = [jb.BSpline(3, 7), jb.BSpline(1, 4), jb.BSpline(0, 3), jb.Polynomial(4), jb.ReLU(5)]

# The bases run under jit here: un-jitted jnp code compiles one tiny program per primitive and
# shape, which made this file slow. A basis is hashable (a static argument of jax.jit).


@partial(jax.jit, static_argnums=0)
def _fit_design(basis, u):
    knots = basis.fit(u)
    return knots, basis.design(u, knots)


@partial(jax.jit, static_argnums=0)
def _interface(basis, u, v, c):
    knots = basis.fit(u)
    Bv, dBv = basis.design(v, knots)
    grad = jax.vmap(jax.grad(lambda z: basis.evaluate(z, knots, c)))(v)
    return knots, basis.design(u, knots), Bv, dBv, basis.evaluate(v, knots, c), basis.evaluate(v, knots, c, 1), grad


def residual_norm(A, B):
    """Relative norm of the part of the columns of ``B`` outside the column span of ``A``."""
    coef, *_ = np.linalg.lstsq(A, B, rcond=None)
    return np.linalg.norm(A @ coef - B) / np.linalg.norm(B)


@pytest.mark.parametrize("basis", BASES, ids=str)
def test_interface_shapes_and_fast_evaluation(basis):
    rng = np.random.default_rng(0)
    u = jnp.asarray(rng.normal(size=50))
    c = jnp.asarray(rng.normal(size=basis.num_coef))
    # evaluate() never builds the dense matrix but must agree with it, also off the data
    v = jnp.asarray(rng.uniform(-4, 4, size=30))
    knots, (B, dB), Bv, dBv, values, slopes, grad = _interface(basis, u, v, c)
    assert knots.shape == (basis.num_knots,)
    assert B.shape == dB.shape == (50, basis.num_coef)
    np.testing.assert_allclose(values, Bv @ c, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(slopes, dBv @ c, rtol=1e-10, atol=1e-10)
    # the derivative column is the derivative of the value column (autodiff oracle)
    np.testing.assert_allclose(grad, dBv @ c, rtol=1e-9, atol=1e-9)
    hash(basis)  # static argument of jax.jit


def test_polynomial_matches_numpy():
    u = jnp.linspace(-2, 3, 17)
    c = np.array([0.5, -1.0, 2.0, 0.25])
    basis = jb.Polynomial(3)
    values, slopes, (B, dB) = jax.jit(
        lambda u, c: (basis.evaluate(u, basis.fit(u), c), basis.evaluate(u, basis.fit(u), c, 1), _fit_design(basis, u)[1])
    )(u, jnp.asarray(c))
    np.testing.assert_allclose(values, np.polyval(c[::-1], u), rtol=1e-12)
    dc = np.polyder(c[::-1])
    np.testing.assert_allclose(slopes, np.polyval(dc, u), rtol=1e-12)
    np.testing.assert_allclose(B, np.vander(np.asarray(u), 4, increasing=True), rtol=1e-12)


@pytest.mark.parametrize("degree", [1, 2, 3, 5, 10])
def test_lemma3_spline_without_interior_knots_spans_the_polynomials(degree):
    """Lemma 3: with ν = d + 1 (no interior knots) the B-splines span exactly P_d."""
    rng = np.random.default_rng(degree)
    u = jnp.asarray(rng.uniform(-1.0, 1.0, 200))
    spline, poly = jb.BSpline(degree, degree + 1), jb.Polynomial(degree)
    _, (B_s, dB_s) = _fit_design(spline, u)
    _, (B_p, dB_p) = _fit_design(poly, u)
    assert residual_norm(np.asarray(B_s), np.asarray(B_p)) < 1e-8  # P_d ⊂ S_d
    assert residual_norm(np.asarray(B_p), np.asarray(B_s)) < 1e-8  # S_d ⊂ P_d
    assert np.linalg.matrix_rank(np.asarray(B_s)) == degree + 1
    # ...and with one interior knot the spline space is strictly larger than P_d
    _, (B_big, _) = _fit_design(jb.BSpline(degree, degree + 2), u)
    assert residual_norm(np.asarray(B_p), np.asarray(B_big)) > 1e-3


@pytest.mark.parametrize("dof", [2, 4, 7])
def test_lemma2_relu_span_is_a_strict_subspace_of_linear_splines(dof):
    """Lemma 2: span{1, ReLU(u − t_j)} ⊂ S_{1,Δ} with Δ = {t0, t1, …}, strictly."""
    rng = np.random.default_rng(dof)
    u = jnp.asarray(rng.uniform(-2.0, 3.0, 300))
    relu = jb.ReLU(dof)
    breaks, (B_relu, _) = _fit_design(relu, u)
    lo, hi = float(u.min()), float(u.max())
    knots = np.r_[lo, lo, np.asarray(breaks), hi, hi]
    B_lin = np.asarray(jax.jit(bspline.design_matrix, static_argnums=2)(u, jnp.asarray(knots), 1))  # degree 1
    assert residual_norm(np.asarray(B_lin), np.asarray(B_relu)) < 1e-10  # inclusion
    # strict: the first hat function has a non-zero slope on (t0, t1): not a ReLU combination
    assert residual_norm(np.asarray(B_relu), np.asarray(B_lin[:, :1])) > 1e-2
    # and every ReLU combination is flat left of the first breakpoint
    c = jnp.asarray(rng.normal(size=dof))
    left = np.linspace(lo - 1.0, float(breaks[0]) - 1e-9, 5) if dof > 1 else np.array([lo])
    np.testing.assert_allclose(jax.jit(partial(relu.evaluate, derivative=1))(jnp.asarray(left), breaks, c), 0.0)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: jb.BSpline(3, 3), "dof"),
        (lambda: jb.BSpline(-1, 3), "degree"),
        (lambda: jb.BSpline(2.5, 5), "degree"),
        (lambda: jb.Polynomial(-2), "degree"),
        (lambda: jb.ReLU(0), "dof"),
    ],
)
def test_bad_basis_arguments_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@partial(jax.jit, static_argnums=0)
def _rescaled(basis, u, coef, alpha):
    """``g(α v)`` from the rescaled parameters at ``v = u / α``, and ``g(u)``; α traced (one program for both α)."""
    knots = basis.fit(u)
    knots2, coef2 = basis.rescale_input(knots, coef, alpha)
    return basis.evaluate(u / alpha, knots2, coef2), basis.evaluate(u, knots, coef)


@pytest.mark.parametrize("basis", [jb.BSpline(3, 7), jb.BSpline(1, 4), jb.Polynomial(3), jb.ReLU(5)], ids=repr)
@pytest.mark.parametrize("alpha", [3.7, 1e-3])
def test_rescale_input_gives_g_of_alpha_v(basis, alpha):
    """``rescale_input`` returns the basis parameters of ``v ↦ g(α v)``, checked pointwise."""
    rng = np.random.default_rng(3)
    u = jnp.asarray(rng.normal(size=200) * 2)
    coef = jnp.asarray(rng.normal(size=basis.num_coef))
    rescaled, original = _rescaled(basis, u, coef, jnp.asarray(alpha))
    np.testing.assert_allclose(rescaled, original, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("basis", [jb.BSpline(3, 7), jb.Polynomial(3), jb.ReLU(5)], ids=repr)
def test_balanced_model_is_the_same_function_and_survives_float32(basis):
    """A model with a near-dead rank (W0 row ~1e-16, compensated in W1), as the non-robust
    solver can return: exact in float64, but its raw float32 copy is not. Balancing keeps the
    function (oracle: the unbalanced float64 model) and makes the float32 layer finite."""
    from flax import nnx

    from jaxbsd.models.decoupled_mlp import DecoupledMLP

    rng = np.random.default_rng(0)
    m, n, r = 6, 5, 4
    x = jnp.asarray(rng.normal(size=(300, m)))
    W0 = rng.normal(size=(r, m)) * np.array([1.0, 1e-16, 40.0, 1e-3])[:, None]
    W1 = rng.normal(size=(n, r)) * np.array([1.0, 1e5, 1e-9, 2.0])[None, :]
    u = x @ W0.T
    knots = jax.jit(jax.vmap(basis.fit, in_axes=1))(u)
    coef = jnp.asarray(rng.normal(size=(r, basis.num_coef)) * 0.1)
    model = jb.Decoupled(W0=jnp.asarray(W0), W1=jnp.asarray(W1), coef=coef, knots=knots, basis=basis)
    apply = jax.jit(lambda model, x: model(x))  # Decoupled is a pytree, its basis static
    reference = np.asarray(apply(model, x))

    balanced = jax.jit(lambda model: model.balanced())(model)
    np.testing.assert_allclose(np.linalg.norm(balanced.W0, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(balanced.W1, axis=0), 1.0, rtol=1e-12)
    np.testing.assert_allclose(apply(balanced, x), reference, rtol=1e-8, atol=1e-10 * float(np.max(np.abs(reference))))

    layer = DecoupledMLP.from_decoupled(model, dtype=jnp.float32)
    out = nnx.jit(lambda layer, x: layer(x))(layer, x.astype(jnp.float32))
    assert bool(np.all(np.isfinite(np.asarray(out))))
    np.testing.assert_allclose(out, reference, rtol=0, atol=1e-4 * float(np.max(np.abs(reference))))


@pytest.mark.parametrize("basis", [jb.BSpline(2, 7), jb.Polynomial(5), jb.ReLU(6)], ids=str)
def test_basis_description_round_trips(basis):
    description = basis.to_dict()
    assert json.loads(json.dumps(description)) == description
    assert jb.Basis.from_dict(description) == basis
    with pytest.raises(ValueError, match="kind"):
        jb.Basis.from_dict({**description, "kind": "Fourier"})
