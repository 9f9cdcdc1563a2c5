"""The convenient driver on top of the solver core: :func:`problem` and :func:`decouple`.

:mod:`jaxbsd.solver.cmtf` is the algorithm as pure functions. This module adds what a one-call user
needs: validation at the boundary (before anything is compiled), placement on devices,
batching of restarts, a progress meter inside the one compiled loop, and the CPU thread
configuration that keeps jaxlib's LAPACK from fighting XLA for the cores.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import threading
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxbsd.solver import cmtf
from jaxbsd.solver.cmtf import CMTFConfig, DecouplingResult, Problem
from jaxbsd.solver.decoupled import Decoupled
from jaxbsd.solver.jacobians import DenseJacobian, JacobianOperator, StructuredJacobian

__all__ = ["problem", "decouple", "configure_cpu_threads", "ProgressCallback"]


# --------------------------------------------------------------------------- CPU threads


def configure_cpu_threads(lapack_threads: int | None = 1) -> dict[str, int]:
    """Limit the BLAS behind jaxlib's CPU LAPACK kernels to ``lapack_threads`` threads.

    jaxlib runs ``eigh``, Cholesky and triangular solves on the OpenBLAS bundled with SciPy
    (``scipy.linalg.cython_lapack``), a different library from NumPy's. Left at its default
    (one thread per core) it busy-waits on the same cores as XLA's own thread pool: a sweep at
    the paper's size ran 1.5× slower, and 16 vmapped restarts could stall for minutes. One
    LAPACK thread is right for the solver's small systems. Called once when :mod:`jaxbsd` is
    imported (the environment variable ``JAXBSD_LAPACK_THREADS`` sets the count, ``0`` leaves
    the library alone); NumPy's own BLAS is not touched.

    Returns:
      ``{library file name: thread count}`` after the change (empty if threadpoolctl or the
      library is not available).
    """
    try:
        import scipy.linalg  # noqa: F401  (loads the BLAS that jaxlib's LAPACK kernels use)
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - both are dependencies
        return {}
    controller = ThreadpoolController()
    paths = [c.filepath for c in controller.lib_controllers if c.user_api == "blas" and "numpy" not in c.filepath]
    if not paths:
        return {}
    blas = controller.select(filepath=paths)
    if lapack_threads:
        blas.limit(limits=lapack_threads)
    return {os.path.basename(c.filepath): c.num_threads for c in blas.lib_controllers}


def _configure_from_environment() -> None:
    value = os.environ.get("JAXBSD_LAPACK_THREADS", "1")
    try:
        threads = int(value)
    except ValueError:
        raise ValueError(f"JAXBSD_LAPACK_THREADS must be an int (0: leave as is), got {value!r}") from None
    configure_cpu_threads(threads or None)


_configure_from_environment()


# --------------------------------------------------------------------------- validation


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


@jax.jit
def _health(leaves: list[jax.Array]) -> jax.Array:
    """``(len(leaves), 2)`` booleans: every entry finite; sum of squares finite. One reduction
    per array on the device: the data never comes back to the host."""
    return jnp.stack([jnp.stack([jnp.all(jnp.isfinite(x)), jnp.isfinite(jnp.sum(jnp.square(x)))]) for x in leaves])


def _check_values(named: dict[str, jax.Array]) -> None:
    concrete = {name: x for name, x in named.items() if _is_concrete(x)}
    if not concrete:
        return
    flags = np.asarray(_health(list(concrete.values())))
    for (name, x), (finite, sq_finite) in zip(concrete.items(), flags):
        if not finite:
            raise ValueError(f"{name} contains NaN or inf")
        if not sq_finite:
            raise ValueError(f"{name} is too large for {x.dtype}: its sum of squares overflows; rescale the data")


def _as_array(name: str, x: Any, ndim: int, shape_doc: str) -> jax.Array:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        x = np.asarray(x)
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    return x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x))  # no compiled copy per shape


def problem(J: Any, F: Any, X: Any) -> Problem:
    """A validated :class:`~jaxbsd.solver.cmtf.Problem` from Jacobians, outputs and sampling points.

    Args:
      J: ``(S, n, m)`` Jacobians (an array: becomes a :class:`~jaxbsd.solver.jacobians.DenseJacobian`
        laid out for the solver), or any :class:`~jaxbsd.solver.jacobians.JacobianOperator` (a
        :class:`~jaxbsd.solver.jacobians.StructuredJacobian`, or your own).
      F: ``(S, n)`` outputs ``f(X)``.
      X: ``(S, m)`` sampling points.

    Raises:
      ValueError: naming the argument, on mismatched shapes, mixed or non-floating dtypes,
        NaN/inf, or values whose sum of squares overflows. Finiteness is checked on the
        device with one reduction per array.
    """
    X = _as_array("X", X, 2, "(S, m)")
    F = _as_array("F", F, 2, "(S, n)")
    S, m = X.shape
    if isinstance(J, JacobianOperator):
        jac = J
        if isinstance(jac, DenseJacobian) and (jac.J_out is None or jac.J_in is None):
            jac = DenseJacobian.from_dense(_as_array("J.J", jac.J, 3, "(S, n, m)"))
        named = {}
        for path, leaf in jax.tree_util.tree_flatten_with_path(jac)[0]:
            name = "J" + "".join(f".{p.name}" if hasattr(p, "name") else str(p) for p in path)
            leaf = jnp.asarray(leaf)
            if not jnp.issubdtype(leaf.dtype, jnp.floating):
                raise ValueError(f"{name} must be a floating-point array, got dtype {leaf.dtype}")
            named[name] = leaf
    else:
        jac = DenseJacobian.from_dense(_as_array("J", J, 3, "(S, n, m)"))
        named = {"J": jac.J}
    # An operator may check the consistency of its own factors (GatedJacobian does).
    check_shapes = getattr(jac, "check_shapes", None)
    if callable(check_shapes):
        check_shapes()
    if isinstance(jac, StructuredJacobian):
        H = jac.D.shape[1]
        if jac.V1.ndim != 2 or jac.V0.ndim != 2 or jac.D.ndim != 2 or jac.V1.shape[1] != H or jac.V0.shape[0] != H:
            raise ValueError(
                f"J: structured factors disagree on the hidden width: V1 {jac.V1.shape}, "
                f"V0 {jac.V0.shape}, D {jac.D.shape}"
            )
    S_J, n, m_J = jac.shape
    if S_J != S or m_J != m:
        raise ValueError(f"J must have shape (S, n, m) = ({S}, n, {m}) to match X {X.shape}, got {jac.shape}")
    if F.shape != (S, n):
        raise ValueError(f"F must have shape (S, n) = ({S}, {n}) to match J {jac.shape}, got {F.shape}")
    dtypes = {jnp.dtype(jnp.asarray(a).dtype) for a in named.values()} | {F.dtype, X.dtype}
    if len(dtypes) != 1:
        raise ValueError(f"J, F and X must share one floating dtype, got {sorted(map(str, dtypes))}")
    _check_values({**named, "F": F, "X": X})
    return Problem(jac=jac, F=F, X=X)


# --------------------------------------------------------------------------- devices, batching


def _place(keys: jax.Array, problem: Problem, shard: str | None) -> tuple[jax.Array, Problem]:
    """Spread restarts, or the sample axis, over ``jax.devices()`` (a no-op on one device).

    ``"restarts"`` shards the restart axis (it must divide evenly); ``"samples"`` shards the
    sample axis ``S`` of ``X``, ``F`` and the Jacobian operator (its ``map_samples``);
    ``"auto"`` picks restarts when they divide evenly, else samples when ``S`` does. The
    compiled program is the same SPMD program on one CPU, several GPUs or a TPU slice.
    """
    if shard not in ("auto", "restarts", "samples", None):
        raise ValueError(f"shard must be 'auto', 'restarts', 'samples' or None, got {shard!r}")
    devices = jax.devices()
    count = len(devices)
    if shard is None or count == 1:
        return keys, problem
    restarts, S = keys.shape[0], problem.X.shape[0]
    if shard == "auto":
        shard = "restarts" if restarts % count == 0 else "samples" if S % count == 0 else None
        if shard is None:
            return keys, problem
    mesh = Mesh(np.asarray(devices), ("d",))
    if shard == "restarts":
        if restarts % count:
            raise ValueError(f"restarts ({restarts}) must be a multiple of the {count} devices to shard them")
        return jax.device_put(keys, NamedSharding(mesh, P("d"))), problem
    if S % count:
        raise ValueError(f"S ({S}) must be a multiple of the {count} devices to shard samples")
    rows = lambda x: jax.device_put(x, NamedSharding(mesh, P("d", *([None] * (x.ndim - 1)))))  # noqa: E731
    return keys, Problem(jac=problem.jac.map_samples(rows), F=rows(problem.F), X=rows(problem.X))


def restart_batching(batch: str | None, restarts: int) -> str:
    """``"vmap"`` or ``"map"`` for ``decouple(batch=...)``; ``None`` picks ``"vmap"``.

    Measured (``benchmarks/run.py``, row (b)): with jaxlib's LAPACK on one thread, 16 vmapped
    restarts at the paper's size run faster than 16 sequential ones on a 2-core CPU as well as
    on accelerators, so vmap is the default everywhere. A single restart runs unbatched, so it
    is bit-identical to :func:`jaxbsd.solve` with its key.
    """
    if batch is None:
        batch = "vmap"
    if batch not in ("vmap", "map"):
        raise ValueError(f"batch must be 'vmap', 'map' or None, got {batch!r}")
    return "map" if restarts <= 1 else batch


# --------------------------------------------------------------------------- progress

#: ``progress(iteration, error_J, error_F)`` with per-restart ``(restarts,)`` arrays.
ProgressCallback = Callable[[int, np.ndarray, np.ndarray], None]

_REPORTERS: dict[int, Callable[..., None]] = {}
_CHANNELS = itertools.count(1)
_REPORTERS_LOCK = threading.Lock()


def emit(channel, *values) -> None:
    """Host side of a compiled loop's report, ``io_callback(emit, None, channel, *values)``: the
    same function in every compiled program (so the program does not depend on who listens); it
    forwards the values (as numpy) to the reporter registered on ``channel`` (:func:`reporting`), if any."""
    reporter = _REPORTERS.get(int(np.asarray(channel)))
    if reporter is not None:
        reporter(*(np.asarray(v) for v in values))


@contextlib.contextmanager
def reporting(reporter: Callable[..., None]) -> Iterator[int]:
    """A fresh channel (an int) that :func:`emit` forwards to ``reporter`` while the block runs."""
    with _REPORTERS_LOCK:
        channel = next(_CHANNELS)
        _REPORTERS[channel] = reporter
    try:
        yield channel
    finally:
        with _REPORTERS_LOCK:
            del _REPORTERS[channel]


def _hook(channel: jax.Array, every: jax.Array, restart: jax.Array, count: jax.Array, loop: cmtf.Iteration) -> None:
    """Inside the compiled loop: report every ``every`` sweeps and when the loop ends
    (``every = 0``: never). ``count`` must be unbatched; ``loop`` may be batched."""
    last = jnp.maximum(loop.it - 1, 0)
    pick = lambda h: jnp.take_along_axis(h, last[..., None], axis=-1)[..., 0]  # noqa: E731
    done = ~jnp.any(loop.running)
    fire = (every > 0) & ((count % jnp.maximum(every, 1) == 0) | done)
    jax.lax.cond(
        fire,
        lambda: io_callback(emit, None, channel, restart, loop.it, pick(loop.history_J), pick(loop.history_F)),
        lambda: None,
    )


def _stack_warm(runs: Any, warm: Any) -> Any:
    """``runs`` (leading restart axis) with ``warm`` (one restart) appended as the last one."""
    return jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b[None]]), runs, warm)


def _run_map(keys, problem, config, channel, every, warm=None, report=True, heldout=None,
             warm_only=False) -> cmtf.RestartResult:
    """Restarts one after the other (``lax.map``); each restart's loop reports itself (unless
    ``report`` is False: no progress hook in the program at all). A warm start (``warm``, a
    :class:`~jaxbsd.solver.cmtf.SolverState`) runs after the random restarts; ``warm_only``: it
    alone (``keys``' one key is then unused), the same loop as the warm restart beside random ones."""

    def hook(index):
        return (lambda loop: _hook(channel, every, index, loop.it, loop)) if report else None

    def one(args):
        index, key = args
        return cmtf.solve(key, problem, config, on_sweep=hook(index), heldout=heldout)

    random = 0 if warm_only else keys.shape[0]
    runs = None if warm_only else jax.lax.map(one, (jnp.arange(random), keys))
    if warm is None:
        return runs
    warm_run = cmtf.solve(keys[0], problem, config, init=warm, on_sweep=hook(jnp.asarray(random)),
                          heldout=heldout)
    if runs is None:
        return jax.tree_util.tree_map(lambda a: a[None], warm_run)
    return _stack_warm(runs, warm_run)


def _run_vmap(keys, problem, config, channel, every, warm=None, report=True, heldout=None) -> cmtf.RestartResult:
    """All restarts in one loop with a shared sweep counter: each sweep is one batched step
    of every running restart (stopped ones are held), as ``vmap`` of the while loop would do,
    and the progress report sees all restarts at once. A warm start (``warm``) is the last
    restart of the batch."""
    over = lambda fn: jax.vmap(functools.partial(fn, heldout=heldout), in_axes=(0, None, None))  # noqa: E731
    loops = over(cmtf.begin)(keys, problem, config)
    if warm is not None:
        loops = _stack_warm(loops, cmtf.begin(keys[0], problem, config, init=warm, heldout=heldout))

    def hold(running, new, old):
        mask = running.reshape(running.shape + (1,) * (new.ndim - 1))
        return jnp.where(mask, new, old)

    def body(carry):
        count, loops = carry
        stepped = over(cmtf.advance)(loops, problem, config)
        loops = jax.tree_util.tree_map(lambda new, old: hold(loops.running, new, old), stepped, loops)
        if report:
            _hook(channel, every, jnp.arange(loops.it.shape[0]), count + 1, loops)
        return count + 1, loops

    _, loops = jax.lax.while_loop(lambda c: jnp.any(c[1].running), body, (jnp.asarray(0), loops))
    return over(cmtf.finish)(loops, problem, config)


def restart_keys(key: jax.Array, restarts: int) -> jax.Array:
    """The keys a solve of ``restarts`` random restarts is given: restart ``k`` uses
    ``jax.random.split(key, restarts)[k]``. With none (``restarts=0``: the warm start alone) one
    key, which the warm start's loop is handed but never uses."""
    return jax.random.split(key, max(restarts, 1))


def decouple_compiled(keys, problem, config, channel, every, init=None, heldout=None, *, batch: str,
                       report: bool = True, warm_only: bool = False) -> DecouplingResult:
    """The whole solve of one problem. ``report=False`` leaves the progress hook out of the
    program (a group of blocks vmaps this function: a batched hook would call the host every
    sweep); the numbers are the same either way. ``heldout``: a :class:`~jaxbsd.solver.cmtf.HeldOut`.
    ``warm_only``: no random restart, the warm start ``init`` alone (``keys``: :func:`restart_keys`
    of 0)."""
    warm = None if init is None else cmtf.warm_state(problem, config, init)
    run = functools.partial(_run_map, warm_only=True) if warm_only else _run_vmap if batch == "vmap" else _run_map
    return cmtf.select_best(run(keys, problem, config, channel, every, warm, report, heldout), config)


#: The whole solve as one compiled function: with the progress hook (``report=True``) when progress
#: is asked for, else without it. A program holding a host callback is never written to JAX's
#: persistent compilation cache, so the hook-free one is what a later process (a rerun, a test
#: worker, a study's next unit) loads from the cache instead of compiling the solver again.
_decouple_jit = jax.jit(decouple_compiled, static_argnames=("batch", "report", "warm_only"))


def _reporter(progress: bool | ProgressCallback, restarts: int, config: CMTFConfig, batch: str):
    """``(reporter, close)``: what :func:`emit` calls, and what ends the display."""
    latest_J = np.full((restarts,), np.nan)
    latest_F = np.full((restarts,), np.nan)
    sweeps = np.zeros((restarts,), np.int64)
    if callable(progress):
        user, close = progress, lambda: None
    else:
        from tqdm.auto import tqdm

        total = config.max_iter * (restarts if batch == "map" else 1)
        bar = tqdm(total=total, desc="R-CMTF sweeps", file=sys.stderr, leave=False)

        def user(iteration, error_J, error_F):
            done = int(sweeps.sum()) if batch == "map" else iteration
            bar.update(done - bar.n)
            bar.set_postfix(error_J=f"{np.nanmin(error_J):.3e}", error_F=f"{np.nanmin(error_F):.3e}")

        close = bar.close

    def report(restart, iteration, error_J, error_F):
        latest_J[restart], latest_F[restart], sweeps[restart] = error_J, error_F, iteration
        user(int(np.max(iteration)), latest_J.copy(), latest_F.copy())

    return report, close


def check_init(init: Any, prob: Problem, config: CMTFConfig) -> Decoupled:
    """``decouple(init=...)`` validated: a finite :class:`~jaxbsd.Decoupled` of the config's
    basis and rank and the problem's sizes, in the problem's dtype."""
    if not isinstance(init, Decoupled):
        raise ValueError(f"init must be a jaxbsd.Decoupled (or None), got {type(init).__name__}")
    if init.basis != config.basis:
        raise ValueError(f"init: its basis {init.basis} is not config.basis {config.basis}")
    S, n, m = prob.jac.shape
    r, nu, K = config.rank, config.basis.num_coef, config.basis.num_knots
    expected = {"W0": (r, m), "W1": (n, r), "coef": (r, nu), "knots": (r, K)}
    for name, shape in expected.items():
        value = getattr(init, name)
        if tuple(np.shape(value)) != shape:
            raise ValueError(f"init.{name} must have shape {shape} (rank {r}, m = {m}, n = {n}), got {np.shape(value)}")
        if not bool(jnp.all(jnp.isfinite(jnp.asarray(value)))):
            raise ValueError(f"init.{name} contains non-finite values")
    dtype = prob.F.dtype
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), init)


def check_heldout(heldout: Any, prob: Problem) -> cmtf.HeldOut:
    """``decouple(heldout=...)`` validated: ``(X_h (N, m), Y_h (N, n))``, finite, ``N >= 1``,
    as a :class:`~jaxbsd.solver.cmtf.HeldOut` in the problem's dtype."""
    if not isinstance(heldout, (tuple, list)) or len(heldout) != 2:
        raise ValueError(f"heldout must be a pair (X_h, Y_h), got {type(heldout).__name__}")
    S, n, m = prob.jac.shape
    X_h = _as_array("heldout[0]", heldout[0], 2, f"(N, m = {m})")
    Y_h = _as_array("heldout[1]", heldout[1], 2, f"(N, n = {n})")
    if X_h.shape[1] != m or Y_h.shape != (X_h.shape[0], n) or X_h.shape[0] < 1:
        raise ValueError(f"heldout must be (X_h (N, {m}), Y_h (N, {n})) with N >= 1, got {X_h.shape} and {Y_h.shape}")
    _check_values({"heldout[0]": X_h, "heldout[1]": Y_h})
    dtype = prob.F.dtype
    return cmtf.HeldOut(X=jnp.asarray(X_h, dtype), Y=jnp.asarray(Y_h, dtype))


def decouple(
    J: Any,
    F: Any,
    X: Any,
    config: CMTFConfig,
    *,
    key: jax.Array,
    restarts: int = 1,
    progress: bool | ProgressCallback = False,
    progress_every: int | None = None,
    shard: str | None = "auto",
    batch: str | None = None,
    init: Decoupled | None = None,
    heldout: tuple[Any, Any] | None = None,
) -> DecouplingResult:
    """Decouple ``f(x) ≈ W1 g(W0 x)`` from Jacobians and outputs at sampling points.

    Args:
      J: ``(S, n, m)`` Jacobians (``jax.vmap(jax.jacfwd(f))(X)``), or a
        :class:`~jaxbsd.solver.jacobians.JacobianOperator` such as
        :class:`~jaxbsd.solver.jacobians.StructuredJacobian` (never materialized) or your own.
      F: ``(S, n)`` outputs ``f(X)``.
      X: ``(S, m)`` sampling points.
      config: a :class:`~jaxbsd.CMTFConfig`.
      key: a ``jax.random`` key; restart ``k`` uses ``jax.random.split(key, restarts)[k]``.
      restarts: number of random restarts, run together in one compiled program; 0 with ``init``:
        the warm start alone (the same loop, bit for bit, as its restart beside random ones).
      progress: ``True`` shows a progress bar with the best Error(𝒥) and Error(F); a callable
        is called as ``progress(iteration, error_J, error_F)`` with per-restart
        ``(restarts,)`` arrays (NaN for restarts not begun yet). The report is an
        ``io_callback`` inside the one compiled loop; without progress the program has no hook
        (so JAX's persistent compilation cache can keep it), and the result is the same, bit
        for bit, with or without it.
      progress_every: sweeps between reports (default ``max_iter / 20``).
      shard: how to use several devices: ``"auto"``, ``"restarts"``, ``"samples"`` or ``None``
        (see :func:`_place`); nothing changes on a single device.
      batch: how restarts share a device: ``"vmap"`` (batched; the default), or ``"map"``
        (one after the other; same results to rounding).
      init: a :class:`~jaxbsd.Decoupled` to start one more restart from (a warm start, e.g.
        a pruned MLP written as a decoupling), run alongside the ``restarts`` random ones as
        the last restart (index ``restarts``); the best of all is kept. Its basis and rank
        must be the config's. The random restarts are the same with or without it.
      heldout: ``(X_h (N, m), Y_h (N, n))``, tokens outside the samples and the function's
        outputs there: each restart then keeps its iterate of lowest relative output error on
        them (the warm start's initial one included) instead of its last best objective, the
        restarts are compared by it, ``config.patience`` (if set) stops a restart once that many
        sweeps have not improved on it, and the result reports ``kept_sweep`` and
        ``heldout_error``. ``None`` (the default): none of this, the same program as before.

    Returns:
      A :class:`~jaxbsd.DecouplingResult`; ``result.model`` is the best restart's model.

    Raises:
      ValueError: on mismatched shapes, non-finite values, mixed dtypes, ``S < dof``, or a bad
        config — before anything is compiled.

    Example:
      >>> J, F = jb.solver.sample(f, X)
      >>> res = jb.decouple(J, F, X, jb.CMTFConfig(rank=3), key=jax.random.key(0), restarts=8)
      >>> res.model(X).shape == F.shape
    """
    if not isinstance(config, CMTFConfig):
        raise ValueError(f"config must be a CMTFConfig, got {type(config).__name__}")
    if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < (0 if init is not None else 1):
        raise ValueError(f"restarts must be an int >= 1 (or 0 with init: the warm start alone), got {restarts!r}")
    if progress_every is not None and (not isinstance(progress_every, int) or progress_every < 1):
        raise ValueError(f"progress_every must be a positive int, got {progress_every!r}")
    prob = problem(J, F, X)
    if prob.X.shape[0] < config.basis.num_coef:
        raise ValueError(
            f"X: the number of samples S = {prob.X.shape[0]} must be >= the basis dof {config.basis.num_coef}"
        )
    if init is not None:
        init = check_init(init, prob, config)
    if heldout is not None:
        heldout = check_heldout(heldout, prob)
    batch = restart_batching(batch, restarts)
    warm_only = restarts == 0
    keys, prob = _place(restart_keys(key, restarts), prob, shard)
    every = (progress_every or max(1, config.max_iter // 20)) if progress else 0
    if not progress:
        return _decouple_jit(keys, prob, config, jnp.int32(0), jnp.int32(0), init, heldout, batch=batch,
                             report=False, warm_only=warm_only)
    report, close = _reporter(progress, restarts + (init is not None), config, batch)
    try:
        with reporting(report) as channel:
            return jax.block_until_ready(
                _decouple_jit(keys, prob, config, jnp.int32(channel), jnp.int32(every), init, heldout, batch=batch,
                              warm_only=warm_only))
    finally:
        close()
