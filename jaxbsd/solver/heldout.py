"""Keeping the best iterate by held-out tokens, and stopping early (used by :mod:`jaxbsd.solver.cmtf`).

* :class:`HeldOut`: tokens outside the solver's samples that judge the iterates;
* :class:`Tracker`: a restart's bookkeeping of the iterate it keeps (part of its loop carry);
* :func:`score`: the criterion an iterate is kept by.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxbsd.solver.config import CMTFConfig
from jaxbsd.solver.decoupled import Decoupled
from jaxbsd.solver.metrics import relative_error

__all__ = ["HeldOut", "Tracker", "tracking", "score"]


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


def tracking(config: CMTFConfig, heldout: HeldOut | None) -> bool:
    """Whether a restart needs a :class:`Tracker`: held-out tokens or early stopping."""
    return heldout is not None or config.patience is not None


def score(state: Any, objective: jax.Array, config: CMTFConfig, heldout: HeldOut | None) -> jax.Array:
    """The criterion iterates are kept by: the held-out ``‖Y − f̂(X)‖²/‖Y‖²`` of the model of
    ``state`` (a :class:`~jaxbsd.solver.cmtf.SolverState`), else its training ``objective``."""
    if heldout is None:
        return objective
    model = Decoupled(W0=state.W0, W1=state.W1, coef=state.coef, knots=state.knots, basis=config.basis)
    return relative_error(heldout.Y, model(heldout.X))
