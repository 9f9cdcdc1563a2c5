"""The Jacobian tensor behind one small interface: MTTKRPs, norms and residuals.

The solver never touches the Jacobian tensor directly; it only needs

* ``mttkrp_w1(W0, G)``: ``M1 = Σ_s J[s] W0ᵀ diag(G[s])``, shape ``(n, r)``;
* ``mttkrp_w0(W1, G)``: ``M2 = Σ_s J[s]ᵀ W1 diag(G[s])``, shape ``(m, r)``;
* ``mttkrp_g(W0, W1)``: ``M3[s, i] = W1[:, i]ᵀ J[s] W0[i]ᵀ``, shape ``(S, r)``;
* ``contract_w1(W1)``, ``mttkrp_w0_from(U, G)``, ``mttkrp_g_from(U, W0)``: the same ``M2`` and
  ``M3`` from one shared contraction ``U`` of ``𝒥`` with ``W1`` (a sweep updates ``W0`` and then
  ``G`` with the same ``W1``, so the dense path pays for the ``S·n·m·r`` product once, not twice);
* ``sq_norm()``: ``‖𝒥‖²``;
* ``residual_sq_norm(W0, W1, G)``: ``‖𝒥 − [[W1, W0ᵀ, G]]‖²``.

Two implementations share it: :class:`DenseJacobian` holds ``J`` of shape ``(S, n, m)``;
:class:`StructuredJacobian` holds an MLP's Jacobian ``J[s] = V1 diag(D[s]) V0`` as the rank-H
CPD ``[[V1, V0ᵀ, D]]`` and computes everything from ``H``-sized products, never forming the
``S·n·m`` tensor. Both are pytrees, so they pass through ``jit``/``vmap`` like arrays.

The Gram identities used throughout (``∘`` elementwise):
``‖[[A, B, C]]‖² = Σ (AᵀA ∘ BᵀB ∘ CᵀC)`` and
``⟨[[A, B, C]], [[A', B', C']]⟩ = Σ (AᵀA' ∘ BᵀB' ∘ CᵀC')``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Union

import jax
import jax.numpy as jnp

__all__ = [
    "DenseJacobian",
    "StructuredJacobian",
    "JacobianOperator",
    "mlp_jacobian",
    "cpd_sq_norm",
]


def cpd_sq_norm(W0: jax.Array, W1: jax.Array, G: jax.Array) -> jax.Array:
    """``‖[[W1, W0ᵀ, G]]‖²`` from ``r × r`` Gram matrices."""
    return jnp.sum((W1.T @ W1) * (W0 @ W0.T) * (G.T @ G))


class DenseJacobian(NamedTuple):
    """A materialized Jacobian tensor.

    Attributes:
      J: ``(S, n, m)``, ``J[s] = ∂f/∂x (x⁽ˢ⁾)``.
    """

    J: jax.Array

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.J.shape)

    @property
    def dtype(self):
        return self.J.dtype

    def mttkrp_w1(self, W0, G):
        return jnp.einsum("sab,ib,si->ai", self.J, W0, G, optimize=True)

    def mttkrp_w0(self, W1, G):
        return self.mttkrp_w0_from(self.contract_w1(W1), G)

    def mttkrp_g(self, W0, W1):
        return self.mttkrp_g_from(self.contract_w1(W1), W0)

    def contract_w1(self, W1):
        """``U[s, b, i] = Σ_a J[s, a, b] W1[a, i]``, shape ``(S, m, r)``."""
        return jnp.einsum("sab,ai->sbi", self.J, W1)

    def mttkrp_w0_from(self, U, G):
        return jnp.einsum("sbi,si->bi", U, G)

    def mttkrp_g_from(self, U, W0):
        return jnp.einsum("sbi,ib->si", U, W0)

    def sq_norm(self):
        return jnp.sum(self.J**2)

    def residual_sq_norm(self, W0, W1, G):
        # Direct difference: exact to rounding even when the fit is (nearly) perfect.
        J_hat = jnp.einsum("ai,si,ib->sab", W1, G, W0)
        return jnp.sum((self.J - J_hat) ** 2)

    def dense(self):
        return self.J


class StructuredJacobian(NamedTuple):
    """Jacobian of ``f(x) = V1 h(V0 x + b0) + b1`` as the CPD ``[[V1, V0ᵀ, D]]``.

    ``J[s] = V1 diag(D[s]) V0`` with ``D = h'(X V0ᵀ + b0)``; rank ``H`` (the hidden width).

    Attributes:
      V1: ``(n, H)`` output weights.
      V0: ``(H, m)`` input weights.
      D: ``(S, H)`` activation derivatives at the samples.
    """

    V1: jax.Array
    V0: jax.Array
    D: jax.Array

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.D.shape[0], self.V1.shape[0], self.V0.shape[1])

    @property
    def dtype(self):
        return self.D.dtype

    def mttkrp_w1(self, W0, G):
        return self.V1 @ ((self.V0 @ W0.T) * (self.D.T @ G))

    def mttkrp_w0(self, W1, G):
        return self.mttkrp_w0_from(self.contract_w1(W1), G)

    def mttkrp_g(self, W0, W1):
        return self.mttkrp_g_from(self.contract_w1(W1), W0)

    def contract_w1(self, W1):
        """``V1ᵀ W1``, shape ``(H, r)``: all of ``W1`` the two MTTKRPs below need."""
        return self.V1.T @ W1

    def mttkrp_w0_from(self, U, G):
        return self.V0.T @ (U * (self.D.T @ G))

    def mttkrp_g_from(self, U, W0):
        return self.D @ (U * (self.V0 @ W0.T))

    def sq_norm(self):
        return cpd_sq_norm(self.V0, self.V1, self.D)

    def residual_sq_norm(self, W0, W1, G):
        # ‖J‖² − 2⟨J, Ĵ⟩ + ‖Ĵ‖²; clamped since rounding can push a perfect fit below zero.
        inner = jnp.sum(G * self.mttkrp_g(W0, W1))
        value = self.sq_norm() - 2 * inner + cpd_sq_norm(W0, W1, G)
        return jnp.maximum(value, 0)

    def dense(self):
        return jnp.einsum("ah,sh,hb->sab", self.V1, self.D, self.V0)


JacobianOperator = Union[DenseJacobian, StructuredJacobian]


def mlp_jacobian(
    X: jax.Array,
    V0: jax.Array,
    b0: jax.Array,
    V1: jax.Array,
    activation_derivative: Callable[[jax.Array], jax.Array],
) -> StructuredJacobian:
    """Structured Jacobian of ``f(x) = V1 h(V0 x + b0) + b1`` at the rows of ``X``.

    Args:
      X: ``(S, m)`` sampling points.
      V0: ``(H, m)``; b0: ``(H,)``; V1: ``(n, H)`` (the output bias does not enter ``J``).
      activation_derivative: ``h'``, elementwise.

    Returns:
      A :class:`StructuredJacobian` with ``D = h'(X V0ᵀ + b0)`` of shape ``(S, H)``.
    """
    return StructuredJacobian(V1=V1, V0=V0, D=activation_derivative(X @ V0.T + b0[None, :]))
