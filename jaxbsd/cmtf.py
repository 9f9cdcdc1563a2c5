"""R-CMTF-BSD: robust coupled matrix–tensor factorization with basis-constrained factors.

Solves (paper, eq. (final_optimization))::

    min  ‖𝒥 − [[W1, W0ᵀ, G]]‖² + λ ‖F − R W1ᵀ‖²
    s.t. G[:, i] = B'_i c_i,  R[:, i] = B_i c_i,   B_i = basis at u_i = X W0[i]ᵀ

by the projected alternating least squares of the paper's Algorithms 1–3, in Gram–Hadamard
form (the Khatri–Rao product is never formed). The pieces are pure functions:

* :func:`init_state` ``(key, problem, config) -> SolverState``;
* :func:`sweep` ``(state, problem, config) -> SolverState``: one iteration of Algorithm 1;
* :func:`solve` one restart as a bounded ``lax.while_loop``;
* :func:`decouple` the public entry point: validation, ``jax.vmap`` over restarts, one
  ``jax.jit``, the best restart by the training objective.

The solver keeps the best finite iterate (lowest objective) of each restart, so a restart that
later diverges or produces non-finite numbers still returns finite factors, and reports a
:class:`Status` per restart.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import sys
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxbsd.bases import Basis, BSpline
from jaxbsd.decoupled import Decoupled
from jaxbsd.tensor import DenseJacobian, JacobianOperator, StructuredJacobian

__all__ = [
    "CMTFConfig",
    "Problem",
    "SolverState",
    "Status",
    "DecouplingResult",
    "init_state",
    "sweep",
    "solve",
    "decouple",
]


class Status(enum.IntEnum):
    """Why a restart stopped."""

    CONVERGED = 0  #: relative change of the objective below ``tol``, or an exact fit
    MAX_ITERATIONS = 1  #: ``max_iter`` sweeps done
    DIVERGED = 2  #: the objective exceeded ``divergence`` × the best objective this restart reached
    NONFINITE = 3  #: a sweep produced inf/NaN; the best finite iterate is returned

    @property
    def message(self) -> str:
        return _STATUS_MESSAGES[self]


_STATUS_MESSAGES = {
    Status.CONVERGED: "converged",
    Status.MAX_ITERATIONS: "reached max_iter without meeting tol",
    Status.DIVERGED: "objective diverged; returned the best iterate",
    Status.NONFINITE: "a sweep produced non-finite values; returned the best finite iterate",
}


@dataclasses.dataclass(frozen=True)
class CMTFConfig:
    """Static configuration of a solve (hashable: a static argument of ``jax.jit``).

    Attributes:
      rank: ``r``, number of internal functions.
      basis: univariate basis of every ``g_i``.
      lam: ``λ``, weight of the zeroth-order term ``‖F − R W1ᵀ‖²``.
      mu_w: Tikhonov weight on the ``W0``/``W1`` updates (robust only).
      mu_c: Tikhonov weight on the coefficients in the projection (robust only).
      eps: norm floor of the normalization (robust only).
      robust: ``True`` for R-CMTF-BSD (normalization + Tikhonov); ``False`` for the paper's
        plain CMTF-BSD/PD: no normalization and ``mu_w = mu_c = 0`` (least-squares updates by
        pseudo-inverse).
      max_iter: maximum number of sweeps.
      tol: stop when the relative decrease of the objective is below ``tol``, or when the
        objective is below ``tol`` times ``‖𝒥‖² + λ‖F‖²``.
      divergence: stop with ``Status.DIVERGED`` when the objective has stayed above this
        multiple of the lowest objective the restart reached so far (floored at
        ``eps_machine · (‖𝒥‖² + λ‖F‖²)``) for ``divergence_patience`` consecutive sweeps.
        The rule is relative to the restart's own best, never to the data's scale: a run whose
        first iterates are huge in absolute terms but keep improving is healthy, and so is a
        run with isolated spikes that it recovers from (R-CMTF-PD with degree-10 monomials
        has single-sweep spikes of 1e15 × its best and then returns to it). The best finite
        iterate is returned either way.
      divergence_patience: consecutive sweeps above ``divergence`` × best before DIVERGED.
    """

    rank: int
    basis: Basis = BSpline(3, 11)
    lam: float = 0.25
    mu_w: float = 1e-4
    mu_c: float = 1e-5
    eps: float = 1e-6
    robust: bool = True
    max_iter: int = 500
    tol: float = 1e-10
    divergence: float = 1e8
    divergence_patience: int = 10

    def __post_init__(self):
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {self.rank!r}")
        if not isinstance(self.basis, Basis):
            raise ValueError(f"basis must be a jaxbsd basis (BSpline, Polynomial, ReLU), got {self.basis!r}")
        for name in ("lam", "mu_w", "mu_c", "eps", "tol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.max_iter, int) and self.max_iter >= 1):
            raise ValueError(f"max_iter must be an int >= 1, got {self.max_iter!r}")
        if not self.divergence > 1:
            raise ValueError(f"divergence must be > 1, got {self.divergence!r}")
        if not (isinstance(self.divergence_patience, int) and self.divergence_patience >= 1):
            raise ValueError(f"divergence_patience must be an int >= 1, got {self.divergence_patience!r}")

    @property
    def effective_mu_w(self) -> float:
        return self.mu_w if self.robust else 0.0

    @property
    def effective_mu_c(self) -> float:
        return self.mu_c if self.robust else 0.0


class Problem(NamedTuple):
    """The data of a decoupling problem (a pytree).

    Attributes:
      jac: the Jacobian tensor, ``(S, n, m)`` behind a :mod:`jaxbsd.tensor` operator.
      F: ``(S, n)`` outputs.
      X: ``(S, m)`` sampling points.
    """

    jac: JacobianOperator
    F: jax.Array
    X: jax.Array


class SolverState(NamedTuple):
    """Factors of one restart. ``W0 (r, m)``, ``W1 (n, r)``, ``G, R (S, r)``,
    ``coef (r, ν)``, ``knots (r, K)``."""

    W0: jax.Array
    W1: jax.Array
    G: jax.Array
    R: jax.Array
    coef: jax.Array
    knots: jax.Array


# --------------------------------------------------------------------------- linear algebra


def _gram_solve(A: jax.Array, B: jax.Array, mu: float, *, spectral: bool = False) -> jax.Array:
    """``B (A + μ I)⁻¹`` for symmetric positive semi-definite ``A`` (``(r, r)``, ``B (k, r)``).

    ``A`` is the Gram matrix ``KᵀK`` of a least-squares problem ``min ‖M − X Kᵀ‖`` given in
    Gram–Hadamard form (``B = M K``), so ``B A⁺`` is that problem's minimum-norm solution.

    With ``μ > 0`` (Tikhonov, robust updates of W0 and W1) the system is positive definite and
    solved directly (LU), or through an eigendecomposition with every eigenvalue shifted by ``μ``
    when ``spectral=True``. With ``μ = 0`` (the paper's plain least squares: the G and R updates,
    and every update of the non-robust CMTF-BSD/PD) it is the pseudo-inverse with a
    machine-precision cutoff, as ``jnp.linalg.pinv``: eigenvalues of ``A`` at or below
    ``r · eps · max|λ|`` are dropped. The same rule holds for every basis.
    """
    r = A.shape[0]
    if mu > 0 and not spectral:
        return jnp.linalg.solve(A + mu * jnp.eye(r, dtype=A.dtype), B.T).T
    w, Q = jnp.linalg.eigh(A)
    if mu > 0:
        # Regularized: every eigenvalue is >= mu, so the inverse is bounded and continuous.
        inv_w = 1 / (jnp.maximum(w, 0) + mu)
    else:
        cutoff = r * jnp.finfo(A.dtype).eps * jnp.maximum(jnp.max(jnp.abs(w)), jnp.finfo(A.dtype).tiny)
        keep = w > cutoff
        inv_w = jnp.where(keep, 1 / jnp.where(keep, w, 1), 0)
    return ((B @ Q) * inv_w[None, :]) @ Q.T


def _lstsq(A: jax.Array, b: jax.Array) -> jax.Array:
    """Minimum-norm ``argmin_c ‖A c − b‖²`` (``A (k, ν)``, ``b (k,)``), singular values below
    ``max(k, ν) · eps · σ_max`` dropped (``jnp.linalg.lstsq(rcond=None)``).

    Solved on ``A`` itself, not on ``AᵀA``: the normal equations would square the condition
    number, which for monomials of degree 10 exceeds what float64 can hold.
    """
    return jnp.linalg.lstsq(A, b, rcond=None)[0]


# --------------------------------------------------------------------------- algorithm steps


def _normalize(state: SolverState, eps: float) -> SolverState:
    """Algorithm 2: unit-norm rows of W0 and columns of W1 with a norm floor ``eps``."""
    beta0 = jnp.maximum(jnp.linalg.norm(state.W0, axis=1), eps)  # (r,)
    beta1 = jnp.maximum(jnp.linalg.norm(state.W1, axis=0), eps)  # (r,)
    return state._replace(
        W0=state.W0 / beta0[:, None],
        W1=state.W1 / beta1[None, :],
        G=state.G * (beta0 * beta1)[None, :],
        R=state.R * beta1[None, :],
    )


def _project(
    X: jax.Array, W0: jax.Array, G: jax.Array, R: jax.Array, config: CMTFConfig
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Algorithm 3, vmapped over ranks: refit knots and coefficients, project G and R.

    Returns:
      ``(G, R, coef, knots)`` with shapes ``(S, r), (S, r), (r, ν), (r, K)``.
    """
    basis, lam, mu_c = config.basis, config.lam, config.effective_mu_c
    U = X @ W0.T  # (S, r)

    def one(u, g, rr):
        knots = basis.fit(u)
        B, dB = basis.design(u, knots)
        if config.robust:
            # Tikhonov-regularized normal equations (μ_c > 0 keeps them definite).
            A = dB.T @ dB + lam * (B.T @ B)
            b = dB.T @ g + lam * (B.T @ rr)
            c = _gram_solve(A, b[None, :], mu_c, spectral=True)[0]
        else:
            # The paper's CMTF-BSD/PD: plain least squares on the stacked system
            # [B'; √λ B] c ≈ [g; √λ r].
            root = jnp.sqrt(jnp.asarray(lam, B.dtype))
            c = _lstsq(jnp.concatenate([dB, root * B]), jnp.concatenate([g, root * rr]))
        return dB @ c, B @ c, c, knots

    G, R, coef, knots = jax.vmap(one, in_axes=(1, 1, 1), out_axes=(1, 1, 0, 0))(U, G, R)
    return G, R, coef, knots


def sweep(state: SolverState, problem: Problem, config: CMTFConfig) -> SolverState:
    """One iteration of R-CMTF-BSD (paper, Algorithm 1; DESIGN.md §3 steps 1–6)."""
    jac, F, X = problem
    lam, mu_w = config.lam, config.effective_mu_w
    if config.robust:
        state = _normalize(state, config.eps)
    W0, W1, G, R = state.W0, state.W1, state.G, state.R
    GtG = G.T @ G
    # W1 ← (M1 + λ Fᵀ R)(GᵀG ∘ W0W0ᵀ + λ RᵀR + μ_W I)⁻¹
    W1 = _gram_solve(GtG * (W0 @ W0.T) + lam * (R.T @ R), jac.mttkrp_w1(W0, G) + lam * (F.T @ R), mu_w)
    # W0ᵀ ← M2 (GᵀG ∘ W1ᵀW1 + μ_W I)⁻¹
    # (M2 and M3 both contract 𝒥 with the new W1: done once, see jaxbsd.tensor.)
    W1tW1 = W1.T @ W1
    U = jac.contract_w1(W1)
    W0 = _gram_solve(GtG * W1tW1, jac.mttkrp_w0_from(U, G), mu_w).T
    # G ← M3 (W0W0ᵀ ∘ W1ᵀW1)⁻¹ ;  R ← F W1 (W1ᵀW1)⁻¹
    G = _gram_solve((W0 @ W0.T) * W1tW1, jac.mttkrp_g_from(U, W0), 0.0)
    R = _gram_solve(W1tW1, F @ W1, 0.0)
    G, R, coef, knots = _project(X, W0, G, R, config)
    return SolverState(W0=W0, W1=W1, G=G, R=R, coef=coef, knots=knots)


def init_state(key: jax.Array, problem: Problem, config: CMTFConfig) -> SolverState:
    """Random initialization (Algorithm 1, line 1): Gaussian factors, scaled by fan-in.

    ``coef`` starts at zero and ``knots`` are fitted to the initial activations, so the state
    is a valid (if useless) model before the first sweep.
    """
    S, n, m = problem.jac.shape
    r = config.rank
    dtype = problem.F.dtype
    k0, k1, k2, k3 = jax.random.split(key, 4)
    W0 = jax.random.normal(k0, (r, m), dtype) / math.sqrt(m)
    W1 = jax.random.normal(k1, (n, r), dtype) / math.sqrt(r)
    G = jax.random.normal(k2, (S, r), dtype)
    R = jax.random.normal(k3, (S, r), dtype)
    knots = jax.vmap(config.basis.fit, in_axes=1)(problem.X @ W0.T)
    coef = jnp.zeros((r, config.basis.num_coef), dtype)
    return SolverState(W0=W0, W1=W1, G=G, R=R, coef=coef, knots=knots)


# --------------------------------------------------------------------------- objective


class Errors(NamedTuple):
    """Squared residuals of one iterate. ``objective = res_J + λ res_F``."""

    res_J: jax.Array
    res_F: jax.Array
    objective: jax.Array


def _errors(state: SolverState, problem: Problem, lam: float) -> Errors:
    res_J = problem.jac.residual_sq_norm(state.W0, state.W1, state.G)
    res_F = jnp.sum((problem.F - state.R @ state.W1.T) ** 2)
    return Errors(res_J, res_F, res_J + lam * res_F)


def _finite(tree: Any) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


# --------------------------------------------------------------------------- one restart


class RestartResult(NamedTuple):
    """Output of :func:`solve` for one restart (a pytree; stacked over restarts by vmap)."""

    state: SolverState  #: best finite iterate
    objective: jax.Array  #: its training objective ``‖𝒥−𝒥̂‖² + λ‖F−F̂‖²``
    error_J: jax.Array  #: its ``‖𝒥−𝒥̂‖²/‖𝒥‖²``
    error_F: jax.Array  #: its ``‖F−F̂‖²/‖F‖²``
    history_J: jax.Array  #: ``(max_iter,)`` Error(𝒥) after each sweep
    history_F: jax.Array  #: ``(max_iter,)`` Error(F) after each sweep
    iterations: jax.Array  #: sweeps done
    status: jax.Array  #: a :class:`Status` value
    dead_ranks: jax.Array  #: ranks whose W0 row or W1 column norm is at or below ``eps``


class _Loop(NamedTuple):
    it: jax.Array
    state: SolverState
    prev_objective: jax.Array
    best: SolverState
    best_errors: Errors
    history_J: jax.Array
    history_F: jax.Array
    status: jax.Array  # -1 while running
    strikes: jax.Array  # consecutive sweeps above divergence × best


class _Norms(NamedTuple):
    J: jax.Array  # ‖𝒥‖² (floored at tiny)
    F: jax.Array  # ‖F‖² (floored at tiny)
    scale: jax.Array  # ‖𝒥‖² + λ‖F‖² (floored at tiny)


def _norms(problem: Problem, lam: float) -> _Norms:
    tiny = jnp.finfo(problem.F.dtype).tiny
    norm_J, norm_F = problem.jac.sq_norm(), jnp.sum(problem.F**2)
    return _Norms(jnp.maximum(norm_J, tiny), jnp.maximum(norm_F, tiny), jnp.maximum(norm_J + lam * norm_F, tiny))


def _start(key: jax.Array, problem: Problem, config: CMTFConfig) -> _Loop:
    """Loop state before the first sweep (the initial state is the fallback best iterate)."""
    norms = _norms(problem, config.lam)
    state0 = init_state(key, problem, config)
    inf = jnp.asarray(jnp.inf, problem.F.dtype)
    errs0 = _errors(state0, problem, config.lam)
    return _Loop(
        it=jnp.asarray(0),
        state=state0,
        prev_objective=inf,
        best=state0,
        best_errors=Errors(inf, inf, inf),
        history_J=jnp.full((config.max_iter,), errs0.res_J / norms.J),
        history_F=jnp.full((config.max_iter,), errs0.res_F / norms.F),
        status=jnp.asarray(-1),
        strikes=jnp.asarray(0),
    )


def _advance(loop: _Loop, problem: Problem, config: CMTFConfig, stop_at: jax.Array | int) -> _Loop:
    """Sweep until the restart stops or ``stop_at`` sweeps are done (a bounded while loop)."""
    norms = _norms(problem, config.lam)

    def body(loop: _Loop) -> _Loop:
        new = sweep(loop.state, problem, config)
        errs = _errors(new, problem, config.lam)
        finite = _finite(new) & jnp.isfinite(errs.objective)
        improved = finite & (errs.objective < loop.best_errors.objective)
        best = jax.tree_util.tree_map(lambda a, b: jnp.where(improved, a, b), new, loop.best)
        best_errors = jax.tree_util.tree_map(lambda a, b: jnp.where(improved, a, b), errs, loop.best_errors)
        # A non-finite sweep records the last finite errors; entries from this sweep on are
        # overwritten (so the tail after the final sweep repeats its value).
        tail = jnp.arange(config.max_iter) >= loop.it
        previous = jnp.maximum(loop.it - 1, 0)
        err_J = jnp.where(finite, errs.res_J / norms.J, loop.history_J[previous])
        err_F = jnp.where(finite, errs.res_F / norms.F, loop.history_F[previous])
        change = jnp.abs(loop.prev_objective - errs.objective)
        converged = (jnp.isfinite(loop.prev_objective) & (change <= config.tol * loop.prev_objective)) | (
            errs.objective <= config.tol * norms.scale
        )
        # Divergence is judged against this restart's own best objective, never against the
        # data's scale: a large but improving start is healthy.
        best_so_far = jnp.maximum(loop.best_errors.objective, jnp.finfo(norms.scale.dtype).eps * norms.scale)
        above = jnp.isfinite(loop.best_errors.objective) & (errs.objective > config.divergence * best_so_far)
        strikes = jnp.where(above, loop.strikes + 1, 0)
        diverged = strikes >= config.divergence_patience
        status = jnp.select(
            [~finite, diverged, converged, loop.it + 1 >= config.max_iter],
            [Status.NONFINITE, Status.DIVERGED, Status.CONVERGED, Status.MAX_ITERATIONS],
            -1,
        )
        # A non-finite sweep is not continued from: the loop stops with the best iterate.
        return _Loop(
            loop.it + 1, new, errs.objective, best, best_errors,
            jnp.where(tail, err_J, loop.history_J), jnp.where(tail, err_F, loop.history_F), status, strikes,
        )

    return jax.lax.while_loop(lambda l: (l.status < 0) & (l.it < stop_at), body, loop)


def _finish(loop: _Loop, problem: Problem, config: CMTFConfig) -> RestartResult:
    """The restart's result from its best iterate (the initial state if no sweep was finite)."""
    norms = _norms(problem, config.lam)
    errs = _errors(loop.best, problem, config.lam)
    return RestartResult(
        state=loop.best,
        objective=errs.objective,
        error_J=errs.res_J / norms.J,
        error_F=errs.res_F / norms.F,
        history_J=loop.history_J,
        history_F=loop.history_F,
        iterations=loop.it,
        status=loop.status,
        dead_ranks=_dead_ranks(loop.best, config.eps),
    )


def _dead_ranks(state: SolverState, eps: float) -> jax.Array:
    """Number of collapsed ranks: their ``g_i`` no longer contributes to the model."""
    dead = (jnp.linalg.norm(state.W0, axis=1) <= eps) | (jnp.linalg.norm(state.W1, axis=0) <= eps)
    return jnp.sum(dead)


def solve(key: jax.Array, problem: Problem, config: CMTFConfig) -> RestartResult:
    """One restart of R-CMTF-BSD as a bounded ``lax.while_loop`` (jittable, vmappable).

    History entries after the last sweep repeat the last value, so the arrays have a static
    shape ``(max_iter,)``; ``iterations`` says how many are real.
    """
    loop = _advance(_start(key, problem, config), problem, config, config.max_iter)
    return _finish(loop, problem, config)


# --------------------------------------------------------------------------- public entry


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecouplingResult:
    """Result of :func:`decouple`.

    Attributes:
      model: the best restart's :class:`~jaxbsd.Decoupled` (lowest training objective).
      error_J: its ``‖𝒥−𝒥̂‖²/‖𝒥‖²``.
      error_F: its ``‖F−F̂‖²/‖F‖²``.
      objective: its training objective.
      status: its :class:`Status` (int).
      iterations: its number of sweeps.
      dead_ranks: its number of collapsed ranks (W0 row or W1 column norm ``<= eps``).
      best_restart: index of the best restart.
      restarts: every restart, stacked on a leading axis of size ``restarts``:
        a :class:`RestartResult` whose ``state`` is the restart's best iterate and whose
        ``history_J``/``history_F`` are ``(restarts, max_iter)``.
      config: the configuration (static).
    """

    model: Decoupled
    error_J: jax.Array
    error_F: jax.Array
    objective: jax.Array
    status: jax.Array
    iterations: jax.Array
    dead_ranks: jax.Array
    best_restart: jax.Array
    restarts: RestartResult
    config: CMTFConfig = dataclasses.field(metadata=dict(static=True))

    @property
    def history(self) -> dict[str, jax.Array]:
        """Per restart, per iteration: ``{"error_J": (R, T), "error_F": (R, T)}``."""
        return {"error_J": self.restarts.history_J, "error_F": self.restarts.history_F}

    def restart_model(self, index: int) -> Decoupled:
        """The model of restart ``index``."""
        s = jax.tree_util.tree_map(lambda x: x[index], self.restarts.state)
        return Decoupled(W0=s.W0, W1=s.W1, coef=s.coef, knots=s.knots, basis=self.config.basis)


def _select(runs: RestartResult, config: CMTFConfig) -> DecouplingResult:
    """The result of stacked restarts: the best one by training objective, and all of them."""
    best = jnp.argmin(jnp.where(jnp.isfinite(runs.objective), runs.objective, jnp.inf))
    pick = lambda x: x[best]  # noqa: E731
    s = jax.tree_util.tree_map(pick, runs.state)
    return DecouplingResult(
        model=Decoupled(W0=s.W0, W1=s.W1, coef=s.coef, knots=s.knots, basis=config.basis),
        error_J=pick(runs.error_J),
        error_F=pick(runs.error_F),
        objective=pick(runs.objective),
        status=pick(runs.status),
        iterations=pick(runs.iterations),
        dead_ranks=pick(runs.dead_ranks),
        best_restart=best,
        restarts=runs,
        config=config,
    )


def _over_restarts(fn: Callable, batch: str) -> Callable:
    """``fn(restart_args, *shared)`` applied along the leading axis of ``restart_args``:
    ``jax.vmap`` (``batch="vmap"``) or one restart after the other (``"map"``, ``lax.map``)."""
    if batch == "vmap":
        return lambda xs, *shared: jax.vmap(fn, in_axes=(0,) + (None,) * len(shared))(xs, *shared)
    return lambda xs, *shared: jax.lax.map(lambda x: fn(x, *shared), xs)


def _solve_restarts(keys: jax.Array, problem: Problem, config: CMTFConfig, batch: str) -> DecouplingResult:
    if keys.shape[0] == 1:
        # Unbatched, so a single restart is bit-identical to ``jax.jit(solve)`` with its key
        # (XLA's batched kernels may sum in another order).
        runs = jax.tree_util.tree_map(lambda x: x[None], solve(keys[0], problem, config))
    else:
        runs = _over_restarts(solve, batch)(keys, problem, config)
    return _select(runs, config)


# The whole solve as one compiled function.
_solve_restarts_jit = jax.jit(_solve_restarts, static_argnames=("config", "batch"))
# The same solve in three compiled pieces, for progress reports between chunks of sweeps
# (``stop_at`` is traced, so every chunk reuses one compilation).
_start_jit = jax.jit(lambda keys, problem, config, batch: _over_restarts(_start, batch)(keys, problem, config),
                     static_argnums=(2, 3))
_advance_jit = jax.jit(
    lambda loop, problem, config, stop_at, batch: _over_restarts(_advance, batch)(loop, problem, config, stop_at),
    static_argnums=(2, 4),
)
_finish_jit = jax.jit(
    lambda loop, problem, config, batch: _select(_over_restarts(_finish, batch)(loop, problem, config), config),
    static_argnums=(2, 3),
)


def _restart_batching(batch: str | None, shard_restarts: bool) -> str:
    """``"vmap"`` or ``"map"`` for ``decouple(batch=...)``; ``None`` picks per platform.

    On CPU, vmapped restarts buy nothing (the batched LAPACK kernels loop over the batch) and
    jaxlib 0.10's batched eigh/LU kernels can deadlock XLA's CPU thread pool when two run at
    once (seen at m = n = r = 64 with 16 restarts): there, restarts run one after the other.
    On accelerators, or when restarts are sharded over devices, they are vmapped.
    """
    if batch is None:
        return "vmap" if shard_restarts or jax.default_backend() != "cpu" else "map"
    if batch not in ("vmap", "map"):
        raise ValueError(f"batch must be 'vmap', 'map' or None, got {batch!r}")
    return batch


ProgressCallback = Callable[[int, np.ndarray, np.ndarray], None]


def _solve_in_chunks(keys, problem, config, every: int, report: ProgressCallback, batch: str) -> DecouplingResult:
    loop = _start_jit(keys, problem, config, batch)
    done = 0
    while done < config.max_iter:
        done = min(done + every, config.max_iter)
        loop = _advance_jit(loop, problem, config, done, batch)
        it = np.asarray(loop.it)
        last = np.maximum(it - 1, 0)[:, None]
        report(int(it.max()), np.take_along_axis(np.asarray(loop.history_J), last, 1)[:, 0],
               np.take_along_axis(np.asarray(loop.history_F), last, 1)[:, 0])
        if np.all(np.asarray(loop.status) >= 0):
            break
    return _finish_jit(loop, problem, config, batch)


def _tqdm_report(config: CMTFConfig) -> tuple[ProgressCallback, Callable[[], None]]:
    from tqdm.auto import tqdm

    bar = tqdm(total=config.max_iter, desc="R-CMTF sweeps", file=sys.stderr, leave=False)

    def report(iteration, error_J, error_F):
        bar.update(iteration - bar.n)
        bar.set_postfix(error_J=f"{np.min(error_J):.3e}", error_F=f"{np.min(error_F):.3e}")

    return report, bar.close


def _place(keys: jax.Array, problem: Problem, shard: str | None) -> tuple[jax.Array, Problem]:
    """Spread restarts, or the sample axis, over ``jax.devices()`` (a no-op on one device).

    ``"restarts"`` shards the restart axis (it must divide evenly); ``"samples"`` shards the
    sample axis ``S`` of ``X``, ``F`` and the Jacobian (``D`` of a structured Jacobian, ``J`` of a
    dense one); ``"auto"`` picks restarts when they divide evenly, else samples when ``S`` does.
    The compiled program is the same SPMD program on one CPU, several GPUs or a TPU slice.
    """
    devices = jax.devices()
    count = len(devices)
    if shard is None or count == 1:
        return keys, problem
    restarts, S = keys.shape[0], problem.X.shape[0]
    if shard == "auto":
        shard = "restarts" if restarts % count == 0 else "samples" if S % count == 0 else None
        if shard is None:
            return keys, problem
    mesh = Mesh(np.asarray(devices), ("d",))
    if shard == "restarts":
        if restarts % count:
            raise ValueError(f"restarts ({restarts}) must be a multiple of the {count} devices to shard them")
        return jax.device_put(keys, NamedSharding(mesh, P("d"))), problem
    if shard == "samples":
        if S % count:
            raise ValueError(f"S ({S}) must be a multiple of the {count} devices to shard samples")
        rows = lambda x: jax.device_put(x, NamedSharding(mesh, P("d", *([None] * (x.ndim - 1)))))  # noqa: E731
        jac = problem.jac
        jac = jac._replace(D=rows(jac.D)) if isinstance(jac, StructuredJacobian) else jac._replace(J=rows(jac.J))
        return keys, Problem(jac=jac, F=rows(problem.F), X=rows(problem.X))
    raise ValueError(f"shard must be 'auto', 'restarts', 'samples' or None, got {shard!r}")


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_array(name: str, x: Any, ndim: int, shape_doc: str) -> jax.Array:
    if not hasattr(x, "shape"):
        x = np.asarray(x)
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    if _is_concrete(x):
        values = np.asarray(x)
        if not bool(np.all(np.isfinite(values))):
            raise ValueError(f"{name} contains NaN or inf")
        with np.errstate(over="ignore"):
            sq_sum = np.sum(np.square(values))
        if not np.isfinite(sq_sum):
            raise ValueError(
                f"{name} is too large for {values.dtype}: its sum of squares overflows; rescale the data"
            )
    return x


def _validate(J: Any, F: Any, X: Any, config: CMTFConfig, restarts: int) -> Problem:
    if not isinstance(config, CMTFConfig):
        raise ValueError(f"config must be a CMTFConfig, got {type(config).__name__}")
    if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 1:
        raise ValueError(f"restarts must be an int >= 1, got {restarts!r}")
    X = _check_array("X", X, 2, "(S, m)")
    F = _check_array("F", F, 2, "(S, n)")
    S, m = X.shape
    if isinstance(J, (DenseJacobian, StructuredJacobian)):
        jac = J
        for field in jac._fields:
            _check_array(f"J.{field}", getattr(jac, field), 2 if isinstance(jac, StructuredJacobian) else 3, "as documented")
    else:
        jac = DenseJacobian(_check_array("J", J, 3, "(S, n, m)"))
    S_J, n, m_J = jac.shape
    if isinstance(jac, StructuredJacobian):
        H = jac.D.shape[1]
        if jac.V1.shape[1] != H or jac.V0.shape[0] != H:
            raise ValueError(
                f"J: structured factors disagree on the hidden width: V1 {jac.V1.shape}, "
                f"V0 {jac.V0.shape}, D {jac.D.shape}"
            )
    if S_J != S or m_J != m:
        raise ValueError(f"J must have shape (S, n, m) = ({S}, n, {m}) to match X {X.shape}, got {jac.shape}")
    if F.shape != (S, n):
        raise ValueError(f"F must have shape (S, n) = ({S}, {n}) to match J {jac.shape}, got {F.shape}")
    dtypes = {jnp.dtype(a.dtype) for a in jax.tree_util.tree_leaves(jac)} | {F.dtype, X.dtype}
    if len(dtypes) != 1:
        raise ValueError(f"J, F and X must share one floating dtype, got {sorted(map(str, dtypes))}")
    if S < config.basis.num_coef:
        raise ValueError(
            f"X: the number of samples S = {S} must be >= the basis dof {config.basis.num_coef}"
        )
    return Problem(jac=jac, F=jnp.asarray(F), X=jnp.asarray(X))


def decouple(
    J: Any,
    F: Any,
    X: Any,
    config: CMTFConfig,
    *,
    key: jax.Array,
    restarts: int = 1,
    progress: bool | ProgressCallback = False,
    progress_every: int | None = None,
    shard: str | None = "auto",
    batch: str | None = None,
) -> DecouplingResult:
    """Decouple ``f(x) ≈ W1 g(W0 x)`` from Jacobians and outputs at sampling points.

    Args:
      J: ``(S, n, m)`` Jacobians (``jax.vmap(jax.jacfwd(f))(X)``), or a
        :class:`~jaxbsd.tensor.StructuredJacobian` (never materialized).
      F: ``(S, n)`` outputs ``f(X)``.
      X: ``(S, m)`` sampling points.
      config: a :class:`CMTFConfig`.
      key: a ``jax.random`` key; restart ``k`` uses ``jax.random.split(key, restarts)[k]``.
      restarts: number of random restarts, run together in one compiled program.
      progress: ``False`` runs the whole solve as one compiled function. ``True`` shows a
        progress bar with the best Error(𝒥) and Error(F); a callable is called as
        ``progress(iteration, error_J, error_F)`` with per-restart ``(restarts,)`` arrays. Either
        way the sweeps run in compiled chunks of ``progress_every`` (default ``max_iter / 20``).
      progress_every: sweeps between reports.
      shard: how to use several devices: ``"auto"``, ``"restarts"``, ``"samples"`` or ``None``
        (see :func:`_place`); nothing changes on a single device.
      batch: how restarts share a device: ``"vmap"`` (batched), ``"map"`` (one after the
        other, same results to rounding) or ``None``: ``"map"`` on CPU unless restarts are
        sharded over several devices, ``"vmap"`` elsewhere (see :func:`_restart_batching`).

    Returns:
      A :class:`DecouplingResult`; ``result.model`` is the best restart's model.

    Raises:
      ValueError: on mismatched shapes, non-finite values, mixed dtypes, ``S < dof``, or a bad
        config — before anything is compiled.

    Example:
      >>> J, F = jb.sample(f, X)
      >>> res = jb.decouple(J, F, X, jb.CMTFConfig(rank=3), key=jax.random.key(0), restarts=8)
      >>> res.model(X).shape == F.shape
    """
    problem = _validate(J, F, X, config, restarts)
    if progress_every is not None and (not isinstance(progress_every, int) or progress_every < 1):
        raise ValueError(f"progress_every must be a positive int, got {progress_every!r}")
    keys, problem = _place(jax.random.split(key, restarts), problem, shard)
    batch = _restart_batching(batch, shard_restarts=_is_concrete(keys) and len(keys.sharding.device_set) > 1)
    if not progress:
        return _solve_restarts_jit(keys, problem, config, batch)
    every = progress_every or max(1, config.max_iter // 20)
    if callable(progress):
        return _solve_in_chunks(keys, problem, config, every, progress, batch)
    report, close = _tqdm_report(config)
    try:
        return _solve_in_chunks(keys, problem, config, every, report, batch)
    finally:
        close()
