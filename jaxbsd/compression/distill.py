"""Label-free distillation of the whole compressed model from the original one.

Block refinement (:mod:`~jaxbsd.compression.refine`) trains each replacement against its own MLP;
the errors left in every block still compound through the ones after it, and nothing trains against
the model's output. This stage does: after the last replacement, the compressed model (the student)
is trained to reproduce what the original model (the teacher) returned on the calibration inputs,
as DistilBERT, TinyBERT and the recovery stages of structured pruning (Sheared-LLaMA, LLM-Pruner,
SliceGPT) do. The teacher's outputs are the only targets, so no label is ever read.

* **Targets.** Computed once, on the original model before any replacement
  (:func:`teacher_outputs`): ``model(calibration)``, or the value a calibration callable returns
  (``calibration(model)``; any pytree of arrays, e.g. ``(logits, features)``), in eval mode.
* **Examples.** The leading axis of the batch (and of every target leaf) indexes examples
  (images, sequences), never tokens: a share ``holdout`` of the *examples* is held out, so no
  held-out image contributes a single token to training. With a batch, every step runs the model on
  ``batch_size`` training examples drawn at random; a callable runs its own forward pass on all of
  its examples, and only the drawn training examples' outputs enter the loss (held-out ones never do).
* **Loss** (:data:`LOSSES`, mean over the target leaves): ``"relative"`` (``‖o − t‖² / ‖t‖²`` per
  leaf, for features and embeddings), ``"kl"`` (``τ² · KL(softmax(t/τ) ‖ softmax(o/τ))`` over the last
  axis, averaged over the other positions: logits), ``"cosine"`` (``1 − cos(o, t)`` over the last
  axis, averaged: embeddings), or a callable ``loss(outputs, targets) -> scalar`` on the pytrees.
* **What trains** (:data:`TRAINABLE`): ``"replaced"`` (default: every ``nnx.Param`` of the replaced
  modules; knots are not parameters), ``"replaced+norms"`` (also every LayerNorm/RMSNorm/BatchNorm
  parameter and every bias), ``"all"`` (every ``nnx.Param``). The structure, the parameter count and
  the budget never change.
* **Honest by construction.** The held-out loss is evaluated every ``eval_every`` steps (default once
  per epoch of the training examples) and at the last; the evaluated step with the lowest held-out
  loss is kept, step 0 (the model as compressed) included, so distillation never raises it. The
  whole loop is one jitted ``lax.scan`` with Optax's Adam: it compiles once per model structure,
  calibration shape and settings (a counter, :func:`trace_count`, lets a test check it).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxbsd.compression.refine import keep_best_evaluated
from jaxbsd.compression.surgery import mode_flags, parse_path, restore_mode_flags

__all__ = ["Distill", "LOSSES", "TRAINABLE", "SCHEDULES", "learning_rate_at", "teacher_outputs", "distill_model",
           "split_examples", "trace_count", "DISTILL_STREAM"]

#: The built-in losses (``Distill.loss`` may also be a callable).
LOSSES = ("relative", "kl", "cosine")
#: Which parameters train (see the module docstring).
TRAINABLE = ("replaced", "replaced+norms", "all")
#: The learning-rate schedules (:attr:`Distill.schedule`).
SCHEDULES = ("constant", "cosine")
#: ``compress_model`` draws the stage's randomness from ``fold_in(key, DISTILL_STREAM)`` (the MLPs'
#: draws use ``fold_in(key, i)`` with ``i`` their index, far below it).
DISTILL_STREAM = 0x44495354


@dataclasses.dataclass(frozen=True)
class Distill:
    """Settings of the distillation stage (pass as ``distill=`` to :func:`jb.compress_model`).

    Attributes:
      steps: Adam steps; 0 turns the stage off.
      learning_rate: Adam's step size (the peak of a schedule).
      batch_size: training examples per step, drawn at random (with replacement) at every step;
        None, or at least the number of training examples: all of them at every step.
      holdout: share of the calibration examples held out to keep the best step (in ``(0, 1)``).
      eval_every: evaluate the held-out loss every this many steps (and at the last); None: once per
        epoch of the training examples, ``ceil(training examples / batch_size)`` steps.
      loss: ``"relative"``, ``"kl"``, ``"cosine"`` (:data:`LOSSES`) or a callable
        ``loss(outputs, targets) -> scalar`` on the two pytrees (jittable, differentiable).
      temperature: ``τ`` of ``loss="kl"`` (positive).
      trainable: ``"replaced"``, ``"replaced+norms"`` or ``"all"`` (:data:`TRAINABLE`).
      forward: with a calibration batch, what of the model is matched: None, ``model(batch)``; or
        ``forward(model, batch) -> pytree`` (e.g. the logits and every block's output, TinyBERT-style),
        for the targets and the student alike. Ignored with a calibration callable (it returns them).
      schedule: ``"constant"``, or ``"cosine"``: at (0-based) step ``t`` the step size rises
        linearly from 0 over the first ``warmup`` steps, then is ``learning_rate · (1 +
        cos(π·(t − warmup)/(steps − warmup))) / 2`` (:data:`SCHEDULES`, :func:`learning_rate_at`):
        a long run can take a higher peak and still settle.
      warmup: steps of linear warm-up before the cosine (``"cosine"`` only; fewer than ``steps``).
    """

    # The defaults are the distillation study's choice (docs/results.md, "Label-free distillation").
    steps: int = 300
    learning_rate: float = 1e-3
    batch_size: int | None = 64
    holdout: float = 0.2
    eval_every: int | None = None
    loss: str | Callable[[Any, Any], jax.Array] = "relative"
    temperature: float = 1.0
    trainable: str = "replaced"
    forward: Callable[[nnx.Module, Any], Any] | None = None
    schedule: str = "cosine"
    warmup: int = 0

    def __post_init__(self):
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"distill: steps must be an int >= 0, got {self.steps!r}")
        if (isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, (int, float))
                or not np.isfinite(self.learning_rate) or self.learning_rate <= 0):
            raise ValueError(f"distill: learning_rate must be a positive number, got {self.learning_rate!r}")
        if isinstance(self.holdout, bool) or not (isinstance(self.holdout, (int, float)) and 0 < self.holdout < 1):
            raise ValueError(f"distill: holdout must be a number in (0, 1), got {self.holdout!r}")
        for name in ("batch_size", "eval_every"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"distill: {name} must be None or an int >= 1, got {value!r}")
        if not callable(self.loss) and self.loss not in LOSSES:
            raise ValueError(f"distill: loss must be one of {LOSSES} or a callable (outputs, targets) -> scalar, "
                             f"got {self.loss!r}")
        if (isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float))
                or not np.isfinite(self.temperature) or self.temperature <= 0):
            raise ValueError(f"distill: temperature must be a positive number, got {self.temperature!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"distill: schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"distill: warmup must be an int >= 0, got {self.warmup!r}")
        if self.warmup and (self.schedule != "cosine" or self.warmup >= max(self.steps, 1)):
            raise ValueError(f"distill: warmup needs schedule='cosine' and fewer steps than steps={self.steps}, "
                             f"got warmup={self.warmup} with schedule={self.schedule!r}")
        if self.trainable not in TRAINABLE:
            raise ValueError(f"distill: trainable must be one of {TRAINABLE}, got {self.trainable!r}")
        if self.forward is not None and not callable(self.forward):
            raise ValueError(f"distill: forward must be None or a callable (model, batch) -> outputs, "
                             f"got {self.forward!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (a callable loss by its qualified name)."""
        d = dataclasses.asdict(self)
        for name in ("loss", "forward"):
            fn = getattr(self, name)
            if callable(fn):
                d[name] = f"callable:{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
        if self.forward is None:
            d.pop("forward")  # absent at its default: identities of runs before it stay valid
        if self.schedule == "constant":
            d.pop("schedule"), d.pop("warmup")  # likewise
        if self.loss != "kl":
            d.pop("temperature")  # only the KL loss has one
        return d


#: How many times the loop has been traced (compiled) in this process: a test reads it.
_TRACES = [0]


def trace_count() -> int:
    """How many times the distillation loop has been traced in this process."""
    return _TRACES[0]


# ----------------------------------------------------------------------------- losses


def per_leaf_loss(kind: str, temperature: float, o: jax.Array, t: jax.Array) -> jax.Array:
    """The loss of one leaf ``o`` against ``t`` (same shape, leading axis examples)."""
    o, t = o.astype(jnp.promote_types(o.dtype, jnp.float32)), t.astype(jnp.promote_types(t.dtype, jnp.float32))
    tiny = jnp.finfo(o.dtype).tiny
    if kind == "relative":
        return jnp.sum((o - t) ** 2) / jnp.maximum(jnp.sum(t ** 2), tiny)
    if kind == "kl":
        log_p = jax.nn.log_softmax(t / temperature, axis=-1)
        log_q = jax.nn.log_softmax(o / temperature, axis=-1)
        # p log p where p = 0 is 0: log_softmax is finite, so exp(log_p) * (...) is too
        kl = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
        return temperature ** 2 * jnp.mean(kl)
    # cosine: 1 − cos over the last axis; a zero vector against anything counts as orthogonal
    dot = jnp.sum(o * t, axis=-1)
    norms = jnp.sqrt(jnp.maximum(jnp.sum(o * o, axis=-1) * jnp.sum(t * t, axis=-1), tiny))
    return jnp.mean(1.0 - dot / norms)


@dataclasses.dataclass(frozen=True)
class _Loss:
    """The loss as a static (hashable) argument of the jitted loop."""

    kind: str | Callable
    temperature: float

    def __call__(self, outputs, targets) -> jax.Array:
        if callable(self.kind):
            return jnp.asarray(self.kind(outputs, targets))
        leaves_o, leaves_t = jax.tree.leaves(outputs), jax.tree.leaves(targets)
        return sum(per_leaf_loss(self.kind, self.temperature, o, t) for o, t in zip(leaves_o, leaves_t)) / len(leaves_t)


# ----------------------------------------------------------------------------- targets and checks


def _examples(tree, what: str) -> int:
    """The common leading axis of the array leaves of ``tree`` (``ValueError`` naming ``calibration``)."""
    leaves = jax.tree.leaves(tree)
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
    if not leaves or None in sizes or len(sizes) != 1:
        shapes = [np.shape(x) for x in leaves]
        raise ValueError(f"calibration: distillation needs {what} whose every array has the same leading axis "
                         f"(the examples), got shapes {shapes}")
    return int(sizes.pop())


def teacher_outputs(model: nnx.Module, calibration, forward: Callable | None = None,
                    batch_size: int | None = None):
    """The targets: the original model's eval-mode outputs on the calibration, ``model(calibration)``
    (or ``calibration(model)``, or ``forward(model, calibration)``: :attr:`Distill.forward`), as a
    pytree of floating-point arrays whose leading axis indexes the examples. Call it before any replacement. The model's train/eval flags are restored.

    ``batch_size``: run a batch calibration (not a callable) that many examples at a time and
    concatenate the outputs (one eager pass over thousands of examples holds every layer's
    activations for all of them at once); ``None``, one pass. Each example's outputs must depend
    on that example alone (eval mode).

    Raises:
      ValueError: naming ``calibration``: a callable that returns nothing, a leaf that is not a
        floating-point array, leaves (or the batch's leaves) without a common leading axis, fewer
        than 2 examples, or non-finite outputs.
    """
    flags = mode_flags(model)
    try:
        model.eval()
        if callable(calibration):
            out = calibration(model)
        else:
            run = (lambda b: model(b)) if forward is None else (lambda b: forward(model, b))
            if batch_size is None:
                out = run(calibration)
            else:
                n, step = _examples(calibration, "a batch"), max(1, int(batch_size))
                out = jax.tree.map(lambda *xs: jnp.concatenate(xs), *(
                    run(jax.tree.map(lambda x, i=i: x[i:i + step], calibration)) for i in range(0, n, step)))
    finally:
        restore_mode_flags(flags)
    leaves = jax.tree.leaves(out)
    if not leaves:
        raise ValueError("calibration: distillation matches what the forward pass returns, and it returned "
                         "nothing (a calibration callable must return the outputs to match, a pytree of arrays)")
    for leaf in leaves:
        if not isinstance(leaf, (jax.Array, np.ndarray)) or not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise ValueError(f"calibration: distillation matches floating-point outputs, but the forward pass "
                             f"returned a {type(leaf).__name__} of dtype {getattr(leaf, 'dtype', None)}")
        if not bool(jnp.all(jnp.isfinite(leaf))):
            raise ValueError("calibration: the original model's outputs hold NaN or inf; distill on finite inputs")
    n = _examples(out, "outputs")
    if not callable(calibration) and _examples(calibration, "a batch") != n:
        raise ValueError(f"calibration: the outputs' leading axis ({n}) is not the batch's; distillation "
                         "holds out examples along it")
    if n < 2:
        raise ValueError(f"calibration: distillation holds out examples and needs at least 2, got {n}")
    return jax.tree.map(jnp.asarray, out)


def split_examples(key: jax.Array, n: int, holdout: float) -> tuple[np.ndarray, np.ndarray]:
    """``(train, held)`` example indices: a permutation of ``n`` drawn with ``key``, its first
    ``max(1, min(n − 1, round(holdout · n)))`` held out."""
    order = np.asarray(jax.random.permutation(key, n))
    held = max(1, min(n - 1, int(round(holdout * n))))
    return order[held:], order[:held]


def _trainable_filter(model: nnx.Module, replaced: Sequence[str], trainable: str):
    """``filter(path, value) -> bool`` selecting the parameters that train."""
    prefixes = [parse_path(p) for p in replaced]
    norms = [path for path, m in nnx.iter_modules(model)
             if isinstance(m, (nnx.LayerNorm, nnx.RMSNorm, nnx.BatchNorm))]

    def keep(path, value) -> bool:
        if not isinstance(value, nnx.Param):
            return False
        if trainable == "all" or any(tuple(path[:len(p)]) == p for p in prefixes):
            return True
        if trainable == "replaced+norms":
            return path[-1] == "bias" or any(tuple(path[:len(p)]) == tuple(p) for p in norms)
        return False

    return keep


# ----------------------------------------------------------------------------- the loop


def learning_rate_at(t: jax.Array, peak: jax.Array, *, schedule: str, steps: int, warmup: int) -> jax.Array:
    """The step size of (0-based) step ``t`` of :attr:`Distill.schedule` (``peak`` traced: a sweep
    over it compiles once)."""
    if schedule == "constant":
        return peak * jnp.ones_like(t, dtype=peak.dtype)
    t = t.astype(peak.dtype)
    rise = peak * t / max(warmup, 1)
    phase = jnp.pi * (t - warmup) / max(steps - warmup, 1)
    return jnp.where(t < warmup, rise, peak * 0.5 * (1.0 + jnp.cos(phase)))



def _take(tree, idx):
    return jax.tree.map(lambda a: a[idx], tree)


@functools.partial(jax.jit, static_argnames=("graphdef", "call", "forward", "loss", "steps", "batch", "eval_every",
                                             "schedule", "warmup"))
def _distill_loop(graphdef, params, rest, inputs, targets, train_idx, held_idx, learning_rate, key, *, call,
                  forward, loss: _Loss, steps: int, batch: int | None, eval_every: int, schedule: str = "constant",
                  warmup: int = 0):
    """``(best params, held-out loss per step (steps + 1,), best step)``: ``steps`` Adam steps on the
    training examples (``train_idx``; all with ``batch=None``, else ``batch`` drawn at random per
    step), keeping the evaluated step (0 = as given) with the lowest loss on ``held_idx``; steps not
    evaluated (every ``eval_every``-th and the last are) record ``inf``. ``call``: None (the model is
    run on ``inputs[idx]``, through ``forward`` if given) or the calibration callable (run on all its
    examples, outputs taken at ``idx``)."""
    _TRACES[0] += 1
    # optax counts its own steps from 0: the same t as the scan's i
    tx = optax.adam(functools.partial(learning_rate_at, peak=learning_rate, schedule=schedule, steps=steps,
                                      warmup=warmup))

    def objective(p, idx):
        model = nnx.merge(graphdef, p, rest)
        if call is not None:
            out = _take(call(model), idx)
        else:
            batch_in = _take(inputs, idx)
            out = model(batch_in) if forward is None else forward(model, batch_in)
        return loss(out, _take(targets, idx))

    held = lambda p: objective(p, held_idx)  # noqa: E731
    err0 = held(params)
    n_train = train_idx.shape[0]

    def step(carry, i):
        p, opt_state, best_p, best_err, best_i = carry
        idx = train_idx if batch is None else \
            train_idx[jax.random.randint(jax.random.fold_in(key, i), (batch,), 0, n_train)]
        grads = jax.grad(objective)(p, idx)
        updates, opt_state = tx.update(grads, opt_state, p)
        p = optax.apply_updates(p, updates)

        best, err = keep_best_evaluated((best_p, best_err, best_i), p, held, i, steps=steps, eval_every=eval_every)
        return (p, opt_state, *best), err

    init = (params, tx.init(params), params, err0, jnp.asarray(0))
    (_, _, best_p, _, best_i), errs = jax.lax.scan(step, init, jnp.arange(steps))
    return best_p, jnp.concatenate([err0[None], errs]), best_i


def distill_model(model: nnx.Module, calibration, targets, replaced: Sequence[str], config: Distill,
                  key: jax.Array) -> dict[str, Any]:
    """Train ``model`` (in place) to reproduce ``targets`` (:func:`teacher_outputs` of the original
    model) on ``calibration``; the report: ``loss``, ``temperature`` (KL only), ``trainable``,
    ``params_trained``, ``steps``, ``steps_kept`` (0 if no step lowered the held-out loss),
    ``loss_before``/``loss_after`` (held-out), ``examples_train``, ``examples_heldout``,
    ``batch_size`` (examples per step), ``evaluations``, ``seconds``.

    Args:
      model: the compressed model; its trainable parameters (``config.trainable``; ``replaced``: the
        dotted paths of the replaced modules) are set to the kept step's.
      calibration: the batch of model inputs or the callable given to ``compress_model``.
      targets: the teacher's outputs, a pytree matching what ``calibration`` yields.
      config: a :class:`Distill`.
      key: the example split and the minibatch draws.

    Raises:
      ValueError: naming ``calibration`` (examples or output structure that do not match the targets).
    """
    start = time.perf_counter()
    n = _examples(targets, "targets")
    if n < 2:
        raise ValueError(f"calibration: distillation holds out examples and needs at least 2, got {n}")
    call = calibration if callable(calibration) else None
    inputs = None if call is not None else jax.tree.map(jnp.asarray, calibration)
    if inputs is not None and _examples(inputs, "a batch") != n:
        raise ValueError(f"calibration: the batch has {_examples(inputs, 'a batch')} examples, the targets {n}")
    train_idx, held_idx = split_examples(jax.random.fold_in(key, 0), n, config.holdout)
    n_train = int(train_idx.shape[0])
    batch = None if config.batch_size is None or config.batch_size >= n_train else config.batch_size
    every = min(config.eval_every or -(-n_train // (batch or n_train)), max(1, config.steps))
    flags = mode_flags(model)
    model.eval()  # the student as the teacher ran: no dropout, running statistics
    try:
        graphdef, params, rest = nnx.split(model, _trainable_filter(model, replaced, config.trainable), ...)
        leaves = jax.tree.leaves(params)
        if not leaves:
            raise ValueError(f"distill: trainable={config.trainable!r} selects no parameter of the model")
        dtype = leaves[0].dtype
        loss = _Loss(config.loss, float(config.temperature))
        def run(p):
            student = nnx.merge(graphdef, p, rest)
            if call is not None:
                return call(student)
            return student(inputs) if config.forward is None else config.forward(student, inputs)

        out = jax.eval_shape(run, params)
        if jax.tree.structure(out) != jax.tree.structure(targets) or any(
                o.shape != t.shape for o, t in zip(jax.tree.leaves(out), jax.tree.leaves(targets))):
            raise ValueError("calibration: the compressed model's outputs do not have the structure and shapes "
                             "of the original model's (the targets)")
        best, losses, best_step = _distill_loop(
            graphdef, params, rest, inputs, targets, jnp.asarray(train_idx), jnp.asarray(held_idx),
            jnp.asarray(config.learning_rate, dtype), jax.random.fold_in(key, 1), call=call,
            forward=None if call is not None else config.forward, loss=loss,
            steps=config.steps, batch=batch, eval_every=every, schedule=config.schedule, warmup=config.warmup)
        nnx.update(model, best)
    finally:
        restore_mode_flags(flags)
    losses = np.asarray(losses, np.float64)
    best_step = int(best_step)
    report = {
        "loss": config.to_dict()["loss"], "trainable": config.trainable,
        "params_trained": int(sum(x.size for x in leaves)), "steps": config.steps, "steps_kept": best_step,
        "loss_before": float(losses[0]), "loss_after": float(losses[best_step]),
        "examples_train": n_train, "examples_heldout": int(held_idx.shape[0]), "batch_size": batch or n_train,
        "learning_rate": config.learning_rate, "schedule": config.schedule, "warmup": config.warmup,
        # every ``every``-th step and the last: ceil(steps / every)
        "evaluations": -(-config.steps // every), "seconds": time.perf_counter() - start,
    }
    if config.loss == "kl":
        report["temperature"] = config.temperature
    return report
