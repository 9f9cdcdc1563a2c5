"""Surgery on any Flax NNX model: submodules by dotted path, and what they see in a forward pass.

* :func:`get_submodule` / :func:`set_submodule`: path resolution and surgery (attribute
  assignment, ``lst[i] = new``);
* :func:`capture_calls`: the inputs and outputs of submodules in a real forward pass, by
  swapping in a recording wrapper for the duration of one eval-mode call — nothing is
  required from the user's classes (no hooks, no ``mlp_input`` methods);
* :func:`model_outputs` / :func:`output_judge`: a model's outputs, and the whole model's output
  error with one submodule swapped (how ``method="auto"`` judges its candidates).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxbsd.solver import metrics

__all__ = ["parse_path", "child", "get_submodule", "set_submodule", "capture_calls", "capture_tokenwise",
           "model_outputs", "output_judge", "mode_flags", "restore_mode_flags"]



def parse_path(path: str) -> tuple[str | int, ...]:
    """``"encoder.layers.3.ffn"`` -> ``("encoder", "layers", 3, "ffn")``."""
    if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
        raise ValueError(f"mlps: a path must be a non-empty dotted string like 'blocks.0.mlp', got {path!r}")
    return tuple(int(p) if p.lstrip("-").isdigit() else p for p in path.split("."))


def child(node, part: str | int, path: str):
    """The attribute or item ``part`` of ``node`` (``ValueError`` naming ``mlps`` if missing)."""
    try:
        if isinstance(part, int):
            return node[part]
        if isinstance(node, Mapping) and part in node:
            return node[part]
        return getattr(node, part)
    except (AttributeError, IndexError, KeyError, TypeError):
        raise ValueError(f"mlps: path {path!r} does not exist ({part!r} not found in a "
                         f"{type(node).__name__})") from None


def get_submodule(model: nnx.Module, path: str) -> nnx.Module:
    """The ``nnx.Module`` at dotted ``path`` (``ValueError`` naming ``mlps`` if there is none)."""
    node = model
    for part in parse_path(path):
        node = child(node, part, path)
    if not isinstance(node, nnx.Module):
        raise ValueError(f"mlps: {path!r} is a {type(node).__name__}, not an nnx.Module")
    return node


def set_submodule(model: nnx.Module, path: str, module: nnx.Module) -> None:
    """Surgery: put ``module`` at ``path`` (attribute assignment or ``parent[i] = module``)."""
    *head, last = parse_path(path)
    parent = model
    for part in head:
        parent = child(parent, part, path)
    if isinstance(last, int) or isinstance(parent, Mapping):
        parent[last] = module
    else:
        setattr(parent, last, module)


# ----------------------------------------------------------------------------- capture


class _Sink:
    """Plain Python storage for recorded calls (a static attribute to NNX, never traced)."""

    def __init__(self, path: str, order: list[str], sequence: list[str] | None = None):
        self.path, self.order, self.calls = path, order, []
        self.sequence = sequence  # every recorded call's path, in call order (shared by the sinks), or None
        self.tracing = False  # inside capture's own compiled forward pass: tracers are expected

    def record(self, x, y, extra: bool) -> None:
        if not self.tracing and (isinstance(x, jax.core.Tracer) or isinstance(y, jax.core.Tracer)):
            raise ValueError(f"calibration: {self.path!r} was called under a JAX transformation; "
                             "capture needs the model's forward pass to run eagerly")
        if self.path not in self.order:
            self.order.append(self.path)
        if self.sequence is not None:
            self.sequence.append(self.path)
        self.calls.append((x, y, extra))


class _Recorder(nnx.Module):
    """Stands in for a submodule during capture: records its input and output, calls it."""

    def __init__(self, inner: nnx.Module, sink: _Sink):
        self.inner, self.sink = inner, sink

    def __call__(self, x, *args, **kwargs):
        y = self.inner(x, *args, **kwargs)
        self.sink.record(x, y, bool(args or kwargs))
        return y


_MODE_FLAGS = ("deterministic", "use_running_average")


def mode_flags(model: nnx.Module) -> list[tuple[nnx.Module, str, Any]]:
    """The train/eval flags of every submodule, to be put back by :func:`restore_mode_flags`."""
    return [(mod, name, getattr(mod, name)) for _, mod in nnx.iter_modules(model)
            for name in _MODE_FLAGS if hasattr(mod, name)]


def restore_mode_flags(flags: list[tuple[nnx.Module, str, Any]]) -> None:
    for mod, name, value in flags:
        setattr(mod, name, value)


def _recording_forward(model: nnx.Module, calibration, sinks: dict[str, _Sink], order: list[str]) -> None:
    """``model(calibration)`` (or ``calibration(model)``) with the recorders in place, as one
    compiled program: run op by op, a forward pass compiles every primitive of the model on its
    own. The recorded ``(x, y)`` are the program's outputs. A forward pass that cannot be traced
    (Python control flow on values, a transformation inside ``calibration``) runs eagerly."""

    def forward(model, batch):
        calibration(model) if callable(calibration) else model(batch)
        return {p: [(x, y) for x, y, _ in sink.calls] for p, sink in sinks.items()}

    graphdef, state = nnx.split(model)

    def recording_forward(state, batch):
        # A pure function of the state, not ``nnx.jit(forward)``: NNX's jit of a fresh closure kept
        # it alive with its outputs, the recorded activations (~45 MB per compression of a small ViT).
        model = nnx.merge(graphdef, state)
        out = forward(model, batch)
        return out, nnx.state(model)  # what the pass changed (RNG counts), put back as nnx.jit would

    batch = None if callable(calibration) else calibration
    for sink in sinks.values():
        sink.tracing = True
        if sink.sequence is not None:  # the sinks share one list: this pass's calls only
            sink.sequence.clear()
    try:
        recorded, after = jax.jit(recording_forward)(state, batch)
    except Exception:  # noqa: BLE001 — not traceable: the eager pass below reports real errors
        recorded = None
    finally:
        for sink in sinks.values():
            sink.tracing = False
    if recorded is not None:
        nnx.update(model, after)
    if recorded is None:
        order.clear()
        for sink in sinks.values():
            sink.calls = []
            if sink.sequence is not None:
                sink.sequence.clear()
        forward(model, batch)
        return
    for p, sink in sinks.items():
        sink.calls = [(x, y, extra) for (x, y), (_, _, extra) in zip(recorded[p], sink.calls)]


def capture_calls(model: nnx.Module, calibration, paths: Sequence[str], *, sequence: list[str] | None = None
                  ) -> tuple[dict[str, tuple[jax.Array, jax.Array]], list[str]]:
    """Inputs and outputs of the submodules at ``paths`` during one eval-mode forward pass.

    Each submodule is replaced by a recording wrapper for the duration of ``model(calibration)``
    (or ``calibration(model)`` if ``calibration`` is callable), then put back; the model's
    train/eval flags are restored afterwards. ``sequence``, if given, is filled with the path of
    every call in the order the forward pass makes them (:func:`unfed_by`).

    Returns:
      ``(tokens, order)``: ``tokens[path] = (X, Y)`` with ``X (N, m)`` the flattened inputs and
      ``Y (N, n)`` the outputs of every call (a module called k times contributes k batches);
      ``order`` lists the paths in the order they were first called.

    Raises:
      ValueError: naming ``mlps`` for a missing path, a submodule never called, called with
        extra arguments, or whose output does not keep the input's leading axes.
    """
    originals = {p: get_submodule(model, p) for p in paths}
    flags = mode_flags(model)
    order: list[str] = []
    sinks = {p: _Sink(p, order, sequence) for p in paths}
    try:
        for p in paths:
            set_submodule(model, p, _Recorder(originals[p], sinks[p]))
        model.eval()
        _recording_forward(model, calibration, sinks, order)
    finally:
        for p in paths:
            set_submodule(model, p, originals[p])
        restore_mode_flags(flags)
    tokens = {}
    for p in paths:
        calls = sinks[p].calls
        if not calls:
            raise ValueError(f"mlps: {p!r} was not called by the model's forward pass on the calibration batch")
        xs, ys = [], []
        for x, y, extra in calls:
            x, y = jnp.asarray(x), jnp.asarray(y) if isinstance(y, jax.Array) else y
            if extra:
                raise ValueError(f"mlps: {p!r} is called with more than one argument; it must map "
                                 "(..., m) -> (..., n)")
            if not isinstance(y, jax.Array) or x.ndim < 1 or y.ndim != x.ndim or y.shape[:-1] != x.shape[:-1]:
                raise ValueError(f"mlps: {p!r} must map (..., m) -> (..., n) keeping the leading axes, "
                                 f"got input {x.shape} and output {getattr(y, 'shape', type(y).__name__)}")
            xs.append(x.reshape(-1, x.shape[-1]))
            ys.append(y.reshape(-1, y.shape[-1]))
        if len({x.shape[1] for x in xs}) > 1 or len({y.shape[1] for y in ys}) > 1:
            raise ValueError(f"mlps: {p!r} is called with inconsistent widths "
                             f"{sorted({(x.shape[1], y.shape[1]) for x, y in zip(xs, ys)})}")
        tokens[p] = (jnp.concatenate(xs), jnp.concatenate(ys))
    return tokens, order



def unfed_by(sequence: Sequence[str], path: str, replaced: Sequence[str]) -> bool:
    """Whether replacing the modules at ``replaced`` leaves the inputs of ``path`` as they were,
    read off ``sequence`` (every call's path in the order of a forward pass, :func:`capture_calls`):
    each of them is first called after the last call of ``path``, so nothing it computes comes
    before any input of ``path`` (back to front through a feed-forward model; not for a module
    called again later, or a replacement called earlier). For a deterministic forward pass (eval
    mode): what runs before a module's first call cannot depend on what it computes."""
    if path not in sequence:
        return False
    last = len(sequence) - 1 - list(reversed(sequence)).index(path)
    return all(q in sequence and sequence.index(q) > last for q in replaced)


def capture_tokenwise(model: nnx.Module, calibration, paths: Sequence[str], *, sequence: list[str] | None = None
                      ) -> tuple[dict[str, tuple[jax.Array, jax.Array]], dict[str, str]]:
    """Like :func:`capture_calls` for candidate paths that may not qualify: one eval-mode forward
    pass with every path recorded, keeping those called with one array and returning an array of
    the same leading axes and one width throughout (``sequence``: as :func:`capture_calls`').

    Returns:
      ``(tokens, rejected)``: ``tokens[path] = (X (N, m), Y (N, n))`` for the qualifying paths, in
      the order of ``paths``; ``rejected[path]`` says why another path does not qualify.
    """
    originals = {p: get_submodule(model, p) for p in paths}
    flags = mode_flags(model)
    order: list[str] = []
    sinks = {p: _Sink(p, order, sequence) for p in paths}
    try:
        for p in paths:
            set_submodule(model, p, _Recorder(get_submodule(model, p), sinks[p]))
        model.eval()
        _recording_forward(model, calibration, sinks, order)
    finally:
        for p in reversed(list(paths)):
            set_submodule(model, p, originals[p])
        restore_mode_flags(flags)
    tokens, rejected = {}, {}
    for p in paths:
        calls = sinks[p].calls
        if not calls:
            rejected[p] = "not called by the forward pass"
            continue
        if any(extra for _, _, extra in calls):
            rejected[p] = "called with more than one argument"
            continue
        if not all(isinstance(x, jax.Array) and isinstance(y, jax.Array) and x.ndim >= 1 and y.ndim == x.ndim
                   and y.shape[:-1] == x.shape[:-1] for x, y, _ in calls):
            rejected[p] = "does not map (..., m) -> (..., n) token by token"
            continue
        xs = [x.reshape(-1, x.shape[-1]) for x, _, _ in calls]
        ys = [y.reshape(-1, y.shape[-1]) for _, y, _ in calls]
        if len({x.shape[1] for x in xs}) > 1 or len({y.shape[1] for y in ys}) > 1:
            rejected[p] = "called with inconsistent widths"
            continue
        tokens[p] = (jnp.concatenate(xs), jnp.concatenate(ys))
    return tokens, rejected


@nnx.jit
def _forward(model: nnx.Module, inputs):
    return model(inputs)


def model_outputs(model: nnx.Module, inputs) -> jax.Array:
    """``(K,)``: the floating-point leaves of the eval-mode output of ``model(inputs)`` (or of
    ``inputs(model)`` if ``inputs`` is callable), flattened and concatenated. The model's
    train/eval flags are restored afterwards.

    Raises:
      ValueError: naming ``calibration`` if the output has no floating-point array.
    """
    flags = mode_flags(model)
    try:
        model.eval()
        out = inputs(model) if callable(inputs) else _forward(model, inputs)
    finally:
        restore_mode_flags(flags)
    leaves = [jnp.ravel(x) for x in jax.tree.leaves(out)
              if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)]
    if not leaves:
        raise ValueError("calibration: method 'auto' judges its candidates by the model's outputs, but the "
                         "forward pass returned no floating-point array (use auto_judge='block')")
    return jnp.concatenate(leaves)


def output_judge(model: nnx.Module, path: str, inputs, reference: jax.Array) -> Callable[[nnx.Module], float]:
    """``judge(module) -> float``: the relative squared error ``‖o − o_ref‖² / ‖o_ref‖²`` (as the
    MLPs' ``output_error``) of the whole model's outputs on ``inputs`` (:func:`model_outputs`)
    with ``module`` put at ``path``, against ``reference`` (``(K,)``, the original model's
    outputs on ``inputs``). The submodule at ``path`` is put back afterwards. For
    :class:`~jaxbsd.compression.methods.Auto`'s ``judge``."""
    def judge(module: nnx.Module) -> float:
        old = get_submodule(model, path)
        set_submodule(model, path, module)
        try:
            out = model_outputs(model, inputs)
        finally:
            set_submodule(model, path, old)
        return float(metrics.relative_error(reference, out))

    return judge

