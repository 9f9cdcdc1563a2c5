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

The interface is the :class:`JacobianOperator` protocol; any pytree with these methods works in
:func:`jaxbsd.decouple` and :func:`jaxbsd.solve` (a low-rank 𝒥 given by its factors, a
Jacobian computed on the fly, ...). Two implementations ship: :class:`DenseJacobian` holds ``J`` of shape ``(S, n, m)``;
:class:`StructuredJacobian` holds an MLP's Jacobian ``J[s] = V1 diag(D[s]) V0`` as the rank-H
CPD ``[[V1, V0ᵀ, D]]`` and computes everything from ``H``-sized products, never forming the
``S·n·m`` tensor. Both are pytrees, so they pass through ``jit``/``vmap`` like arrays.

The Gram identities used throughout (``∘`` elementwise):
``‖[[A, B, C]]‖² = Σ (AᵀA ∘ BᵀB ∘ CᵀC)`` and
``⟨[[A, B, C]], [[A', B', C']]⟩ = Σ (AᵀA' ∘ BᵀB' ∘ CᵀC')``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

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


@runtime_checkable
class JacobianOperator(Protocol):
    """What the solver needs of the Jacobian tensor ``𝒥`` of shape ``(S, n, m)``.

    An operator is a pytree (a ``NamedTuple`` of arrays is the easy way) so it passes through
    ``jit``/``vmap``; ``r`` below is the rank of the decoupling. ``U`` is whatever
    :meth:`contract_w1` returns: the solver only hands it back to the two ``*_from`` methods.
    """

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(S, n, m)``."""

    @property
    def dtype(self) -> Any:
        """Floating dtype of the operator's arrays."""

    def mttkrp_w1(self, W0: jax.Array, G: jax.Array) -> jax.Array:
        """``M1 = Σ_s J[s] W0ᵀ diag(G[s])``: ``W0 (r, m)``, ``G (S, r)`` -> ``(n, r)``."""

    def contract_w1(self, W1: jax.Array) -> Any:
        """A contraction of ``𝒥`` with ``W1 (n, r)`` shared by the next two methods."""

    def mttkrp_w0_from(self, U: Any, G: jax.Array) -> jax.Array:
        """``M2 = Σ_s J[s]ᵀ W1 diag(G[s])`` from ``U = contract_w1(W1)``: ``(m, r)``."""

    def mttkrp_g_from(self, U: Any, W0: jax.Array) -> jax.Array:
        """``M3[s, i] = W1[:, i]ᵀ J[s] W0[i]ᵀ`` from ``U = contract_w1(W1)``: ``(S, r)``."""

    def sq_norm(self) -> jax.Array:
        """``‖𝒥‖²`` (a scalar)."""

    def residual_sq_norm(self, W0: jax.Array, W1: jax.Array, G: jax.Array) -> jax.Array:
        """``‖𝒥 − [[W1, W0ᵀ, G]]‖²``, accurate even when the fit is (nearly) exact."""

    def map_samples(self, fn: Callable[[jax.Array], jax.Array]) -> "JacobianOperator":
        """The operator with ``fn`` applied to every array whose leading axis is the sample
        axis ``S`` (how the driver shards samples over devices)."""


def _per_rank_matvec(V: jax.Array, G: jax.Array) -> jax.Array:
    """``out[i, a] = Σ_s V[i, s, a] G[s, i]`` for ``V (r, S, k)``, ``G (S, r)``: ``(r, k)``."""
    return jax.lax.dot_general(V, G.T, (((1,), (1,)), ((0,), (0,))))


class DenseJacobian(NamedTuple):
    """A materialized Jacobian tensor.

    Attributes:
      J: ``(S, n, m)``, ``J[s] = ∂f/∂x (x⁽ˢ⁾)``.
      J_out: ``(n, S, m)``, the same tensor output-axis first, or ``None``.
      J_in: ``(m, S, n)``, the same tensor input-axis first, or ``None``.

    With the two extra layouts both contractions of a sweep are plain row-major GEMMs,
    ``W1ᵀ (r, n) @ (n, S·m)`` and ``W0 (r, m) @ (m, S·n)``, that write the rank-major blocks
    the reductions after them want; :meth:`from_dense` fills them in (:func:`jaxbsd.problem`
    does), at three times the memory. Without them the same products run as einsums.
    """

    J: jax.Array
    J_out: jax.Array | None = None
    J_in: jax.Array | None = None

    @classmethod
    def from_dense(cls, J: jax.Array) -> "DenseJacobian":
        """``J (S, n, m)`` with the two layouts the solver's GEMMs read."""
        J = jnp.asarray(J)
        return cls(J, jnp.transpose(J, (1, 0, 2)), jnp.transpose(J, (2, 0, 1)))

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.J.shape)

    @property
    def dtype(self):
        return self.J.dtype

    # Layout: the contractions produce rank-major ``(r, S, ·)`` blocks straight from one 2-d
    # GEMM each, so the per-rank reductions that follow are batched matrix–vector products
    # over contiguous rows (on CPU 5x faster than reducing an ``(S, ·, r)`` array over ``S``).

    def mttkrp_w1(self, W0, G):
        S, n, m = self.J.shape
        if self.J_in is None:
            V = jnp.einsum("sab,ib->isa", self.J, W0)
        else:
            V = (W0 @ self.J_in.reshape(m, S * n)).reshape(-1, S, n)  # V[i, s, a] = Σ_b W0[i, b] J[s, a, b]
        return _per_rank_matvec(V, G).T  # Σ_s V[i, s, a] G[s, i]

    def mttkrp_w0(self, W1, G):
        return self.mttkrp_w0_from(self.contract_w1(W1), G)

    def mttkrp_g(self, W0, W1):
        return self.mttkrp_g_from(self.contract_w1(W1), W0)

    def contract_w1(self, W1):
        """``U[i, s, b] = Σ_a W1[a, i] J[s, a, b]``, shape ``(r, S, m)``."""
        if self.J_out is None:
            return jnp.einsum("sab,ai->isb", self.J, W1)
        n, S, m = self.J_out.shape
        return (W1.T @ self.J_out.reshape(n, S * m)).reshape(-1, S, m)

    def mttkrp_w0_from(self, U, G):
        return _per_rank_matvec(U, G).T  # Σ_s U[i, s, b] G[s, i]

    def mttkrp_g_from(self, U, W0):
        # Σ_b U[i, s, b] W0[i, b]
        return jax.lax.dot_general(U, W0, (((2,), (1,)), ((0,), (0,)))).T

    def sq_norm(self):
        return jnp.sum(self.J**2)

    def residual_sq_norm(self, W0, W1, G):
        # Direct difference: exact to rounding even when the fit is (nearly) perfect.
        J_hat = jnp.einsum("ai,si,ib->sab", W1, G, W0)
        return jnp.sum((self.J - J_hat) ** 2)

    def dense(self):
        return self.J

    def map_samples(self, fn):
        # fn acts on a leading sample axis; the other layouts carry S second.
        second = lambda x: None if x is None else jnp.swapaxes(fn(jnp.swapaxes(x, 0, 1)), 0, 1)  # noqa: E731
        return DenseJacobian(fn(self.J), second(self.J_out), second(self.J_in))


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

    def map_samples(self, fn):
        return self._replace(D=fn(self.D))


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
