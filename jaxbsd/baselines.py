"""Baselines for MLP compression: truncated SVD, DRONE, structured pruning, and budget helpers.

SVD and DRONE replace each dense layer ``y = x K + b`` of a block's MLP (``K`` of shape ``(in, out)``) by
``y = (x A) B + b`` with ``A (in, k)`` and ``B (k, out)``, keeping the activation and biases:

* **SVD** (Hajimolahoseini et al. 2022): ``A B`` is the best rank-``k`` approximation of ``K``
  in the Frobenius norm (Eckart–Young), split as ``U_k Σ_k^½`` and ``Σ_k^½ V_kᵀ``.
* **DRONE** (Chen et al. 2021): data-aware, ``A B = argmin_{rank k} ‖X K − X K'‖_F`` for the
  layer's real inputs ``X``. With the thin SVD ``X = U Σ Vᵀ`` (rank ρ) this is
  ``K' = V Σ⁻¹ [Σ Vᵀ K]_k``, ``[·]_k`` the truncated SVD: closed form, no iterations.
* **Pruning** (:func:`prune_mlp`): keep the ``k`` hidden units of largest data-aware
  importance ``‖V1[:, j]‖ · RMS(h_j)`` on calibration tokens and refit the output layer by least
  squares; the result is an ordinary narrower MLP (:class:`PrunedMLP`).
* **Gated MLPs** ``down(h(gate(x)) ⊙ up(x))`` get the same three: each of the three kernels at
  rank ``k`` (:func:`lowrank_gated_mlp`: SVD, or DRONE with ``x`` for gate and up and the hidden
  units ``h(gate x) ⊙ up x`` for down), or ``k`` kept hidden units with ``down`` refitted
  (:func:`prune_gated_mlp`). Biases are kept exactly where the original has them.

The parameter helpers pick each method's rank so that its count fits a budget; counts are those
of the modules actually placed in the model (no dense weights are kept).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from typing import Any, Callable, NamedTuple

import numpy as np

from jaxbsd.solver.metrics import params_bsd
from jaxbsd.models.layers import ACTIVATIONS, MLP

__all__ = [
    "LowRankLinear",
    "LowRankMLP",
    "truncated_svd_factors",
    "drone_factors",
    "svd_mlp",
    "drone_mlp",
    "lowrank_mlp",
    "lowrank_mlp_params",
    "lowrank_rank_for_budget",
    "bsd_rank_for_budget",
    "PrunedMLP",
    "Pruning",
    "prune_importance",
    "prune_weights",
    "prune_mlp",
    "pruned_mlp_params",
    "LowRankGatedMLP",
    "PrunedGatedMLP",
    "GatedPruning",
    "gated_hidden",
    "lowrank_gated_mlp",
    "lowrank_gated_params",
    "prune_gated_weights",
    "prune_gated_mlp",
    "pruned_gated_params",
]


def _on_device(a, dtype=None) -> jax.Array:
    """``jnp.asarray(a, dtype)`` without a compiled copy: a host array is cast on the host and put
    on the device (``jnp.asarray`` of a numpy array compiles a program per shape)."""
    if isinstance(a, jax.Array):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return jax.device_put(np.asarray(a, dtype))


def _linear_of(K, b=None) -> nnx.Linear:
    """An ``nnx.Linear`` holding the kernel ``K (d_in, d_out)`` and the bias ``b`` (None: a layer
    without one) in ``K``'s dtype, built without drawing the initial values it would overwrite
    (each draw compiles a program per shape)."""
    d_in, d_out = K.shape
    dtype = np.dtype(K.dtype)
    layer = nnx.eval_shape(lambda: nnx.Linear(d_in, d_out, use_bias=b is not None, param_dtype=dtype,
                                              rngs=nnx.Rngs(0)))
    layer.kernel = nnx.Param(_on_device(K))
    if b is not None:
        layer.bias = nnx.Param(_on_device(b, dtype))
    return layer


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


def truncated_svd_factors(K: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Best rank-``k`` factors ``A (in, k)``, ``B (k, out)`` of ``K (in, out)``."""
    _check_rank(k, K)
    return _truncated_svd_factors(K, k)


@functools.partial(jax.jit, static_argnames="k")  # one program per shape and rank, not a dispatch per op
def _truncated_svd_factors(K: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    U, s, Vt = jnp.linalg.svd(K, full_matrices=False)
    root = jnp.sqrt(s[:k])
    return U[:, :k] * root[None, :], root[:, None] * Vt[:k]


def drone_factors(X: jax.Array, K: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """DRONE: rank-``k`` ``A B`` minimizing ``‖X K − X A B‖_F`` for inputs ``X (S, in)``.

    Directions of the input space that ``X`` never visits (singular values below
    ``sqrt(eps) · σ_max``) get no weight: the minimum-norm minimizer.
    """
    _check_rank(k, K)
    if X.ndim != 2 or X.shape[1] != K.shape[0]:
        raise ValueError(f"X must have shape (S, {K.shape[0]}), got {X.shape}")
    return _drone_factors(X, K, k)


@functools.partial(jax.jit, static_argnames="k")
def _drone_factors(X: jax.Array, K: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    _, sx, Vxt = jnp.linalg.svd(X, full_matrices=False)  # X = U diag(sx) Vxt
    keep = sx > jnp.sqrt(jnp.finfo(X.dtype).eps) * sx[0]
    inv = jnp.where(keep, 1 / jnp.where(keep, sx, 1), 0)
    M = sx[:, None] * (Vxt @ K)  # Σ Vᵀ K: what X K looks like in X's own coordinates
    P, sm, Qt = jnp.linalg.svd(M, full_matrices=False)
    root = jnp.sqrt(sm[:k])
    A = Vxt.T @ (inv[:, None] * (P[:, :k] * root[None, :]))
    return A, root[:, None] * Qt[:k]


def _check_rank(k: int, K: jax.Array) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= min(K.shape):
        raise ValueError(f"rank must be an int in [1, {min(K.shape)}], got {k!r}")


def kernels(mlp: MLP):
    """``((fc1 kernel, fc1 bias), (fc2 kernel, fc2 bias))`` of an :class:`MLP`."""
    return (mlp.fc1.kernel[...], mlp.fc1.bias[...]), (mlp.fc2.kernel[...], mlp.fc2.bias[...])


def lowrank_mlp(
    K1: jax.Array,
    b1: jax.Array | None,
    K2: jax.Array,
    b2: jax.Array | None,
    activation: str | Callable,
    rank: int,
    *,
    method: str = "svd",
    X: jax.Array | None = None,
) -> LowRankMLP:
    """Low-rank replacement of any two-layer MLP ``h(x K1 + b1) K2 + b2``.

    Args:
      K1: ``(m, H)``; b1: ``(H,)`` or None (no bias: zeros, so the count stays uniform).
      K2: ``(H, n)``; b2: ``(n,)`` or None.
      activation: a name in ``ACTIVATIONS`` or an elementwise callable.
      rank: ``k`` of both layers, in ``[1, min(m, H, n)]``.
      method: ``"svd"`` (truncated SVD) or ``"drone"`` (data-aware; needs ``X``).
      X: ``(S, m)`` real inputs of the MLP (DRONE only).

    Returns:
      A :class:`LowRankMLP` ``(..., m) -> (..., n)`` with
      :func:`lowrank_mlp_params` ``(m, H, rank, n)`` parameters.
    """
    if method not in ("svd", "drone"):
        raise ValueError(f"method must be 'svd' or 'drone', got {method!r}")
    if K1.ndim != 2 or K2.ndim != 2 or K1.shape[1] != K2.shape[0]:
        raise ValueError(f"K1 (m, H) and K2 (H, n) must share H, got {K1.shape} and {K2.shape}")
    b1 = jnp.zeros((K1.shape[1],), K1.dtype) if b1 is None else b1
    b2 = jnp.zeros((K2.shape[1],), K2.dtype) if b2 is None else b2
    if method == "svd":
        f1, f2 = truncated_svd_factors(K1, rank), truncated_svd_factors(K2, rank)
    else:
        if X is None:
            raise ValueError("X (the MLP's real inputs) is required for method 'drone'")
        h = ACTIVATIONS[activation] if isinstance(activation, str) else activation
        hidden = h(X @ K1 + b1[None, :])
        f1, f2 = drone_factors(X, K1, rank), drone_factors(hidden, K2, rank)
    return LowRankMLP(LowRankLinear(*f1, b1), LowRankLinear(*f2, b2), activation)


def svd_mlp(mlp: MLP, rank: int) -> LowRankMLP:
    """Truncated SVD of both dense layers of ``mlp`` at the same ``rank``."""
    (K1, b1), (K2, b2) = kernels(mlp)
    return lowrank_mlp(K1, b1, K2, b2, mlp.activation, rank, method="svd")


def drone_mlp(mlp: MLP, X: jax.Array, rank: int) -> LowRankMLP:
    """DRONE on both dense layers of ``mlp``; their inputs are ``X (S, m)`` and ``h(fc1(X))``."""
    (K1, b1), (K2, b2) = kernels(mlp)
    return lowrank_mlp(K1, b1, K2, b2, mlp.activation, rank, method="drone", X=X)


def lowrank_mlp_params(m: int, hidden: int, rank: int, n: int | None = None) -> int:
    """Parameters of a :class:`LowRankMLP` ``m -> hidden -> n`` (default ``n = m``).

    Two rank-``k`` layers plus both biases: ``k (m + H) + k (H + n) + H + n``.
    """
    n = m if n is None else n
    return rank * (m + hidden) + rank * (hidden + n) + hidden + n


def lowrank_rank_for_budget(m: int, hidden: int, budget: int, n: int | None = None) -> int:
    """Largest rank whose :class:`LowRankMLP` has at most ``budget`` parameters (>= 1)."""
    n = m if n is None else n
    rank = (budget - hidden - n) // (m + 2 * hidden + n)
    if rank < 1:
        raise ValueError(f"budget {budget} is below a rank-1 low-rank MLP ({lowrank_mlp_params(m, hidden, 1, n)})")
    return int(rank)


def bsd_rank_for_budget(m: int, n: int, dof: int, budget: int) -> int:
    """Largest rank whose decoupled MLP (``P_BSD = r (m + n + ν)``) fits ``budget`` (>= 1)."""
    rank = budget // (m + n + dof)
    if rank < 1:
        raise ValueError(f"budget {budget} is below a rank-1 decoupling ({params_bsd(m, n, 1, dof)})")
    assert params_bsd(m, n, rank, dof) <= budget
    return int(rank)


# ----------------------------------------------------------------------------- structured pruning


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
        self.fc1, self.fc2 = _linear_of(K1, b1), _linear_of(K2, b2)
        self.activation = activation
        self.in_features, self.hidden, self.out_features = int(m), int(k), int(n)
        self.rank = int(k)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = ACTIVATIONS[self.activation] if isinstance(self.activation, str) else self.activation
        return self.fc2(h(self.fc1(x)))


class Pruning(NamedTuple):
    """What :func:`prune_weights` returns (host ``numpy`` arrays, in ``K1``'s dtype).

    Attributes:
      kept: ``(k,)`` indices of the kept hidden units, ascending.
      importance: ``(H,)`` importance of every hidden unit (see :func:`prune_importance`).
      K1: ``(m, k)`` the kept columns of the first kernel; b1: ``(k,)`` their biases.
      K2: ``(k, n)`` the refitted output kernel; b2: ``(n,)`` the refitted output bias.
    """

    kept: np.ndarray
    importance: np.ndarray
    K1: np.ndarray
    b1: np.ndarray
    K2: np.ndarray
    b2: np.ndarray


def pruned_mlp_params(m: int, k: int, n: int) -> int:
    """Parameters of a :class:`PrunedMLP` ``m -> k -> n`` with both biases: ``k (m + 1) + n (k + 1)``."""
    return k * (m + 1) + n * (k + 1)


def _hidden(K1, b1, activation, X) -> np.ndarray:
    """``h(X K1 + b1)`` as a float64 host array ``(N, H)``."""
    h = ACTIVATIONS[activation] if isinstance(activation, str) else activation
    K1 = jnp.asarray(K1)
    z = jnp.asarray(X, K1.dtype) @ K1 + (0 if b1 is None else jnp.asarray(b1, K1.dtype)[None, :])
    return np.asarray(h(z), np.float64)


def prune_importance(K1: jax.Array, b1: jax.Array | None, K2: jax.Array, activation: str | Callable,
                     X: jax.Array) -> np.ndarray:
    """Data-aware importance of each hidden unit: ``‖V1[:, j]‖₂ · RMS_tokens(h_j)``.

    ``V1 = K2ᵀ`` is the output weight matrix and ``h_j(x) = h(x K1[:, j] + b1[j])`` the unit's
    activation on the calibration tokens ``X (N, m)``. The product is, up to the factor
    ``√N``, the Frobenius norm of what unit ``j`` adds to the block's outputs on those tokens,
    ``‖h_j V1[:, j]ᵀ‖_F = ‖h_j‖₂ ‖V1[:, j]‖₂``: the output error of removing that unit alone.
    It is the structured form of the weight-magnitude × input-activation-norm score of Wanda
    (Sun et al., "A Simple and Effective Pruning Approach for Large Language Models", ICLR
    2024: ``|W_ij| · ‖X_j‖₂`` per weight), taken in ℓ2 over the whole output column of a
    hidden unit, as structured LLM pruning does with column norms times input-feature
    statistics (FLAP, An et al., AAAI 2024, which uses the feature's variance and compensates
    the mean with a bias).

    Returns:
      ``(H,)`` float64 scores (>= 0).
    """
    return _importance(_hidden(K1, b1, activation, X), K2)


def _importance(hidden: np.ndarray, K2) -> np.ndarray:
    column = np.linalg.norm(np.asarray(K2, np.float64), axis=1)  # ‖V1[:, j]‖ = ‖K2[j, :]‖
    return column * np.sqrt(np.mean(hidden ** 2, axis=0))


def _check_pruning(k: Any, H: int, X: Any, m: int, refitted: str, ridge: float | None = None) -> int:
    """``k`` as an int after checking it (``1 ≤ k ≤ H``) and the tokens ``X (N, m)`` (finite, at
    least ``k + 1`` of them to refit ``refitted`` with an intercept, unless the refit is
    regularized by ``ridge``). Raises ``ValueError`` naming the argument."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= H:
        raise ValueError(f"k must be an int in [1, {H}], got {k!r}")
    k = int(k)
    if getattr(X, "ndim", None) != 2 or X.shape[1] != m:
        raise ValueError(f"X must have shape (N, {m}), got {getattr(X, 'shape', type(X).__name__)}")
    if ridge is not None and (isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not ridge > 0):
        raise ValueError(f"ridge must be a positive number or None, got {ridge!r}")
    if X.shape[0] < (1 if ridge else k + 1):
        raise ValueError(f"X: refitting {refitted} of {k} kept units needs at least {k + 1} tokens, "
                         f"got {X.shape[0]}")
    if not np.all(np.isfinite(np.asarray(X))):
        raise ValueError("X must be finite")
    return k


def prune_weights(
    K1: jax.Array,
    b1: jax.Array | None,
    K2: jax.Array,
    b2: jax.Array | None,
    activation: str | Callable,
    k: int,
    X: jax.Array,
    Y: jax.Array | None = None,
    *,
    ridge: float | None = None,
) -> Pruning:
    """Structured pruning of an MLP ``h(x K1 + b1) K2 + b2`` to ``k`` hidden units, training-free.

    1. Keep the ``k`` units of largest :func:`prune_importance` on the tokens ``X`` (ties:
       the lower index).
    2. Refit the output layer, weights and bias, by least squares so that the pruned MLP's
       outputs match ``Y`` on ``X``: ``min_{K2', b2'} ‖H_k K2' + 1 b2'ᵀ − Y‖_F`` with ``H_k``
       the kept units' activations. This is the least-squares reconstruction step of channel
       pruning (He et al., "Channel Pruning for Accelerating Very Deep Neural Networks", ICCV
       2017; Luo et al., ThiNet, ICCV 2017). It is solved in float64 on the host, with the
       intercept eliminated by centring (the same solution as ``lstsq`` with a ones column,
       better conditioned), and the minimum-norm solution when ``H_k`` is rank deficient.

    Args:
      K1: ``(m, H)``; b1: ``(H,)`` or None (zeros).
      K2: ``(H, n)``; b2: ``(n,)`` or None (only used for the default ``Y``).
      activation: a name in ``ACTIVATIONS`` or an elementwise callable.
      k: hidden units to keep, in ``[1, H]``.
      X: ``(N, m)`` calibration tokens, ``N >= k + 1`` (the refit has ``k + 1`` coefficients
        per output).
      Y: ``(N, n)`` the outputs to match; default the MLP's own outputs on ``X``.
      ridge: None (plain least squares, ``N >= k + 1`` tokens required), or ``ρ > 0``: the refit
        is regularized towards the original output weights of the kept units,
        ``min ‖H_k K2' + 1 b2'ᵀ − Y‖² + λ ‖K2' − K2[kept]‖²`` with ``λ = ρ · ‖H_k − mean‖²_F / k``
        (``ρ`` times the mean energy of a kept unit on the tokens), which is well posed for any
        ``N >= 1``: with fewer tokens than coefficients the data decide only the directions they
        span and the original weights the rest.

    Returns:
      A :class:`Pruning` (kept indices, importance, and the pruned weights in ``K1``'s dtype).

    Raises:
      ValueError: naming the argument: shapes that do not fit, ``k`` outside ``[1, H]``,
        fewer than ``k + 1`` tokens, non-finite tokens, outputs or refitted weights.
    """
    if K1.ndim != 2 or K2.ndim != 2 or K1.shape[1] != K2.shape[0]:
        raise ValueError(f"K1 (m, H) and K2 (H, n) must share H, got {K1.shape} and {K2.shape}")
    (m, H), n = K1.shape, K2.shape[1]
    if b1 is not None and b1.shape != (H,):
        raise ValueError(f"b1 must have shape ({H},), got {b1.shape}")
    if b2 is not None and b2.shape != (n,):
        raise ValueError(f"b2 must have shape ({n},), got {b2.shape}")
    k = _check_pruning(k, H, X, m, "the output layer", ridge)
    hidden = _hidden(K1, b1, activation, X)
    if Y is None:
        Y = hidden @ np.asarray(K2, np.float64) + (0 if b2 is None else np.asarray(b2, np.float64)[None, :])
    elif getattr(Y, "shape", None) != (X.shape[0], n):
        raise ValueError(f"Y must have shape ({X.shape[0]}, {n}), got {getattr(Y, 'shape', type(Y).__name__)}")
    Y = np.asarray(Y, np.float64)
    if not (np.all(np.isfinite(Y)) and np.all(np.isfinite(hidden))):
        raise ValueError("Y and the hidden activations on X must be finite")
    importance, kept, W, bias = _keep_and_refit(hidden, K2, k, Y, intercept=True, ridge=ridge)
    dtype = np.dtype(K1.dtype)
    b1_kept = np.zeros(k, dtype) if b1 is None else np.asarray(b1)[kept]
    return Pruning(kept=kept, importance=importance, K1=np.asarray(K1)[:, kept].astype(dtype),
                   b1=b1_kept.astype(dtype), K2=W.astype(dtype), b2=bias.astype(dtype))


def _keep_and_refit(hidden: np.ndarray, K2, k: int, Y: np.ndarray, *, intercept: bool, ridge: float | None = None):
    """Keep the ``k`` units of largest importance and refit the output layer by least squares.

    Args:
      hidden: ``(N, H)`` float64 hidden activations; K2: ``(H, n)`` output kernel.
      Y: ``(N, n)`` float64 outputs to match.
      intercept: refit an output bias too (centred least squares); else weights only.
      ridge: None, or the relative weight ``ρ`` of a pull towards the original weights
        ``K2[kept]`` (see :func:`prune_weights`).

    Returns:
      ``(importance (H,), kept (k,) ascending, W (k, n), bias (n,) or None)``, float64.
    """
    importance = _importance(hidden, K2)
    kept = np.sort(np.argsort(-importance, kind="stable")[:k])
    Hk = hidden[:, kept]
    if ridge:
        mean_h = Hk.mean(axis=0) if intercept else np.zeros(k)
        mean_y = Y.mean(axis=0) if intercept else np.zeros(Y.shape[1])
        Hc, Yc = Hk - mean_h[None, :], Y - mean_y[None, :]
        prior = np.asarray(K2, np.float64)[kept]
        lam = max(ridge * float(np.sum(Hc ** 2)) / k, np.finfo(np.float64).tiny)
        W = np.linalg.solve(Hc.T @ Hc + lam * np.eye(k), Hc.T @ Yc + lam * prior)
        bias = mean_y - mean_h @ W if intercept else None
    elif intercept:
        mean_h, mean_y = Hk.mean(axis=0), Y.mean(axis=0)
        W, *_ = np.linalg.lstsq(Hk - mean_h[None, :], Y - mean_y[None, :], rcond=None)
        bias = mean_y - mean_h @ W
    else:
        W, *_ = np.linalg.lstsq(Hk, Y, rcond=None)
        bias = None
    if not (np.all(np.isfinite(W)) and (bias is None or np.all(np.isfinite(bias)))):
        raise ValueError("X: the least-squares refit of the output layer is not finite")
    return importance, kept, W, bias


def prune_mlp(K1, b1, K2, b2, activation: str | Callable, k: int, X: jax.Array,
              Y: jax.Array | None = None, *, ridge: float | None = None) -> tuple[PrunedMLP, Pruning]:
    """:func:`prune_weights` as a module: ``(PrunedMLP, Pruning)``, the module in ``K1``'s dtype
    with :func:`pruned_mlp_params` ``(m, k, n)`` parameters."""
    res = prune_weights(K1, b1, K2, b2, activation, k, X, Y, ridge=ridge)
    return PrunedMLP(*(_on_device(a) for a in (res.K1, res.b1, res.K2, res.b2)), activation), res


# ----------------------------------------------------------------------------- gated MLPs


def _activation_fn(activation: str | Callable) -> Callable:
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, got {activation!r}")
        return ACTIVATIONS[activation]
    if not callable(activation):
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, got {activation!r}")
    return activation


def _check_gated(Kg, bg, Ku, bu, Kd, bd) -> tuple[int, int, int]:
    """``(m, H, n)`` of gated kernels ``Kg, Ku (m, H)``, ``Kd (H, n)``; ``ValueError`` otherwise."""
    if Kg.ndim != 2 or Ku.shape != Kg.shape or Kd.ndim != 2 or Kd.shape[0] != Kg.shape[1]:
        raise ValueError(f"Kg, Ku (m, H) and Kd (H, n) must share m and H, got {Kg.shape}, {Ku.shape}, {Kd.shape}")
    (m, H), n = Kg.shape, Kd.shape[1]
    for name, b, size in (("bg", bg, H), ("bu", bu, H), ("bd", bd, n)):
        if b is not None and tuple(b.shape) != (size,):
            raise ValueError(f"{name} must have shape ({size},) or be None, got {tuple(b.shape)}")
    return m, H, n


def gated_hidden(Kg, bg, Ku, bu, activation: str | Callable, X) -> jax.Array:
    """``h(X Kg + bg) ⊙ (X Ku + bu)``: the hidden units of a gated MLP on ``X (N, m)``, ``(N, H)``
    in ``Kg``'s dtype (absent biases are zero)."""
    h = _activation_fn(activation)
    Kg = jnp.asarray(Kg)
    X = jnp.asarray(X, Kg.dtype)
    z = X @ Kg + (0 if bg is None else jnp.asarray(bg, Kg.dtype)[None, :])
    v = X @ jnp.asarray(Ku, Kg.dtype) + (0 if bu is None else jnp.asarray(bu, Kg.dtype)[None, :])
    return h(z) * v


class LowRankGatedMLP(nnx.Module):
    """A gated MLP whose three dense layers are low-rank: ``down(h(gate(x)) ⊙ up(x))``.

    ``gate``, ``up`` (``m -> H``) and ``down`` (``H -> n``) are :class:`LowRankLinear` (each with
    a bias only where the original layer had one); ``activation`` is a name in
    :data:`~jaxbsd.models.layers.ACTIVATIONS` (or an elementwise callable, which cannot be saved
    as data). ``in_features``, ``hidden``, ``out_features`` and ``rank`` are plain ints.
    """

    def __init__(self, gate: LowRankLinear, up: LowRankLinear, down: LowRankLinear, activation: str | Callable):
        _activation_fn(activation)
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
        return self.down(_activation_fn(self.activation)(self.gate(x)) * self.up(x))


class PrunedGatedMLP(nnx.Module):
    """An ordinary, narrower gated MLP ``down(h(gate(x)) ⊙ up(x))``, ``(..., m) -> (..., k) -> (..., n)``.

    Built by :func:`prune_gated_mlp`: ``gate``, ``up`` and ``down`` are plain ``nnx.Linear``,
    each with a bias exactly where the original layer had one. ``in_features``, ``hidden``
    (= ``rank`` = ``k``) and ``out_features`` are plain ints.
    """

    def __init__(self, Kg, bg, Ku, bu, Kd, bd, activation: str | Callable):
        _activation_fn(activation)
        m, k, n = _check_gated(Kg, bg, Ku, bu, Kd, bd)
        if k < 1:
            raise ValueError(f"a pruned gated MLP keeps k >= 1 hidden units, got kernels {Kg.shape}, {Kd.shape}")
        self.gate, self.up, self.down = _linear_of(Kg, bg), _linear_of(Ku, bu), _linear_of(Kd, bd)
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
        return self.down(_activation_fn(self.activation)(self.gate(x)) * self.up(x))


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


def lowrank_gated_mlp(Kg, bg, Ku, bu, Kd, bd, activation: str | Callable, rank: int, *, method: str = "svd",
                      X: jax.Array | None = None) -> LowRankGatedMLP:
    """Low-rank replacement of a gated MLP ``(h(x Kg + bg) ⊙ (x Ku + bu)) Kd + bd``.

    Args:
      Kg, Ku: ``(m, H)``; Kd: ``(H, n)``; bg, bu: ``(H,)`` or None; bd: ``(n,)`` or None (the
        replacement has a bias exactly where the original has one).
      activation: a name in ``ACTIVATIONS`` or an elementwise callable.
      rank: ``k`` of all three layers, in ``[1, min(m, H, n)]``.
      method: ``"svd"`` (truncated SVD of each kernel) or ``"drone"`` (data-aware: ``Kg`` and
        ``Ku`` for the inputs ``X``, ``Kd`` for the hidden units ``h(X Kg + bg) ⊙ (X Ku + bu)``).
      X: ``(N, m)`` real inputs of the MLP (DRONE only).

    Returns:
      A :class:`LowRankGatedMLP` with :func:`lowrank_gated_params` parameters.
    """
    if method not in ("svd", "drone"):
        raise ValueError(f"method must be 'svd' or 'drone', got {method!r}")
    _activation_fn(activation)
    _check_gated(Kg, bg, Ku, bu, Kd, bd)
    if method == "svd":
        factors = [truncated_svd_factors(K, rank) for K in (Kg, Ku, Kd)]
    else:
        if X is None:
            raise ValueError("X (the MLP's real inputs) is required for method 'drone'")
        X = jnp.asarray(X, Kg.dtype)
        hidden = gated_hidden(Kg, bg, Ku, bu, activation, X)
        factors = [drone_factors(X, Kg, rank), drone_factors(X, Ku, rank), drone_factors(hidden, Kd, rank)]
    layers = [LowRankLinear(A, B, b) for (A, B), b in zip(factors, (bg, bu, bd))]
    return LowRankGatedMLP(*layers, activation)


class GatedPruning(NamedTuple):
    """What :func:`prune_gated_weights` returns (host ``numpy`` arrays, in ``Kg``'s dtype).

    Attributes:
      kept: ``(k,)`` indices of the kept hidden units, ascending.
      importance: ``(H,)`` importance ``‖Kd[j, :]‖ · RMS(hidden_j)`` of every unit.
      Kg, Ku: ``(m, k)`` the kept columns; bg, bu: ``(k,)`` their biases or None.
      Kd: ``(k, n)`` the refitted down kernel; bd: ``(n,)`` its refitted bias, or None.
    """

    kept: np.ndarray
    importance: np.ndarray
    Kg: np.ndarray
    bg: np.ndarray | None
    Ku: np.ndarray
    bu: np.ndarray | None
    Kd: np.ndarray
    bd: np.ndarray | None


def prune_gated_weights(Kg, bg, Ku, bu, Kd, bd, activation: str | Callable, k: int, X: jax.Array,
                        Y: jax.Array | None = None, *, ridge: float | None = None) -> GatedPruning:
    """Structured pruning of a gated MLP to ``k`` hidden units, training-free (as :func:`prune_weights`).

    The hidden units are ``hidden = h(X Kg + bg) ⊙ (X Ku + bu)``. Keep the ``k`` of largest
    ``‖Kd[j, :]‖ · RMS_tokens(hidden_j)`` (ties: the lower index), then refit ``down`` by least
    squares so that the pruned MLP matches ``Y`` on ``X``: weights and bias (centred) if the
    original ``down`` has a bias, weights only if it has none. Float64 on the host.

    Args:
      Kg, Ku: ``(m, H)``; Kd: ``(H, n)``; bg, bu: ``(H,)`` or None; bd: ``(n,)`` or None.
      activation: a name in ``ACTIVATIONS`` or an elementwise callable.
      k: units to keep, in ``[1, H]``.
      X: ``(N, m)`` calibration tokens, ``N >= k + 1``.
      Y: ``(N, n)`` outputs to match; default the MLP's own outputs on ``X``.
      ridge: None, or a regularized refit for few tokens, as in :func:`prune_weights`.

    Raises:
      ValueError: naming the argument, as :func:`prune_weights`.
    """
    m, H, n = _check_gated(Kg, bg, Ku, bu, Kd, bd)
    k = _check_pruning(k, H, X, m, "the down projection", ridge)
    hidden = np.asarray(gated_hidden(Kg, bg, Ku, bu, activation, X), np.float64)
    if Y is None:
        Y = hidden @ np.asarray(Kd, np.float64) + (0 if bd is None else np.asarray(bd, np.float64)[None, :])
    elif getattr(Y, "shape", None) != (X.shape[0], n):
        raise ValueError(f"Y must have shape ({X.shape[0]}, {n}), got {getattr(Y, 'shape', type(Y).__name__)}")
    Y = np.asarray(Y, np.float64)
    if not (np.all(np.isfinite(Y)) and np.all(np.isfinite(hidden))):
        raise ValueError("Y and the hidden units on X must be finite")
    importance, kept, W, bias = _keep_and_refit(hidden, Kd, k, Y, intercept=bd is not None, ridge=ridge)
    dtype = np.dtype(Kg.dtype)
    cut = lambda b: None if b is None else np.asarray(b)[kept].astype(dtype)  # noqa: E731
    return GatedPruning(kept=kept, importance=importance, Kg=np.asarray(Kg)[:, kept].astype(dtype), bg=cut(bg),
                        Ku=np.asarray(Ku)[:, kept].astype(dtype), bu=cut(bu), Kd=W.astype(dtype),
                        bd=None if bias is None else bias.astype(dtype))


def prune_gated_mlp(Kg, bg, Ku, bu, Kd, bd, activation: str | Callable, k: int, X: jax.Array,
                    Y: jax.Array | None = None, *, ridge: float | None = None) -> tuple[PrunedGatedMLP, GatedPruning]:
    """:func:`prune_gated_weights` as a module: ``(PrunedGatedMLP, GatedPruning)``, in ``Kg``'s dtype
    with :func:`pruned_gated_params` parameters."""
    res = prune_gated_weights(Kg, bg, Ku, bu, Kd, bd, activation, k, X, Y, ridge=ridge)
    arrays = [None if a is None else jnp.asarray(a) for a in (res.Kg, res.bg, res.Ku, res.bu, res.Kd, res.bd)]
    return PrunedGatedMLP(*arrays, activation), res
