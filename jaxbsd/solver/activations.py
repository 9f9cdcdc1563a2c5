"""The elementwise activations of jaxbsd's MLPs and their derivatives, by name.

They live in the solver core because both sides use them: the models' MLPs
(:mod:`jaxbsd.models.layers`) and the structured Jacobian's ``h'``, and the activation-augmented
basis (:class:`jaxbsd.solver.bases.Augmented`), which the models may import but not the other way.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

__all__ = ["ACTIVATIONS", "ACTIVATION_DERIVATIVES", "elementwise_derivative"]


@jax.jit
def _gelu(x: jax.Array) -> jax.Array:
    # Exact (erf) GELU, as in PyTorch's default nn.GELU used by ViT/Swin/DeiT. Each activation
    # here is one jitted program: called outside jit (a model run eagerly, a spec checked on
    # tokens), jax.nn.gelu would dispatch and compile its five primitives one by one.
    return jax.nn.gelu(x, approximate=False)


@jax.jit
def _gelu_derivative(x: jax.Array) -> jax.Array:
    # d/dx [x Φ(x)] = Φ(x) + x φ(x).
    cdf = 0.5 * (1.0 + jax.lax.erf(x / math.sqrt(2.0)))
    pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return cdf + x * pdf


@jax.jit
def _relu_derivative(x: jax.Array) -> jax.Array:
    # Subgradient 0 at the kink, matching jax.grad(jax.nn.relu)(0.0) == 0.
    return (x > 0).astype(x.dtype)


@jax.jit
def _gelu_tanh(x: jax.Array) -> jax.Array:
    # The tanh approximation (jax.nn.gelu's default, GPT-2/BERT style).
    return jax.nn.gelu(x, approximate=True)


def elementwise_derivative(h: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    """``h'`` of an elementwise ``h``: the JVP along ones is ``h'`` entrywise (one pass, any shape)."""
    return jax.jit(lambda x: jax.jvp(h, (x,), (jnp.ones_like(x),))[1])


@jax.jit
def _silu_derivative(x: jax.Array) -> jax.Array:
    s = jax.nn.sigmoid(x)
    return s * (1 + x * (1 - s))


#: Elementwise activations by name: ``h`` in f(x) = V1 h(V0 x + b0) + b1.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
}

#: Their derivatives ``h'``, used by the solver's structured Jacobian.
ACTIVATION_DERIVATIVES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": _gelu_derivative,
    "gelu_tanh": elementwise_derivative(_gelu_tanh),
    "relu": _relu_derivative,
    "silu": _silu_derivative,
    "tanh": jax.jit(lambda x: 1 - jnp.tanh(x) ** 2),
    "sigmoid": jax.jit(lambda x: jax.nn.sigmoid(x) * (1 - jax.nn.sigmoid(x))),
}
