"""Label-free refinement: train a replacement to reproduce the original MLP's outputs.

After a method has built a replacement, its parameters (every ``nnx.Param``: a decoupling's
``W0``, ``W1`` and spline coefficients — not its knots —, a pruned MLP's two layers, a low-rank
MLP's factors and biases) are trained for a few hundred Adam steps to minimise the relative
squared output error ``‖f̂(X) − Y‖² / ‖Y‖²`` on the calibration tokens ``X`` the MLP is fed (each
step on a random minibatch of ``batch_size`` = 512 tokens by default, or with ``batch_size=None``
on all of them, full batch), before any fine-tuning, against a target ``Y`` that needs no labels:

* ``target="consistent"`` (the default): the original *model*'s MLP outputs on the same
  calibration inputs, so the replacement also absorbs what the MLPs replaced before it changed
  upstream;
* ``target="local"``: the original MLP applied to the inputs the compressed model feeds it.

Back to front (the default order) no MLP upstream has changed yet when one is replaced, so the two
targets are the same tokens; front to back they differ (the docs' results page compares them).

A share ``holdout`` of the tokens is held out and evaluated once per epoch of the training tokens
(every step with full batches) and at the last step; the evaluated step with the lowest held-out
error is kept (step 0, the replacement as built, included), so refining never raises the held-out
error. In :func:`jb.compress_model` the held-out tokens are set apart before the replacement is
built (:meth:`jaxbsd.compression.engine.Plan.reserve`, ``Site.held_X``): no build fits on them. Were they among the tokens
a build fitted, step 0 would be judged in sample (a pruned MLP's output layer is the least-squares
fit on its tokens) and no step of refinement could be seen to beat it.

Minibatches of 512 tokens are the default: a full-batch step costs as much as the whole
calibration set, and the loop then takes longer than the decoupling it refines
(``benchmarks/refine.py`` times both; the results page compares their accuracies). The
whole loop is one jitted ``lax.scan``: it compiles once per replacement structure and token count
(all the blocks of a transformer share one program). The structure is unchanged: a
``DecoupledMLP`` stays a ``DecoupledMLP`` of the same rank, a pruned MLP keeps its units, and the
parameter count does not move.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import io_callback

from jaxbsd.compression import progress
from jaxbsd.compression.devices import Devices, run_blocks
from jaxbsd.compression.methods import Built, Method
from jaxbsd.compression.sites import Site, output_error, refined_error_tokens

__all__ = ["Refine", "Refiner", "TARGETS", "refine_module", "refine_group", "site_refiner", "refine_stage", "reported",
           "trace_count"]

#: What the refined replacement is trained to reproduce (see the module docstring).
TARGETS = ("local", "consistent")


@dataclasses.dataclass(frozen=True)
class Refine:
    """Settings of the refinement stage (pass as ``refine=`` to :func:`jb.compress_model`).

    Attributes:
      steps: Adam steps; 0 turns the stage off.
      learning_rate: Adam's step size.
      holdout: share of the tokens held out to keep the best step (in ``(0, 1)``).
      target: ``"consistent"`` (default) or ``"local"`` (:data:`TARGETS`).
      max_tokens: at most this many tokens are used (drawn at random), train and held out together.
      batch_size: training tokens per step, drawn at random (with replacement) at every step; None,
        or at least the number of training tokens: every step on all of them (full batch).
      eval_every: evaluate the held-out error every this many steps (and at the last); None: once
        per epoch, ``ceil(training tokens / batch_size)`` steps — every step with full batches.
    """

    steps: int = 300
    learning_rate: float = 1e-3
    holdout: float = 0.2
    target: str = "consistent"
    max_tokens: int = 16384
    batch_size: int | None = 512
    eval_every: int | None = None

    def __post_init__(self):
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"refine: steps must be an int >= 0, got {self.steps!r}")
        if not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0):
            raise ValueError(f"refine: learning_rate must be a positive number, got {self.learning_rate!r}")
        if not (isinstance(self.holdout, (int, float)) and 0 < self.holdout < 1):
            raise ValueError(f"refine: holdout must be a number in (0, 1), got {self.holdout!r}")
        if self.target not in TARGETS:
            raise ValueError(f"refine: target must be one of {TARGETS}, got {self.target!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 2:
            raise ValueError(f"refine: max_tokens must be an int >= 2, got {self.max_tokens!r}")
        for name in ("batch_size", "eval_every"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"refine: {name} must be None or an int >= 1, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def keep_best_evaluated(best: tuple, p, held: Callable, i, *, steps: int, eval_every: int) -> tuple:
    """After step ``i`` (0-based) of a loop that keeps its best evaluated parameters:
    ``(best, err)``, where ``best = (params, held-out error, step)`` is replaced by ``(p, held(p),
    i + 1)`` when ``p`` is evaluated (every ``eval_every``-th step and the last) and strictly better,
    and ``err`` is ``held(p)`` or ``inf`` on a step not evaluated. A non-finite error is never kept
    (nor anything after it, its parameters being non-finite)."""
    def evaluate(best):
        best_p, best_err, best_i = best
        err = held(p)
        better = jnp.isfinite(err) & (err < best_err)
        best_p = jax.tree.map(lambda new, old: jnp.where(better, new, old), p, best_p)
        return (best_p, jnp.where(better, err, best_err), jnp.where(better, i + 1, best_i)), err

    if eval_every == 1:
        return evaluate(best)
    # a held-out pass costs as much as a few minibatch steps: only every eval_every-th and the last
    due = ((i + 1) % eval_every == 0) | (i == steps - 1)
    return jax.lax.cond(due, evaluate, lambda b: (b, jnp.asarray(jnp.inf, b[1].dtype)), best)


#: How many times the loop has been traced (compiled) in this process: a test reads it.
_TRACES = [0]


def trace_count() -> int:
    """How many times the refinement loop has been traced in this process."""
    return _TRACES[0]


def _relative_error(graphdef, params, rest, X, Y):
    out = nnx.merge(graphdef, params, rest)(X)
    return jnp.sum((out - Y) ** 2) / jnp.maximum(jnp.sum(Y ** 2), jnp.finfo(Y.dtype).tiny)


@functools.partial(jax.jit, static_argnames=("graphdef", "steps", "batch", "eval_every"))
def refine_loop(graphdef, params, rest, X_train, Y_train, X_held, Y_held, learning_rate, key, *, steps: int,
                 batch: int | None, eval_every: int, channel=None):
    """``(best params, held-out error per step (steps + 1,), best step)``: ``steps`` Adam steps on the
    training tokens (all of them with ``batch=None``, else ``batch`` drawn at random per step),
    keeping the parameters of the evaluated step (0 = as given) with the lowest held-out error;
    steps not evaluated (every ``eval_every``-th and the last are) record ``inf``. ``channel``: an
    int32 the loop reports its steps on (:func:`jaxbsd.compression.progress.step_bar`); None: no
    hook in the program."""
    _TRACES[0] += 1
    tx = optax.adam(learning_rate)
    loss = functools.partial(_relative_error, graphdef)
    held = lambda p: loss(p, rest, X_held, Y_held)  # noqa: E731
    err0 = held(params)
    n_train = X_train.shape[0]

    def step(carry, i):
        p, opt_state, best_p, best_err, best_i = carry
        if batch is None:
            grads = jax.grad(loss)(p, rest, X_train, Y_train)
        else:
            take = jax.random.randint(jax.random.fold_in(key, i), (batch,), 0, n_train)
            grads = jax.grad(loss)(p, rest, X_train[take], Y_train[take])
        updates, opt_state = tx.update(grads, opt_state, p)
        p = optax.apply_updates(p, updates)
        best, err = keep_best_evaluated((best_p, best_err, best_i), p, held, i, steps=steps, eval_every=eval_every)
        if channel is not None:  # about 50 reports a run, and the last step
            due = ((i + 1) % max(1, steps // 50) == 0) | (i == steps - 1)
            jax.lax.cond(due, lambda: io_callback(progress.emit, None, channel, i + 1), lambda: None)
        return (p, opt_state, *best), err

    init = (params, tx.init(params), params, err0, jnp.asarray(0))
    (_, _, best_p, _, best_i), errs = jax.lax.scan(step, init, jnp.arange(steps))
    return best_p, jnp.concatenate([err0[None], errs]), best_i


def refine_module(module: nnx.Module, X: jax.Array, Y: jax.Array, config: Refine,
                  key: jax.Array, *, held: tuple[jax.Array, jax.Array] | None = None) -> tuple[nnx.Module, dict[str, Any]]:
    """``module`` refined on ``X (N, m) -> Y (N, n)`` (a new module of the same structure; ``module``
    itself is not changed), and the report: ``target``, ``steps``, ``steps_kept`` (the best step, 0
    if none improved), ``error_before``/``error_after`` (relative output error on the held-out
    tokens), ``tokens_train``, ``tokens_heldout``, ``batch_size`` (tokens per step), ``evaluations``
    (held-out evaluations), ``seconds``.

    The held-out tokens are a ``config.holdout`` share of a random permutation of ``X`` or, with
    ``held = (X_held (R, m), Y_held (R, n))``, those: then all of ``X`` trains (at most
    ``config.max_tokens - R`` of it, drawn at random).

    Raises:
      ValueError: naming ``calibration`` with fewer than 2 tokens, or shapes that do not match.
    """
    start = time.perf_counter()
    prep = prepare_refinement(module, X, Y, config, key, held)
    with progress.step_bar(config.steps, "refinement steps") as channel:
        hook = {} if channel is None else {"channel": jnp.int32(channel)}
        best, errors, best_step = refine_loop(prep.graphdef, *prep.operands, steps=config.steps, batch=prep.batch,
                                               eval_every=prep.every, **hook)
        if hook:  # the bar closes once the loop has run
            jax.block_until_ready(errors)
    return finish_refinement(prep, config, best, errors, best_step, start)


@dataclasses.dataclass(frozen=True)
class PreparedRefinement:
    """One module's refinement, ready to run: its split module, tokens and loop sizes."""

    graphdef: Any
    operands: tuple  # (params, rest, X_train, Y_train, X_held, Y_held, learning_rate, key)
    batch: int | None
    every: int
    n_train: int
    held: int

    def signature(self) -> tuple:
        """What must agree for two refinements to run as one program."""
        leaves = jax.tree_util.tree_leaves(self.operands)
        return (self.graphdef, self.batch, self.every, jax.tree_util.tree_structure(self.operands),
                tuple((jnp.shape(a), jnp.result_type(a)) for a in leaves))


def prepare_refinement(module, X, Y, config: Refine, key, given=None) -> PreparedRefinement:
    for name, (x, y) in [("", (X, Y))] + ([] if given is None else [(" (held out)", given)]):
        if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0] or x.shape[1] != X.shape[1] or y.shape[1] != Y.shape[1]:
            raise ValueError(f"calibration: refinement needs tokens X (N, m) and targets Y (N, n){name}, "
                             f"got {x.shape}, {y.shape}")
    N = int(X.shape[0])
    if (N < 2) if given is None else (N < 1 or given[0].shape[0] < 1):
        raise ValueError(f"calibration: refinement needs at least 2 tokens, one to train and one held out, got {N}"
                         + ("" if given is None else f" and {given[0].shape[0]} held out"))
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    dtype = jax.tree.leaves(params)[0].dtype
    X, Y = jnp.asarray(X, dtype), jnp.asarray(Y, dtype)
    if given is None:  # a share of a permutation of X is held out
        take = min(N, config.max_tokens)
        held = max(1, min(take - 1, int(round(config.holdout * take))))
        X_train, Y_train, X_held, Y_held = _draw_training(key, X, Y, take, held)
    else:  # the held-out tokens are given (set apart before the build): X trains, at most max_tokens in all
        held = int(given[0].shape[0])
        X_train, Y_train, _, _ = _draw_training(key, X, Y, min(N, max(1, config.max_tokens - held)), 0)
        X_held, Y_held = (jnp.asarray(a, dtype) for a in given)
    n_train = int(X_train.shape[0])
    batch = None if config.batch_size is None or config.batch_size >= n_train else config.batch_size
    every = min(config.eval_every or (1 if batch is None else -(-n_train // batch)), max(1, config.steps))
    operands = (params, rest, X_train, Y_train, X_held, Y_held, jnp.asarray(config.learning_rate, dtype),
                jax.random.fold_in(key, 1))
    return PreparedRefinement(graphdef, operands, batch, every, n_train, held)


@jax.jit
def _concatenate(arrays: tuple[jax.Array, ...]) -> jax.Array:
    return jnp.concatenate(arrays)  # one program per shapes, not an eager op with its own compile


@jax.jit
def _rows_of(reference: jax.Array, indices: tuple[jax.Array, ...]) -> jax.Array:
    """``reference``'s rows at each of ``indices``, concatenated (one program)."""
    return jnp.concatenate([reference[i] for i in indices])


@functools.partial(jax.jit, static_argnums=(3, 4))
def _draw_training(key, X, Y, take: int, held: int):
    """``(X_train, Y_train, X_held, Y_held)``: the first ``take`` tokens of a permutation of ``X``'s,
    the first ``held`` of them held out, as one program (eager, each gather compiles on its own)."""
    order = jax.random.permutation(key, X.shape[0])[:take]
    train, out = order[held:], order[:held]
    return X[train], Y[train], X[out], Y[out]


def finish_refinement(prep: PreparedRefinement, config: Refine, best, errors, best_step, start: float) -> tuple[nnx.Module, dict[str, Any]]:
    errors = np.asarray(errors, np.float64)
    best_step = int(best_step)
    refined = nnx.merge(prep.graphdef, best, prep.operands[1])
    return refined, {
        "target": config.target, "steps": config.steps, "steps_kept": best_step,
        "error_before": float(errors[0]), "error_after": float(errors[best_step]),
        "tokens_train": prep.n_train, "tokens_heldout": prep.held, "batch_size": prep.batch or prep.n_train,
        # every ``every``-th step and the last: ceil(steps / every)
        "evaluations": -(-config.steps // prep.every), "seconds": time.perf_counter() - start,
    }


@dataclasses.dataclass(frozen=True)
class Refiner:
    """The refinement of one site's replacement: ``refiner(module) -> (refined, info)`` on the
    tokens ``X (N, m)`` against the targets ``Y (N, n)`` (:func:`refine_module`); several are run
    as one program by :func:`refine_group`."""

    X: jax.Array
    Y: jax.Array
    config: Refine
    key: jax.Array
    held: tuple[jax.Array, jax.Array] | None = None  # (X_held, Y_held), see refine_module

    def __call__(self, module: nnx.Module) -> tuple[nnx.Module, dict[str, Any]]:
        return refine_module(module, self.X, self.Y, self.config, self.key, held=self.held)


def _refine_block(block, shared, *, graphdef, steps: int, batch: int | None, eval_every: int):
    params, rest, X_train, Y_train, X_held, Y_held, key_data = block
    return refine_loop(graphdef, params, rest, X_train, Y_train, X_held, Y_held, shared,
                        jax.random.wrap_key_data(key_data), steps=steps, batch=batch, eval_every=eval_every)


def refine_group(modules: list[nnx.Module], refiners: list[Refiner], devices=None) -> list[tuple[nnx.Module, dict]]:
    """:func:`refine_module` of several modules, those of one structure and token count as one
    program with a leading block axis (``jax.vmap`` of the loop, sharded over ``devices``' mesh,
    :func:`jaxbsd.compression.devices.run_blocks`); what each refiner alone returns, up to rounding."""
    start = time.perf_counter()
    preps = [prepare_refinement(mod, r.X, r.Y, r.config, r.key, r.held) for mod, r in zip(modules, refiners)]
    buckets: dict = {}
    for i, prep in enumerate(preps):
        buckets.setdefault(prep.signature(), []).append(i)
    out: dict[int, tuple] = {}
    for members in buckets.values():
        first, config = preps[members[0]], refiners[members[0]].config
        blocks = [(*preps[i].operands[:6], jax.random.key_data(preps[i].operands[7])) for i in members]
        solved = run_blocks(_refine_block, blocks, first.operands[6], devices if devices is not None else Devices(),
                            graphdef=first.graphdef, steps=config.steps, batch=first.batch, eval_every=first.every)
        for i, result in zip(members, solved):
            out[i] = result
    share = (time.perf_counter() - start) / len(modules)
    results = []
    for i, prep in enumerate(preps):
        module, info = finish_refinement(prep, refiners[i].config, *out[i], time.perf_counter())
        info["seconds"] += share
        results.append((module, info))
    return results


def site_refiner(config: Refine, site, reference, key: jax.Array) -> Refiner | None:
    """The engine's refinement of one site's replacement: the site's check and fit tokens (what the
    MLP is fed now) train and its reserved tokens (``held_X``, which no build saw) are held out,
    against the original MLP's outputs there (``"local"``) or the original model's
    (``"consistent"``, ``reference``: its outputs on every captured token, indexed by the tokens'
    ``check_idx``/``fit_idx``/``held_idx``). A site without reserved tokens holds out a share of
    the others. None with fewer than 2 tokens (nothing to hold out: the replacement stays as built)."""
    parts = [(site.check_X, site.check_Y, site.check_idx)]
    if site.fit_X is not None and site.fit_X.shape[0]:
        parts.append((site.fit_X, site.fit_Y, site.fit_idx))
    held = None if site.held_X is None else (site.held_X, site.held_Y, site.held_idx)
    if sum(x.shape[0] for x, _, _ in parts) + (0 if held is None else held[0].shape[0]) < 2:
        return None

    def targets(*group):
        if config.target == "local":
            return _concatenate(tuple(y for _, y, _ in group))
        return _rows_of(reference, tuple(np.asarray(i) for _, _, i in group))

    X = _concatenate(tuple(x for x, _, _ in parts))
    return Refiner(X, targets(*parts), config, key, None if held is None else (held[0], targets(held)))


def refine_stage(method: Method, members, builds: dict[int, Built], refiners: dict[int, Refiner | None],
                 devices: Devices | None = None) -> dict[int, Built]:
    """The engine's refinement stage, the same for every method that does not refine its own
    candidates (and for builds that came back unrefined): ``builds`` (by step, of the ``(step,
    path)`` of ``members``) with each refined by its refiner, a group's replacements as one program
    (:func:`refine_group` on ``devices``)."""
    staged = [s for s, _ in members if refiners[s] is not None and not method.refines_candidates
              and builds[s].refine is None]
    if not staged:
        return builds
    modules, stage_refiners = [builds[s].module for s in staged], [refiners[s] for s in staged]
    refined = ([stage_refiners[0](modules[0])] if len(staged) == 1
               else refine_group(modules, stage_refiners, devices))
    out = dict(builds)
    for s, (module, refine_info) in zip(staged, refined):
        out[s] = builds[s].replace(module=module, refine=refine_info)
    return out


def reported(config: Refine | None, site: Site, built: Built, refined: bool) -> Built:
    """The build as the engine returns it: once refined, with the output error of the module returned
    (on :func:`~jaxbsd.compression.sites.refined_error_tokens`, the error as built kept beside); a
    refinement (``config``) that could not run for too few tokens says so."""
    if refined:
        return built.replace(refine=dict(built.refine, output_error_built=built.output_error),
                             output_error=float(output_error(built.module, *refined_error_tokens(site))))
    if config is not None and config.steps > 0:
        tokens_seen = site.check_X.shape[0] + (0 if site.fit_X is None else site.fit_X.shape[0])
        return built.replace(refine={"target": config.target, "steps": 0, "steps_kept": 0,
                                     "skipped": f"{tokens_seen} calibration token(s); refinement needs 2"})
    return built
