"""``DecoupledMLP``: a decoupled function ``W1 g(W0 x)`` as a trainable Flax NNX module.

It replaces a transformer block's MLP (``block.mlp = DecoupledMLP.from_decoupled(res.model)``).
``W0``, ``W1`` and the spline coefficients are ``nnx.Param`` and are fine-tuned with the rest of
the model; the knots are a :class:`Knots` variable, which an optimizer built with
``wrt=nnx.Param`` never updates (they were placed by the solver on the sampled activations).
The forward pass uses the basis' fast local evaluation, never a dense design matrix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxbsd.solver.bases import Basis
from jaxbsd.solver.decoupled import Decoupled

__all__ = ["DecoupledMLP", "Knots"]


class Knots(nnx.Variable):
    """Fixed, data-dependent state of the internal functions (not a trainable parameter)."""


class DecoupledMLP(nnx.Module):
    """``(..., m) -> (..., n)``: ``x ↦ W1 g(W0 x)`` with univariate ``g_i`` in ``basis``.

    Attributes:
      W0: ``nnx.Param (r, m)``.
      W1: ``nnx.Param (n, r)``.
      coef: ``nnx.Param (r, ν)``.
      knots: ``Knots (r, K)``.
      basis: the static basis.
      in_features, out_features, rank: ``m``, ``n``, ``r`` as plain ints (with ``basis``, all
        that is needed to rebuild an empty module of this structure).
    """

    def __init__(self, W0: jax.Array, W1: jax.Array, coef: jax.Array, knots: jax.Array, basis: Basis):
        r, m = W0.shape
        if W1.ndim != 2 or W1.shape[1] != r:
            raise ValueError(f"W1 must have shape (n, {r}), got {W1.shape}")
        if coef.shape != (r, basis.num_coef):
            raise ValueError(f"coef must have shape ({r}, {basis.num_coef}), got {coef.shape}")
        if knots.shape != (r, basis.num_knots):
            raise ValueError(f"knots must have shape ({r}, {basis.num_knots}), got {knots.shape}")
        self.W0 = nnx.Param(jnp.asarray(W0))
        self.W1 = nnx.Param(jnp.asarray(W1))
        self.coef = nnx.Param(jnp.asarray(coef))
        self.knots = Knots(jnp.asarray(knots))
        self.basis = basis
        self.in_features, self.out_features, self.rank = int(m), int(W1.shape[0]), int(r)

    @classmethod
    def from_decoupled(cls, model: Decoupled, dtype=None) -> "DecoupledMLP":
        """Build from a solver result's model, optionally cast (e.g. float64 solve → float32 net).

        The model is first :meth:`~jaxbsd.Decoupled.balanced` (unit-norm ``W0`` rows and ``W1``
        columns, the same function), so that a float64 solution stays finite in float32.
        """
        model = model.balanced()
        cast = (lambda x: x) if dtype is None else (lambda x: jnp.asarray(x, dtype))
        return cls(cast(model.W0), cast(model.W1), cast(model.coef), cast(model.knots), model.basis)

    def to_decoupled(self) -> Decoupled:
        """The current (possibly fine-tuned) weights as a :class:`~jaxbsd.Decoupled` pytree."""
        return Decoupled(W0=self.W0[...], W1=self.W1[...], coef=self.coef[...], knots=self.knots[...], basis=self.basis)

    def num_params(self) -> int:
        """Trainable parameters ``m r + r n + r ν`` (the paper's ``P_BSD``)."""
        return int(self.W0[...].size + self.W1[...].size + self.coef[...].size)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.to_decoupled()(x)
