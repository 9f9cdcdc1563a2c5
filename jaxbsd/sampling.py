"""First- and zeroth-order information of a function at sampling points."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

__all__ = ["sample"]


def sample(f: Callable[[jax.Array], jax.Array], X: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Jacobians and outputs of ``f`` at the rows of ``X``.

    Args:
      f: ``(m,) -> (n,)``, differentiable.
      X: ``(S, m)`` sampling points.

    Returns:
      ``(J, F)``: ``J`` of shape ``(S, n, m)`` (``jax.vmap(jax.jacfwd(f))(X)``) and ``F`` of
      shape ``(S, n)``.
    """
    X = jnp.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must have shape (S, m), got {X.shape}")
    F = jax.eval_shape(jax.vmap(f), X)
    if F.ndim != 2:
        raise ValueError(f"f must map (m,) to (n,); it returned shape {F.shape[1:]} per sample")
    try:
        hash(f)
    except TypeError:  # not usable as a static argument: trace it op by op
        return _sample.__wrapped__(f, X)
    return _sample(f, X)


@functools.partial(jax.jit, static_argnums=0)
def _sample(f: Callable[[jax.Array], jax.Array], X: jax.Array) -> tuple[jax.Array, jax.Array]:
    # One compiled program (outside jax.jit, vmap(jacfwd(f)) would compile every primitive).
    return jax.vmap(jax.jacfwd(f))(X), jax.vmap(f)(X)
