"""Low-rank baselines for MLP compression: truncated SVD and DRONE, and budget helpers.

Both replace each dense layer ``y = x K + b`` of a block's MLP (``K`` of shape ``(in, out)``) by
``y = (x A) B + b`` with ``A (in, k)`` and ``B (k, out)``, keeping the activation and biases:

* **SVD** (Hajimolahoseini et al. 2022): ``A B`` is the best rank-``k`` approximation of ``K``
  in the Frobenius norm (Eckart–Young), split as ``U_k Σ_k^½`` and ``Σ_k^½ V_kᵀ``.
* **DRONE** (Chen et al. 2021): data-aware, ``A B = argmin_{rank k} ‖X K − X K'‖_F`` for the
  layer's real inputs ``X``. With the thin SVD ``X = U Σ Vᵀ`` (rank ρ) this is
  ``K' = V Σ⁻¹ [Σ Vᵀ K]_k``, ``[·]_k`` the truncated SVD: closed form, no iterations.

The parameter helpers pick each method's rank so that its count fits a budget; counts are those
of the modules actually placed in the model (no dense weights are kept).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from typing import Callable

from jaxbsd.metrics import params_bsd
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
]


class LowRankLinear(nnx.Module):
    """``x ↦ (x A) B + bias``: ``(..., in) -> (..., out)`` with ``A (in, k)``, ``B (k, out)``."""

    def __init__(self, A: jax.Array, B: jax.Array, bias: jax.Array):
        if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
            raise ValueError(f"A (in, k) and B (k, out) must share k, got {A.shape} and {B.shape}")
        if bias.shape != (B.shape[1],):
            raise ValueError(f"bias must have shape ({B.shape[1]},), got {bias.shape}")
        self.A = nnx.Param(jnp.asarray(A))
        self.B = nnx.Param(jnp.asarray(B))
        self.bias = nnx.Param(jnp.asarray(bias))

    def __call__(self, x: jax.Array) -> jax.Array:
        y = (x @ self.A[...]) @ self.B[...]
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
