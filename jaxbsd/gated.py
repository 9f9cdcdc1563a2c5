"""The Jacobian of a gated MLP (SwiGLU, GeGLU) as a :class:`~jaxbsd.tensor.JacobianOperator`.

A gated MLP (Llama, Qwen, Gemma, Mistral) computes ::

    y = V1 (a(Vg x + bg) ⊙ (Vu x + bu)) + b1

with ``Vg``, ``Vu`` of shape ``(H, m)`` (gate and up projections), ``V1`` of shape ``(n, H)``
(down projection) and an elementwise activation ``a`` (SiLU for SwiGLU, GELU for GeGLU). Its
Jacobian at a sample ``x⁽ˢ⁾`` is ::

    J[s] = V1 diag(Dg[s]) Vg + V1 diag(Du[s]) Vu,
    Dg = a'(X Vgᵀ + bg) ⊙ (X Vuᵀ + bu),   Du = a(X Vgᵀ + bg)          (both (S, H)),

the sum of two CPDs ``[[V1, Vgᵀ, Dg]] + [[V1, Vuᵀ, Du]]`` that share their first factor.
:class:`GatedJacobian` computes everything the solver needs from these factors and never forms
the ``(S, n, m)`` tensor (``S·n·m`` floats: 16 GiB in float32 at d = 4096 with S = 256).

Costs, for rank ``r`` (the sweep's three MTTKRPs together):

* ``mttkrp_w1``: ``2·H·m·r + 2·S·H·r + n·H·r`` multiply-adds;
* ``contract_w1``: ``n·H·r``; ``mttkrp_w0_from``: ``2·S·H·r + 2·H·m·r``;
  ``mttkrp_g_from``: ``2·H·m·r + 2·S·H·r``;

so a sweep is ``O(H·r·(S + n + m))``, against ``O(S·n·m·r)`` for the dense tensor. The
squared norm is the only quadratic-in-``H`` part: with the Gram identity ::

    ‖𝒥‖² = Σ V1ᵀV1 ∘ (DgᵀDg ∘ VgVgᵀ + 2 DgᵀDu ∘ VgVuᵀ + DuᵀDu ∘ VuVuᵀ)

(the cross term pairs the two CPDs; ``V1ᵀV1`` is symmetric, so the two mixed terms are equal),
it costs ``H²·(n + 3m + 3S)`` multiply-adds and is computed in blocks of rows of these
``H × H`` matrices (``O(block·H)`` memory, never ``O(H²)`` when ``H > block``). No form linear
in ``H`` exists for general shapes: ``Σ_s ‖V1 M_s‖²`` with ``M_s = diag(Dg[s]) Vg +
diag(Du[s]) Vu`` costs ``S·n·m·H``. Inside :func:`jaxbsd.solve` / :func:`jaxbsd.decouple`
``‖𝒥‖²`` is loop-invariant and XLA computes it once, before the loop (checked in the compiled
HLO on CPU, blocked form included); a lone :func:`jaxbsd.sweep` call pays it every time. At
``H = 3d``, ``S = 128``, ``r = 64`` one evaluation costs ``9d²(4d + 384)`` multiply-adds and the
MTTKRPs of one sweep ``192d(8d + 768)``: the norm is worth ``d/43`` sweeps' products, a one-off
cost that a solve of hundreds of sweeps amortizes.

This module is part of the solver core: arrays in, arrays out, no Flax. To build the operator
from three ``nnx.Linear`` layers (kernels ``(in, out)``), transpose their kernels:
``gated_mlp_jacobian(X, gate.kernel[...].T, up.kernel[...].T, down.kernel[...].T, jax.nn.silu,
gate_bias=gate.bias[...], up_bias=up.bias[...])``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxbsd.tensor import cpd_sq_norm

__all__ = ["GatedJacobian", "gated_mlp", "gated_mlp_jacobian"]

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

        As for :class:`~jaxbsd.tensor.StructuredJacobian`, the rounding floor is about
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
