"""First- and zeroth-order information of a function at sampling points."""

from __future__ import annotations

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
    F = jax.vmap(f)(X)
    if F.ndim != 2:
        raise ValueError(f"f must map (m,) to (n,); it returned shape {F.shape[1:]} per sample")
    return jax.vmap(jax.jacfwd(f))(X), F
