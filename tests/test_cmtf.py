"""R-CMTF-BSD: planted decouplings, determinism, jit parity, validation, degenerate data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbsd as jb
from jaxbsd.solver import linalg

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_sequential_and_vmapped_restarts_agree[True]",
    "test_planted_exact_decoupling_is_recovered[BSpline(degree=3, dof=4)]",
    "test_degenerate_data_never_gives_nan[ReLU(dof=4)-True]",
    "test_degenerate_data_never_gives_nan[Polynomial(degree=3)-True]",
    "test_zero_row_of_W0_gives_a_finite_sweep[True]",
}


def _sample(f, X):
    """``jb.solver.sample(f, X)`` as one compiled program (run eagerly, each of its ops compiles on its own)."""
    return jax.jit(lambda X: jb.solver.sample(f, X))(X)


def planted_problem(key, m=4, n=3, S=120):
    """f(x) = W1 g(W0 x) with cubic g: exactly representable by every basis below."""
    k0, k1, k2 = jax.random.split(key, 3)
    W0 = jax.random.normal(k0, (2, m)) / np.sqrt(m)
    W1 = jax.random.normal(k1, (n, 2))

    def f(x):
        u = W0 @ x
        return W1 @ jnp.stack([u[0] ** 3 - u[0], 0.5 * u[1] ** 2 + 1.0])

    X = jax.random.uniform(k2, (S, m), minval=-1.0, maxval=1.0)
    J, F = _sample(f, X)
    return f, X, J, F


@pytest.fixture(scope="module")
def planted():
    return planted_problem(jax.random.key(7))


# Model evaluation and its autodiff Jacobian, each one compiled program (eager, every jnp op of the
# model would compile on its own for each basis and shape).
_call = jax.jit(lambda mdl, x: mdl(x))
_jacrev = jax.jit(lambda mdl, x: jax.vmap(jax.jacrev(mdl))(x))

# One solver configuration shared by the tests that only need *some* small solve (determinism,
# result contents, the returned model, map vs vmap): one compiled program for all of them.
SMALL = jb.CMTFConfig(rank=2, basis=jb.BSpline(3, 5), max_iter=30)
SMALL_RESTARTS = 3


# BSpline(3, 6) repeats BSpline(3, 4)'s claim with more coefficients: slow step.
@pytest.mark.parametrize("basis", [jb.BSpline(3, 4), pytest.param(jb.BSpline(3, 6), marks=pytest.mark.slow), jb.Polynomial(3)],
                         ids=str)
def test_planted_exact_decoupling_is_recovered(planted, basis):
    f, X, J, F = planted
    config = jb.CMTFConfig(rank=2, basis=basis, max_iter=1500, tol=1e-13)
    res = jb.decouple(J, F, X, config, key=jax.random.key(0), restarts=4)
    assert float(res.error_J) < 1e-6 and float(res.error_F) < 1e-6
    # The returned model reproduces f on fresh points inside the sampled box (oracle: f itself),
    # and its autodiff Jacobian is the reported one.
    X_new = np.random.default_rng(99).uniform(-0.9, 0.9, (50, X.shape[1]))
    F_new = np.asarray(jax.jit(jax.vmap(f))(X_new))
    rel = lambda A, B: np.sum((A - B) ** 2) / np.sum(A**2)  # noqa: E731  (metrics.relative_error, in numpy)
    assert rel(F_new, np.asarray(_call(res.model, X_new))) < 1e-5
    J_model = np.asarray(_jacrev(res.model, X))
    np.testing.assert_allclose(rel(np.asarray(J), J_model), float(res.error_J), rtol=1e-6, atol=1e-12)


def test_structured_jacobian_gives_the_dense_result():
    key = jax.random.key(3)
    k0, k1, k2, k3 = jax.random.split(key, 4)
    m, n, H, S = 4, 3, 12, 120  # the planted problem's shapes: the dense solve reuses SMALL's program
    V0, b0 = jax.random.normal(k0, (H, m)) / np.sqrt(m), jax.random.normal(k1, (H,)) * 0.1
    V1 = jax.random.normal(k2, (n, H)) / np.sqrt(H)
    f = lambda x: V1 @ jnp.tanh(V0 @ x + b0)  # noqa: E731
    X = jax.random.normal(k3, (S, m))
    J, F = _sample(f, X)
    structured = jb.solver.jacobians.mlp_jacobian(X, V0, b0, V1, lambda z: 1 - jnp.tanh(z) ** 2)
    np.testing.assert_allclose(structured.dense(), J, rtol=1e-12, atol=1e-12)
    config = SMALL
    dense_res = jb.decouple(J, F, X, config, key=key, restarts=SMALL_RESTARTS)
    struct_res = jb.decouple(structured, F, X, config, key=key, restarts=SMALL_RESTARTS)
    for a, b in [(dense_res.model.W0, struct_res.model.W0), (dense_res.model.W1, struct_res.model.W1),
                 (dense_res.model.coef, struct_res.model.coef)]:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(dense_res.error_J, struct_res.error_J, rtol=1e-6)
    np.testing.assert_allclose(dense_res.history["error_J"], struct_res.history["error_J"], rtol=1e-6, atol=1e-12)


def test_same_key_same_result_and_restarts_are_independent_solves(planted):
    _, X, J, F = planted
    config = SMALL
    a = jb.decouple(J, F, X, config, key=jax.random.key(1), restarts=SMALL_RESTARTS)
    b = jb.decouple(J, F, X, config, key=jax.random.key(1), restarts=SMALL_RESTARTS)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)
    c = jb.decouple(J, F, X, config, key=jax.random.key(2), restarts=SMALL_RESTARTS)
    assert not np.allclose(a.restarts.state.W0, c.restarts.state.W0)
    # restart k of the vmapped solve is the single solve with key split(key, R)[k]
    key_1 = jax.random.split(jax.random.key(1), 3)[1]
    single = jax.jit(jb.solver.solve)(key_1, jb.solver.Problem(jb.solver.DenseJacobian(J), F, X), config)
    np.testing.assert_allclose(a.restarts.state.W0[1], single.state.W0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.restarts.history_J[1], single.history_J, rtol=1e-10, atol=1e-14)


# Slow step: the whole solve op by op; jit/eager parity of one sweep stays in the fast suite
# (test_core_api.SweepParityTest).
@pytest.mark.slow
def test_jit_and_eager_agree(planted):
    _, X, J, F = planted
    config = jb.CMTFConfig(rank=2, basis=jb.BSpline(3, 5), max_iter=3)
    problem = jb.solver.Problem(jb.solver.DenseJacobian(J), F, X)
    key = jax.random.key(5)
    jitted = jax.jit(jb.solver.solve)(key, problem, config)
    with jax.disable_jit():
        eager = jb.solver.solve(key, problem, config)
    for x, y in zip(jax.tree_util.tree_leaves(jitted), jax.tree_util.tree_leaves(eager)):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)


def test_result_contents(planted):
    _, X, J, F = planted
    config = SMALL
    res = jb.decouple(J, F, X, config, key=jax.random.key(0), restarts=SMALL_RESTARTS)
    assert res.history["error_J"].shape == res.history["error_F"].shape == (3, 30)
    assert np.all(np.isfinite(res.history["error_J"])) and np.all(np.isfinite(res.history["error_F"]))
    best = int(res.best_restart)
    assert float(res.objective) == pytest.approx(float(np.min(res.restarts.objective)))
    assert res.model.W0.shape == (2, 4) and res.model.W1.shape == (3, 2)
    assert res.model.coef.shape == (2, 5) and res.model.knots.shape == (2, 9)
    assert int(res.status) in {s.value for s in jb.Status}
    np.testing.assert_array_equal(res.restart_model(best).W0, res.model.W0)
    assert 1 <= int(res.iterations) <= 30
    assert res.model.num_params() == jb.solver.metrics.params_bsd(4, 3, 2, 5)


@pytest.mark.slow  # jit, grad and vmap programs of the model: 5-8 s
def test_decoupled_model_is_jittable_and_differentiable(planted):
    _, X, J, F = planted
    res = jb.decouple(J, F, X, SMALL, key=jax.random.key(0), restarts=SMALL_RESTARTS)
    model = res.model
    np.testing.assert_allclose(_call(model, X), model(X), rtol=1e-12)
    jacobian = jax.jit(lambda mdl, x: mdl.jacobian(x))  # compiled: eagerly each op compiles on its own
    np.testing.assert_allclose(jacobian(model, X), _jacrev(model, X), rtol=1e-10, atol=1e-12)
    batch = X.reshape(4, 30, 4)
    assert jax.eval_shape(model, batch).shape == (4, 30, 3)  # traced, not compiled
    grads = jax.jit(jax.grad(lambda mdl: jnp.sum(mdl(X) ** 2)))(model)
    assert all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))


def test_no_python_loop_over_ranks():
    """The traced sweep has the same number of operations whatever the rank (on either side of
    the output width n = 3: at r > n the R update goes through the n x n Gram, a different
    but equally rank-independent program)."""

    def count(rank):
        S, n, m = 40, 3, 5
        problem = jb.solver.Problem(jb.solver.DenseJacobian(jnp.ones((S, n, m))), jnp.ones((S, n)), jnp.ones((S, m)))
        config = jb.CMTFConfig(rank=rank, basis=jb.BSpline(3, 6))
        # Shapes only: tracing needs no values, so nothing compiles.
        state = jax.eval_shape(jb.solver.init_state, jax.random.key(0), problem, config)
        return len(jax.make_jaxpr(jb.solver.sweep)(state, problem, config).jaxpr.eqns)

    assert count(1) == count(2)
    assert count(4) == count(9)


def _bad_inputs():
    S, n, m = 30, 2, 3
    J, F, X = np.ones((S, n, m)), np.ones((S, n)), np.ones((S, m))
    nan_J = J.copy()
    nan_J[0, 0, 0] = np.nan
    inf_X = X.copy()
    inf_X[3, 1] = np.inf
    ok = jb.CMTFConfig(rank=2, basis=jb.BSpline(3, 6))
    return [
        ((J[:, :, :2], F, X, ok), "J"),
        ((J, F[:, :1], X, ok), "F"),
        ((J, F, X[:-1], ok), "J"),
        ((J[0], F, X, ok), "J"),
        ((nan_J, F, X, ok), "J contains NaN"),
        ((J, F, inf_X, ok), "X contains NaN or inf"),
        ((J[:5], F[:5], X[:5], ok), "S = 5 must be >= the basis dof 6"),
        ((J.astype(np.float32), F, X, ok), "dtype"),
        ((J, F, X, "rank=2"), "config"),
    ]


@pytest.mark.parametrize("args, match", _bad_inputs())
def test_bad_input_raises_before_compiling(args, match, monkeypatch):
    def fail(*a, **k):
        raise AssertionError("compiled before validating")

    monkeypatch.setattr(jb.solver.driver, "_decouple_jit", fail)
    with pytest.raises(ValueError, match=match):
        jb.decouple(*args, key=jax.random.key(0))


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(rank=0), "rank"), (dict(rank=2, lam=-1.0), "lam"), (dict(rank=2, max_iter=0), "max_iter"),
     (dict(rank=2, basis="bspline"), "basis"), (dict(rank=2, tol=float("nan")), "tol")],
)
def test_bad_config_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jb.CMTFConfig(**kwargs)


def test_restarts_must_be_positive(planted):
    _, X, J, F = planted
    with pytest.raises(ValueError, match="restarts"):
        jb.decouple(J, F, X, jb.CMTFConfig(rank=2), key=jax.random.key(0), restarts=0)


@pytest.mark.parametrize("robust", [True, pytest.param(False, marks=pytest.mark.slow)])  # the paper's method by default
@pytest.mark.parametrize("basis", [jb.BSpline(3, 6), jb.Polynomial(3), jb.ReLU(4)], ids=str)
def test_degenerate_data_never_gives_nan(robust, basis):
    """Tied samples, a constant input coordinate and an all-zero output stay finite."""
    S, m = 40, 3
    base = jax.random.normal(jax.random.key(0), (S // 4, m))
    X = jnp.concatenate([base] * 4)  # every sample four times
    X = X.at[:, 2].set(1.0)  # a constant coordinate
    f = lambda x: jnp.stack([jnp.tanh(x[0] + x[1]), 0.0 * x[0]])  # noqa: E731
    J, F = _sample(f, X)
    config = jb.CMTFConfig(rank=4, basis=basis, robust=robust, max_iter=30, lam=1e-6)
    res = jb.decouple(J, F, X, config, key=jax.random.key(1), restarts=2)
    for leaf in jax.tree_util.tree_leaves(res):
        assert np.all(np.isfinite(np.asarray(leaf)))


@pytest.mark.parametrize("robust", [True, False])
def test_zero_row_of_W0_gives_a_finite_sweep(planted, robust):
    _, X, J, F = planted
    problem = jb.solver.Problem(jb.solver.DenseJacobian(J), F, X)
    config = jb.CMTFConfig(rank=3, basis=jb.BSpline(3, 6), robust=robust)
    state = jax.jit(jb.solver.init_state)(jax.random.key(0), problem, config)  # one compile, not one per op
    state = state._replace(W0=state.W0.at[1].set(0.0), W1=state.W1.at[:, 2].set(0.0))
    new = jax.jit(jb.solver.sweep)(state, problem, config)
    for leaf in new:
        assert np.all(np.isfinite(np.asarray(leaf)))


@pytest.mark.parametrize("progress", [pytest.param(False, marks=pytest.mark.slow), True])
def test_sequential_and_vmapped_restarts_agree(planted, progress):
    """``batch="map"`` (the CPU default) and ``batch="vmap"`` run the same restarts: each
    restart of either equals its own single solve, and the best one is the same."""
    _, X, J, F = planted
    config = SMALL
    key = jax.random.key(11)
    kw = dict(key=key, restarts=SMALL_RESTARTS, progress=(lambda *a: None) if progress else False, progress_every=7)
    seq = jb.decouple(J, F, X, config, batch="map", **kw)
    vec = jb.decouple(J, F, X, config, batch="vmap", **kw)
    for k, sub in enumerate(jax.random.split(key, SMALL_RESTARTS)):
        single = jax.jit(jb.solver.solve)(sub, jb.solver.Problem(jb.solver.DenseJacobian(J), F, X), config)
        for res in (seq, vec):
            np.testing.assert_allclose(res.restarts.objective[k], single.objective, rtol=1e-8)
    assert int(seq.best_restart) == int(vec.best_restart)
    np.testing.assert_allclose(_call(seq.model, X), _call(vec.model, X), rtol=1e-7, atol=1e-10)
    with pytest.raises(ValueError, match="batch"):
        jb.decouple(J, F, X, config, key=key, restarts=2, batch="pmap")


@pytest.mark.parametrize("rank", [
    # r < n: test_sequential_and_vmapped_restarts_agree (default run) vmaps that form's restarts
    pytest.param(2, marks=pytest.mark.slow), 4, 7], ids=["r<n", "r=n", "r>n"])
def test_vmapped_sweeps_on_either_side_of_the_output_width(rank):
    """The R update takes three forms (certified pinv at r < n, eigh at r = n, the n × n Gram at
    r > n), each a batch-polymorphic solve: a sweep vmapped over restarts' states runs every form
    (its batching rule) and equals each state's own sweep."""
    S, n, m = 40, 4, 3
    rng = np.random.default_rng(rank)
    J, F, X = (jnp.asarray(rng.standard_normal(shape)) for shape in ((S, n, m), (S, n), (S, m)))
    problem = jb.solver.Problem(jb.solver.DenseJacobian(J), F, X)
    config = jb.CMTFConfig(rank=rank, basis=jb.BSpline(3, 4))
    keys = jax.random.split(jax.random.key(3), 2)
    states = jax.jit(jax.vmap(jb.solver.init_state, in_axes=(0, None, None)))(keys, problem, config)
    batched = jax.jit(jax.vmap(jb.solver.sweep, in_axes=(0, None, None)))(states, problem, config)
    one = jax.jit(jb.solver.sweep)
    for k in range(2):
        alone = one(jax.tree_util.tree_map(lambda a, k=k: a[k], states), problem, config)
        for got, want in zip(batched, alone):
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want), rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- small solves


def _psd(eigenvalues, seed=0):
    """``Q diag(w) Qᵀ`` with a random orthogonal ``Q`` (numpy), and ``Q``."""
    r = len(eigenvalues)
    Q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((r, r)))
    return (Q * np.asarray(eigenvalues)) @ Q.T, Q


def _min_norm_oracle(eigenvalues, Q, B):
    """``B A⁺`` from the exact eigendecomposition, eigenvalues at or below ``r eps max|λ|``
    dropped (``numpy.linalg.pinv(A, rcond=r eps, hermitian=True)``'s rule)."""
    w = np.asarray(eigenvalues)
    keep = w > len(w) * np.finfo(np.float64).eps * np.abs(w).max()
    inv = np.where(keep, 1 / np.where(keep, w, 1), 0)
    return ((B @ Q) * inv) @ Q.T


SPECTRA = {
    "well conditioned": np.linspace(1.0, 3.0, 12),
    "ill conditioned, nothing cut": np.geomspace(1.0, 1e-11, 12),
    "exactly rank deficient": np.r_[np.linspace(1.0, 2.0, 9), 0.0, 0.0, 0.0],
    "below the cutoff": np.r_[np.linspace(1.0, 2.0, 10), 1e-10, 1e-17],
}


@pytest.mark.parametrize("solve", ["pinv_solve", "pinv_solve_by_eigh"])
@pytest.mark.parametrize("spectrum", SPECTRA, ids=str)
def test_pinv_solve_is_the_minimum_norm_solution(spectrum, solve):
    """Cholesky where the condition number certifies ``A⁺ = A⁻¹``, the eigendecomposition with
    pinv's cutoff elsewhere (always, for the R update at r >= n): each equals the exact
    minimum-norm solution, alone and vmapped."""
    pinv_solve = getattr(linalg, solve)
    w = SPECTRA[spectrum]
    A, Q = _psd(w)
    B = np.random.default_rng(1).standard_normal((5, len(w)))
    expected = _min_norm_oracle(w, Q, B)
    # Rounding in A is amplified by 1/λ_min of the kept eigenvalues (1e10 at most here).
    rtol = 1e-12 if w[w > 0].min() > 0.5 else 1e-4
    got = np.asarray(pinv_solve(jnp.asarray(A), jnp.asarray(B)))
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * np.abs(expected).max())
    # vmapped over a batch mixing this matrix with a well-conditioned one
    A2, Q2 = _psd(SPECTRA["well conditioned"], seed=3)
    both = jax.vmap(pinv_solve)(jnp.stack([A, A2]), jnp.stack([B, B]))
    np.testing.assert_allclose(np.asarray(both[0]), expected, rtol=rtol, atol=rtol * np.abs(expected).max())
    np.testing.assert_allclose(np.asarray(both[1]), _min_norm_oracle(SPECTRA["well conditioned"], Q2, B), rtol=1e-12)


@pytest.mark.parametrize("singular", [(1.0, 2.0, 3.0, 0.5), (1.0, 2.0, 0.0, 0.0), (1.0, 2.0, 3e-9, 1e-17)],
                         ids=["full row rank", "rank deficient", "one kept, one cut"])
def test_the_wide_r_update_is_the_minimum_norm_least_squares(singular):
    """R ← F W1 (W1ᵀW1)⁺ at r > n goes through the n × n Gram (``_wide_least_squares``): it
    equals numpy's minimum-norm least squares with the r × r Gram's cutoff (eigenvalues at or
    below r·eps of the largest, i.e. singular values below √(r·eps) of the largest), alone and
    vmapped, and the r × r eigendecomposition it replaces."""
    n, r, S = 4, 9, 6
    rng = np.random.default_rng(5)
    U, _ = np.linalg.qr(rng.standard_normal((n, n)))
    V, _ = np.linalg.qr(rng.standard_normal((r, n)))
    W1 = U @ np.diag(singular) @ V.T  # (n, r), singular values as given
    F = rng.standard_normal((S, n))
    pinv = np.linalg.pinv(W1, rcond=np.sqrt(r * np.finfo(np.float64).eps))  # (r, n)
    expected = F @ pinv.T  # each row: argmin ‖F_s − W1 R_sᵀ‖ of least norm
    got = np.asarray(linalg.wide_least_squares(jnp.asarray(W1), jnp.asarray(F)))
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    old = np.asarray(linalg.pinv_solve_by_eigh(jnp.asarray(W1.T @ W1), jnp.asarray(F @ W1)))
    np.testing.assert_allclose(got, old, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
    both = jax.vmap(linalg.wide_least_squares)(jnp.stack([W1, 2 * W1]), jnp.stack([F, F]))
    np.testing.assert_allclose(np.asarray(both[0]), expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    np.testing.assert_allclose(np.asarray(both[1]), expected / 2, rtol=1e-9, atol=1e-9 * np.abs(expected).max())


@pytest.mark.parametrize("mu", [1e-4, 1e-30])
def test_tikhonov_solve_matches_numpy(mu):
    """``B (A + μI)⁻¹``: by Cholesky when it succeeds, by LU when rounding makes ``A + μI``
    indefinite (a singular ``A`` with ``μ`` far below its rounding)."""
    A, _ = _psd(np.r_[np.linspace(1.0, 2.0, 8), 0.0, 0.0])
    A = A + 1e-15 * np.random.default_rng(2).standard_normal(A.shape)  # rounding-level asymmetry
    B = np.random.default_rng(1).standard_normal((4, 10))
    expected = np.linalg.solve(A + mu * np.eye(10), B.T).T
    got = np.asarray(linalg.tikhonov_solve(jnp.asarray(A), jnp.asarray(B), jnp.asarray(mu)))
    if mu > 1e-10:
        np.testing.assert_allclose(got, expected, rtol=1e-8)
    else:  # a numerically singular system: the solve is finite and solves it as well as LU does
        residual = lambda X: np.linalg.norm(X @ (A + mu * np.eye(10)) - B)  # noqa: E731
        assert np.all(np.isfinite(got))
        assert residual(got) <= 10 * residual(expected) + 1e-8
