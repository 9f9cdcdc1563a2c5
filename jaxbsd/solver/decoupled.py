"""The decoupled model ``f̂(x) = W1 g(W0 x)`` as a pytree."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxbsd.solver.bases import Basis

__all__ = ["Decoupled"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Decoupled:
    """A single-layer decoupled function ``f̂(x) = W1 g(W0 x)``.

    A pytree (the basis is static metadata), so it can be jitted, vmapped (a leading axis
    holds restarts), differentiated and stored.

    Attributes:
      W0: ``(r, m)`` input map.
      W1: ``(n, r)`` output map.
      coef: ``(r, ν)`` coefficients of each internal function ``g_i``.
      knots: ``(r, K)`` data-dependent state of each ``g_i`` (``K = basis.num_knots``).
      basis: the univariate basis shared by all ``g_i``.
    """

    W0: jax.Array
    W1: jax.Array
    coef: jax.Array
    knots: jax.Array
    basis: Basis = dataclasses.field(metadata=dict(static=True))

    @property
    def rank(self) -> int:
        return self.W0.shape[-2]

    @property
    def in_features(self) -> int:
        return self.W0.shape[-1]

    @property
    def out_features(self) -> int:
        return self.W1.shape[-2]

    def num_params(self) -> int:
        """``m r + r n + r ν`` (paper, eq. for ``P_BSD``); knots are not learned."""
        return int(self.W0.size + self.W1.size + self.coef.size)

    def internal(self, u: jax.Array, derivative: int = 0) -> jax.Array:
        """``g(u)`` (or ``g'(u)``) applied per rank: ``(..., r) -> (..., r)``."""
        batch = u.shape[:-1]
        flat = u.reshape(-1, u.shape[-1]).T  # (r, N)
        evaluate = jax.vmap(lambda ui, ki, ci: self.basis.evaluate(ui, ki, ci, derivative))
        return evaluate(flat, self.knots, self.coef).T.reshape(batch + (u.shape[-1],))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``(..., m) -> (..., n)``."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have trailing dimension {self.in_features}, got {x.shape}")
        return _apply(self, x)

    def balanced(self) -> "Decoupled":
        """The same function with every ``W0`` row and ``W1`` column at unit norm.

        ``W1 g(W0 x)`` is unchanged by ``W0[i] → W0[i]/α``, ``g_i(u) → g_i(α u)`` and
        ``W1[:, i] → W1[:, i]/β``, ``g_i → β g_i``. The solver's non-robust variants can end
        with rows of norm ~1e-16 and columns of ~1e5; such a model is exact in float64 but its
        knots and coefficients under- or overflow in float32. Ranks with a zero row or column
        are left as they are. Works on stacked models (leading restart axes) too.
        """
        tiny = jnp.finfo(self.W0.dtype).tiny
        alpha = jnp.linalg.norm(self.W0, axis=-1)  # (..., r)
        alpha = jnp.where(alpha > tiny, alpha, 1)
        beta = jnp.linalg.norm(self.W1, axis=-2)  # (..., r)
        beta = jnp.where(beta > tiny, beta, 1)
        rescale = self.basis.rescale_input
        for _ in range(alpha.ndim):
            rescale = jax.vmap(rescale)
        knots, coef = rescale(self.knots, self.coef, alpha)
        return Decoupled(W0=self.W0 / alpha[..., None], W1=self.W1 / beta[..., None, :],
                         coef=coef * beta[..., None], knots=knots, basis=self.basis)

    def jacobian(self, x: jax.Array) -> jax.Array:
        """Closed-form Jacobians ``W1 diag(g'(W0 x)) W0``: ``(S, m) -> (S, n, m)``."""
        return _jacobian(self, x)


# One compiled program per call signature (outside jax.jit, the op-by-op version would compile
# every primitive separately); inside a traced computation they are inlined.
@jax.jit
def _apply(model: Decoupled, x: jax.Array) -> jax.Array:
    return model.internal(x @ model.W0.T) @ model.W1.T


@jax.jit
def _jacobian(model: Decoupled, x: jax.Array) -> jax.Array:
    G = model.internal(x @ model.W0.T, derivative=1)
    return jnp.einsum("ai,si,ib->sab", model.W1, G, model.W0)
