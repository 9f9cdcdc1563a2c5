"""Structured pruning: keep the ``k`` hidden units of largest data-aware importance
``‖V1[:, j]‖ · RMS(h_j)`` on calibration tokens and refit the output layer by least squares
(:func:`prune_mlp`; a gated MLP's unit is ``h(gate x)_j · (up x)_j`` and ``down`` is refitted,
:func:`prune_gated_mlp`). The result is an ordinary narrower MLP
(:class:`~jaxbsd.models.compressed.PrunedMLP`, :class:`~jaxbsd.models.compressed.PrunedGatedMLP`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from jaxbsd.models.compressed import PrunedGatedMLP, PrunedMLP, activation_fn, check_gated, on_device
from jaxbsd.models.layers import ACTIVATIONS

__all__ = ["Pruning", "prune_importance", "prune_weights", "prune_mlp", "gated_hidden", "GatedPruning", "prune_gated_weights", "prune_gated_mlp"]


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
       better conditioned): by the normal equations (the ``k × k`` Gram of the centred kept
       units, accumulated over chunks of tokens, and its Cholesky factor) where they are well
       conditioned, else by SVD (``lstsq``), the minimum-norm solution when ``H_k`` is rank
       deficient.

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
    mean_h = hidden.mean(axis=0)[kept] if intercept else np.zeros(k)
    mean_y = Y.mean(axis=0) if intercept else np.zeros(Y.shape[1])
    G, B = _centred_gram(hidden, kept, Y, mean_h, mean_y)
    if ridge:
        prior = np.asarray(K2, np.float64)[kept]
        lam = max(ridge * float(np.trace(G)) / k, np.finfo(np.float64).tiny)
        W = np.linalg.solve(G + lam * np.eye(k), B + lam * prior)
    else:
        W = _solve_normal_equations(G, B)
        if W is None:  # rank deficient or ill-conditioned: the minimum-norm least squares, by SVD
            Hc = hidden[:, kept] - mean_h[None, :]
            W, *_ = np.linalg.lstsq(Hc, Y - mean_y[None, :], rcond=None)
    bias = mean_y - mean_h @ W if intercept else None
    if not (np.all(np.isfinite(W)) and (bias is None or np.all(np.isfinite(bias)))):
        raise ValueError("X: the least-squares refit of the output layer is not finite")
    return importance, kept, W, bias


#: Tokens per chunk of the Gram accumulation: the centred copy of the kept units is never whole.
_GRAM_CHUNK = 2048
#: The largest condition number (of the Gram matrix with its diagonal scaled to one, as
#: :func:`_condition_estimate` estimates it) the normal equations are trusted with: they lose about ``κ · eps`` of
#: relative accuracy (``κ`` of the Gram, the square of the tokens' own), so 1e8 keeps the refit
#: within ~1e-8 of the SVD's; worse goes to ``lstsq``.
_GRAM_CONDITION = 1e8


def _centred_gram(hidden: np.ndarray, kept: np.ndarray, Y: np.ndarray, mean_h: np.ndarray, mean_y: np.ndarray):
    """``(Hcᵀ Hc (k, k), Hcᵀ Yc (k, n))`` for ``Hc = hidden[:, kept] − mean_h`` and ``Yc = Y − mean_y``,
    in float64, accumulated over chunks of tokens so only one chunk of ``Hc`` is held at a time."""
    k, n = kept.shape[0], Y.shape[1]
    G, B = np.zeros((k, k)), np.zeros((k, n))
    for start in range(0, hidden.shape[0], _GRAM_CHUNK):
        Hc = hidden[start:start + _GRAM_CHUNK, kept] - mean_h[None, :]
        G += Hc.T @ Hc  # numpy runs a symmetric rank-k update for ``a.T @ a``
        B += Hc.T @ (Y[start:start + _GRAM_CHUNK] - mean_y[None, :])
    return G, B


def _condition_estimate(factor, A: np.ndarray, iterations: int = 12) -> float:
    """A lower estimate of ``κ₂(A)`` for symmetric positive definite ``A`` with its Cholesky
    ``factor``: the spread of the factor's pivots, or power iterations on ``A`` and ``A⁻¹`` (from
    a fixed start), whichever is larger. An estimate, not a bound: a threshold on it is a guard
    against the badly conditioned refits, not a certificate."""
    L = np.abs(np.diag(factor[0]))
    if not L.min() > 0:
        return np.inf
    pivots = (L.max() / L.min()) ** 2
    v = w = np.random.default_rng(0).standard_normal(A.shape[0])
    for _ in range(iterations):
        v = A @ v
        v /= np.linalg.norm(v)
        w = scipy.linalg.cho_solve(factor, w, check_finite=False)
        w /= np.linalg.norm(w)
    largest = float(v @ A @ v)
    smallest = float(w @ A @ w)
    return max(pivots, largest / smallest if smallest > 0 else np.inf)


def _solve_normal_equations(G: np.ndarray, B: np.ndarray) -> np.ndarray | None:
    """``G⁻¹ B`` by Cholesky of the Jacobi-scaled ``G`` (``D^{-1/2} G D^{-1/2}``), or None when
    ``G`` is singular or worse conditioned than :data:`_GRAM_CONDITION` (the caller solves the
    least squares by SVD then: the minimum-norm solution of a rank-deficient refit)."""
    d = np.sqrt(np.diag(G))
    if not np.all(d > 0) or not np.all(np.isfinite(G)):
        return None  # a unit constant on the tokens: rank deficient
    scaled = G / d[:, None] / d[None, :]
    try:
        factor = scipy.linalg.cho_factor(scaled, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return None
    if _condition_estimate(factor, scaled) > _GRAM_CONDITION:
        return None
    return scipy.linalg.cho_solve(factor, B / d[:, None], check_finite=False) / d[:, None]


def prune_mlp(K1, b1, K2, b2, activation: str | Callable, k: int, X: jax.Array,
              Y: jax.Array | None = None, *, ridge: float | None = None) -> tuple[PrunedMLP, Pruning]:
    """:func:`prune_weights` as a module: ``(PrunedMLP, Pruning)``, the module in ``K1``'s dtype
    with :func:`pruned_mlp_params` ``(m, k, n)`` parameters."""
    res = prune_weights(K1, b1, K2, b2, activation, k, X, Y, ridge=ridge)
    return PrunedMLP(*(on_device(a) for a in (res.K1, res.b1, res.K2, res.b2)), activation), res


def gated_hidden(Kg, bg, Ku, bu, activation: str | Callable, X) -> jax.Array:
    """``h(X Kg + bg) ⊙ (X Ku + bu)``: the hidden units of a gated MLP on ``X (N, m)``, ``(N, H)``
    in ``Kg``'s dtype (absent biases are zero)."""
    h = activation_fn(activation)
    Kg = jnp.asarray(Kg)
    X = jnp.asarray(X, Kg.dtype)
    z = X @ Kg + (0 if bg is None else jnp.asarray(bg, Kg.dtype)[None, :])
    v = X @ jnp.asarray(Ku, Kg.dtype) + (0 if bu is None else jnp.asarray(bu, Kg.dtype)[None, :])
    return h(z) * v


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
    m, H, n = check_gated(Kg, bg, Ku, bu, Kd, bd)
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
