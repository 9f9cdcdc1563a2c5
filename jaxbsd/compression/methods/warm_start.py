"""A pruned MLP written as a decoupled model, and choosing among restarts by output error.

A pruned MLP ``y = K2ᵀ h(K1ᵀ x + b1) + b2`` (:class:`~jaxbsd.models.compressed.PrunedMLP`, ``k`` hidden
units) is almost a decoupled function ``W1 g(W0 x)``: ``W0`` the kept rows of the first layer,
``g_i(u) = h(u + b1_i)`` and ``W1`` the refitted output layer. Two things differ:

* ``g_i`` must lie in the solver's basis: each is fitted by least squares of the basis at the
  unit's activations ``u_i = X W0[i]ᵀ`` on the sampling points, with the knots the basis itself
  places there (``basis.fit``, as the solver's first sweep will). What remains is the basis's
  approximation of the shifted activation on that range.
* A decoupling has no output bias (:class:`~jaxbsd.models.decoupled_mlp.DecoupledMLP`: the
  output bias of the original MLP enters through the outputs ``F`` it is fitted to). At rank
  ``k + 1`` one extra internal function, constant, carries ``b2`` exactly; at rank ``k`` the
  internal functions take constants ``c`` with ``W1 c`` the least-squares projection of ``b2``
  on the columns of ``W1`` (exact only when ``b2`` lies in their span; :func:`bias_residual`
  measures how far it is, :func:`bias_tolerance` says what counts as in it).

:func:`restart_output_errors` measures each restart of a :class:`~jaxbsd.DecouplingResult` by
the relative output error on given tokens, and :func:`choose_restart` picks one by that or by
the solver's training objective.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbsd.solver import metrics
from jaxbsd.solver.bases import AUGMENT_ACTIVATIONS, Augmented, Basis
from jaxbsd.solver.cmtf import DecouplingResult
from jaxbsd.solver.decoupled import Decoupled
from jaxbsd.models.layers import ACTIVATIONS

__all__ = ["SELECTIONS", "bias_residual", "bias_tolerance", "decoupled_from_pruned", "mlp_from_decoupled",
           "restart_output_errors", "choose_restart"]

#: How a restart is chosen: ``"objective"`` (the solver's training objective
#: ``‖𝒥−𝒥̂‖² + λ‖F−F̂‖²`` on the samples, as :func:`jaxbsd.decouple` does) or ``"output"``
#: (the relative output error on held-out calibration tokens, what users measure).
SELECTIONS = ("objective", "output")


def bias_residual(pruned: Any, dtype: Any = np.float64) -> float:
    """``‖W1 c − b2‖ / ‖b2‖`` for a pruned MLP at rank ``k``: ``W1 = K2ᵀ`` and the units' constants
    ``c = argmin ‖K2ᵀ c − b2‖`` (float64, as :func:`decoupled_from_pruned` solves it), both rounded
    to ``dtype`` (the solve's) before the product, which is taken in float64: how far from the
    output bias the decoupling at rank ``k`` starts. 0 when ``b2 = 0``.

    ``b2`` lies in the span of ``K2``'s ``n``-dimensional rows generically when ``k ≥ n`` (a full
    row rank ``K2ᵀ``), never generically when ``k < n``. Measured on all-MiniLM-L6-v2's six MLPs
    (``n = 384``, pruned on their captured tokens, float32): at ``k = 767`` 7e-9 … 2e-8 (1e-15 in
    float64), at ``k = 384`` 8e-8 … 2.7e-6 (``K2`` conditioned 6e3 … 5e4), at ``k = 383`` 1e-3 … 4e-2.
    """
    K2 = np.asarray(pruned.fc2.kernel[...], np.float64)
    b2 = np.asarray(pruned.fc2.bias[...], np.float64)
    norm = float(np.linalg.norm(b2))
    if norm == 0.0:
        return 0.0
    c, *_ = np.linalg.lstsq(K2.T, b2, rcond=None)
    rounded = lambda a: np.asarray(a, dtype).astype(np.float64)  # noqa: E731
    return float(np.linalg.norm(rounded(K2).T @ rounded(c) - b2)) / norm


def bias_tolerance(dtype: Any) -> float:
    """The largest :func:`bias_residual` at which the rank-``k`` decoupling counts as carrying the
    output bias: ``max(1e-6, 100 ε)`` of ``dtype`` (1e-6 in float64, 1.2e-5 in float32, whose
    rounding of ``W1`` and ``c`` alone leaves ~1e-8 … 1e-6)."""
    return max(1e-6, 100 * float(np.finfo(np.dtype(dtype)).eps))


def _fit_internal(basis: Basis, u: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(knots (K,), coef (ν,))``: knots placed by ``basis.fit`` on ``u (S,)``, coefficients
    by least squares of the basis at ``u`` on ``values (S,)`` (float64, minimum norm)."""
    uj = jnp.asarray(u)
    knots = basis.fit(uj)
    B = np.asarray(basis.design(uj, knots)[0], np.float64)
    coef, *_ = np.linalg.lstsq(B, values, rcond=None)
    return np.asarray(knots, np.float64), coef


def _fit_augmented(basis: Augmented, u: np.ndarray, shift: float, values: np.ndarray,
                   weight: float) -> tuple[np.ndarray, np.ndarray]:
    """``(knots (K + 2,), coef (ν + 1,))`` of ``u ↦ weight · σ(u + shift) + e(u)`` in an
    :class:`~jaxbsd.solver.bases.Augmented` basis: the activation's coefficient ``weight``, its
    scale 1 and shift ``shift``, and the inner basis fitted by least squares at ``u (S,)`` to
    what remains of ``values (S,)`` (a constant for a pruned unit: exact in a basis with constants)."""
    activation = np.asarray(AUGMENT_ACTIVATIONS[basis.activation][0](jnp.asarray(u + shift)), np.float64)
    inner_knots, inner_coef = _fit_internal(basis.inner, u, values - weight * activation)
    return np.concatenate([inner_knots, [1.0, shift]]), np.concatenate([inner_coef, [weight]])


def _fit_units(basis: Basis, U: np.ndarray, targets: np.ndarray, shifts: np.ndarray, weights: np.ndarray,
               exact: bool):
    """``(knots (rank, K), coef (rank, ν))`` of every internal function: through the activation
    (``exact``: ``basis`` is augmented with the pruned MLP's own; ``weights``: 1 for a unit, 0 for
    the constant one), or by least squares of the whole basis."""
    rank = U.shape[1]
    if exact:
        fits = [_fit_augmented(basis, U[:, i], float(shifts[i]), targets[:, i], float(weights[i])) for i in range(rank)]
    else:
        fits = [_fit_internal(basis, U[:, i], targets[:, i]) for i in range(rank)]
    return np.stack([f[0] for f in fits]).reshape(rank, basis.num_knots), np.stack([f[1] for f in fits])


def decoupled_from_pruned(pruned: Any, X: jax.Array, basis: Basis, *, rank: int | None = None,
                          output_bias: bool = True) -> Decoupled:
    """The decoupled model of a pruned MLP, to warm-start the solver (``jb.decouple(init=...)``).

    For a :class:`~jaxbsd.models.compressed.PrunedMLP` ``y = h(x K1 + b1) K2 + b2`` with ``k`` units:

    * ``W0[i] = K1[:, i]ᵀ`` for ``i < k`` (the kept rows of the first layer, unscaled);
    * ``g_i ≈ u ↦ h(u + b1_i) + c_i`` in ``basis``: knots ``basis.fit(u_i)`` and least-squares
      coefficients at ``u_i = X W0[i]ᵀ``; in an :class:`~jaxbsd.solver.bases.Augmented` basis
      whose activation is the MLP's (by name), exactly: the activation's coefficient 1, scale 1
      and shift ``b1_i``, and ``c_i`` in the inner basis (so ``e_i = 0`` below, to rounding);
    * ``W1[:, i] = K2[i, :]`` (the refitted output layer);
    * the output bias ``b2``: with ``rank = k + 1`` the last internal function is the constant 1
      (fitted the same way; ``W0`` row: the leading right singular vector of ``X``, so its knots
      span a real range) and ``W1[:, k] = b2`` — exact; with ``rank = k`` (the default),
      ``c = argmin ‖K2ᵀ c − b2‖`` — exact only when ``b2`` is in the span of ``K2``'s rows.

    So on ``X``, ``model(X) = pruned(X) + Σ_i e_i W1[:, i]ᵀ`` (+ ``(K2ᵀ c − b2)`` at rank ``k``),
    ``e_i`` the basis's least-squares residual of ``g_i`` at ``u_i``.

    Args:
      pruned: a :class:`~jaxbsd.models.compressed.PrunedMLP` with a named activation (or a callable).
      X: ``(S, m)`` sampling points (the solver's; the knots are placed on their activations).
      basis: the solver's basis (``config.basis``).
      rank: ``k`` or ``k + 1`` (None: ``k``).
      output_bias: ``False``: ``b2`` left out (taken as 0), so the model is ``pruned(x) − b2`` (its
        caller carries ``b2``: :func:`mlp_from_decoupled`); at rank ``k`` that is exact in every
        basis with constants, whatever the span of ``K2``'s rows.

    Returns:
      A :class:`~jaxbsd.Decoupled` of rank ``rank`` in ``X``'s dtype, with ``W0 (rank, m)``,
      ``W1 (n, rank)``, ``coef (rank, ν)``, ``knots (rank, K)``.

    Raises:
      ValueError: naming the argument: ``pruned`` not a pruned MLP, ``X`` of the wrong shape,
        non-finite or with fewer rows than ``ν``, ``rank`` not ``k`` or ``k + 1``.
    """
    from jaxbsd.models.compressed import PrunedMLP

    if not isinstance(pruned, PrunedMLP):
        raise ValueError(f"pruned must be a jaxbsd.models.compressed.PrunedMLP, got {type(pruned).__name__}")
    if not isinstance(basis, Basis):
        raise ValueError(f"basis must be a jaxbsd basis, got {type(basis).__name__}")
    K1 = np.asarray(pruned.fc1.kernel[...], np.float64)
    b1 = np.asarray(pruned.fc1.bias[...], np.float64)
    K2 = np.asarray(pruned.fc2.kernel[...], np.float64)
    b2 = np.asarray(pruned.fc2.bias[...], np.float64) * float(output_bias)
    m, k = K1.shape
    if getattr(X, "ndim", None) != 2 or X.shape[1] != m:
        raise ValueError(f"X must have shape (S, {m}), got {getattr(X, 'shape', type(X).__name__)}")
    if X.shape[0] < basis.num_coef:
        raise ValueError(f"X: fitting {basis.num_coef} coefficients per unit needs at least that many rows, "
                         f"got {X.shape[0]}")
    rank = k if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank not in (k, k + 1):
        raise ValueError(f"rank must be k = {k} or k + 1 = {k + 1} (an extra constant unit for the output bias), "
                         f"got {rank!r}")
    Xh = np.asarray(X, np.float64)
    if not np.all(np.isfinite(Xh)):
        raise ValueError("X must be finite")
    h = ACTIVATIONS[pruned.activation] if isinstance(pruned.activation, str) else pruned.activation
    U = Xh @ K1  # (S, k): the units' activations without their bias
    hidden = np.asarray(h(jnp.asarray(U + b1[None, :])), np.float64)
    W0, W1 = K1.T, K2.T
    if rank == k:
        # No output bias in a decoupling: constants in the g_i carry its projection on range(W1).
        c, *_ = np.linalg.lstsq(W1, b2, rcond=None)
        targets = hidden + c[None, :]
    else:
        direction = np.linalg.svd(Xh, full_matrices=False)[2][0]  # a row whose activations spread
        W0 = np.concatenate([W0, direction[None, :]])
        W1 = np.concatenate([W1, b2[:, None]], axis=1)
        U = np.concatenate([U, (Xh @ direction)[:, None]], axis=1)
        targets = np.concatenate([hidden, np.ones((Xh.shape[0], 1))], axis=1)
    # Another activation than the MLP's (or a callable one): least squares of the whole basis.
    exact = isinstance(basis, Augmented) and basis.activation == pruned.activation
    shifts = np.concatenate([b1, np.zeros(rank - k)])
    weights = np.concatenate([np.ones(k), np.zeros(rank - k)])
    knots, coef = _fit_units(basis, U, targets, shifts, weights, exact)
    if not all(np.all(np.isfinite(a)) for a in (W0, W1, coef, knots)):
        raise ValueError("pruned: its decoupled form is not finite (non-finite weights or activations)")
    dtype = jnp.asarray(X).dtype
    cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    return Decoupled(W0=cast(W0), W1=cast(W1), coef=cast(coef), knots=cast(knots), basis=basis)


def mlp_from_decoupled(model: Decoupled, output_bias: jax.Array, dtype: Any = None) -> Any:
    """The MLP that ``x ↦ model(x) + output_bias`` is, for a decoupling in an
    :class:`~jaxbsd.solver.bases.Augmented` basis whose inner basis spans the constants only
    (:attr:`~jaxbsd.solver.bases.Augmented.is_mlp`): ``g_i(u) = c_i + a_i σ(s_i u + t_i)``, so

    * ``fc1``: kernel column ``i`` is ``s_i W0[i]``, bias ``t_i``;
    * ``fc2``: kernel row ``i`` is ``a_i W1[:, i]``, bias ``output_bias + W1 c``.

    The inverse of :func:`decoupled_from_pruned` (with ``output_bias=False`` and ``b2`` given
    back here), for any iterate of the solver, not only its start.

    Args:
      model: ``W0 (r, m)``, ``W1 (n, r)``, ``coef (r, 2)``, ``knots (r, K + 2)``.
      output_bias: ``(n,)``.
      dtype: the module's parameter dtype (None: ``model``'s).

    Returns:
      A :class:`~jaxbsd.models.compressed.PrunedMLP` of ``r`` units with the basis's activation.

    Raises:
      ValueError: naming ``model`` if its basis is not such an augmented basis.
    """
    from jaxbsd.models.compressed import PrunedMLP

    basis = model.basis
    if not (isinstance(basis, Augmented) and basis.is_mlp):
        raise ValueError(f"model must be in an Augmented basis whose inner basis spans the constants only, got {basis!r}")
    inner_knots, scale, shift = basis.split_state(model.knots)
    # The inner function's value, the same at every input: taken at 0.
    constant = jax.vmap(lambda k, c: basis.inner.evaluate(jnp.zeros((1,), model.W0.dtype), k, c)[0])(
        inner_knots, model.coef[:, :-1])
    dtype = model.W0.dtype if dtype is None else dtype
    cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    K1 = (model.W0 * scale[:, None]).T
    K2 = (model.W1 * model.coef[None, :, -1]).T
    b2 = jnp.asarray(output_bias, model.W1.dtype) + model.W1 @ constant
    return PrunedMLP(cast(K1), cast(shift), cast(K2), cast(b2), basis.activation)


def restart_output_errors(result: DecouplingResult, X: jax.Array, Y: jax.Array) -> np.ndarray:
    """Relative output error ``‖Y − f̂_i(X)‖²/‖Y‖²`` of every restart ``i`` of ``result``.

    Args:
      result: a :class:`~jaxbsd.DecouplingResult` (warm restart included, last).
      X: ``(N, m)`` tokens; Y: ``(N, n)`` the block's outputs there.

    Returns:
      ``(restarts,)`` float64 host array; a non-finite error (a restart whose model does not
      evaluate to finite numbers) is ``inf``, so it is never chosen.
    """
    count = int(np.shape(result.restarts.objective)[0])
    X, Y = jnp.asarray(X), jnp.asarray(Y)
    errors = np.array([float(relative_output_error(result.restart_model(i), X, Y)) for i in range(count)], np.float64)
    return np.where(np.isfinite(errors), errors, np.inf)


@jax.jit
def relative_output_error(model: Decoupled, X: jax.Array, Y: jax.Array) -> jax.Array:
    X = X.astype(model.W0.dtype)
    return metrics.relative_error(Y.astype(model.W0.dtype), model(X))


def choose_restart(result: DecouplingResult, selection: str, output_errors: np.ndarray) -> int:
    """The restart kept: ``result.best_restart`` (``"objective"``) or the smallest of
    ``output_errors`` (``"output"``; ties: the lower index; all infinite: by objective)."""
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    if selection == "objective" or not np.any(np.isfinite(output_errors)):
        return int(result.best_restart)
    return int(np.argmin(output_errors))
