"""The solver's configuration and its outcome codes: :class:`CMTFConfig` (a pytree of static and
traced fields, so a sweep over λ or the tolerances is one compiled program) and :class:`Status`;
and what an opt-in held-out selection adds to a solve: its tokens (:class:`HeldOut`) and its
bookkeeping (:class:`Tracker`)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxbsd.solver.bases import Basis, BSpline

__all__ = ["CMTFConfig", "Status", "HeldOut", "Tracker", "TRACED_FIELDS", "STATIC_FIELDS"]


class Status(enum.IntEnum):
    """Why a restart stopped."""

    CONVERGED = 0  #: relative change of the objective below ``tol``, or an exact fit
    MAX_ITERATIONS = 1  #: ``max_iter`` sweeps done
    DIVERGED = 2  #: the objective exceeded ``divergence`` × the best objective this restart reached
    NONFINITE = 3  #: a sweep produced inf/NaN; the best finite iterate is returned
    EARLY_STOPPED = 4  #: the kept iterate was not improved on for ``patience`` sweeps

    @property
    def message(self) -> str:
        return _STATUS_MESSAGES[self]


_STATUS_MESSAGES = {
    Status.CONVERGED: "converged",
    Status.MAX_ITERATIONS: "reached max_iter without meeting tol",
    Status.DIVERGED: "objective diverged; returned the best iterate",
    Status.NONFINITE: "a sweep produced non-finite values; returned the best finite iterate",
    Status.EARLY_STOPPED: "no sweep improved on the kept iterate for `patience` sweeps; returned it",
}


# --------------------------------------------------------------------------- held-out selection


class HeldOut(NamedTuple):
    """Tokens that judge the iterates, outside the solver's samples (a pytree).

    Attributes:
      X: ``(N, m)`` inputs; Y: ``(N, n)`` the function's outputs there.
    """

    X: jax.Array
    Y: jax.Array


class Tracker(NamedTuple):
    """Which iterate a restart keeps when it is judged by held-out tokens or stops early."""

    score: jax.Array  #: the kept iterate's held-out relative output error (without tokens: objective)
    kept: jax.Array  #: the sweep that produced it (0: the initial state)
    stale: jax.Array  #: sweeps since the kept iterate last changed
    lowest_objective: jax.Array  #: the lowest finite training objective so far (the divergence rule's)


# --------------------------------------------------------------------------- configuration

#: Fields of :class:`CMTFConfig` that are pytree leaves (traced under ``jit``/``vmap``).
TRACED_FIELDS = ("lam", "mu_w", "mu_c", "eps", "tol", "divergence")
#: Fields that fix the program's structure (shapes, branches): static, part of the treedef.
STATIC_FIELDS = ("rank", "basis", "robust", "max_iter", "divergence_patience", "patience")


def _concrete_scalar(name: str, value: Any) -> float | None:
    """``value`` as a float when it is a concrete number; ``None`` when it is traced."""
    if isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number, np.ndarray, jax.Array)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if np.ndim(value) != 0:
        raise ValueError(
            f"{name} must be a scalar, got shape {np.shape(value)}; to sweep it, jax.vmap over "
            f"config.replace({name}=...)"
        )
    return float(value)


@dataclasses.dataclass(frozen=True)
class CMTFConfig:
    """Configuration of a solve: a pytree whose numbers are traced and whose structure is static.

    ``rank``, ``basis``, ``robust``, ``max_iter`` and ``divergence_patience`` fix the compiled
    program; ``lam``, ``mu_w``, ``mu_c``, ``eps``, ``tol`` and ``divergence`` are leaves, so
    ``jax.vmap(lambda lam: jb.solver.solve(key, problem, config.replace(lam=lam)))(lams)`` is one
    compiled program. Concrete values are validated at construction and by :meth:`replace`;
    traced values pass through. Inside the solver the leaves are cast to the problem's dtype.

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
      patience: ``None`` (the default): no early stopping. An int ``p >= 1``: stop with
        ``Status.EARLY_STOPPED`` once ``p`` consecutive sweeps have not improved on the kept
        iterate, judged by the held-out output error when the solve is given held-out tokens
        (:func:`jaxbsd.decouple`'s ``heldout``), else by the training objective.
    """

    rank: int
    basis: Basis = BSpline(3, 11)
    lam: Any = 0.25
    mu_w: Any = 1e-4
    mu_c: Any = 1e-5
    eps: Any = 1e-6
    robust: bool = True
    max_iter: int = 500
    tol: Any = 1e-10
    divergence: Any = 1e8
    divergence_patience: int = 10
    patience: int | None = None

    def __repr__(self) -> str:
        # The dataclass's own repr, with ``patience`` only when set: a run's identity records the
        # repr, and configs without early stopping keep the identity they had before it existed.
        shown = [f.name for f in dataclasses.fields(self) if f.name != "patience" or self.patience is not None]
        return f"CMTFConfig({', '.join(f'{name}={getattr(self, name)!r}' for name in shown)})"

    def __post_init__(self):
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {self.rank!r}")
        if not isinstance(self.basis, Basis):
            raise ValueError(f"basis must be a jaxbsd basis (BSpline, Polynomial, ReLU, Augmented), got {self.basis!r}")
        if not isinstance(self.robust, bool):
            raise ValueError(f"robust must be a bool, got {self.robust!r}")
        for name in ("lam", "mu_w", "mu_c", "eps", "tol"):
            value = _concrete_scalar(name, getattr(self, name))
            if value is not None and not (np.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        if not (isinstance(self.max_iter, int) and not isinstance(self.max_iter, bool) and self.max_iter >= 1):
            raise ValueError(f"max_iter must be an int >= 1, got {self.max_iter!r}")
        divergence = _concrete_scalar("divergence", self.divergence)
        if divergence is not None and not divergence > 1:
            raise ValueError(f"divergence must be > 1, got {self.divergence!r}")
        if not (isinstance(self.divergence_patience, int) and self.divergence_patience >= 1):
            raise ValueError(f"divergence_patience must be an int >= 1, got {self.divergence_patience!r}")
        if self.patience is not None and (isinstance(self.patience, bool) or not isinstance(self.patience, int)
                                          or self.patience < 1):
            raise ValueError(f"patience must be None or an int >= 1, got {self.patience!r}")

    def replace(self, **changes: Any) -> "CMTFConfig":
        """A new config with ``changes`` applied (validated like the constructor)."""
        return dataclasses.replace(self, **changes)

    @property
    def effective_mu_w(self) -> Any:
        return self.mu_w if self.robust else 0.0

    @property
    def effective_mu_c(self) -> Any:
        return self.mu_c if self.robust else 0.0

    def cast(self, dtype: Any) -> "CMTFConfig":
        """The config with every traced number an array of ``dtype`` (the solver computes in
        the problem's dtype, whatever precision the numbers were given in)."""
        return jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), self)


def _config_flatten_with_keys(config: CMTFConfig):
    children = [(jax.tree_util.GetAttrKey(name), getattr(config, name)) for name in TRACED_FIELDS]
    return children, tuple(getattr(config, name) for name in STATIC_FIELDS)


def _config_unflatten(static: tuple, leaves: Any) -> CMTFConfig:
    # No validation here: JAX rebuilds configs with tracers and placeholder leaves.
    config = object.__new__(CMTFConfig)
    for name, value in zip(STATIC_FIELDS + TRACED_FIELDS, tuple(static) + tuple(leaves)):
        object.__setattr__(config, name, value)
    return config


jax.tree_util.register_pytree_with_keys(
    CMTFConfig,
    _config_flatten_with_keys,
    _config_unflatten,
    lambda c: ([getattr(c, n) for n in TRACED_FIELDS], tuple(getattr(c, n) for n in STATIC_FIELDS)),
)


