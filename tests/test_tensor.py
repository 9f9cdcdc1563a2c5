"""Jacobian operators: MTTKRPs and norms against explicit unfoldings and Khatri–Rao products."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbsd as jb


def _sample(f, X):
    """``jb.solver.sample(f, X)`` as one compiled program (run eagerly, each of its ops compiles on its own)."""
    return jax.jit(lambda X: jb.solver.sample(f, X))(X)


def khatri_rao(A, B):
    """Column-wise Kronecker product: (I, r), (K, r) -> (I K, r)."""
    return np.einsum("ir,kr->ikr", A, B).reshape(-1, A.shape[1])


@pytest.fixture
def operators():
    rng = np.random.default_rng(0)
    S, n, m, H = 7, 3, 4, 5
    V1, V0, D = rng.normal(size=(n, H)), rng.normal(size=(H, m)), rng.normal(size=(S, H))
    structured = jb.solver.StructuredJacobian(jnp.asarray(V1), jnp.asarray(V0), jnp.asarray(D))
    J = np.einsum("ah,sh,hb->sab", V1, D, V0)
    return J, [jb.solver.DenseJacobian(jnp.asarray(J)), structured]


def test_mttkrps_match_explicit_unfoldings(operators):
    J, ops = operators
    S, n, m = J.shape
    r = 3
    rng = np.random.default_rng(1)
    W0, W1, G = rng.normal(size=(r, m)), rng.normal(size=(n, r)), rng.normal(size=(S, r))
    # paper's unfoldings of 𝒥 (n × m × S): mode 1 rows index n, columns (m, S) pairs, etc.
    T = np.transpose(J, (1, 2, 0))  # (n, m, S)
    unfold1 = T.reshape(n, m * S)  # columns ordered (m, S) with S fastest
    unfold2 = np.transpose(T, (1, 0, 2)).reshape(m, n * S)
    unfold3 = np.transpose(T, (2, 0, 1)).reshape(S, n * m)
    M1 = unfold1 @ khatri_rao(W0.T, G)
    M2 = unfold2 @ khatri_rao(W1, G)
    M3 = unfold3 @ khatri_rao(W1, W0.T)
    for op in ops:
        np.testing.assert_allclose(op.mttkrp_w1(jnp.asarray(W0), jnp.asarray(G)), M1, rtol=1e-10)
        np.testing.assert_allclose(op.mttkrp_w0(jnp.asarray(W1), jnp.asarray(G)), M2, rtol=1e-10)
        np.testing.assert_allclose(op.mttkrp_g(jnp.asarray(W0), jnp.asarray(W1)), M3, rtol=1e-10)
        U = op.contract_w1(jnp.asarray(W1))  # the sweep's shared contraction
        np.testing.assert_allclose(op.mttkrp_w0_from(U, jnp.asarray(G)), M2, rtol=1e-10)
        np.testing.assert_allclose(op.mttkrp_g_from(U, jnp.asarray(W0)), M3, rtol=1e-10)
        np.testing.assert_allclose(op.sq_norm(), np.sum(J**2), rtol=1e-10)
        J_hat = np.einsum("ai,si,ib->sab", W1, G, W0)
        np.testing.assert_allclose(
            op.residual_sq_norm(jnp.asarray(W0), jnp.asarray(W1), jnp.asarray(G)), np.sum((J - J_hat) ** 2), rtol=1e-10
        )
        assert op.shape == J.shape


def test_structured_residual_of_an_exact_fit_is_not_negative(operators):
    _, ops = operators
    s = ops[1]
    # the structured tensor is itself a rank-H CPD: fitting it with its own factors is exact
    value = s.residual_sq_norm(s.V0, s.V1, s.D)
    assert 0.0 <= float(value) <= 1e-9 * float(s.sq_norm())


def test_mlp_jacobian_matches_autodiff():
    rng = np.random.default_rng(0)  # numpy draws: no eager jax.random compiles
    V0, b0, V1, X = (jnp.asarray(rng.normal(size=shape)) for shape in [(6, 3), (6,), (2, 6), (9, 3)])
    J, _ = _sample(lambda x: V1 @ jax.nn.gelu(V0 @ x + b0, approximate=False), X)
    dgelu = jax.vmap(jax.vmap(jax.grad(lambda z: jax.nn.gelu(z, approximate=False))))
    # one compiled program (eagerly, each jnp op inside would compile on its own)
    dense = jax.jit(lambda *a: jb.solver.jacobians.mlp_jacobian(*a, dgelu).dense())(X, V0, b0, V1)
    np.testing.assert_allclose(dense, J, rtol=1e-10, atol=1e-12)
