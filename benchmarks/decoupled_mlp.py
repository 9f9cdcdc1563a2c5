"""Row (d): the jitted forward of ``DecoupledMLP`` against the ``MLP`` it replaces.

Float32, m = 384, r = m, 128 × 197 tokens; and (d') the spline evaluation alone,
``bspline.evaluate`` against the Cox–de Boor/gather evaluation through ``bspline.local_basis``.
"""

from __future__ import annotations

import math

from benchmarks.common import Row, block, check_dtype, interleaved  # first: enables float64 before jaxbsd is imported

import jax
import jax.numpy as jnp
import numpy as np

import jaxbsd as jb


__all__ = ["bench_decoupled_mlp"]


def _spline_local_basis(u, knots, coef, degree):
    """Cox–de Boor evaluation through ``jaxbsd.solver.bspline.local_basis`` plus a coefficient
    gather: the reference of row (d')."""
    k, values = jb.solver.bspline.local_basis(u, knots, degree)
    idx = k[..., None] - degree + jnp.arange(degree + 1).reshape((1,) * k.ndim + (degree + 1,))
    return jnp.sum(values * coef[idx], axis=-1)


def bench_decoupled_mlp(
    m: int = 384, batch: int = 128, tokens: int = 197, hidden_factor: int = 4, dof: int = 4,
    degree: int = 3, repeats: int = 5, spline_reference: bool = True,
) -> list[Row]:
    """(d) Jitted forward of ``DecoupledMLP`` (r = m) vs the ``MLP`` (fc1, GELU, fc2), float32."""
    from flax import nnx

    from jaxbsd.models.decoupled_mlp import DecoupledMLP
    from jaxbsd.models.layers import MLP

    r = m
    mlp = MLP(m, hidden_factor * m, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    W0 = normal(r, m) / np.float32(math.sqrt(m))
    W1 = normal(m, r) / np.float32(math.sqrt(r))
    x = normal(batch, tokens, m)
    coef = normal(r, dof)
    basis = jb.BSpline(degree, dof)
    # Knots as the solver would place them: quantiles of the activations of (up to) 1024 tokens.
    knots = jax.jit(lambda u: jax.vmap(basis.fit, in_axes=1)(u))(x.reshape(-1, m)[: min(1024, batch * tokens)] @ W0.T)
    dec = DecoupledMLP(W0, W1, coef, knots, basis)

    g_mlp, s_mlp = nnx.split(mlp)
    g_dec, s_dec = nnx.split(dec)
    f_mlp = jax.jit(lambda s, x: nnx.merge(g_mlp, s)(x))
    f_dec = jax.jit(lambda s, x: nnx.merge(g_dec, s)(x))
    check_dtype("(d) MLP forward", f_mlp(s_mlp, x), jnp.float32)
    check_dtype("(d) DecoupledMLP forward", f_dec(s_dec, x), jnp.float32)
    fns = {
        "mlp": lambda: block(f_mlp(s_mlp, x)),
        "decoupled": lambda: block(f_dec(s_dec, x)),
    }
    # (d') the spline part alone: fast evaluate vs the Cox–de Boor/gather evaluation.
    u = x.reshape(-1, m) @ W0.T
    per_rank = lambda ev: jax.jit(  # noqa: E731
        lambda u: jax.vmap(ev, in_axes=(1, 0, 0), out_axes=1)(u, knots, coef)
    )
    ev_new = per_rank(lambda ui, ki, ci: jb.solver.bspline.evaluate(ui, ki, ci, degree))
    ev_old = per_rank(lambda ui, ki, ci: _spline_local_basis(ui, ki, ci, degree))
    if spline_reference:
        fns["spline_evaluate"] = lambda: block(ev_new(u))
        fns["spline_local_basis"] = lambda: block(ev_old(u))
    t = interleaved(fns, repeats=repeats)
    t_mlp, t_dec = t["mlp"]["median"], t["decoupled"]["median"]
    ratio = t_mlp / t_dec
    macs = (2 * m * hidden_factor * m, 2 * m * r)
    rows = [
        Row(
            "(d) DecoupledMLP vs MLP forward",
            t_dec, t_mlp, ratio, ">= 1.5x", ratio >= 1.5,
            ratio_min=t["mlp"]["min"] / t["decoupled"]["min"],
            note=f"m={m}, hidden={hidden_factor * m}, r={m}, ν={dof}, d={degree}, x {batch}x{tokens}x{m} f32; "
            f"MACs/token {macs[1]} vs {macs[0]}",
            details={"timings": t},
        )
    ]
    if spline_reference:
        a, b = ev_new(u), ev_old(u)
        diff = float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
        tn, to = t["spline_evaluate"]["median"], t["spline_local_basis"]["median"]
        tn_min = t["spline_evaluate"]["min"]
        rows.append(
            Row(
                "(d') spline eval: evaluate vs Cox-de Boor",
                tn, to, to / tn, "info", None,
                ratio_min=t["spline_local_basis"]["min"] / tn_min,
                note=f"g(u) for {batch * tokens}x{r} points; max |diff| / max |g| = {diff:.1e} (f32)",
                details={"max_rel_diff": diff},
            )
        )
    return rows
