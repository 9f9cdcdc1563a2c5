"""Low-rank baselines: truncated SVD (Hajimolahoseini et al. 2022) and DRONE (Chen et al. 2021).

Each dense layer ``y = x K + b`` of an MLP (``K (in, out)``) becomes ``y = (x A) B + b`` with
``A (in, k)`` and ``B (k, out)``, the activation and biases kept:

* **SVD**: ``A B`` is the best rank-``k`` approximation of ``K`` in the Frobenius norm
  (Eckart–Young), split as ``U_k Σ_k^½`` and ``Σ_k^½ V_kᵀ``.
* **DRONE**: data-aware, ``A B = argmin_{rank k} ‖X K − X K'‖_F`` for the layer's real inputs ``X``;
  with the thin SVD ``X = U Σ Vᵀ`` (rank ρ), ``K' = V Σ⁻¹ [Σ Vᵀ K]_k``: closed form.
* **Gated MLPs** ``down(h(gate(x)) ⊙ up(x))``: each of the three kernels at rank ``k``
  (:func:`lowrank_gated_mlp`: SVD, or DRONE with ``x`` for gate and up and the hidden units for down).

The budget helpers pick each method's rank so that its count fits a budget.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from jaxbsd.models.compressed import LowRankGatedMLP, LowRankLinear, LowRankMLP, activation_fn, check_gated, lowrank_mlp_params
from jaxbsd.compression.baselines.pruning import gated_hidden
from jaxbsd.models.layers import ACTIVATIONS, MLP
from jaxbsd.solver.metrics import params_bsd

__all__ = ["truncated_svd_factors", "drone_factors", "kernels", "lowrank_mlp", "svd_mlp", "drone_mlp", "lowrank_rank_for_budget", "bsd_rank_for_budget", "lowrank_gated_mlp"]


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
    activation_fn(activation)
    check_gated(Kg, bg, Ku, bu, Kd, bd)
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
