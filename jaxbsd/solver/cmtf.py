"""R-CMTF-BSD: robust coupled matrix–tensor factorization with basis-constrained factors.

Solves (paper, eq. (final_optimization))::

    min  ‖𝒥 − [[W1, W0ᵀ, G]]‖² + λ ‖F − R W1ᵀ‖²
    s.t. G[:, i] = B'_i c_i,  R[:, i] = B_i c_i,   B_i = basis at u_i = X W0[i]ᵀ

by the projected alternating least squares of the paper's Algorithms 1–3, in Gram–Hadamard
form (the Khatri–Rao product is never formed). This module is the algorithm only, as pure
functions of arrays and a :class:`CMTFConfig` (a pytree: its numbers are traced, so a study can
``jax.vmap`` over λ, μ or the tolerance without recompiling):

* :func:`init_state` ``(key, problem, config) -> SolverState``;
* :func:`sweep` ``(state, problem, config) -> SolverState``: one iteration of Algorithm 1;
* :func:`begin` / :func:`advance` / :func:`finish`: one restart's bounded loop, step by step;
* :func:`solve` ``(key, problem, config) -> RestartResult``: one restart, a ``lax.while_loop``;
* :func:`select_best` ``(runs, config) -> DecouplingResult``: the best of stacked restarts.

Given held-out tokens (:class:`HeldOut`, the ``heldout`` argument of :func:`begin`,
:func:`advance`, :func:`finish`, :func:`solve`), a restart keeps the iterate with the lowest
held-out output error instead (iterate 0 included when it is a warm start), restarts are
compared by it, and ``config.patience`` stops a restart early (:class:`Status` ``EARLY_STOPPED``)
once that many sweeps have not improved on its kept iterate.

:func:`jaxbsd.decouple` (``jaxbsd/driver.py``) is the convenient driver on top: validation,
devices, batching of restarts, progress.

Each restart keeps its best finite iterate (lowest objective), so a restart that later
diverges or produces non-finite numbers still returns finite factors, and reports a
:class:`Status`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxbsd.solver.config import CMTFConfig, HeldOut, Status, Tracker
from jaxbsd.solver.decoupled import Decoupled
from jaxbsd.solver.jacobians import JacobianOperator, cpd_sq_norm
from jaxbsd.solver.metrics import relative_error
from jaxbsd.solver.linalg import lstsq, pinv_solve, pinv_solve_by_eigh, small_tikhonov_solve, tikhonov_solve, wide_least_squares

__all__ = [
    "CMTFConfig",
    "Problem",
    "HeldOut",
    "Tracker",
    "SolverState",
    "Status",
    "Errors",
    "Iteration",
    "RestartResult",
    "DecouplingResult",
    "init_state",
    "warm_state",
    "sweep",
    "begin",
    "advance",
    "finish",
    "solve",
    "select_best",
]


class Problem(NamedTuple):
    """The data of a decoupling problem (a pytree). Build it with :func:`jaxbsd.problem`,
    which validates; this constructor does not.

    Attributes:
      jac: the Jacobian tensor ``(S, n, m)`` behind a :class:`~jaxbsd.solver.jacobians.JacobianOperator`.
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


# --------------------------------------------------------------------------- algorithm steps


def _normalize(state: SolverState, eps: jax.Array, basis=None) -> SolverState:
    """Algorithm 2: unit-norm rows of W0 and columns of W1 with a norm floor ``eps`` (and the
    basis's state that the data cannot refit, rescaled with the rows: ``basis.rescaled_state``)."""
    beta0 = jnp.maximum(jnp.linalg.norm(state.W0, axis=1), eps)  # (r,)
    beta1 = jnp.maximum(jnp.linalg.norm(state.W1, axis=0), eps)  # (r,)
    return state._replace(
        W0=state.W0 / beta0[:, None],
        W1=state.W1 / beta1[None, :],
        G=state.G * (beta0 * beta1)[None, :],
        R=state.R * beta1[None, :],
        knots=state.knots if basis is None else jax.vmap(basis.rescaled_state)(state.knots, beta0),
    )


def _project(
    X: jax.Array, W0: jax.Array, G: jax.Array, R: jax.Array, config: CMTFConfig, knots: jax.Array | None = None
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Algorithm 3 for all ranks at once: refit knots (``basis.refit``, from the current
    ``knots (r, K)``) and coefficients, project G and R.

    Returns:
      ``(G, R, coef, knots)`` with shapes ``(S, r), (S, r), (r, ν), (r, K)``.
    """
    basis, lam = config.basis, config.lam
    # Rank-major layout throughout: every per-rank quantity is a contiguous row.
    U = W0 @ X.T  # (r, S)
    knots = jax.vmap(basis.fit)(U) if knots is None else jax.vmap(basis.refit)(U, knots)  # (r, K)
    B, dB = jax.vmap(basis.design)(U, knots)  # (r, S, ν) each
    Gt, Rt = G.T, R.T  # (r, S)
    if config.robust:
        # Tikhonov-regularized normal equations (μ_c > 0 keeps them definite), one ν × ν system
        # per rank.
        # Sums over the samples run along the contiguous minor axis ((r, ν, S) layout): on CPU
        # 1.6x faster than batched ν × S products.
        Bt, dBt = jnp.swapaxes(B, 1, 2), jnp.swapaxes(dB, 1, 2)  # (r, ν, S)
        gram = lambda M: jnp.sum(M[:, :, None, :] * M[:, None, :, :], axis=-1)  # noqa: E731
        A = gram(dBt) + lam * gram(Bt)
        b = jnp.sum(dBt * Gt[:, None, :], axis=-1) + lam * jnp.sum(Bt * Rt[:, None, :], axis=-1)
        coef = small_tikhonov_solve(A, b, config.mu_c)
    else:
        # The paper's CMTF-BSD/PD: plain least squares on the stacked system
        # [B'; √λ B] c ≈ [g; √λ r].
        root = jnp.sqrt(jnp.asarray(lam, B.dtype))
        stacked = jnp.concatenate([dB, root * B], axis=1)  # (r, 2S, ν)
        rhs = jnp.concatenate([Gt, root * Rt], axis=1)  # (r, 2S)
        coef = jax.vmap(lstsq)(stacked, rhs)
    G = jnp.einsum("rsi,ri->sr", dB, coef)
    R = jnp.einsum("rsi,ri->sr", B, coef)
    return G, R, coef, knots


class Errors(NamedTuple):
    """Squared residuals of one iterate. ``objective = res_J + λ res_F``."""

    res_J: jax.Array
    res_F: jax.Array
    objective: jax.Array


def _sweep(state: SolverState, problem: Problem, config: CMTFConfig, sq_norm_J: jax.Array) -> tuple[SolverState, Errors]:
    """One sweep and the residuals of its result.

    ``‖𝒥 − 𝒥̂‖²`` comes from the Gram identity ``‖𝒥‖² − 2⟨𝒥, 𝒥̂⟩ + ‖𝒥̂‖²`` with
    ``⟨𝒥, 𝒥̂⟩ = Σ G ∘ M3``: ``M3`` is already computed for the G update (the projection moves
    G, not W0 or W1), so tracking the objective costs ``O(S r)`` instead of a third pass over
    𝒥. Its rounding floor is ``~eps · ‖𝒥‖²``; the final result is re-evaluated exactly
    (:meth:`~jaxbsd.solver.jacobians.JacobianOperator.residual_sq_norm`).
    """
    jac, F, X = problem
    lam, mu_w = config.lam, config.effective_mu_w
    if config.robust:
        state = _normalize(state, config.eps, config.basis)
    W0, W1, G, R = state.W0, state.W1, state.G, state.R
    GtG = G.T @ G
    # W1 ← (M1 + λ Fᵀ R)(GᵀG ∘ W0W0ᵀ + λ RᵀR + μ_W I)⁻¹
    gram_w1 = GtG * (W0 @ W0.T) + lam * (R.T @ R)
    rhs_w1 = jac.mttkrp_w1(W0, G) + lam * (F.T @ R)
    W1 = tikhonov_solve(gram_w1, rhs_w1, mu_w) if config.robust else pinv_solve(gram_w1, rhs_w1)
    # W0ᵀ ← M2 (GᵀG ∘ W1ᵀW1 + μ_W I)⁻¹
    # (M2 and M3 both contract 𝒥 with the new W1: done once, see jaxbsd.solver.jacobians.)
    W1tW1 = W1.T @ W1
    U = jac.contract_w1(W1)
    rhs_w0 = jac.mttkrp_w0_from(U, G)
    W0 = (tikhonov_solve(GtG * W1tW1, rhs_w0, mu_w) if config.robust else pinv_solve(GtG * W1tW1, rhs_w0)).T
    # G ← M3 (W0W0ᵀ ∘ W1ᵀW1)⁻¹ ;  R ← F W1 (W1ᵀW1)⁻¹  (plain least squares in both variants)
    M3 = jac.mttkrp_g_from(U, W0)
    G = pinv_solve((W0 @ W0.T) * W1tW1, M3)
    # W1ᵀW1 (r × r) has rank at most n: at r > n it is singular (solved through the n × n Gram,
    # wide_least_squares) and at r = n ill-conditioned in practice (κ₂ 9.5e9 at the ViT-B
    # benchmark, κ∞ 3e5 at the paper size), so the certified Cholesky of pinv_solve would fail
    # every sweep and only add its cost to the eigh's.
    n, r = W1.shape
    if r > n:
        R = wide_least_squares(W1, F)
    else:
        R = (pinv_solve_by_eigh if r == n else pinv_solve)(W1tW1, F @ W1)
    G, R, coef, knots = _project(X, W0, G, R, config, state.knots)
    new = SolverState(W0=W0, W1=W1, G=G, R=R, coef=coef, knots=knots)
    res_J = jnp.maximum(sq_norm_J - 2 * jnp.sum(G * M3) + cpd_sq_norm(W0, W1, G), 0)
    res_F = jnp.sum((F - R @ W1.T) ** 2)
    return new, Errors(res_J, res_F, res_J + lam * res_F)


def sweep(state: SolverState, problem: Problem, config: CMTFConfig) -> SolverState:
    """One iteration of R-CMTF-BSD (paper, Algorithm 1; DESIGN.md §3 steps 1–6).

    Args:
      state: the current factors.
      problem: a :class:`Problem`.
      config: a :class:`CMTFConfig`.

    Returns:
      The next :class:`SolverState`, same shapes and dtype.
    """
    config = config.cast(problem.F.dtype)
    return _sweep(state, problem, config, problem.jac.sq_norm())[0]


@jax.jit  # one program when called outside jit (op by op, every primitive would compile)
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


def _errors(state: SolverState, problem: Problem, lam: jax.Array) -> Errors:
    """Exact residuals of ``state`` (the operator's own ``‖𝒥 − 𝒥̂‖²``)."""
    res_J = problem.jac.residual_sq_norm(state.W0, state.W1, state.G)
    res_F = jnp.sum((problem.F - state.R @ state.W1.T) ** 2)
    return Errors(res_J, res_F, res_J + lam * res_F)


def _finite(tree: Any) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


class _Norms(NamedTuple):
    J: jax.Array  # ‖𝒥‖² (floored at tiny)
    F: jax.Array  # ‖F‖² (floored at tiny)
    scale: jax.Array  # ‖𝒥‖² + λ‖F‖² (floored at tiny)


def _norms(problem: Problem, lam: jax.Array) -> _Norms:
    tiny = jnp.finfo(problem.F.dtype).tiny
    norm_J, norm_F = problem.jac.sq_norm(), jnp.sum(problem.F**2)
    return _Norms(jnp.maximum(norm_J, tiny), jnp.maximum(norm_F, tiny), jnp.maximum(norm_J + lam * norm_F, tiny))


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
    #: with held-out tokens or ``config.patience``: the sweep whose iterate was kept (0: the initial
    #: state); else None
    kept_sweep: jax.Array | None = None
    #: with held-out tokens: the kept iterate's held-out relative output error; else None
    heldout_error: jax.Array | None = None


class Iteration(NamedTuple):
    """The carry of one restart's loop (a pytree): :func:`begin` makes it, :func:`advance`
    moves it one sweep, :func:`finish` turns it into a :class:`RestartResult`."""

    it: jax.Array  #: sweeps done
    state: SolverState  #: the current iterate
    prev_objective: jax.Array
    best: SolverState  #: the best finite iterate so far
    best_errors: Errors
    history_J: jax.Array  #: ``(max_iter,)``
    history_F: jax.Array  #: ``(max_iter,)``
    status: jax.Array  #: ``-1`` while running, else a :class:`Status`
    strikes: jax.Array  #: consecutive sweeps above ``divergence`` × best
    #: the early-stopping bookkeeping, with held-out tokens or ``config.patience``; else None
    tracker: Tracker | None = None

    @property
    def running(self) -> jax.Array:
        return self.status < 0


def _tracking(config: CMTFConfig, heldout: HeldOut | None) -> bool:
    """Whether a restart needs a :class:`Tracker`: held-out tokens or early stopping."""
    return heldout is not None or config.patience is not None


def _heldout_score(state: SolverState, objective: jax.Array, config: CMTFConfig, heldout: HeldOut | None):
    """The criterion iterates are kept by: the held-out ``‖Y − f̂(X)‖²/‖Y‖²``, else the objective."""
    if heldout is None:
        return objective
    model = Decoupled(W0=state.W0, W1=state.W1, coef=state.coef, knots=state.knots, basis=config.basis)
    return relative_error(heldout.Y, model(heldout.X))


@jax.jit  # (as init_state)
def warm_state(problem: Problem, config: CMTFConfig, model: Decoupled) -> SolverState:
    """The solver state of a given decoupled model, to start a restart from it (a warm start).

    ``W0``, ``W1``, ``coef`` and ``knots`` are the model's; ``G`` and ``R`` are its internal
    functions' derivatives and values at the samples, ``G[s, i] = g_i'(u_i⁽ˢ⁾)`` and
    ``R[s, i] = g_i(u_i⁽ˢ⁾)`` with ``u = X W0ᵀ``, so the state's zeroth- and first-order
    factors describe exactly the model given (before any sweep refits the knots).

    Args:
      problem: the :class:`Problem` to be solved.
      config: its :class:`CMTFConfig`; ``model.basis`` must be ``config.basis`` and
        ``model.rank`` must be ``config.rank`` (:func:`jaxbsd.decouple` checks both).
      model: a :class:`~jaxbsd.Decoupled` with ``W0 (r, m)``, ``W1 (n, r)``, ``coef (r, ν)``,
        ``knots (r, K)``.

    Returns:
      A :class:`SolverState` in the problem's dtype.
    """
    dtype = problem.F.dtype
    W0, W1, coef, knots = (jnp.asarray(a, dtype) for a in (model.W0, model.W1, model.coef, model.knots))
    U = W0 @ problem.X.T  # (r, S)
    B, dB = jax.vmap(config.basis.design)(U, knots)  # (r, S, ν) each
    G = jnp.einsum("rsi,ri->sr", dB, coef)
    R = jnp.einsum("rsi,ri->sr", B, coef)
    return SolverState(W0=W0, W1=W1, G=G, R=R, coef=coef, knots=knots)


def begin(key: jax.Array, problem: Problem, config: CMTFConfig, *, init: SolverState | None = None,
          heldout: HeldOut | None = None) -> Iteration:
    """Loop state before the first sweep (the initial state is the fallback best iterate).

    ``init``: start from this state (:func:`warm_state`) instead of the random one of ``key``.
    A warm initial state also competes as an iterate: if no sweep improves on its objective
    (its held-out error, given ``heldout``), the restart returns it unchanged.
    """
    config = config.cast(problem.F.dtype)
    norms = _norms(problem, config.lam)
    state0 = init_state(key, problem, config) if init is None else init
    inf = jnp.asarray(jnp.inf, problem.F.dtype)
    errs0 = _errors(state0, problem, config.lam)
    best_errors = Errors(inf, inf, inf)
    if init is not None:
        # A warm start is a model someone chose (e.g. a pruned MLP): it stays the answer unless
        # a sweep beats it. A random initial state is only the fallback, never a candidate.
        finite0 = _finite(state0) & jnp.isfinite(errs0.objective)
        best_errors = jax.tree_util.tree_map(lambda e: jnp.where(finite0, e, inf), errs0)
    tracker = None
    if _tracking(config, heldout):
        score0 = _heldout_score(state0, errs0.objective, config, heldout)
        candidate = (init is not None) & _finite(state0) & jnp.isfinite(errs0.objective) & jnp.isfinite(score0)
        zero = jnp.asarray(0)
        tracker = Tracker(jnp.where(candidate, score0, inf), zero, zero, best_errors.objective)
    return Iteration(
        it=jnp.asarray(0),
        state=state0,
        prev_objective=inf,
        best=state0,
        best_errors=best_errors,
        history_J=jnp.full((config.max_iter,), errs0.res_J / norms.J),
        history_F=jnp.full((config.max_iter,), errs0.res_F / norms.F),
        status=jnp.asarray(-1),
        strikes=jnp.asarray(0),
        tracker=tracker,
    )


def advance(loop: Iteration, problem: Problem, config: CMTFConfig, *, heldout: HeldOut | None = None) -> Iteration:
    """One sweep of a running restart, with the bookkeeping of Algorithm 1's loop: best
    iterate (by objective, or by held-out error given ``heldout``), history, and the stopping
    rules (convergence, divergence, non-finite, patience, max_iter). Call it only while
    ``loop.running`` (a stopped restart is not continued)."""
    config = config.cast(problem.F.dtype)
    norms = _norms(problem, config.lam)
    new, errs = _sweep(loop.state, problem, config, problem.jac.sq_norm())
    finite = _finite(new) & jnp.isfinite(errs.objective)
    tracker, lowest, stopped = loop.tracker, loop.best_errors.objective, jnp.asarray(False)
    if tracker is None:
        improved = finite & (errs.objective < loop.best_errors.objective)
    else:
        score = _heldout_score(new, errs.objective, config, heldout)
        improved = finite & jnp.isfinite(score) & (score < tracker.score)
        lowest = tracker.lowest_objective
        stale = jnp.where(improved, 0, tracker.stale + 1)
        tracker = Tracker(jnp.where(improved, score, tracker.score), jnp.where(improved, loop.it + 1, tracker.kept),
                          stale, jnp.where(finite, jnp.minimum(lowest, errs.objective), lowest))
        if config.patience is not None:
            stopped = stale >= config.patience
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
    best_so_far = jnp.maximum(lowest, jnp.finfo(norms.scale.dtype).eps * norms.scale)
    above = jnp.isfinite(lowest) & (errs.objective > config.divergence * best_so_far)
    strikes = jnp.where(above, loop.strikes + 1, 0)
    diverged = strikes >= config.divergence_patience
    status = jnp.select(
        [~finite, diverged, converged, stopped, loop.it + 1 >= config.max_iter],
        [Status.NONFINITE, Status.DIVERGED, Status.CONVERGED, Status.EARLY_STOPPED, Status.MAX_ITERATIONS],
        -1,
    )
    # A non-finite sweep is not continued from: the loop stops with the best iterate.
    return Iteration(
        loop.it + 1, new, errs.objective, best, best_errors,
        jnp.where(tail, err_J, loop.history_J), jnp.where(tail, err_F, loop.history_F), status, strikes, tracker,
    )


def finish(loop: Iteration, problem: Problem, config: CMTFConfig, *, heldout: HeldOut | None = None) -> RestartResult:
    """The restart's result from its best iterate (the initial state if no sweep was finite),
    with exact residuals (and, given ``heldout``, the kept iterate's held-out error)."""
    config = config.cast(problem.F.dtype)
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
        kept_sweep=None if loop.tracker is None else loop.tracker.kept,
        heldout_error=None if heldout is None else loop.tracker.score,
    )


def _dead_ranks(state: SolverState, eps: jax.Array) -> jax.Array:
    """Number of collapsed ranks: their ``g_i`` no longer contributes to the model."""
    dead = (jnp.linalg.norm(state.W0, axis=1) <= eps) | (jnp.linalg.norm(state.W1, axis=0) <= eps)
    return jnp.sum(dead)


#: ``on_sweep(loop)``, called inside the compiled loop after every sweep (traced values).
SweepHook = Callable[[Iteration], None]


def solve(
    key: jax.Array, problem: Problem, config: CMTFConfig, *, init: SolverState | None = None,
    on_sweep: SweepHook | None = None, heldout: HeldOut | None = None,
) -> RestartResult:
    """One restart of R-CMTF-BSD as a bounded ``lax.while_loop`` (jittable, vmappable over
    the key, the problem's arrays or the config's numbers).

    History entries after the last sweep repeat the last value, so the arrays have a static
    shape ``(max_iter,)``; ``iterations`` says how many are real.

    Args:
      key: a ``jax.random`` key.
      problem: a :class:`Problem` (:func:`jaxbsd.problem` builds a validated one).
      config: a :class:`CMTFConfig`.
      init: start from this state (a warm start, :func:`warm_state`) instead of a random one;
        ``key`` is then unused.
      on_sweep: optional hook called inside the loop after each sweep with the traced
        :class:`Iteration` (for monitoring with ``jax.experimental.io_callback``); it must not
        be batched by an enclosing ``vmap`` if it branches on the iteration count.
      heldout: keep the iterate with the lowest output error on these tokens (:class:`HeldOut`)
        instead of the lowest objective; ``config.patience`` stops early by the same criterion.

    Returns:
      A :class:`RestartResult`.
    """

    def body(loop: Iteration) -> Iteration:
        loop = advance(loop, problem, config, heldout=heldout)
        if on_sweep is not None:
            on_sweep(loop)
        return loop

    loop = jax.lax.while_loop(lambda l: l.running, body, begin(key, problem, config, init=init, heldout=heldout))
    return finish(loop, problem, config, heldout=heldout)


# --------------------------------------------------------------------------- several restarts


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecouplingResult:
    """The best of several restarts (:func:`select_best`, :func:`jaxbsd.decouple`).

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
      config: the configuration.
      kept_sweep: with held-out tokens or ``config.patience``, the sweep whose iterate the best
        restart kept (0: its initial state); else None.
      heldout_error: with held-out tokens (by which restarts are then compared), the best
        restart's held-out relative output error; else None.
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
    config: CMTFConfig
    kept_sweep: jax.Array | None = None
    heldout_error: jax.Array | None = None

    @property
    def history(self) -> dict[str, jax.Array]:
        """Per restart, per iteration: ``{"error_J": (R, T), "error_F": (R, T)}``."""
        return {"error_J": self.restarts.history_J, "error_F": self.restarts.history_F}

    def restart_model(self, index: int) -> Decoupled:
        """The model of restart ``index``."""
        s = jax.tree_util.tree_map(lambda x: x[index], self.restarts.state)
        return Decoupled(W0=s.W0, W1=s.W1, coef=s.coef, knots=s.knots, basis=self.config.basis)


def select_best(runs: RestartResult, config: CMTFConfig) -> DecouplingResult:
    """The result of restarts stacked on a leading axis (``jax.vmap(solve)`` over keys): the
    best one by training objective (by held-out error when the restarts have one; non-finite
    values never win), and all of them.

    Args:
      runs: a :class:`RestartResult` whose leaves have a leading restart axis ``(R, ...)``.
      config: the config the restarts were solved with.
    """
    score = runs.objective if runs.heldout_error is None else runs.heldout_error
    best = jnp.argmin(jnp.where(jnp.isfinite(score), score, jnp.inf))
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
        kept_sweep=None if runs.kept_sweep is None else pick(runs.kept_sweep),
        heldout_error=None if runs.heldout_error is None else pick(runs.heldout_error),
    )
