"""The Jacobian tensor behind one small interface: dense, structured (an MLP's) and gated operators.

The solver never touches the Jacobian tensor directly; it only needs

* ``mttkrp_w1(W0, G)``: ``M1 = Σ_s J[s] W0ᵀ diag(G[s])``, shape ``(n, r)``;
* ``mttkrp_w0(W1, G)``: ``M2 = Σ_s J[s]ᵀ W1 diag(G[s])``, shape ``(m, r)``;
* ``mttkrp_g(W0, W1)``: ``M3[s, i] = W1[:, i]ᵀ J[s] W0[i]ᵀ``, shape ``(S, r)``;
* ``contract_w1(W1)``, ``mttkrp_w0_from(U, G)``, ``mttkrp_g_from(U, W0)``: the same ``M2`` and
  ``M3`` from one shared contraction ``U`` of ``𝒥`` with ``W1`` (a sweep updates ``W0`` and then
  ``G`` with the same ``W1``, so the dense path pays for the ``S·n·m·r`` product once, not twice);
* ``sq_norm()``: ``‖𝒥‖²``; ``residual_sq_norm(W0, W1, G)``: ``‖𝒥 − [[W1, W0ᵀ, G]]‖²``.

The interface is the :class:`JacobianOperator` protocol; any pytree with these methods works in
``jaxbsd.decouple`` and ``jaxbsd.solver.solve``. Three implementations ship, all pytrees:

* :class:`DenseJacobian` holds ``J`` of shape ``(S, n, m)``;
* :class:`StructuredJacobian` holds an MLP's ``J[s] = V1 diag(D[s]) V0`` as the rank-H CPD
  ``[[V1, V0ᵀ, D]]`` and computes everything from ``H``-sized products;
* :class:`GatedJacobian` holds a gated MLP's (SwiGLU, GeGLU: ``y = V1 (a(Vg x + bg) ⊙ (Vu x + bu)) + b1``)
  ``J[s] = V1 diag(Dg[s]) Vg + V1 diag(Du[s]) Vu`` with ``Dg = a'(X Vgᵀ + bg) ⊙ (X Vuᵀ + bu)`` and
  ``Du = a(X Vgᵀ + bg)`` (both ``(S, H)``): two CPDs sharing their first factor. A sweep costs
  ``O(H·r·(S + n + m))`` against ``O(S·n·m·r)`` dense; its squared norm, the one part quadratic in
  ``H`` (``‖𝒥‖² = Σ V1ᵀV1 ∘ (DgᵀDg ∘ VgVgᵀ + 2 DgᵀDu ∘ VgVuᵀ + DuᵀDu ∘ VuVuᵀ)``), is computed in
  blocks of :data:`GRAM_BLOCK` rows, and is loop-invariant inside a solve.

None forms the ``S·n·m`` tensor but the dense one. The Gram identities used throughout
(``∘`` elementwise): ``‖[[A, B, C]]‖² = Σ (AᵀA ∘ BᵀB ∘ CᵀC)`` and
``⟨[[A, B, C]], [[A', B', C']]⟩ = Σ (AᵀA' ∘ BᵀB' ∘ CᵀC')``. Arrays in, arrays out, no Flax: to build
a gated operator from ``nnx.Linear`` layers (kernels ``(in, out)``), transpose their kernels.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DenseJacobian", "StructuredJacobian", "GatedJacobian", "JacobianOperator", "mlp_jacobian",
           "gated_mlp", "gated_mlp_jacobian", "cpd_sq_norm"]


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


# --------------------------------------------------------------------------- gated MLPs

#: Rows of the ``H × H`` Gram matrices formed at a time by :meth:`GatedJacobian.sq_norm`.
GRAM_BLOCK = 1024


class GatedJacobian(NamedTuple):
    """Jacobian of the gated MLP ``f(x) = V1 (a(Vg x + bg) ⊙ (Vu x + bu)) + b1``.

    ``J[s] = V1 diag(Dg[s]) Vg + V1 diag(Du[s]) Vu``: two CPDs of rank ``H`` (the hidden width)
    sharing ``V1``. Build it with :func:`gated_mlp_jacobian`, which validates; this constructor
    does not (:func:`jaxbsd.problem` checks the shapes with :meth:`check_shapes`).

    Attributes:
      V1: ``(n, H)`` down-projection weights.
      Vg: ``(H, m)`` gate-projection weights.
      Vu: ``(H, m)`` up-projection weights.
      Dg: ``(S, H)``, ``a'(z) ⊙ v`` at the samples (``z = Vg x + bg``, ``v = Vu x + bu``).
      Du: ``(S, H)``, ``a(z)`` at the samples.
    """

    V1: jax.Array
    Vg: jax.Array
    Vu: jax.Array
    Dg: jax.Array
    Du: jax.Array

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.Dg.shape[0], self.V1.shape[0], self.Vg.shape[1])

    @property
    def dtype(self):
        return self.Dg.dtype

    @property
    def hidden(self) -> int:
        """``H``."""
        return self.V1.shape[1]

    def check_shapes(self) -> None:
        """Raise ``ValueError`` (naming ``J`` and the factors) if the factors disagree on
        ``S``, ``H`` or ``m``."""
        shapes = {name: tuple(np.shape(x)) for name, x in zip(self._fields, self)}
        if any(len(s) != 2 for s in shapes.values()):
            raise ValueError(f"J: gated factors must all be 2-d, got shapes {shapes}")
        n, H = shapes["V1"]
        S, m = shapes["Dg"][0], shapes["Vg"][1]
        expected = {"V1": (n, H), "Vg": (H, m), "Vu": (H, m), "Dg": (S, H), "Du": (S, H)}
        if shapes != expected:
            raise ValueError(
                f"J: gated factors disagree on their shapes: got {shapes}, expected "
                f"V1 (n, H), Vg (H, m), Vu (H, m), Dg (S, H), Du (S, H) = {expected}"
            )

    # ---------------------------------------------------------------- the solver's products

    def mttkrp_w1(self, W0, G):
        """``Σ_s J[s] W0ᵀ diag(G[s]) = V1 (Vg W0ᵀ ∘ DgᵀG + Vu W0ᵀ ∘ DuᵀG)``: ``(n, r)``."""
        return self.V1 @ ((self.Vg @ W0.T) * (self.Dg.T @ G) + (self.Vu @ W0.T) * (self.Du.T @ G))

    def mttkrp_w0(self, W1, G):
        return self.mttkrp_w0_from(self.contract_w1(W1), G)

    def mttkrp_g(self, W0, W1):
        return self.mttkrp_g_from(self.contract_w1(W1), W0)

    def contract_w1(self, W1):
        """``V1ᵀ W1``, shape ``(H, r)``: shared by both terms and both MTTKRPs below."""
        return self.V1.T @ W1

    def mttkrp_w0_from(self, U, G):
        """``Vgᵀ (U ∘ DgᵀG) + Vuᵀ (U ∘ DuᵀG)``: ``(m, r)``."""
        return self.Vg.T @ (U * (self.Dg.T @ G)) + self.Vu.T @ (U * (self.Du.T @ G))

    def mttkrp_g_from(self, U, W0):
        """``Dg (U ∘ Vg W0ᵀ) + Du (U ∘ Vu W0ᵀ)``: ``(S, r)``."""
        return self.Dg @ (U * (self.Vg @ W0.T)) + self.Du @ (U * (self.Vu @ W0.T))

    def sq_norm(self):
        """``‖𝒥‖²`` by Gram matrices, ``H²·(n + 3m + 3S)`` multiply-adds, in row blocks of
        :data:`GRAM_BLOCK` (see the module docstring)."""
        return _gated_sq_norm(self.V1, self.Vg, self.Vu, self.Dg, self.Du, GRAM_BLOCK)

    def inner(self, other: GatedJacobian) -> jax.Array:
        """``⟨𝒥, 𝒥'⟩ = Σ_s tr(J[s]ᵀ J'[s])`` with another gated Jacobian at the same samples
        (e.g. of a low-rank replacement: ``‖𝒥 − 𝒥'‖² = ‖𝒥‖² − 2⟨𝒥, 𝒥'⟩ + ‖𝒥'‖²``), in
        ``H·H'·(n + 4m + 4S)`` multiply-adds, blocked like :meth:`sq_norm`."""
        if not isinstance(other, GatedJacobian) or other.shape != self.shape:
            raise ValueError(f"other must be a GatedJacobian of shape {self.shape}, got "
                             f"{type(other).__name__} {getattr(other, 'shape', None)}")
        return _gated_inner(self, other, GRAM_BLOCK)

    def residual_sq_norm(self, W0, W1, G):
        """``‖𝒥 − [[W1, W0ᵀ, G]]‖² = ‖𝒥‖² − 2⟨𝒥, 𝒥̂⟩ + ‖𝒥̂‖²`` with ``⟨𝒥, 𝒥̂⟩ = Σ G ∘ M3``.

        As for :class:`~jaxbsd.solver.jacobians.StructuredJacobian`, the rounding floor is about
        ``eps · ‖𝒥‖²`` (the difference is never formed); the value is clamped at zero.
        """
        inner = jnp.sum(G * self.mttkrp_g(W0, W1))
        return jnp.maximum(self.sq_norm() - 2 * inner + cpd_sq_norm(W0, W1, G), 0)

    def dense(self):
        """The ``(S, n, m)`` tensor (for tests and small problems only)."""
        return jnp.einsum("ah,sh,hb->sab", self.V1, self.Dg, self.Vg) + jnp.einsum(
            "ah,sh,hb->sab", self.V1, self.Du, self.Vu
        )

    def map_samples(self, fn):
        return self._replace(Dg=fn(self.Dg), Du=fn(self.Du))


@functools.partial(jax.jit, static_argnames="block")  # one program, not a dispatch per Gram product
def _gated_sq_norm(V1, Vg, Vu, Dg, Du, block: int) -> jax.Array:
    """``Σ V1ᵀV1 ∘ (DgᵀDg ∘ VgVgᵀ + 2 DgᵀDu ∘ VgVuᵀ + DuᵀDu ∘ VuVuᵀ)``, ``block`` rows at a time."""

    def rows(v1, vg, vu, dg, du):
        # Rows h of the H × H Grams, against all columns k.
        terms = (dg.T @ Dg) * (vg @ Vg.T) + 2 * (dg.T @ Du) * (vg @ Vu.T) + (du.T @ Du) * (vu @ Vu.T)
        return jnp.sum((v1.T @ V1) * terms)

    return _sum_over_row_blocks(rows, V1, Vg, Vu, Dg, Du, block)


@functools.partial(jax.jit, static_argnames="block")
def _gated_inner(a: GatedJacobian, b: GatedJacobian, block: int) -> jax.Array:
    """``⟨𝒥_a, 𝒥_b⟩``: four CPD inner products, ``block`` hidden units of ``a`` at a time."""

    def rows(v1, vg, vu, dg, du):
        terms = ((dg.T @ b.Dg) * (vg @ b.Vg.T) + (dg.T @ b.Du) * (vg @ b.Vu.T)
                 + (du.T @ b.Dg) * (vu @ b.Vg.T) + (du.T @ b.Du) * (vu @ b.Vu.T))
        return jnp.sum((v1.T @ b.V1) * terms)

    return _sum_over_row_blocks(rows, a.V1, a.Vg, a.Vu, a.Dg, a.Du, block)


def _sum_over_row_blocks(rows, V1, Vg, Vu, Dg, Du, block: int) -> jax.Array:
    """``Σ rows(V1[:, b], Vg[b], Vu[b], Dg[:, b], Du[:, b])`` over blocks ``b`` of hidden units."""
    H = V1.shape[1]
    if H <= block:
        return rows(V1, Vg, Vu, Dg, Du)
    # Zero-padded hidden units contribute nothing (their rows of every Gram vanish).
    count = math.ceil(H / block)
    pad = count * block - H
    split_cols = lambda A: jnp.pad(A, ((0, 0), (0, pad))).reshape(A.shape[0], count, block).transpose(1, 0, 2)  # noqa: E731
    split_rows = lambda A: jnp.pad(A, ((0, pad), (0, 0))).reshape(count, block, A.shape[1])  # noqa: E731
    parts = jax.lax.map(
        lambda a: rows(*a), (split_cols(V1), split_rows(Vg), split_rows(Vu), split_cols(Dg), split_cols(Du))
    )
    return jnp.sum(parts)


# --------------------------------------------------------------------------- constructors


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _matrix(name: str, x: Any, ndim: int, doc: str) -> jax.Array:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        x = np.asarray(x)
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {doc}, got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    return jnp.asarray(x)


@jax.jit
def _all_finite(arrays: list[jax.Array]) -> jax.Array:
    """``(len(arrays),)`` booleans, one reduction per array in one program."""
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in arrays])


def _check_finite(named: dict[str, jax.Array], what: str = "contains NaN or inf") -> None:
    concrete = {name: x for name, x in named.items() if _is_concrete(x)}
    if not concrete:
        return
    for name, finite in zip(concrete, np.asarray(_all_finite(list(concrete.values())))):
        if not finite:
            raise ValueError(f"{name} {what}")


def _validated(X, gate, up, down, gate_bias, up_bias, down_bias=None):
    """Arrays of one dtype with matching shapes; ``ValueError`` naming the argument."""
    X = _matrix("X", X, 2, "(S, m)")
    gate = _matrix("gate", gate, 2, "(H, m)")
    up = _matrix("up", up, 2, "(H, m)")
    down = _matrix("down", down, 2, "(n, H)")
    m = X.shape[1]
    H = gate.shape[0]
    if gate.shape != (H, m):
        raise ValueError(f"gate must have shape (H, m) with m = {m} (from X {X.shape}), got {gate.shape}")
    if up.shape != (H, m):
        raise ValueError(f"up must have shape (H, m) = ({H}, {m}) like gate, got {up.shape}")
    if down.shape[1] != H:
        raise ValueError(f"down must have shape (n, H) with H = {H} (from gate {gate.shape}), got {down.shape}")
    named = {"X": X, "gate": gate, "up": up, "down": down}
    for name, b, size in (("gate_bias", gate_bias, H), ("up_bias", up_bias, H), ("down_bias", down_bias, down.shape[0])):
        if b is not None:
            b = _matrix(name, b, 1, f"({size},)")
            if b.shape != (size,):
                raise ValueError(f"{name} must have shape ({size},), got {b.shape}")
            named[name] = b
    dtypes = {str(x.dtype) for x in named.values()}
    if len(dtypes) != 1:
        raise ValueError(f"X, gate, up, down and the biases must share one floating dtype, got {sorted(dtypes)}")
    _check_finite(named)
    return named


def _pre_activations(X, gate, up, gate_bias, up_bias):
    z = X @ gate.T
    v = X @ up.T
    if gate_bias is not None:
        z = z + gate_bias[None, :]
    if up_bias is not None:
        v = v + up_bias[None, :]
    return z, v


def gated_mlp_jacobian(
    X: jax.Array,
    gate: jax.Array,
    up: jax.Array,
    down: jax.Array,
    activation: Callable[[jax.Array], jax.Array],
    *,
    gate_bias: jax.Array | None = None,
    up_bias: jax.Array | None = None,
    activation_derivative: Callable[[jax.Array], jax.Array] | None = None,
) -> GatedJacobian:
    """Structured Jacobian of ``f(x) = down (a(gate x + bg) ⊙ (up x + bu)) + bd`` at the rows
    of ``X`` (the output bias ``bd`` does not enter ``J``).

    Args:
      X: ``(S, m)`` sampling points.
      gate: ``(H, m)``; up: ``(H, m)``; down: ``(n, H)``. For ``nnx.Linear`` layers these are
        the transposed kernels (``layer.kernel[...].T``).
      activation: ``a``, elementwise (``jax.nn.silu`` for SwiGLU, ``jax.nn.gelu`` for GeGLU).
      gate_bias, up_bias: ``(H,)`` or ``None`` (no bias, as in Llama/Qwen).
      activation_derivative: ``a'``, elementwise; by default the JVP of ``activation`` along
        ones, computed together with ``a`` in one pass.

    Returns:
      A :class:`GatedJacobian` with ``Dg = a'(z) ⊙ v``, ``Du = a(z)`` of shape ``(S, H)``,
      ``z = X gateᵀ + bg``, ``v = X upᵀ + bu``.

    Raises:
      ValueError: naming the argument, on a shape mismatch, a non-floating or mixed dtype, or
        NaN/inf in the inputs; naming ``activation`` if it is not callable or gives non-finite
        values at the samples. Value checks run only on concrete (not traced) arrays, so the
        function is ``jit``-able.
    """
    if not callable(activation):
        raise ValueError(f"activation must be an elementwise callable, got {activation!r}")
    if activation_derivative is not None and not callable(activation_derivative):
        raise ValueError(f"activation_derivative must be a callable or None, got {activation_derivative!r}")
    a = _validated(X, gate, up, down, gate_bias, up_bias)
    z, v = _pre_activations(a["X"], a["gate"], a["up"], a.get("gate_bias"), a.get("up_bias"))
    if activation_derivative is None:
        # Elementwise a: the JVP along ones is a' entrywise, and it comes with a(z) itself.
        az, daz = jax.jvp(activation, (z,), (jnp.ones_like(z),))
    else:
        az, daz = activation(z), activation_derivative(z)
    if az.shape != z.shape or daz.shape != z.shape:
        raise ValueError(f"activation must be elementwise: maps {z.shape} to {az.shape} (derivative {daz.shape})")
    jac = GatedJacobian(V1=a["down"], Vg=a["gate"], Vu=a["up"], Dg=(daz * v).astype(z.dtype), Du=az.astype(z.dtype))
    _check_finite({"activation": jac.Du, "activation_derivative": jac.Dg}, "gives NaN or inf at the samples")
    return jac


def gated_mlp(
    X: jax.Array,
    gate: jax.Array,
    up: jax.Array,
    down: jax.Array,
    activation: Callable[[jax.Array], jax.Array],
    *,
    gate_bias: jax.Array | None = None,
    up_bias: jax.Array | None = None,
    down_bias: jax.Array | None = None,
) -> jax.Array:
    """``F = (a(X gateᵀ + bg) ⊙ (X upᵀ + bu)) downᵀ + bd``: ``(S, m) -> (S, n)`` (the outputs
    :func:`jaxbsd.decouple` needs beside :func:`gated_mlp_jacobian`). Validated the same way."""
    if not callable(activation):
        raise ValueError(f"activation must be an elementwise callable, got {activation!r}")
    a = _validated(X, gate, up, down, gate_bias, up_bias, down_bias)
    z, v = _pre_activations(a["X"], a["gate"], a["up"], a.get("gate_bias"), a.get("up_bias"))
    F = (activation(z) * v) @ a["down"].T
    return F if down_bias is None else F + a["down_bias"][None, :]
