"""Dense linear algebra of the ALS updates: certified SPD solves, minimum-norm least squares.

Every solve here is written for any number of leading batch dimensions (restarts, λ, blocks under
``vmap``) and never silently returns NaN: a failed Cholesky certificate falls back to an
eigendecomposition with a relative cutoff (:func:`pinv_solve`), and near-singular least squares
drop singular values below a cutoff stated with each function. The cutoffs are part of the
solver's numerical fingerprint (:mod:`jaxbsd.solver.fingerprint`).
"""

from __future__ import annotations

from typing import Callable
import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_solve

__all__ = ["batch_polymorphic", "mT", "spd_inverse", "tikhonov_solve", "pinv_solve_by_eigh", "pinv_solve", "wide_least_squares", "pinv_relative_cutoff", "pinv_by_eigh_cut", "pinv_by_eigh", "UNROLLED_MAX", "small_tikhonov_solve", "lstsq"]


def batch_polymorphic(fn: Callable) -> Callable:
    """``fn`` (a LAPACK-backed solve written for any number of leading batch dimensions),
    whose ``vmap`` batches on accelerators and runs one batch member at a time on the CPU.

    On GPU/TPU a vmap over restarts or λ calls ``fn`` once on the stacked operands (one
    batched kernel per step, no loop). On the CPU it runs as a ``lax.map`` of unbatched
    calls, because jaxlib's batched CPU LAPACK kernels split a batch over XLA's intra-op
    thread pool and block a pool thread until the pieces are done: when two such kernels run
    concurrently (the sweep's independent solves under ``vmap``) on a two-thread pool, both
    threads wait and nothing runs the pieces, a deadlock (stack traces show both pool threads in
    ``jax::ParallelBatchMap``). ``jax.lax.platform_dependent`` picks the branch when the program
    is lowered, so an accelerator program holds no trace of the CPU workaround.
    """
    wrapped = jax.custom_batching.custom_vmap(fn)

    @wrapped.def_vmap
    def _rule(axis_size, in_batched, *args):
        batched = [i for i, b in enumerate(in_batched) if b]

        def one_at_a_time(*args):
            def one(xs):
                full = list(args)
                for i, x in zip(batched, xs):
                    full[i] = x
                return wrapped(*full)

            return jax.lax.map(one, tuple(args[i] for i in batched))

        def all_at_once(*args):
            # The batch axis leads every operand; fn broadcasts over leading dimensions.
            full = [a if b else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a)) for a, b in zip(args, in_batched)]
            return wrapped(*full)

        out = jax.lax.platform_dependent(*args, cpu=one_at_a_time, default=all_at_once)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return wrapped


def mT(A: jax.Array) -> jax.Array:
    return jnp.swapaxes(A, -1, -2)


def spd_inverse(A: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(A⁻¹, ‖A‖∞ ‖A⁻¹‖∞)`` for symmetric ``A (..., r, r)`` by Cholesky: ``A⁻¹ = L⁻ᵀ L⁻¹``.

    One factorization, one triangular inverse and one product, kernels that batch on every
    backend (``eigh`` is iterative and far slower on small matrices). ``κ∞ = ‖A‖∞‖A⁻¹‖∞``
    bounds the 2-norm condition number from above (symmetric ``A``: ``‖A‖₂ ≤ ‖A‖∞``), and is
    ``nan``/``inf`` where the factorization failed (``A`` not numerically positive definite).
    """
    r = A.shape[-1]
    L = jnp.linalg.cholesky(A)
    eye = jnp.broadcast_to(jnp.eye(r, dtype=A.dtype), A.shape)
    L_inv = jax.lax.linalg.triangular_solve(L, eye, left_side=True, lower=True)
    A_inv = mT(L_inv) @ L_inv
    norm = lambda M: jnp.max(jnp.sum(jnp.abs(M), axis=-1), axis=-1)  # noqa: E731
    kappa = norm(A) * norm(A_inv)
    return A_inv, jnp.where(jnp.isfinite(kappa), kappa, jnp.inf)


@batch_polymorphic
def tikhonov_solve(A: jax.Array, B: jax.Array, mu: jax.Array) -> jax.Array:
    """``B (A + μ I)⁻¹`` for symmetric positive semi-definite ``A (..., r, r)`` and ``μ > 0``
    (``B (..., k, r)``, ``μ (...)``): the robust updates of ``W0`` and ``W1``.

    Cholesky; LU where the Cholesky fails: ``A`` is formed in floating point, and when ``μ`` is
    below its rounding (large Grams in float32) ``A + μ I`` can be numerically indefinite. LU
    still returns the solution of the system as given, which is what the paper's update is.
    The LU branch runs only when some member of the batch needs it.
    """
    r = A.shape[-1]
    shifted = A + mu[..., None, None] * jnp.eye(r, dtype=A.dtype).reshape((1,) * (A.ndim - 2) + (r, r))
    factor = jnp.linalg.cholesky(shifted)
    ok = jnp.all(jnp.isfinite(factor), axis=(-2, -1))
    by_cholesky = mT(cho_solve((factor, True), mT(B)))

    def by_lu():
        lu = mT(jnp.linalg.solve(shifted, mT(B)))
        return jnp.where(ok[..., None, None], by_cholesky, lu)

    return jax.lax.cond(jnp.all(ok), lambda: by_cholesky, by_lu)


@batch_polymorphic
def pinv_solve(A: jax.Array, B: jax.Array) -> jax.Array:
    """``B A⁺`` for symmetric positive semi-definite ``A (..., r, r)``, ``B (..., k, r)``: the
    paper's plain least squares (the G and R updates, and every update of the non-robust
    CMTF-BSD/PD).

    ``A`` is the Gram matrix ``KᵀK`` of ``min ‖M − X Kᵀ‖`` given in Gram–Hadamard form
    (``B = M K``), so ``B A⁺`` is that problem's minimum-norm solution. The pseudo-inverse has
    ``jnp.linalg.pinv``'s machine-precision cutoff: eigenvalues at or below
    ``r · eps · max|λ|`` are dropped. The same rule holds for every basis.

    Where no eigenvalue is near the cutoff, ``A⁺ = A⁻¹``: certified by ``κ∞(A) ≤ 1 / (2 r eps)``
    (then ``λ_min / λ_max ≥ 1/κ₂ ≥ 1/κ∞ > r eps``, with a factor 2 for the rounding of the
    computed inverse), and the solve is a Cholesky. Otherwise, and only then, the eigenvalue
    decomposition applies the cutoff exactly. Where the caller knows the certificate cannot pass
    (a Gram of rank below its size), :data:`pinv_solve_by_eigh` skips the Cholesky attempt.
    """
    inverse, kappa = spd_inverse(A)
    ok = kappa <= 1 / (2 * pinv_relative_cutoff(A))
    by_cholesky = B @ inverse

    def by_eigh():
        return jnp.where(ok[..., None, None], by_cholesky, pinv_by_eigh(A, B))

    return jax.lax.cond(jnp.all(ok), lambda: by_cholesky, by_eigh)


@batch_polymorphic
def wide_least_squares(W1: jax.Array, F: jax.Array) -> jax.Array:
    """``F W1 (W1ᵀW1)⁺`` for a wide ``W1 (..., n, r)``, ``r > n`` (``F (..., S, n)``): the R
    update's minimum-norm least squares through the ``n × n`` Gram, ``F (W1 W1ᵀ)⁺ W1``.

    The two are equal, pseudo-inverse cutoff included: with ``W1 = U Σ Vᵀ`` both are
    ``F U Σ⁻¹ Vᵀ`` over the singular values kept, and ``W1ᵀW1`` and ``W1 W1ᵀ`` share their
    nonzero eigenvalues ``Σ²``; the cutoff stays the ``r × r`` Gram's (``r · eps`` of the
    largest). The eigenvalue decomposition is of an ``n × n`` matrix instead of an ``r × r`` one
    (at n = 384, r = 765 on a 2-core CPU: 17 ms instead of 62 ms, the largest step of a
    MiniLM-size sweep). No Cholesky attempt: ``W1 W1ᵀ`` is well enough conditioned for one
    only sometimes (κ₂ 2e2 … 2e3 measured at r = 459 … 765, near the float32 certificate's
    limit), and a failed attempt costs more than it saves."""
    relative = W1.shape[-1] * jnp.finfo(W1.dtype).eps
    return pinv_by_eigh_cut(W1 @ mT(W1), F, relative) @ W1


def pinv_relative_cutoff(A: jax.Array) -> float:
    """Eigenvalues of ``A (..., r, r)`` at or below this times ``max|λ|`` are dropped (``r · eps``)."""
    return A.shape[-1] * jnp.finfo(A.dtype).eps


def pinv_by_eigh(A: jax.Array, B: jax.Array) -> jax.Array:
    """``B A⁺`` by the eigenvalue decomposition, with :func:`pinv_solve`'s cutoff applied exactly."""
    return pinv_by_eigh_cut(A, B, pinv_relative_cutoff(A))


def pinv_by_eigh_cut(A: jax.Array, B: jax.Array, relative: float) -> jax.Array:
    """:func:`pinv_by_eigh` with the relative cutoff ``relative`` (two positional arguments
    only for the former: ``custom_vmap`` would pass a keyword's default to its batching rule)."""
    w, Q = jnp.linalg.eigh(A)
    cutoff = relative * jnp.maximum(jnp.max(jnp.abs(w), axis=-1, keepdims=True), jnp.finfo(A.dtype).tiny)
    keep = w > cutoff
    inv_w = jnp.where(keep, 1 / jnp.where(keep, w, 1), 0)
    return ((B @ Q) * inv_w[..., None, :]) @ mT(Q)


#: :func:`pinv_solve` without the Cholesky attempt, for a Gram known to be (near) singular.
pinv_solve_by_eigh = batch_polymorphic(pinv_by_eigh)


#: Largest coefficient count whose projection systems are solved by the unrolled Cholesky below.
UNROLLED_MAX = 16


def small_tikhonov_solve(A: jax.Array, b: jax.Array, mu: jax.Array) -> jax.Array:
    """``(A + μ I)⁻¹ b`` for a batch of small symmetric positive semi-definite ``A (..., ν, ν)``,
    ``b (..., ν)``, ``μ > 0``: the robust projection's coefficient systems.

    One ``ν × ν`` system per rank (and per restart, per λ under vmap), ``ν = 4 … 11``:
    unrolled Cholesky and substitutions over the static ``ν``, vectorized over the batch, a
    few hundred elementwise operations that XLA fuses, instead of a LAPACK call per system
    (whose per-call overhead dominated the sweep). Larger ``ν`` use a batched LAPACK Cholesky.

    In exact arithmetic every pivot of ``A + μ I`` is at least ``μ``. Computed pivots carry a
    rounding error of about ``ν · eps · max diag(A)``, which for a collapsed rank (activations
    in an interval of width 1e-8, degree-10 splines: ``max diag(A) ~ 1e20``) dwarfs ``μ``; a
    pivot that rounding drove below ``max(μ, ν · eps · max diag(A))`` is clamped to that floor,
    which leaves every well-conditioned system as it is and keeps the factor's growth bounded
    (clamping at ``μ`` alone let it overflow to inf).
    """
    nu = A.shape[-1]
    eps = jnp.finfo(A.dtype).eps
    scale = jnp.max(jnp.diagonal(A, axis1=-2, axis2=-1), axis=-1)
    floor = jnp.maximum(jnp.maximum(mu, nu * eps * scale), jnp.finfo(A.dtype).tiny)
    if nu > UNROLLED_MAX:
        factor = jnp.linalg.cholesky(A + mu * jnp.eye(nu, dtype=A.dtype).reshape((1,) * (A.ndim - 2) + (nu, nu)))
        return cho_solve((factor, True), b[..., None])[..., 0]
    zero = jnp.zeros_like(A[..., 0, 0])
    L = [[None] * nu for _ in range(nu)]
    for j in range(nu):
        L[j][j] = jnp.sqrt(jnp.maximum(A[..., j, j] + mu - sum((L[j][k] ** 2 for k in range(j)), zero), floor))
        inv = 1 / L[j][j]
        for i in range(j + 1, nu):
            L[i][j] = (A[..., i, j] - sum((L[i][k] * L[j][k] for k in range(j)), zero)) * inv
    y = []
    for i in range(nu):
        y.append((b[..., i] - sum((L[i][k] * y[k] for k in range(i)), zero)) / L[i][i])
    x = [None] * nu
    for i in reversed(range(nu)):
        x[i] = (y[i] - sum((L[k][i] * x[k] for k in range(i + 1, nu)), zero)) / L[i][i]
    return jnp.stack(x, axis=-1)


@batch_polymorphic
def lstsq(A: jax.Array, b: jax.Array) -> jax.Array:
    """Minimum-norm ``argmin_c ‖A c − b‖²`` (``A (..., k, ν)``, ``b (..., k)``), singular values
    below ``max(k, ν) · eps · σ_max`` dropped (``jnp.linalg.lstsq(rcond=None)``).

    Solved on ``A`` itself, not on ``AᵀA``: the normal equations would square the condition
    number, which for monomials of degree 10 exceeds what float64 can hold.
    """
    return jnp.vectorize(lambda A, b: jnp.linalg.lstsq(A, b, rcond=None)[0], signature="(k,v),(k)->(v)")(A, b)


