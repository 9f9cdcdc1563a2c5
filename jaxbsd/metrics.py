"""The paper's metrics: decoupling errors, per-output relative RMSE, parameter counts.

Error(𝒥) = ‖𝒥 − 𝒥̂‖² / ‖𝒥‖², Error(F) = ‖F − F̂‖² / ‖F‖² (paper §6.1), ``e_i`` the relative
RMSE of output ``i`` in percent, savings percentage SP and accuracy drop AD, ``P_BSD`` and
``P_FC`` and the bounds of the paper's Lemma 4.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

__all__ = [
    "relative_error",
    "error_J",
    "error_F",
    "relative_rmse",
    "savings_percentage",
    "accuracy_drop",
    "params_bsd",
    "params_fc",
    "max_rank",
    "max_dof",
]


def relative_error(Y, Y_hat):
    """``‖Y − Ŷ‖² / ‖Y‖²`` over all entries (a scalar)."""
    Y, Y_hat = jnp.asarray(Y), jnp.asarray(Y_hat)
    if Y.shape != Y_hat.shape:
        raise ValueError(f"Y_hat must have the shape of Y {Y.shape}, got {Y_hat.shape}")
    return jnp.sum((Y - Y_hat) ** 2) / jnp.sum(Y**2)


def error_J(J, J_hat):
    """Error(𝒥) for ``(S, n, m)`` Jacobians."""
    return relative_error(J, J_hat)


def error_F(F, F_hat):
    """Error(F) for ``(S, n)`` outputs."""
    return relative_error(F, F_hat)


def relative_rmse(Y, Y_hat):
    """The paper's ``e_i`` in percent, one per output.

    ``e_i = 100 · sqrt(Σ_s (y_si − ŷ_si)² / Σ_s (y_si − mean_s y_si)²)``.

    Args:
      Y, Y_hat: ``(S, n)``.

    Returns:
      ``(n,)``.
    """
    Y, Y_hat = jnp.asarray(Y), jnp.asarray(Y_hat)
    if Y.shape != Y_hat.shape or Y.ndim != 2:
        raise ValueError(f"Y and Y_hat must both have shape (S, n), got {Y.shape} and {Y_hat.shape}")
    num = jnp.sum((Y - Y_hat) ** 2, axis=0)
    den = jnp.sum((Y - jnp.mean(Y, axis=0, keepdims=True)) ** 2, axis=0)
    return 100 * jnp.sqrt(num / den)


def savings_percentage(p_new: int, p_old: int) -> float:
    """SP = (1 − p_new / p_old) · 100."""
    if p_old <= 0:
        raise ValueError(f"p_old must be > 0, got {p_old}")
    return (1 - p_new / p_old) * 100


def accuracy_drop(acc_before: float, acc_after: float) -> float:
    """AD = Acc_B − Acc_A (same units as the inputs)."""
    return acc_before - acc_after


def params_bsd(m: int, n: int, r: int, dof: int) -> int:
    """``P_BSD = m r + r n + r ν``."""
    return m * r + r * n + r * dof


def params_fc(m: int, hidden: int, n: int | None = None, *, bias: bool = False) -> int:
    """Parameters of ``V1 h(V0 x (+ b0)) (+ b1)``; ``2 δ m²`` for ``n = m`` without biases."""
    n = m if n is None else n
    return m * hidden + hidden * n + ((hidden + n) if bias else 0)


def _largest_int_below(bound: float) -> int:
    return math.ceil(bound) - 1


def max_rank(m: int, hidden: int, dof: int, n: int | None = None) -> int:
    """Largest rank with ``P_BSD(r, ν) < P_FC`` (Lemma 4: ``r < δ m² / (m + ν/2)`` for n = m)."""
    n = m if n is None else n
    return _largest_int_below(hidden * (m + n) / (m + n + dof))


def max_dof(m: int, hidden: int, rank: int, n: int | None = None) -> int:
    """Largest dof with ``P_BSD(r, ν) < P_FC`` (Lemma 4: ``ν < 2m(δm − r)/r`` for n = m)."""
    n = m if n is None else n
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    return _largest_int_below((hidden - rank) * (m + n) / rank)
