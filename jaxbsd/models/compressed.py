"""The modules the compared methods put in a model: low-rank and pruned MLPs, two-layer and gated.

Each is an ordinary Flax NNX module (jittable, differentiable) with plain-int widths, and its
parameter count is what :mod:`jaxbsd.compression` prices a rank by. Built by
:mod:`jaxbsd.compression.baselines` (truncated SVD, DRONE, structured pruning); saved and loaded
by :mod:`jaxbsd.checkpoint` in factored form.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.models.layers import ACTIVATIONS

__all__ = ["check_gated", "on_device", "linear_of", "activation_fn", "LowRankLinear", "LowRankMLP", "PrunedMLP", "LowRankGatedMLP", "PrunedGatedMLP", "lowrank_mlp_params", "pruned_mlp_params", "lowrank_gated_params", "pruned_gated_params"]


def on_device(a, dtype=None) -> jax.Array:
    """``jnp.asarray(a, dtype)`` without a compiled copy: a host array is cast on the host and put
    on the device (``jnp.asarray`` of a numpy array compiles a program per shape)."""
    if isinstance(a, jax.Array):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return jax.device_put(np.asarray(a, dtype))


def linear_of(K, b=None) -> nnx.Linear:
    """An ``nnx.Linear`` holding the kernel ``K (d_in, d_out)`` and the bias ``b`` (None: a layer
    without one) in ``K``'s dtype, built without drawing the initial values it would overwrite
    (each draw compiles a program per shape)."""
    d_in, d_out = K.shape
    dtype = np.dtype(K.dtype)
    layer = nnx.eval_shape(lambda: nnx.Linear(d_in, d_out, use_bias=b is not None, param_dtype=dtype,
                                              rngs=nnx.Rngs(0)))
    layer.kernel = nnx.Param(on_device(K))
    if b is not None:
        layer.bias = nnx.Param(on_device(b, dtype))
    return layer


def activation_fn(activation: str | Callable) -> Callable:
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, got {activation!r}")
        return ACTIVATIONS[activation]
    if not callable(activation):
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, got {activation!r}")
    return activation


class LowRankLinear(nnx.Module):
    """``x ↦ (x A) B + bias``: ``(..., in) -> (..., out)`` with ``A (in, k)``, ``B (k, out)``.

    ``bias`` is ``(out,)``, or None for a layer without one (the gated baselines keep the
    original's biases only where it has them: Llama's projections have none).
    """

    def __init__(self, A: jax.Array, B: jax.Array, bias: jax.Array | None):
        if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
            raise ValueError(f"A (in, k) and B (k, out) must share k, got {A.shape} and {B.shape}")
        if bias is not None and bias.shape != (B.shape[1],):
            raise ValueError(f"bias must have shape ({B.shape[1]},) or be None, got {bias.shape}")
        self.A = nnx.Param(jnp.asarray(A))
        self.B = nnx.Param(jnp.asarray(B))
        self.bias = nnx.Param(jnp.asarray(bias)) if bias is not None else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = (x @ self.A[...]) @ self.B[...]
        if self.bias is None:
            return y
        return y + self.bias[...].reshape((1,) * (y.ndim - 1) + (-1,))


class LowRankMLP(nnx.Module):
    """An MLP whose two dense layers are low-rank: ``fc2(h(fc1(x)))``, ``(..., m) -> (..., n)``.

    ``activation`` is a name in :data:`~jaxbsd.models.layers.ACTIVATIONS` (plain data, so the
    module can be rebuilt from its attributes) or, for activations jaxbsd does not name, an
    elementwise callable. ``in_features``, ``hidden``, ``out_features`` and ``rank`` are plain
    int attributes (the rank of ``fc1``; both layers share it when built by this module).
    """

    def __init__(self, fc1: LowRankLinear, fc2: LowRankLinear, activation: str | Callable):
        if isinstance(activation, str):
            if activation not in ACTIVATIONS:
                raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, got {activation!r}")
        elif not callable(activation):
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, got {activation!r}")
        if fc1.B[...].shape[1] != fc2.A[...].shape[0]:
            raise ValueError(f"fc1 output ({fc1.B[...].shape[1]}) must match fc2 input ({fc2.A[...].shape[0]})")
        self.fc1, self.fc2, self.activation = fc1, fc2, activation
        self.in_features = int(fc1.A[...].shape[0])
        self.hidden = int(fc1.B[...].shape[1])
        self.out_features = int(fc2.B[...].shape[1])
        self.rank = int(fc1.A[...].shape[1])

    @property
    def ranks(self) -> tuple[int, int]:
        return self.fc1.A[...].shape[1], self.fc2.A[...].shape[1]

    def __call__(self, x: jax.Array) -> jax.Array:
        h = ACTIVATIONS[self.activation] if isinstance(self.activation, str) else self.activation
        return self.fc2(h(self.fc1(x)))


class PrunedMLP(nnx.Module):
    """An ordinary, narrower MLP ``fc2(h(fc1(x)))``: ``(..., m) -> (..., k) -> (..., n)``.

    Built by :func:`prune_mlp` from the ``k`` kept hidden units of a wider MLP (``fc1``: their
    columns of the first kernel and their biases; ``fc2``: the refitted output layer). Both
    layers are plain ``nnx.Linear`` with biases; ``activation`` is a name in
    :data:`~jaxbsd.models.layers.ACTIVATIONS` (or an elementwise callable, which cannot be
    saved as data). ``in_features``, ``hidden`` (= ``rank`` = ``k``) and ``out_features`` are
    plain ints.
    """

    def __init__(self, K1: jax.Array, b1: jax.Array, K2: jax.Array, b2: jax.Array, activation: str | Callable):
        if isinstance(activation, str):
            if activation not in ACTIVATIONS:
                raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, got {activation!r}")
        elif not callable(activation):
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, got {activation!r}")
        if K1.ndim != 2 or K2.ndim != 2 or K1.shape[1] != K2.shape[0] or K1.shape[1] < 1:
            raise ValueError(f"K1 (m, k) and K2 (k, n) must share k >= 1, got {K1.shape} and {K2.shape}")
        if b1.shape != (K1.shape[1],) or b2.shape != (K2.shape[1],):
            raise ValueError(f"b1 must have shape ({K1.shape[1]},) and b2 ({K2.shape[1]},), got {b1.shape}, {b2.shape}")
        (m, k), n = K1.shape, K2.shape[1]
        self.fc1, self.fc2 = linear_of(K1, b1), linear_of(K2, b2)
        self.activation = activation
        self.in_features, self.hidden, self.out_features = int(m), int(k), int(n)
        self.rank = int(k)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = ACTIVATIONS[self.activation] if isinstance(self.activation, str) else self.activation
        return self.fc2(h(self.fc1(x)))


class LowRankGatedMLP(nnx.Module):
    """A gated MLP whose three dense layers are low-rank: ``down(h(gate(x)) ⊙ up(x))``.

    ``gate``, ``up`` (``m -> H``) and ``down`` (``H -> n``) are :class:`LowRankLinear` (each with
    a bias only where the original layer had one); ``activation`` is a name in
    :data:`~jaxbsd.models.layers.ACTIVATIONS` (or an elementwise callable, which cannot be saved
    as data). ``in_features``, ``hidden``, ``out_features`` and ``rank`` are plain ints.
    """

    def __init__(self, gate: LowRankLinear, up: LowRankLinear, down: LowRankLinear, activation: str | Callable):
        activation_fn(activation)
        H = gate.B[...].shape[1]
        if up.B[...].shape[1] != H or up.A[...].shape[0] != gate.A[...].shape[0] or down.A[...].shape[0] != H:
            raise ValueError(f"gate and up must map the same m -> H and down take H = {H}, got "
                             f"{gate.A[...].shape[0]} -> {H}, {up.A[...].shape[0]} -> {up.B[...].shape[1]}, "
                             f"{down.A[...].shape[0]} -> {down.B[...].shape[1]}")
        self.gate, self.up, self.down, self.activation = gate, up, down, activation
        self.in_features = int(gate.A[...].shape[0])
        self.hidden = int(H)
        self.out_features = int(down.B[...].shape[1])
        self.rank = int(gate.A[...].shape[1])

    @property
    def ranks(self) -> tuple[int, int, int]:
        return tuple(int(layer.A[...].shape[1]) for layer in (self.gate, self.up, self.down))

    def kernels(self):
        """The dense equivalent ``(Kg, bg, Ku, bu, Kd, bd)`` (``A B`` products; biases or None)."""
        out = []
        for layer in (self.gate, self.up, self.down):
            out += [layer.A[...] @ layer.B[...], None if layer.bias is None else layer.bias[...]]
        return tuple(out)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(activation_fn(self.activation)(self.gate(x)) * self.up(x))


class PrunedGatedMLP(nnx.Module):
    """An ordinary, narrower gated MLP ``down(h(gate(x)) ⊙ up(x))``, ``(..., m) -> (..., k) -> (..., n)``.

    Built by :func:`prune_gated_mlp`: ``gate``, ``up`` and ``down`` are plain ``nnx.Linear``,
    each with a bias exactly where the original layer had one. ``in_features``, ``hidden``
    (= ``rank`` = ``k``) and ``out_features`` are plain ints.
    """

    def __init__(self, Kg, bg, Ku, bu, Kd, bd, activation: str | Callable):
        activation_fn(activation)
        m, k, n = check_gated(Kg, bg, Ku, bu, Kd, bd)
        if k < 1:
            raise ValueError(f"a pruned gated MLP keeps k >= 1 hidden units, got kernels {Kg.shape}, {Kd.shape}")
        self.gate, self.up, self.down = linear_of(Kg, bg), linear_of(Ku, bu), linear_of(Kd, bd)
        self.activation = activation
        self.in_features, self.hidden, self.out_features = int(m), int(k), int(n)
        self.rank = int(k)

    def kernels(self):
        """``(Kg, bg, Ku, bu, Kd, bd)`` (biases None where there are none)."""
        out = []
        for layer in (self.gate, self.up, self.down):
            out += [layer.kernel[...], None if layer.bias is None else layer.bias[...]]
        return tuple(out)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(activation_fn(self.activation)(self.gate(x)) * self.up(x))


def lowrank_mlp_params(m: int, hidden: int, rank: int, n: int | None = None) -> int:
    """Parameters of a :class:`LowRankMLP` ``m -> hidden -> n`` (default ``n = m``).

    Two rank-``k`` layers plus both biases: ``k (m + H) + k (H + n) + H + n``.
    """
    n = m if n is None else n
    return rank * (m + hidden) + rank * (hidden + n) + hidden + n


def pruned_mlp_params(m: int, k: int, n: int) -> int:
    """Parameters of a :class:`PrunedMLP` ``m -> k -> n`` with both biases: ``k (m + 1) + n (k + 1)``."""
    return k * (m + 1) + n * (k + 1)


def lowrank_gated_params(m: int, hidden: int, rank: int, n: int, biases: tuple[bool, bool, bool]) -> int:
    """Parameters of a :class:`LowRankGatedMLP` ``m -> hidden -> n`` at ``rank``: three rank-``k``
    layers, ``2 k (m + H) + k (H + n)``, plus the biases ``biases = (gate, up, down)`` has."""
    bg, bu, bd = (bool(b) for b in biases)
    return 2 * rank * (m + hidden) + rank * (hidden + n) + hidden * (bg + bu) + n * bd


def pruned_gated_params(m: int, k: int, n: int, biases: tuple[bool, bool, bool]) -> int:
    """Parameters of a :class:`PrunedGatedMLP` keeping ``k`` units: ``2 k m + k n`` plus the
    biases ``biases = (gate, up, down)`` has (``k`` each for gate and up, ``n`` for down)."""
    bg, bu, bd = (bool(b) for b in biases)
    return 2 * k * m + k * n + k * (bg + bu) + n * bd


def check_gated(Kg, bg, Ku, bu, Kd, bd) -> tuple[int, int, int]:
    """``(m, H, n)`` of gated kernels ``Kg, Ku (m, H)``, ``Kd (H, n)``; ``ValueError`` otherwise."""
    if Kg.ndim != 2 or Ku.shape != Kg.shape or Kd.ndim != 2 or Kd.shape[0] != Kg.shape[1]:
        raise ValueError(f"Kg, Ku (m, H) and Kd (H, n) must share m and H, got {Kg.shape}, {Ku.shape}, {Kd.shape}")
    (m, H), n = Kg.shape, Kd.shape[1]
    for name, b, size in (("bg", bg, H), ("bu", bu, H), ("bd", bd, n)):
        if b is not None and tuple(b.shape) != (size,):
            raise ValueError(f"{name} must have shape ({size},) or be None, got {tuple(b.shape)}")
    return m, H, n
