"""The paper's metrics: decoupling errors, per-output relative RMSE, parameter counts; and
label-free fidelity metrics of text embeddings.

Error(𝒥) = ‖𝒥 − 𝒥̂‖² / ‖𝒥‖², Error(F) = ‖F − F̂‖² / ‖F‖² (paper §6.1), ``e_i`` the relative
RMSE of output ``i`` in percent, savings percentage SP and accuracy drop AD, ``P_BSD`` and
``P_FC`` and the bounds of the paper's Lemma 4.

Embeddings (a compressed sentence encoder against its original, no labels): :func:`mean_cosine`
between paired embeddings, :func:`neighbour_overlap` of the top-k neighbour sets, and
:func:`retrieval_recall` of query i's document i (title → section retrieval, whose pairs come from
the documents' structure). All by cosine similarity.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

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
    "mean_cosine",
    "neighbour_overlap",
    "retrieval_recall",
]


def relative_error(Y, Y_hat):
    """``‖Y − Ŷ‖² / ‖Y‖²`` over all entries (a scalar)."""
    Y, Y_hat = jnp.asarray(Y), jnp.asarray(Y_hat)
    if Y.shape != Y_hat.shape:
        raise ValueError(f"Y_hat must have the shape of Y {Y.shape}, got {Y_hat.shape}")
    return _relative_error(Y, Y_hat)


@jax.jit
def _relative_error(Y, Y_hat):
    # One program per shape: called eagerly, each of its four ops would compile on its own.
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


# ----------------------------------------------------------------------------- text embeddings


def _unit(E, name: str):
    E = jnp.asarray(E)
    if E.ndim != 2 or E.shape[0] < 1:
        raise ValueError(f"{name} must have shape (N, d) with N >= 1, got {E.shape}")
    return E / jnp.maximum(jnp.linalg.norm(E, axis=1, keepdims=True), jnp.finfo(E.dtype).tiny)


def mean_cosine(A, B):
    """Mean over rows of ``cos(A_i, B_i)``: ``(N, d), (N, d) -> ()`` (a zero row counts as cosine 0)."""
    A, B = _unit(A, "A"), _unit(B, "B")
    if A.shape != B.shape:
        raise ValueError(f"B must have the shape of A {A.shape}, got {B.shape}")
    return jnp.mean(jnp.sum(A * B, axis=1))


def _top_k(U, k: int):
    sims = U @ U.T
    sims = jnp.where(jnp.eye(U.shape[0], dtype=bool), -jnp.inf, sims)  # a text is not its own neighbour
    return jnp.argsort(-sims, axis=1, stable=True)[:, :k]


def neighbour_overlap(A, B, k: int = 10):
    """Mean share of each text's ``k`` nearest neighbours (by cosine, itself excluded) that two
    embeddings of the same ``N`` texts agree on: ``|top_k^A(i) ∩ top_k^B(i)| / k`` averaged over i.

    ``(N, d), (N, d') -> ()``; needs ``1 <= k < N``. Ties are broken by the lower index.
    """
    A, B = _unit(A, "A"), _unit(B, "B")
    if A.shape[0] != B.shape[0]:
        raise ValueError(f"A and B must embed the same N texts, got {A.shape[0]} and {B.shape[0]}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < A.shape[0]:
        raise ValueError(f"k must be an int in [1, {A.shape[0] - 1}], got {k!r}")
    ta, tb = _top_k(A, k), _top_k(B, k)
    shared = jnp.sum(jnp.any(ta[:, :, None] == tb[:, None, :], axis=2), axis=1)
    return jnp.mean(shared / k)


def retrieval_recall(queries, documents, ks=(1, 10)) -> dict[int, float]:
    """Recall@k of retrieving document ``i`` for query ``i`` by cosine among all ``N`` documents.

    A query's rank is the number of documents scored strictly higher than its own (so ties count in
    its favour); recall@k is the share of queries of rank ``< k``.

    Args:
      queries: ``(N, d)``; documents: ``(N, d)``.
      ks: the cut-offs.

    Returns:
      ``{k: recall@k}`` (floats in [0, 1]).
    """
    Q, D = _unit(queries, "queries"), _unit(documents, "documents")
    if Q.shape != D.shape:
        raise ValueError(f"documents must have the shape of queries {Q.shape}, got {D.shape}")
    ks = tuple(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks must be positive ints, got {ks!r}")
    sims = Q @ D.T
    own = jnp.diagonal(sims)[:, None]
    rank = np.asarray(jnp.sum(sims > own, axis=1))
    return {k: float(np.mean(rank < k)) for k in ks}
