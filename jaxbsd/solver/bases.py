"""Univariate bases for the internal functions g_i of a decoupled model.

Every basis is a frozen, hashable dataclass (so it can be a static argument of ``jax.jit``)
with one small interface:

* ``num_coef``: number of coefficients ``ν`` of one internal function;
* ``num_knots``: length of its data-dependent state (``0`` when it has none);
* ``fit(u) -> knots``: ``(S,) -> (num_knots,)``, recomputed every solver iteration;
* ``design(u, knots) -> (B, dB)``: values and first derivatives of the basis, ``(S, ν)`` each;
* ``evaluate(u, knots, coef, derivative=0)``: ``g(u)`` or ``g'(u)`` without a dense matrix.

``BSpline`` is the paper's parameterization; ``Polynomial`` (R-CMTF-PD, monomials on raw
``u``, ill-conditioning kept on purpose) and ``ReLU`` (Zniyed et al.) are its baselines.
``Augmented(inner, activation)`` adds an MLP's own activation to any of them, so that a
decoupling contains the MLP it was started from.

Two more methods have defaults that every basis above keeps: ``refit(u, knots)`` (the knots a
solver sweep places, ``fit(u)``: all the state comes from the data) and ``rescaled_state(knots,
alpha)`` (the state after the solver divides a ``W0`` row by ``alpha``; unchanged, since it is
refitted anyway). ``Augmented`` overrides both: its activation's input scale and shift are state
that the data cannot tell.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxbsd.solver import bspline
from jaxbsd.solver.activations import ACTIVATION_DERIVATIVES, ACTIVATIONS, elementwise_derivative


#: The bases' ``fit``/``design``/``evaluate`` as one compiled program each (the basis itself is
#: hashable, hence static): called outside ``jax.jit`` they would otherwise dispatch and compile
#: every primitive separately; inside a traced solve they are inlined.
_jit_method = functools.partial(jax.jit, static_argnums=0)
_jit_evaluate = functools.partial(jax.jit, static_argnums=(0, 4), static_argnames=("derivative",))

__all__ = ["Basis", "BSpline", "Polynomial", "ReLU", "Augmented", "AUGMENT_ACTIVATIONS"]


def _trailing(v: jax.Array, ndim: int) -> jax.Array:
    """``v`` (1-d) shaped to broadcast against an array of rank ``ndim + 1``."""
    return v.reshape((1,) * ndim + v.shape)


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


class Basis:
    """Interface shared by all bases (see the module docstring)."""

    @property
    def num_coef(self) -> int:
        raise NotImplementedError

    @property
    def num_knots(self) -> int:
        raise NotImplementedError

    def fit(self, u: jax.Array) -> jax.Array:
        raise NotImplementedError

    def design(self, u: jax.Array, knots: jax.Array) -> tuple[jax.Array, jax.Array]:
        raise NotImplementedError

    def evaluate(
        self, u: jax.Array, knots: jax.Array, coef: jax.Array, derivative: int = 0
    ) -> jax.Array:
        raise NotImplementedError

    def rescale_input(self, knots: jax.Array, coef: jax.Array, alpha: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(knots', coef')`` of the function ``v ↦ g(α v)``, where ``g`` has ``(knots, coef)``.

        Lets a rank's input be rescaled (``u = α v``) without changing what it computes.
        """
        raise NotImplementedError

    def refit(self, u: jax.Array, knots: jax.Array) -> jax.Array:
        """The knots ``(K,)`` a solver sweep places for activations ``u (S,)``, given the current
        ones; ``fit(u)`` unless part of the state cannot be read off the data."""
        return self.fit(u)

    def rescaled_state(self, knots: jax.Array, alpha: jax.Array) -> jax.Array:
        """The knots ``(K,)`` after the input is divided by ``alpha`` (the solver's normalization
        of a ``W0`` row), before :meth:`refit`; unchanged when :meth:`refit` ignores them."""
        return knots

    def to_dict(self) -> dict:
        """JSON-able description, ``{"kind": class name, **fields}``; inverse of :meth:`from_dict`."""
        return {"kind": type(self).__name__, **dataclasses.asdict(self)}

    @staticmethod
    def from_dict(description: dict) -> "Basis":
        """The basis described by ``description`` (as written by :meth:`to_dict`).

        Raises:
          ValueError: if ``kind`` is not one of ``BSpline``, ``Polynomial``, ``ReLU``, ``Augmented``.
        """
        fields = dict(description)
        kind = fields.pop("kind", None)
        kinds = {cls.__name__: cls for cls in (BSpline, Polynomial, ReLU, Augmented)}
        if kind not in kinds:
            raise ValueError(f"description['kind'] must be one of {sorted(kinds)}, got {kind!r}")
        if kind == "Augmented" and isinstance(fields.get("inner"), dict):
            fields["inner"] = Basis.from_dict(fields["inner"])
        return kinds[kind](**fields)


@dataclasses.dataclass(frozen=True)
class BSpline(Basis):
    """Clamped B-splines of degree ``d`` with ``ν = dof`` functions, quantile knots.

    With ``dof == degree + 1`` there are no interior knots and the span is the polynomials of
    degree ``d`` (paper, Lemma 3).
    """

    degree: int = 3
    dof: int = 11

    def __post_init__(self):
        _check_int("degree", self.degree, 0)
        _check_int("dof", self.dof, self.degree + 1)

    @property
    def num_coef(self) -> int:
        return self.dof

    @property
    def num_knots(self) -> int:
        return bspline.num_knots(self.dof, self.degree)

    @_jit_method
    def fit(self, u):
        return bspline.quantile_knots(u, self.dof, self.degree)

    @_jit_method
    def design(self, u, knots):
        return bspline.design_matrices(u, knots, self.degree)

    @_jit_evaluate
    def evaluate(self, u, knots, coef, derivative=0):
        return bspline.evaluate(u, knots, coef, self.degree, derivative)

    def rescale_input(self, knots, coef, alpha):
        # B-splines are invariant under scaling the argument and the knots together.
        return knots / alpha, coef


@dataclasses.dataclass(frozen=True)
class Polynomial(Basis):
    """Monomials ``1, u, …, u^d`` on the raw activations (R-CMTF-PD); no knots."""

    degree: int = 3

    def __post_init__(self):
        _check_int("degree", self.degree, 0)

    @property
    def num_coef(self) -> int:
        return self.degree + 1

    @property
    def num_knots(self) -> int:
        return 0

    @_jit_method
    def fit(self, u):
        return jnp.zeros((0,), jnp.asarray(u).dtype)

    def _powers(self, u, derivative):
        """``(..., d + 1)`` derivatives of order ``derivative`` of ``u**j``, ``j = 0 … d``.

        Powers by cumulative products, not ``u ** j``: no ``log`` in the gradient at ``u = 0``.
        """
        d = self.degree
        ones = jnp.ones(u.shape + (1,), u.dtype)
        powers = jnp.concatenate([ones, jnp.cumprod(jnp.repeat(u[..., None], d, -1), -1)], -1)
        if derivative == 0:
            return powers
        j = jnp.arange(d + 1)
        factor = jnp.ones((d + 1,), u.dtype)
        for q in range(derivative):
            factor = factor * jnp.maximum(j - q, 0)
        zeros = jnp.zeros(u.shape + (min(derivative, d + 1),), u.dtype)
        shifted = jnp.concatenate([zeros, powers[..., : d + 1 - derivative]], -1)
        return _trailing(factor, u.ndim) * shifted

    @_jit_method
    def design(self, u, knots):
        return self._powers(u, 0), self._powers(u, 1)

    @_jit_evaluate
    def evaluate(self, u, knots, coef, derivative=0):
        # Horner on the differentiated coefficients: stable and cheap.
        j = jnp.arange(self.degree + 1)
        factor = jnp.ones((self.degree + 1,), coef.dtype)
        for q in range(derivative):
            factor = factor * jnp.maximum(j - q, 0)
        c = (coef * factor)[derivative:]
        out = jnp.zeros_like(u)
        for cj in c[::-1]:
            out = out * u + cj
        return out

    def rescale_input(self, knots, coef, alpha):
        # Σ c_j (α v)^j = Σ (c_j α^j) v^j.
        return knots, coef * alpha ** jnp.arange(self.degree + 1, dtype=coef.dtype)


@dataclasses.dataclass(frozen=True)
class ReLU(Basis):
    """``1`` and ``ReLU(u − t_j)``, ``j = 1 … ν − 1``, breakpoints at quantiles (Zniyed et al.).

    The breakpoints sit at the quantile levels ``j / ν`` of the activations, snapped to the
    nearest sample. The span is the degree-1 splines whose leftmost piece is constant: a
    strict subspace of the degree-1 B-splines on the same breakpoints (paper, Lemma 2).
    """

    dof: int = 4

    def __post_init__(self):
        _check_int("dof", self.dof, 1)

    @property
    def num_coef(self) -> int:
        return self.dof

    @property
    def num_knots(self) -> int:
        return self.dof - 1

    @_jit_method
    def fit(self, u):
        u = jnp.asarray(u)
        if self.dof == 1:
            return jnp.zeros((0,), u.dtype)
        idx = bspline.quantile_indices(u.shape[0], range(1, self.dof), self.dof)
        return bspline.sort_floats(u)[idx]

    def _columns(self, u, knots, derivative):
        shifted = u[..., None] - _trailing(knots, u.ndim)
        if derivative == 0:
            ones = jnp.ones(u.shape + (1,), u.dtype)
            return jnp.concatenate([ones, jnp.maximum(shifted, 0)], axis=-1)
        zeros = jnp.zeros(u.shape + (1,), u.dtype)
        if derivative == 1:
            return jnp.concatenate([zeros, (shifted > 0).astype(u.dtype)], axis=-1)
        return jnp.zeros(u.shape + (self.dof,), u.dtype)

    @_jit_method
    def design(self, u, knots):
        return self._columns(u, knots, 0), self._columns(u, knots, 1)

    @_jit_evaluate
    def evaluate(self, u, knots, coef, derivative=0):
        return self._columns(u, knots, derivative) @ coef

    def rescale_input(self, knots, coef, alpha):
        # max(α v − k, 0) = α max(v − k/α, 0) for α > 0; the constant column is unchanged.
        return knots / alpha, coef * jnp.concatenate([jnp.ones((1,), coef.dtype), jnp.full((self.dof - 1,), alpha, coef.dtype)])



# --------------------------------------------------------------------------- activation-augmented


#: The activations :class:`Augmented` can add, ``name -> (σ, σ')``: the models' own
#: (:mod:`jaxbsd.solver.activations`).
AUGMENT_ACTIVATIONS = {name: (ACTIVATIONS[name], ACTIVATION_DERIVATIVES[name]) for name in ACTIVATIONS}


def _activation(name: str, x: jax.Array, derivative: int) -> jax.Array:
    """``σ⁽ᵈ⁾(x)`` entrywise (orders above 1 by forward differentiation of ``σ'``)."""
    value, slope = AUGMENT_ACTIVATIONS[name]
    if derivative == 0:
        return value(x)
    fn = slope
    for _ in range(derivative - 1):
        fn = elementwise_derivative(fn)
    return fn(x)


@dataclasses.dataclass(frozen=True)
class Augmented(Basis):
    """``g(u) = Σ_k c_k B_k(u) + a σ(s u + t)``: the basis ``inner`` plus one activation function.

    With ``a = 1`` and ``c`` a constant, ``g`` is an MLP's hidden unit ``σ(u + b)`` (``t = b``,
    ``s = 1``) exactly, so a decoupling in this basis contains the pruned MLP it is warm-started
    from (:func:`jaxbsd.compression.methods.warm_start.decoupled_from_pruned`).

    Layout of one internal function's arrays:

    * ``coef (ν + 1,)``: ``inner``'s ``ν`` coefficients, then ``a``;
    * ``knots (K + 2,)``: ``inner``'s ``K`` knots, then ``s`` and ``t``, the activation's input
      scale and shift. Like knots they are fixed state, not parameters: :meth:`fit` sets
      ``s = 1, t = 0``; the solver's normalization of a ``W0`` row by ``α`` multiplies ``s`` by
      ``α`` (:meth:`rescaled_state`), so the activation sees the same input; :meth:`refit`
      places ``inner``'s knots on the data and keeps ``s, t``.

    Attributes:
      inner: the spline (or polynomial, ReLU) part; not itself an ``Augmented``.
      activation: a key of :data:`AUGMENT_ACTIVATIONS` (``"gelu"`` exact, ``"gelu_tanh"``,
        ``"relu"``, ``"silu"``, ``"tanh"``, ``"sigmoid"``).
    """

    inner: Basis = BSpline(3, 4)
    activation: str = "gelu"

    def __post_init__(self):
        if not isinstance(self.inner, Basis) or isinstance(self.inner, Augmented):
            raise ValueError(f"inner must be a BSpline, Polynomial or ReLU basis, got {self.inner!r}")
        if self.activation not in AUGMENT_ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(AUGMENT_ACTIVATIONS)}, got {self.activation!r}")

    @property
    def num_coef(self) -> int:
        return self.inner.num_coef + 1

    @property
    def num_knots(self) -> int:
        return self.inner.num_knots + 2

    @property
    def is_mlp(self) -> bool:
        """Whether ``inner`` spans the constants only (``BSpline(0, 1)``, ``Polynomial(0)``): then
        ``g(u) = c + a σ(s u + t)`` is an MLP's hidden unit up to its output weight and bias, and a
        decoupling in this basis is an MLP with ``r`` units of ``activation``."""
        inner = self.inner
        return (isinstance(inner, BSpline) and inner.dof == 1) or (isinstance(inner, Polynomial) and inner.degree == 0)

    def to_dict(self) -> dict:
        return {"kind": "Augmented", "inner": self.inner.to_dict(), "activation": self.activation}

    def split_state(self, knots):
        """``(inner knots (..., K), scale (...), shift (...))``: the parts of an internal function's state."""
        K = self.inner.num_knots
        return knots[..., :K], knots[..., K], knots[..., K + 1]

    @_jit_method
    def fit(self, u):
        u = jnp.asarray(u)
        return jnp.concatenate([self.inner.fit(u), jnp.asarray([1.0, 0.0], u.dtype)])

    def refit(self, u, knots):
        return jnp.concatenate([self.inner.fit(u), knots[self.inner.num_knots:]])

    def rescaled_state(self, knots, alpha):
        inner, scale, shift = self.split_state(knots)
        return jnp.concatenate([inner, jnp.stack([scale * alpha, shift])])

    @_jit_method
    def design(self, u, knots):
        inner, scale, shift = self.split_state(knots)
        B, dB = self.inner.design(u, inner)
        z = scale * u + shift
        value = _activation(self.activation, z, 0)[..., None]
        slope = (scale * _activation(self.activation, z, 1))[..., None]
        return jnp.concatenate([B, value], axis=-1), jnp.concatenate([dB, slope], axis=-1)

    @_jit_evaluate
    def evaluate(self, u, knots, coef, derivative=0):
        inner, scale, shift = self.split_state(knots)
        spline = self.inner.evaluate(u, inner, coef[:-1], derivative)
        return spline + coef[-1] * scale**derivative * _activation(self.activation, scale * u + shift, derivative)

    def rescale_input(self, knots, coef, alpha):
        # σ(s (α v) + t): the scale takes α, the inner basis rescales as it does alone.
        inner, scale, shift = self.split_state(knots)
        inner_knots, inner_coef = self.inner.rescale_input(inner, coef[:-1], alpha)
        knots = jnp.concatenate([inner_knots, jnp.stack([scale * alpha, shift]).astype(inner_knots.dtype)])
        return knots, jnp.concatenate([inner_coef, coef[-1:]])
