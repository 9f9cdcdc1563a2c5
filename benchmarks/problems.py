"""The benchmarks' problems: random dense ones, a random transformer MLP's structured Jacobian
and its dense tensor, and the library's sweep and initialization jitted.

Shapes follow jaxbsd's conventions: ``J (S, n, m)``, ``F (S, n)``, ``X (S, m)``.
"""

from __future__ import annotations

import math

import jax

jax.config.update("jax_enable_x64", True)  # float64 where stated; float32 is always explicit

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxbsd as jb  # noqa: E402
from jaxbsd.solver.jacobians import DenseJacobian, StructuredJacobian  # noqa: E402

__all__ = ["random_dense_problem", "mlp_problem", "dense_from_structured", "sweep_jit", "init_jit"]


def random_dense_problem(S: int, n: int, m: int, seed: int = 0, dtype=np.float64):
    """Random ``J (S, n, m)``, ``F (S, n)``, ``X (S, m)`` (a generic, non-decouplable problem)."""
    rng = np.random.default_rng(seed)
    J = rng.standard_normal((S, n, m)).astype(dtype)
    F = rng.standard_normal((S, n)).astype(dtype)
    X = rng.standard_normal((S, m)).astype(dtype)
    return J, F, X


def mlp_problem(m: int, hidden: int, S: int, seed: int = 0, dtype=np.float32):
    """A random transformer MLP ``x ↦ V1 gelu(V0 x + b0) + b1`` (fan-in scaled weights, unit
    normal inputs as after a LayerNorm) and its structured Jacobian at ``S`` points.

    Returns:
      ``(jac, F, X)`` with ``jac`` a :class:`StructuredJacobian`.
    """
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    V0 = normal(hidden, m) / dtype(math.sqrt(m))
    b0 = normal(hidden) * dtype(0.1)
    V1 = normal(m, hidden) / dtype(math.sqrt(hidden))
    b1 = normal(m) * dtype(0.1)
    X = normal(S, m)
    return _mlp_jacobian_and_outputs(*(jnp.asarray(a) for a in (X, V0, b0, V1, b1)))


@jax.jit
def _mlp_jacobian_and_outputs(X, V0, b0, V1, b1):
    from jaxbsd.models.layers import ACTIVATION_DERIVATIVES, ACTIVATIONS

    F = ACTIVATIONS["gelu"](X @ V0.T + b0[None, :]) @ V1.T + b1[None, :]
    jac = jb.solver.jacobians.mlp_jacobian(X, V0, b0, V1, ACTIVATION_DERIVATIVES["gelu"])
    return jac, F, X


@jax.jit
def _dense_chunks(V1, V0, D_chunks):
    # J[s] = V1 diag(D[s]) V0, a chunk of samples at a time (no (S, n, H) intermediate).
    return jax.lax.map(lambda d: jnp.einsum("ah,ch,hb->cab", V1, d, V0), D_chunks)


def dense_from_structured(jac: StructuredJacobian, chunk: int = 8) -> DenseJacobian:
    """Materialize ``J (S, n, m)`` from its CPD, ``chunk`` samples at a time."""
    S, n, m = jac.shape
    chunk = math.gcd(S, chunk)
    J = _dense_chunks(jac.V1, jac.V0, jac.D.reshape(S // chunk, chunk, -1))
    return DenseJacobian(J.reshape(S, n, m))


#: The library's own sweep and initialization, jitted (the config is a pytree argument).
sweep_jit = jax.jit(jb.solver.sweep)
init_jit = jax.jit(jb.solver.init_state)
