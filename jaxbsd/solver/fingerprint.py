"""A numerical fingerprint of the solver: staleness judged by numbers, not by source bytes.

A committed result depends on what the solver *computes*, not on the text of its files. The
fingerprint is a small fixed set of canonical float64 solves on planted data (fixed seeds,
fixed keys, ``tol = 0`` so every case runs its fixed number of sweeps), reduced to a few
well-conditioned scalars each: relative residuals of the final iterate and of an early one.
A result records the fingerprint it ran with (:func:`jaxbsd.io.provenance`);
``experiments/report.py --check`` recomputes it and calls the result stale only when an
entry moved beyond :data:`RTOL` (:func:`compare_fingerprints`). A comment, a rename or a
refactoring that leaves the numbers alone stales nothing; a change of the algorithm's
numbers (a cutoff, an update rule, a basis) stales everything.

The cases cover what the solver does: B-spline, degree-10 polynomial and ReLU bases, the
robust (R-CMTF-BSD) and plain (CMTF-BSD, least squares by pseudo-inverse) variants, a dense
and a structured (MLP) Jacobian operator, and two near-singular least-squares problems whose
answers depend on the minimum-norm cutoffs (``_pinv_solve`` and ``_lstsq`` in
:mod:`jaxbsd.solver.cmtf`).

Every value is chosen to be insensitive to rounding: perturbing the inputs at rounding level
moves no entry by more than a small fraction of :data:`RTOL` (``tests/test_results_fresh.py``
measures it), so the fingerprint does not move between machines, BLAS builds or XLA fusion
decisions, while multiplying either least-squares cutoff by 1e6 moves the near-singular
entries by orders of magnitude more than :data:`RTOL`.

This module is part of the solver core: it imports the solver and nothing above it
(models, data, experiments), and for its cache the file primitives of ``jaxbsd._files``
(not :mod:`jaxbsd.io`, which imports this module for the provenance of results).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import json
import math
import os
import pathlib
import platform
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxbsd.solver.bases import BSpline, Polynomial, ReLU
from jaxbsd.solver.cmtf import CMTFConfig, SolverState, solve, sweep
from jaxbsd.solver.driver import problem as make_problem
from jaxbsd._files import source_hash, write_json_atomic
from jaxbsd.solver.jacobians import StructuredJacobian

__all__ = ["FINGERPRINT_VERSION", "RTOL", "ATOL", "solver_fingerprint", "compare_fingerprints", "CASES"]

#: Bumped whenever the set of cases or their data change (then every recorded fingerprint is
#: compared against a different set of entries and is reported as moved).
FINGERPRINT_VERSION = 1

#: Relative tolerance of :func:`compare_fingerprints` (issue 20: "for example 1e-9 relative").
#: Measured when it was set (CPU, jax 0.10.2): perturbing every input of every case by 1e-15
#: or 1e-14 relative (about 5 and 45 ulps) moved no entry by more than 3.1e-11 (the degree-10
#: polynomial and near-singular entries; B-spline and ReLU entries by at most 1.4e-13), and
#: eager (``jax.disable_jit``) against compiled evaluation by at most 1e-11: a margin of 30
#: below the tolerance. Multiplying ``_pinv_solve``'s cutoff by 1e6 moves
#: ``near_singular_pinv.ls_W1`` by 7.0e-4 relative, multiplying ``_lstsq``'s by 1e6 moves
#: ``near_singular_lstsq.ls_coef`` by 1.5e-2: 6e5 and 1e7 times the tolerance.
RTOL = 1e-9
#: Absolute floor of the comparison. Every entry is a relative residual between 5e-4 and 1,
#: so this only matters for an entry that is (near) zero.
ATOL = 1e-15

#: Sweeps per solve: enough to leave the start behind, few enough to stay far from chaos.
SWEEPS = 24
#: The early iterate recorded beside the final one (history index, 0-based).
EARLY = 3


# --------------------------------------------------------------------------- planted data


def _planted_decoupled(seed: int, S: int = 48, m: int = 4, n: int = 3, r: int = 2, noise: float = 0.03):
    """Samples of a decoupled ``f(x) = W1 g(W0 x)`` with smooth ``g`` (not in any basis), with
    seeded noise on ``J`` and ``F`` so that every fit keeps a residual well above rounding.

    Returns:
      ``(J (S, n, m), F (S, n), X (S, m))`` float64 numpy arrays.
    """
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(S, m))
    W0 = rng.normal(size=(r, m)) / math.sqrt(m)
    W1 = rng.normal(size=(n, r))
    U = X @ W0.T  # (S, r)
    g = np.stack([np.tanh(U[:, 0]), np.sin(1.3 * U[:, 1])], axis=1)[:, :r]
    dg = np.stack([1 - np.tanh(U[:, 0]) ** 2, 1.3 * np.cos(1.3 * U[:, 1])], axis=1)[:, :r]
    J = np.einsum("ai,si,ib->sab", W1, dg, W0)
    F = g @ W1.T
    J = J + noise * np.std(J) * rng.normal(size=J.shape)
    F = F + noise * np.std(F) * rng.normal(size=F.shape)
    return J, F, X


def _planted_mlp(seed: int, S: int = 48, m: int = 4, H: int = 8, n: int = 3):
    """A small random tanh MLP ``f(x) = V1 tanh(V0 x + b0)`` and its samples.

    Returns:
      ``(V1 (n, H), V0 (H, m), D (S, H), F (S, n), X (S, m))`` float64 numpy arrays, with
      ``J[s] = V1 diag(D[s]) V0``.
    """
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(S, m))
    V0 = rng.normal(size=(H, m)) / math.sqrt(m)
    b0 = 0.1 * rng.normal(size=(H,))
    V1 = rng.normal(size=(n, H)) / math.sqrt(H)
    A = X @ V0.T + b0[None, :]
    return V1, V0, 1 - np.tanh(A) ** 2, np.tanh(A) @ V1.T, X


# --------------------------------------------------------------------------- cases

class Case(NamedTuple):
    """One canonical computation.

    Attributes:
      inputs: ``() -> tuple`` of float64 numpy arrays, its planted data (perturbable: the
        robustness test calls :attr:`values` on perturbed copies).
      values: ``(*inputs) -> dict[str, scalar]``, jittable, runs the solver.
      entries: the keys of :attr:`values` that enter the fingerprint (None: all).
    """

    inputs: Callable[[], tuple]
    values: Callable[..., dict]
    entries: tuple[str, ...] | None = None


def _restart_values(res) -> dict:
    """A restart's relative residuals, final and after sweep ``EARLY + 1``."""
    return {"error_J": res.error_J, "error_F": res.error_F,
            f"error_J_sweep{EARLY + 1}": res.history_J[EARLY], f"error_F_sweep{EARLY + 1}": res.history_F[EARLY]}


def _dense_case(basis, robust: bool, data_seed: int = 0, key_seed: int = 0, rank: int = 2) -> Case:
    """One restart of ``rank``/``basis``/``robust`` on planted decoupled data (dense 𝒥)."""
    config = CMTFConfig(rank=rank, basis=basis, robust=robust, max_iter=SWEEPS, tol=0.0)

    def values(J, F, X):
        return _restart_values(solve(jax.random.key(key_seed), make_problem(J, F, X), config))

    return Case(lambda: _planted_decoupled(data_seed), values)


def _structured_case(basis, robust: bool, data_seed: int = 7, key_seed: int = 1, rank: int = 3) -> Case:
    """One restart on a planted MLP's Jacobian given by its factors (:class:`StructuredJacobian`)."""
    config = CMTFConfig(rank=rank, basis=basis, robust=robust, max_iter=SWEEPS, tol=0.0)

    def values(V1, V0, D, F, X):
        jac = StructuredJacobian(V1, V0, D)
        return _restart_values(solve(jax.random.key(key_seed), make_problem(jac, F, X), config))

    return Case(lambda: _planted_mlp(data_seed), values)


#: Shapes and configuration of the near-singular cases (one plain sweep from a given state).
_NS_S, _NS_M, _NS_N, _NS_R = 48, 4, 3, 3
_NS_CONFIG = CMTFConfig(rank=_NS_R, basis=Polynomial(10), robust=False, max_iter=1, tol=0.0)


def _ns_inputs_pinv(seed: int = 3, delta: float = 2e-6) -> tuple:
    """A state whose ``W1`` system is nearly singular: ranks 0 and 1 nearly equal.

    Rows 0 and 1 of ``W0`` and columns 0 and 1 of ``G`` and ``R`` differ by ``delta``, so the
    Gram matrix of the ``W1`` update (``GᵀG ∘ W0W0ᵀ + λ RᵀR``) has one eigenvalue at about
    ``delta²`` relative to the largest (measured: 2.1e-12): above the pseudo-inverse's cutoff
    ``r · eps`` (6.7e-16), below a million times it (6.7e-10). The data (``J``, ``F``) are
    noisy, so the least-squares target has a component along the nearly dependent direction.
    """
    rng = np.random.default_rng(seed)
    J, F, X = _planted_decoupled(seed, S=_NS_S, m=_NS_M, n=_NS_N, r=2, noise=0.3)
    W0 = rng.normal(size=(_NS_R, _NS_M)) / math.sqrt(_NS_M)
    G = rng.normal(size=(_NS_S, _NS_R))
    R = rng.normal(size=(_NS_S, _NS_R))
    W0[1] = W0[0] + delta * rng.normal(size=_NS_M)
    G[:, 1] = G[:, 0] + delta * rng.normal(size=_NS_S)
    R[:, 1] = R[:, 0] + delta * rng.normal(size=_NS_S)
    W1 = np.zeros((_NS_N, _NS_R))  # not read by the plain W1 update
    return W0, W1, G, R, J, F, X


def _ns_inputs_lstsq(seed: int = 4, noise: float = 2.0) -> tuple:
    """A state at an exact CPD of ``𝒥`` and ``F`` whose projection systems are nearly singular.

    ``𝒥 = [[W1, W0ᵀ, G]]`` and ``F = R W1ᵀ`` exactly, so the sweep's ``W1``, ``W0``, ``G`` and
    ``R`` updates return the given factors (to rounding). The activations ``u_i = X W0[i]ᵀ``
    fill ``[0.3, 2]``, where the stacked degree-10 monomial design ``[B'; √λ B]`` (96 × 11)
    has its smallest singular value at 2e-9 … 4e-9 of the largest (measured per rank): above
    ``lstsq``'s cutoff ``96 · eps`` (2e-14), below a million times it (2e-8); the next one,
    4e-8 … 9e-8, stays above both. ``G`` and ``R`` are a smooth function plus noise of
    relative size ``noise``, so the fit's residual is of order one and the target has a
    component along the nearly dependent direction. (With ``u`` in ``[0.5, 2]``, smallest
    singular value 8e-10, the rounding noise of this entry reached 3e-10 relative: too close
    to :data:`RTOL`.)
    """
    rng = np.random.default_rng(seed)
    W0 = rng.normal(size=(_NS_R, _NS_M)) / math.sqrt(_NS_M)
    W1 = rng.normal(size=(_NS_N, _NS_R))
    U = rng.uniform(0.3, 2.0, size=(_NS_S, _NS_R))
    # X with X W0ᵀ = U: the minimum-norm solution plus a seeded component in W0's null space.
    null = np.linalg.svd(W0)[2][_NS_R:]  # (m - r, m)
    X = U @ np.linalg.pinv(W0).T + rng.normal(size=(_NS_S, _NS_M - _NS_R)) @ null
    G = np.exp(0.5 * U) * 0.5 + noise * rng.normal(size=U.shape)
    R = np.exp(0.5 * U) + noise * rng.normal(size=U.shape)
    J = np.einsum("ai,si,ib->sab", W1, G, W0)
    F = R @ W1.T
    return W0, W1, G, R, J, F, X


def _ns_values(W0, W1, G, R, J, F, X) -> dict:
    """One plain sweep from the given state, and the two least-squares objectives it minimizes.

    Values that are stationary at the computed solution do not move, to first order, with its
    rounding error, however ill-conditioned the system; a cutoff that drops a direction moves
    them by that direction's share of the target.

    * ``ls_W1``: ``(‖𝒥 − [[W1', W0ᵀ, G]]‖² + λ‖F − R W1'ᵀ‖²) / (‖𝒥‖² + λ‖F‖²)`` at the new
      ``W1'``, the objective of the sweep's first (pseudo-inverse) update.
    * ``ls_coef``: ``Σ_i ‖B'_i c_i − G[:, i]‖² + λ‖B_i c_i − R[:, i]‖²`` over the same sum
      of the targets' squares, at the new coefficients ``c_i`` and the new ``W0`` (which is
      the given one to rounding on the lstsq case): the projection's (``lstsq``) objective.
    """
    problem = make_problem(J, F, X)
    jac = problem.jac
    config = _NS_CONFIG
    lam = jnp.asarray(config.lam, J.dtype)
    knots = jax.vmap(config.basis.fit)(W0 @ X.T)
    state = SolverState(W0=W0, W1=W1, G=G, R=R, coef=jnp.zeros((_NS_R, config.basis.num_coef), J.dtype),
                        knots=knots)
    new = sweep(state, problem, config)
    ls_w1 = (jac.residual_sq_norm(W0, new.W1, G) + lam * jnp.sum((F - R @ new.W1.T) ** 2)) / (
        jac.sq_norm() + lam * jnp.sum(F**2))
    B, dB = jax.vmap(config.basis.design)(new.W0 @ X.T, new.knots)  # (r, S, ν) each
    fit_G = jnp.einsum("rsi,ri->sr", dB, new.coef)
    fit_R = jnp.einsum("rsi,ri->sr", B, new.coef)
    ls_coef = (jnp.sum((fit_G - G) ** 2) + lam * jnp.sum((fit_R - R) ** 2)) / (jnp.sum(G**2) + lam * jnp.sum(R**2))
    return {"ls_W1": ls_w1, "ls_coef": ls_coef}


CASES: dict[str, Case] = {
    "bspline3_robust": _dense_case(BSpline(3, 7), True),
    "bspline3_plain": _dense_case(BSpline(3, 7), False),
    "poly10_robust": _dense_case(Polynomial(10), True),
    "poly10_plain": _dense_case(Polynomial(10), False),
    "relu_robust_structured": _structured_case(ReLU(6), True),
    # Both near-singular cases run the same program (one plain sweep) on different states.
    "near_singular_pinv": Case(_ns_inputs_pinv, _ns_values, ("ls_W1",)),
    "near_singular_lstsq": Case(_ns_inputs_lstsq, _ns_values, ("ls_coef",)),
}


# --------------------------------------------------------------------------- the fingerprint


@contextlib.contextmanager
def _cpu_x64():
    """float64 on the CPU, whatever the global ``jax_enable_x64`` flag and default device say:
    the fingerprint describes the solver's arithmetic, and every machine has a CPU backend
    (unless ``JAX_PLATFORMS`` leaves it out: then the default device computes it)."""
    try:
        device = jax.devices("cpu")[0]
    except RuntimeError:
        device = None
    with jax.enable_x64(True), jax.default_device(device):
        yield


#: Compiled programs, one per distinct ``Case.values`` (the near-singular pair shares one).
_EXECUTABLES: dict[Callable, Any] = {}


def _arrays(args: tuple) -> tuple:
    return tuple(jnp.asarray(np.asarray(a, np.float64)) for a in args)


def _compile(names: Iterable[str]) -> None:
    """Compile the programs of ``names`` not compiled yet, concurrently: tracing holds the GIL,
    XLA's compilation does not, and compilation is most of the fingerprint's cost."""
    todo = {}
    with _cpu_x64():
        for name in names:
            case = CASES[name]
            if case.values not in _EXECUTABLES and case.values not in todo:
                todo[case.values] = jax.jit(case.values).lower(*_arrays(case.inputs()))
    if not todo:
        return
    workers = max(1, min(len(todo), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for values, compiled in zip(todo, pool.map(lambda lowered: lowered.compile(), todo.values())):
            _EXECUTABLES[values] = compiled


def case_values(name: str, inputs: tuple | None = None) -> dict[str, float]:
    """The fingerprint entries of one case, ``{"case.value": float}``, computed on its planted
    inputs or on ``inputs`` (perturbed copies of them, same shapes), in float64 on the CPU."""
    case = CASES[name]
    _compile([name])
    with _cpu_x64():
        out = _EXECUTABLES[case.values](*_arrays(case.inputs() if inputs is None else inputs))
        keys = case.entries if case.entries is not None else sorted(out)
        return {f"{name}.{k}": float(out[k]) for k in keys}


def _package_hash() -> str:
    return source_hash()


#: The package's sources as imported (the code that computes the fingerprint), for the cache key.
_SOURCES_AT_IMPORT = _package_hash()


def _cache_file() -> pathlib.Path:
    """Where this package's fingerprint is kept, keyed by everything its numbers depend on: the
    bytes of every source file of the package (when this module was imported), the versions of
    jax, jaxlib and numpy, and the machine. Same key, same program, same numbers: only a
    byte-identical solver reuses it."""
    import jaxlib

    key = hashlib.sha256(json.dumps([FINGERPRINT_VERSION, _SOURCES_AT_IMPORT, jax.__version__, jaxlib.__version__,
                                     np.__version__, platform.machine(), platform.processor()]).encode())
    base = os.environ.get("JAXBSD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxbsd")
    return pathlib.Path(base) / "fingerprint" / f"{key.hexdigest()[:32]}.json"


@functools.lru_cache(maxsize=1)
def _fingerprint(cache: bool) -> tuple[tuple[str, float], ...]:
    path = _cache_file() if cache else None
    if path is not None and path.is_file():
        try:
            stored = json.loads(path.read_text())
            if isinstance(stored, dict) and stored and all(isinstance(v, float) for v in stored.values()):
                return tuple(sorted(stored.items()))
        except (OSError, ValueError):
            pass  # unreadable: recompute and overwrite
    _compile(CASES)
    values: dict[str, float] = {}
    for name in CASES:
        values.update(case_values(name))
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    if bad:
        raise RuntimeError(f"solver fingerprint: non-finite values {bad}")
    if path is not None:
        try:
            write_json_atomic(path, values)
        except OSError:
            pass  # a read-only cache only costs the recomputation next time
    return tuple(sorted(values.items()))


def solver_fingerprint(*, cache: bool = True) -> dict[str, float]:
    """The solver's fingerprint: ``{"case.value": float}`` over :data:`CASES`.

    Computed once per process (a few seconds of compilation, the solves themselves take
    milliseconds) and, with ``cache``, kept in ``$JAXBSD_CACHE/fingerprint/`` (default
    ``~/.cache/jaxbsd``) under a key of the package's source bytes and the library versions,
    so a byte-identical package on the same machine does not recompute it.
    """
    return dict(_fingerprint(bool(cache)))


def compare_fingerprints(recorded: Mapping[str, float], current: Mapping[str, float], rtol: float = RTOL,
                         atol: float = ATOL) -> list[str]:
    """The entries that moved between a ``recorded`` fingerprint and the ``current`` one:
    ``|new − old| > atol + rtol·|old|`` (a NaN always moves), or present on one side only.

    Args:
      recorded: the fingerprint a result recorded (``{"case.value": float}``).
      current: the current solver's (:func:`solver_fingerprint`).
      rtol, atol: the tolerance (default :data:`RTOL`, :data:`ATOL`).

    Returns:
      One line per moved entry, ``"name: old -> new (relative change c)"``, the largest
      change first (entries present on one side only before all). Empty when they agree.
    """
    if not isinstance(recorded, Mapping) or not recorded:
        return ["(no recorded fingerprint)"]
    moved: list[tuple[float, str]] = []
    for name in sorted(set(recorded) | set(current)):
        if name not in current:
            moved.append((math.inf, f"{name}: {recorded[name]!r} -> (not computed any more)"))
            continue
        if name not in recorded:
            moved.append((math.inf, f"{name}: (not recorded) -> {current[name]!r}"))
            continue
        old, new = recorded[name], current[name]
        try:
            old, new = float(old), float(new)
        except (TypeError, ValueError):
            moved.append((math.inf, f"{name}: {old!r} -> {new!r} (not a number)"))
            continue
        if not abs(new - old) <= atol + rtol * abs(old):  # written so that NaN moves
            rel = abs(new - old) / abs(old) if old else math.inf
            moved.append((rel if rel == rel else math.inf, f"{name}: {old!r} -> {new!r} (relative change {rel:.2e})"))
    return [line for _, line in sorted(moved, key=lambda m: -m[0])]
