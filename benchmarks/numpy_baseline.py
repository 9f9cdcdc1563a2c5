"""A plain NumPy/SciPy R-CMTF-BSD sweep: the reference the benchmark compares against.

Written the way a researcher would write it from the paper (Algorithms 1–3), not tuned:

* every factor update is a (Tikhonov-stacked) least-squares problem on an explicit
  unfolding of the Jacobian tensor and an explicit Khatri–Rao product, solved with
  ``np.linalg.lstsq``;
* the B-spline projection is a Python ``for i in range(r)`` loop; each internal function
  gets quantile knots (``np.quantile``, snapped to the nearest sample) and a design matrix
  built by ``scipy.interpolate.BSpline`` with identity coefficients (values and derivative).

Conventions are jaxbsd's (DESIGN.md §1): ``J (S, n, m)``, ``F (S, n)``, ``X (S, m)``,
``W0 (r, m)``, ``W1 (n, r)``, ``G, R (S, r)``, ``coef (r, ν)``, ``knots (r, ν + d + 1)``.
From the same state, one sweep here equals one ``jaxbsd.solver.cmtf.sweep`` to rounding
(``tests/test_benchmarks.py`` checks it). Edge-case handling of jaxbsd that random data never
triggers (merging near-coincident knots, widening a zero-width activation range) is not
reproduced.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.interpolate import BSpline as ScipyBSpline

__all__ = ["State", "khatri_rao", "quantile_knots", "design", "sweep"]


class State(NamedTuple):
    W0: np.ndarray
    W1: np.ndarray
    G: np.ndarray
    R: np.ndarray
    coef: np.ndarray
    knots: np.ndarray


def rcond(r: int) -> float:
    """Singular values below ``rcond(r) · σ_max`` are dropped in the unregularized G and R solves.

    jaxbsd solves them through the ``r × r`` Gram matrix with the pseudo-inverse's
    machine-precision cutoff (eigenvalues below ``r · eps · λ_max``), i.e. singular values
    below ``sqrt(r · eps) · σ_max`` of the explicit matrix solved here."""
    return float(np.sqrt(r * np.finfo(np.float64).eps))


def khatri_rao(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Column-wise Kronecker product: ``(I, r), (K, r) -> (I K, r)``, row ``i K + k``."""
    I, r = A.shape
    K, _ = B.shape
    out = np.empty((I * K, r), dtype=A.dtype)
    for j in range(r):
        out[:, j] = np.kron(A[:, j], B[:, j])
    return out


def quantile_knots(u: np.ndarray, dof: int, degree: int) -> np.ndarray:
    """Clamped knots on [min u, max u]; interior knots at the quantiles k/(ν−d), snapped to
    the nearest sample (paper, Algorithm 3).

    ``np.quantile`` (linear) puts the level-``q`` quantile at the fractional rank
    ``q (S − 1)`` of the sorted samples, so the nearest sample is the order statistic at the
    rounded rank; a quantile exactly halfway between two samples takes the upper one (the
    rank is rounded in integers, so the choice cannot depend on rounding of ``q (S − 1)``).
    """
    S = len(u)
    us = np.sort(u)
    den = dof - degree
    interior = [us[(2 * k * (S - 1) + den) // (2 * den)] for k in range(1, den)]
    return np.concatenate([[us[0]] * (degree + 1), interior, [us[-1]] * (degree + 1)])


def design(u: np.ndarray, knots: np.ndarray, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """``(B, B')`` of shape ``(S, ν)`` through scipy (extrapolating the boundary pieces)."""
    dof = len(knots) - degree - 1
    spl = ScipyBSpline(knots, np.eye(dof), degree, extrapolate=True)
    return spl(u), spl.derivative(1)(u)


def _ridge_lstsq(A: np.ndarray, b: np.ndarray, mu: float) -> np.ndarray:
    """argmin_x ‖A x − b‖² + μ‖x‖² by ``lstsq`` on the stacked system."""
    if mu > 0:
        k = A.shape[1]
        A = np.vstack([A, np.sqrt(mu) * np.eye(k)])
        b = np.concatenate([b, np.zeros((k,) + b.shape[1:])], axis=0)
    return np.linalg.lstsq(A, b, rcond=None)[0]


def sweep(
    state: State,
    J: np.ndarray,
    F: np.ndarray,
    X: np.ndarray,
    *,
    degree: int = 3,
    dof: int = 4,
    lam: float = 0.25,
    mu_w: float = 1e-4,
    mu_c: float = 1e-5,
    eps: float = 1e-6,
) -> State:
    """One R-CMTF-BSD iteration (normalize, W1, W0, G, R, B-spline projection)."""
    S, n, m = J.shape
    W0, W1, G, R = (np.array(a, dtype=np.float64) for a in state[:4])
    r = W0.shape[0]

    # Algorithm 2: normalization.
    beta0 = np.maximum(np.linalg.norm(W0, axis=1), eps)
    beta1 = np.maximum(np.linalg.norm(W1, axis=0), eps)
    W0 = W0 / beta0[:, None]
    W1 = W1 / beta1[None, :]
    G = G * (beta0 * beta1)[None, :]
    R = R * beta1[None, :]

    # W1: min ‖J_(n) − W1 (G ⊙ W0ᵀ)ᵀ‖² + λ‖Fᵀ − W1 Rᵀ‖² + μ‖W1‖².
    J_n = J.transpose(1, 0, 2).reshape(n, S * m)  # column s·m + b
    A = np.vstack([khatri_rao(G, W0.T), np.sqrt(lam) * R])
    b = np.vstack([J_n.T, np.sqrt(lam) * F])
    W1 = _ridge_lstsq(A, b, mu_w).T

    # W0: min ‖J_(m) − W0ᵀ (G ⊙ W1)ᵀ‖² + μ‖W0‖².
    J_m = J.transpose(2, 0, 1).reshape(m, S * n)  # column s·n + a
    W0 = _ridge_lstsq(khatri_rao(G, W1), J_m.T, mu_w)

    # G: min ‖J_(S) − G (W1 ⊙ W0ᵀ)ᵀ‖² (minimum-norm least squares, see rcond).
    J_s = J.reshape(S, n * m)  # column a·m + b
    G = np.linalg.lstsq(khatri_rao(W1, W0.T), J_s.T, rcond=rcond(r))[0].T

    # R: min ‖Fᵀ − W1 Rᵀ‖².
    R = np.linalg.lstsq(W1, F.T, rcond=rcond(r))[0].T

    # Algorithm 3: B-spline projection, one internal function at a time.
    U = X @ W0.T
    coef = np.zeros((r, dof))
    knots = np.zeros((r, dof + degree + 1))
    G_new, R_new = np.empty_like(G), np.empty_like(R)
    for i in range(r):
        knots[i] = quantile_knots(U[:, i], dof, degree)
        B, dB = design(U[:, i], knots[i], degree)
        A = np.vstack([dB, np.sqrt(lam) * B])
        b = np.concatenate([G[:, i], np.sqrt(lam) * R[:, i]])
        coef[i] = _ridge_lstsq(A, b, mu_c)
        G_new[:, i] = dB @ coef[i]
        R_new[:, i] = B @ coef[i]
    return State(W0=W0, W1=W1, G=G_new, R=R_new, coef=coef, knots=knots)
