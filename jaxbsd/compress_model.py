"""Compress the MLPs of any Flax NNX model, addressed by dotted paths, under a parameter budget.

``jb.compress_model(model, calibration, mlps=[...], reduction=ρ, key=...)`` replaces each
submodule named in ``mlps`` (``"encoder.layers.3.ffn"``: attribute names and integer indices,
also into ``nnx.List``) by a decoupled ``W1 g(W0 x)`` (R-CMTF-BSD), a low-rank MLP (truncated
SVD, DRONE) or a narrower MLP (structured pruning of hidden units), so that the whole model
keeps at most ``(1 − ρ)·P`` parameters.

The pieces, each usable alone:

* :func:`get_submodule` / :func:`set_submodule`: path resolution and surgery (attribute
  assignment, ``lst[i] = new``);
* :func:`capture_calls`: the inputs and outputs of submodules in a real forward pass, by
  swapping in a recording wrapper for the duration of one eval-mode call — nothing is
  required from the user's classes (no hooks, no ``mlp_input`` methods);
* :class:`MLPSpec`: how to read a two-``nnx.Linear`` MLP ``fc2(h(fc1(x)))`` so its Jacobian is
  structured (never materialized), and :class:`GatedMLPSpec` a gated one
  ``down(h(gate(x)) ⊙ up(x))`` (Llama, Qwen: the :class:`~jaxbsd.gated.GatedJacobian`); any
  other module gets dense ``vmap(jacfwd)`` Jacobians;
* :func:`build_replacement`: one MLP's replacement at one rank from sampled tokens;
* :func:`uniform_ranks` / :func:`greedy_ranks`: how a parameter budget is shared.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd import baselines, metrics
from jaxbsd.bases import BSpline
from jaxbsd.cmtf import CMTFConfig
from jaxbsd.driver import decouple
from jaxbsd.models import count_params
from jaxbsd.models.capture import module_jacobians
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.gated import GatedJacobian, gated_mlp_jacobian
from jaxbsd.models.layers import ACTIVATION_DERIVATIVES, ACTIVATIONS, MLP
from jaxbsd.models.lm import GatedMLP
from jaxbsd.tensor import StructuredJacobian, cpd_sq_norm, mlp_jacobian

__all__ = [
    "METHODS",
    "ALLOCATIONS",
    "MLPSpec",
    "GatedMLPSpec",
    "MLPReport",
    "CompressionReport",
    "Site",
    "compress_model",
    "parse_path",
    "get_submodule",
    "set_submodule",
    "capture_calls",
    "spec_for",
    "build_replacement",
    "check_budget",
    "make_site",
    "uniform_ranks",
    "greedy_ranks",
    "greedy_candidates",
    "selection_tokens",
    "warm_init",
    "auto_ranks",
    "auto_prune_rank",
    "build_auto",
    "AUTO_JUDGES",
    "model_outputs",
    "output_judge",
    "DEFAULT_CONFIG",
    "GREEDY_SCALES",
]

METHODS = ("bsd", "svd", "drone", "prune", "auto")
ALLOCATIONS = ("uniform", "greedy")
#: The solver template when ``config`` is None (the CLI's defaults: cubic splines, ν = 4).
DEFAULT_CONFIG = CMTFConfig(rank=1, basis=BSpline(3, 4), max_iter=300, tol=1e-8)
#: Candidate ranks of the greedy allocation, as multiples of each MLP's uniform rank.
GREEDY_SCALES = (0.5, 0.75, 1.0, 1.5, 2.0)
#: Calibration tokens on which the relative output error is measured (and DRONE's inputs).
_CHECK_TOKENS = 8192
#: Pruning refits on held-out tokens only when they number at least this many per coefficient
#: of an output (k + 1); fewer would make a worse refit than the check tokens give.
_PRUNE_TOKENS_PER_COEF = 4


# ----------------------------------------------------------------------------- paths


def parse_path(path: str) -> tuple[str | int, ...]:
    """``"encoder.layers.3.ffn"`` -> ``("encoder", "layers", 3, "ffn")``."""
    if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
        raise ValueError(f"mlps: a path must be a non-empty dotted string like 'blocks.0.mlp', got {path!r}")
    return tuple(int(p) if p.lstrip("-").isdigit() else p for p in path.split("."))


def _child(node, part: str | int, path: str):
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
        node = _child(node, part, path)
    if not isinstance(node, nnx.Module):
        raise ValueError(f"mlps: {path!r} is a {type(node).__name__}, not an nnx.Module")
    return node


def set_submodule(model: nnx.Module, path: str, module: nnx.Module) -> None:
    """Surgery: put ``module`` at ``path`` (attribute assignment or ``parent[i] = module``)."""
    *head, last = parse_path(path)
    parent = model
    for part in head:
        parent = _child(parent, part, path)
    if isinstance(last, int) or isinstance(parent, Mapping):
        parent[last] = module
    else:
        setattr(parent, last, module)


# ----------------------------------------------------------------------------- capture


class _Sink:
    """Plain Python storage for recorded calls (a static attribute to NNX, never traced)."""

    def __init__(self, path: str, order: list[str]):
        self.path, self.order, self.calls = path, order, []
        self.tracing = False  # inside capture's own compiled forward pass: tracers are expected

    def record(self, x, y, extra: bool) -> None:
        if not self.tracing and (isinstance(x, jax.core.Tracer) or isinstance(y, jax.core.Tracer)):
            raise ValueError(f"calibration: {self.path!r} was called under a JAX transformation; "
                             "capture needs the model's forward pass to run eagerly")
        if self.path not in self.order:
            self.order.append(self.path)
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


def _mode_flags(model: nnx.Module) -> list[tuple[nnx.Module, str, Any]]:
    """The train/eval flags of every submodule, to be put back by :func:`_restore_mode_flags`."""
    return [(mod, name, getattr(mod, name)) for _, mod in nnx.iter_modules(model)
            for name in _MODE_FLAGS if hasattr(mod, name)]


def _restore_mode_flags(flags: list[tuple[nnx.Module, str, Any]]) -> None:
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

    batch = None if callable(calibration) else calibration
    for sink in sinks.values():
        sink.tracing = True
    try:
        recorded = nnx.jit(forward)(model, batch)
    except Exception:  # noqa: BLE001 — not traceable: the eager pass below reports real errors
        recorded = None
    finally:
        for sink in sinks.values():
            sink.tracing = False
    if recorded is None:
        order.clear()
        for sink in sinks.values():
            sink.calls = []
        forward(model, batch)
        return
    for p, sink in sinks.items():
        sink.calls = [(x, y, extra) for (x, y), (_, _, extra) in zip(recorded[p], sink.calls)]


def capture_calls(model: nnx.Module, calibration, paths: Sequence[str]) -> tuple[dict[str, tuple[jax.Array, jax.Array]], list[str]]:
    """Inputs and outputs of the submodules at ``paths`` during one eval-mode forward pass.

    Each submodule is replaced by a recording wrapper for the duration of ``model(calibration)``
    (or ``calibration(model)`` if ``calibration`` is callable), then put back; the model's
    train/eval flags are restored afterwards.

    Returns:
      ``(tokens, order)``: ``tokens[path] = (X, Y)`` with ``X (N, m)`` the flattened inputs and
      ``Y (N, n)`` the outputs of every call (a module called k times contributes k batches);
      ``order`` lists the paths in the order they were first called.

    Raises:
      ValueError: naming ``mlps`` for a missing path, a submodule never called, called with
        extra arguments, or whose output does not keep the input's leading axes.
    """
    originals = {p: get_submodule(model, p) for p in paths}
    flags = _mode_flags(model)
    order: list[str] = []
    sinks = {p: _Sink(p, order) for p in paths}
    try:
        for p in paths:
            set_submodule(model, p, _Recorder(originals[p], sinks[p]))
        model.eval()
        _recording_forward(model, calibration, sinks, order)
    finally:
        for p in paths:
            set_submodule(model, p, originals[p])
        _restore_mode_flags(flags)
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


# ----------------------------------------------------------------------------- MLP specs


@dataclasses.dataclass(frozen=True)
class MLPSpec:
    """Declares that a submodule computes ``fc2(h(fc1(x)))`` with two ``nnx.Linear`` children.

    With a spec the Jacobian is structured, ``J[s] = V1 diag(h'(V0 x + b0)) V0``, never
    materialized, and the low-rank baselines (``"svd"``, ``"drone"``) can factor the two
    kernels. jaxbsd's own :class:`~jaxbsd.models.layers.MLP` needs no spec, and for other
    modules :func:`jaxbsd.specs.find_spec` usually finds one on the calibration tokens.

    The claim is checked on the calibration tokens: ``ValueError`` naming ``mlp_specs`` if
    ``fc2(h(fc1(x)))`` differs from the module's output.

    Attributes:
      fc1: attribute name (or dotted path, ``"layers.0"``) of the first ``nnx.Linear`` (kernel
        ``(m, H)``, bias ``(H,)`` or none).
      fc2: attribute name (or dotted path) of the second ``nnx.Linear`` (kernel ``(H, n)``).
      activation: a name in :data:`~jaxbsd.models.layers.ACTIVATIONS` (``"gelu"`` exact erf,
        ``"gelu_tanh"``, ``"relu"``, ``"silu"``, ``"tanh"``, ``"sigmoid"``) or an elementwise
        callable (its derivative comes from a JVP; a low-rank replacement then holds the
        callable, which cannot be stored as data).
    """

    fc1: str = "fc1"
    fc2: str = "fc2"
    activation: str | Callable[[jax.Array], jax.Array] = "gelu"

    def __post_init__(self):
        if isinstance(self.activation, str):
            if self.activation not in ACTIVATIONS:
                raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, "
                                 f"got {self.activation!r}")
        elif not callable(self.activation):
            raise ValueError(f"activation must be a name or a callable, got {self.activation!r}")

    @property
    def h(self) -> Callable[[jax.Array], jax.Array]:
        return ACTIVATIONS[self.activation] if isinstance(self.activation, str) else self.activation

    @property
    def h_prime(self) -> Callable[[jax.Array], jax.Array]:
        if isinstance(self.activation, str):
            return ACTIVATION_DERIVATIVES[self.activation]
        h = self.activation
        return lambda z: jax.jvp(h, (z,), (jnp.ones_like(z),))[1]

    def kernels(self, module: nnx.Module, path: str = "?"):
        """``(K1 (m, H), b1 (H,) | None, K2 (H, n), b2 (n,) | None)`` of ``module``."""
        layers = []
        for name in (self.fc1, self.fc2):
            layer = _resolve_linear(module, name, path)
            bias = layer.bias[...] if getattr(layer, "bias", None) is not None else None
            layers.append((layer.kernel[...], bias))
        (K1, b1), (K2, b2) = layers
        if K1.shape[1] != K2.shape[0]:
            raise ValueError(f"mlp_specs: {path!r}: {self.fc1} outputs {K1.shape[1]} features but "
                             f"{self.fc2} takes {K2.shape[0]}")
        return K1, b1, K2, b2

    def describe(self) -> str:
        act = self.activation if isinstance(self.activation, str) else "activation"
        return f"{self.fc2}({act}({self.fc1}(x)))"

    def apply(self, module: nnx.Module, X: jax.Array) -> jax.Array:
        """``fc2(h(fc1(X)))`` from the kernels: ``(S, m) -> (S, n)``."""
        K1, b1, K2, b2 = self.kernels(module)
        hidden = self.h(X @ K1 + (0 if b1 is None else b1[None, :]))
        return hidden @ K2 + (0 if b2 is None else b2[None, :])


def _resolve_linear(module: nnx.Module, name: str, path: str) -> nnx.Linear:
    try:  # an attribute name, or a dotted path one level down ("net.0", "proj.fc")
        layer = functools.reduce(lambda node, part: _child(node, part, name), parse_path(name), module)
    except ValueError:
        layer = None
    if not isinstance(layer, nnx.Linear):
        raise ValueError(f"mlp_specs: {path!r} has no nnx.Linear attribute {name!r} "
                         f"(found {type(layer).__name__})")
    return layer


@dataclasses.dataclass(frozen=True)
class GatedMLPSpec:
    """Declares that a submodule computes ``down(h(gate(x)) ⊙ up(x))`` with three ``nnx.Linear``.

    The MLP of Llama, Qwen, Gemma and Mistral (SwiGLU: ``h`` = SiLU; GeGLU: GELU). With a spec
    the Jacobian is the structured :class:`~jaxbsd.gated.GatedJacobian`, never materialized,
    and the baselines (``"svd"``, ``"drone"``, ``"prune"``) can factor or prune the three
    kernels. :func:`jaxbsd.specs.find_spec` usually finds it on the calibration tokens;
    jaxbsd's own :class:`~jaxbsd.models.lm.GatedMLP` needs none. The claim is checked on the
    calibration tokens (``ValueError`` naming ``mlp_specs`` if it does not hold).

    Attributes:
      gate, up: attribute names (or dotted paths) of the two input ``nnx.Linear`` (kernels
        ``(m, H)``, biases ``(H,)`` or none).
      down: attribute name (or dotted path) of the output ``nnx.Linear`` (kernel ``(H, n)``).
      activation: applied to the gate: a name in :data:`~jaxbsd.models.layers.ACTIVATIONS`
        (``"silu"``, ``"gelu"``, ``"gelu_tanh"``, …) or an elementwise callable.
    """

    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    activation: str | Callable[[jax.Array], jax.Array] = "silu"

    def __post_init__(self):
        for name in ("gate", "up", "down"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty attribute name, got {getattr(self, name)!r}")
        if isinstance(self.activation, str):
            if self.activation not in ACTIVATIONS:
                raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, "
                                 f"got {self.activation!r}")
        elif not callable(self.activation):
            raise ValueError(f"activation must be a name or a callable, got {self.activation!r}")

    h = MLPSpec.h
    h_prime = MLPSpec.h_prime

    def describe(self) -> str:
        act = self.activation if isinstance(self.activation, str) else "activation"
        return f"{self.down}({act}({self.gate}(x)) * {self.up}(x))"

    def kernels(self, module: nnx.Module, path: str = "?"):
        """``(Kg (m, H), bg, Ku (m, H), bu, Kd (H, n), bd)`` of ``module`` (biases or None)."""
        out = []
        for name in (self.gate, self.up, self.down):
            layer = _resolve_linear(module, name, path)
            out += [layer.kernel[...], layer.bias[...] if getattr(layer, "bias", None) is not None else None]
        Kg, _, Ku, _, Kd, _ = out
        if Kg.shape != Ku.shape or Kd.shape[0] != Kg.shape[1]:
            raise ValueError(f"mlp_specs: {path!r}: {self.gate} {Kg.shape} and {self.up} {Ku.shape} must map the "
                             f"same m -> H, and {self.down} {Kd.shape} take H")
        return tuple(out)

    def biases(self, module: nnx.Module, path: str = "?") -> tuple[bool, bool, bool]:
        """Which of gate, up, down have a bias."""
        return tuple(b is not None for b in self.kernels(module, path)[1::2])

    def apply(self, module: nnx.Module, X: jax.Array) -> jax.Array:
        """``down(h(gate(X)) ⊙ up(X))`` from the kernels: ``(S, m) -> (S, n)``."""
        Kg, bg, Ku, bu, Kd, bd = self.kernels(module)
        hidden = baselines.gated_hidden(Kg, bg, Ku, bu, self.h, X)
        return hidden @ Kd + (0 if bd is None else bd[None, :])


AnySpec = MLPSpec | GatedMLPSpec


def spec_for(module: nnx.Module, path: str, mlp_specs) -> AnySpec | None:
    """The spec used for ``module`` at ``path``: given, jaxbsd's own (gated) MLP, or None."""
    if isinstance(mlp_specs, (MLPSpec, GatedMLPSpec)):
        return mlp_specs
    if mlp_specs and path in mlp_specs:
        return mlp_specs[path]
    if isinstance(module, MLP) or (isinstance(module, baselines.PrunedMLP) and isinstance(module.activation, str)):
        return MLPSpec("fc1", "fc2", module.activation)
    if isinstance(module, GatedMLP):
        return GatedMLPSpec("gate_proj", "up_proj", "down_proj", module.activation)
    if isinstance(module, baselines.PrunedGatedMLP) and isinstance(module.activation, str):
        return GatedMLPSpec("gate", "up", "down", module.activation)
    return None


# ----------------------------------------------------------------------------- one replacement


@dataclasses.dataclass(frozen=True)
class Site:
    """One MLP to compress: its module, widths, sampled tokens and parameter-count function.

    Attributes:
      path: dotted path in the model.
      module: the original submodule.
      spec: its :class:`MLPSpec` or :class:`GatedMLPSpec`, or None (dense Jacobians).
      m, n: input and output widths; hidden: ``H`` (None without a spec).
      biases: for a gated MLP, which of gate, up, down have a bias (their replacements keep
        exactly those); else None.
      params: trainable parameters of the original submodule.
      X: ``(S, m)`` sampling points; F: ``(S, n)`` outputs there.
      check_X, check_Y: ``(N, m)``, ``(N, n)``: calibration tokens for the output error
        (and DRONE's inputs), at most 8192.
      fit_X, fit_Y: ``(M, m)``, ``(M, n)``: up to 8192 other calibration tokens, none of them
        among the check tokens (``M`` may be 0): pruning fits on them when there are enough, so
        its output error is measured on held-out tokens. None when not drawn.
      spec_status: how the spec was obtained (see :func:`jaxbsd.specs.choose_spec`).
    """

    path: str
    module: nnx.Module
    spec: AnySpec | None
    m: int
    n: int
    hidden: int | None
    params: int
    X: jax.Array
    F: jax.Array
    check_X: jax.Array
    check_Y: jax.Array
    fit_X: jax.Array | None = None
    fit_Y: jax.Array | None = None
    spec_status: str = "given"
    biases: tuple[bool, bool, bool] | None = None

    @property
    def gated(self) -> bool:
        return isinstance(self.spec, GatedMLPSpec)

    def params_at(self, method: str, rank: int, dof: int) -> int:
        """Parameters of this site's replacement at ``rank`` (for ``"prune"``: kept units)."""
        if method == "bsd":
            return metrics.params_bsd(self.m, self.n, rank, dof)
        if self.gated:
            if method == "prune":
                return baselines.pruned_gated_params(self.m, rank, self.n, self.biases)
            return baselines.lowrank_gated_params(self.m, self.hidden, rank, self.n, self.biases)
        if method == "prune":
            return baselines.pruned_mlp_params(self.m, rank, self.n)
        return baselines.lowrank_mlp_params(self.m, self.hidden, rank, self.n)

    def max_rank(self, method: str, dof: int) -> int:
        """Largest rank worth considering: no more parameters than the original (>= 1); for the
        low-rank baselines also ``min(m, H, n)`` (a factor cannot exceed its matrix's rank), for
        pruning ``H`` (the units there are)."""
        if method == "bsd":
            return max(1, self.params // (self.m + self.n + dof))
        if self.gated:
            # Both counts are affine in the rank: cost(r) = slope·r + fixed.
            fixed = self.params_at(method, 0, dof)
            slope = self.params_at(method, 1, dof) - fixed
            cap = self.hidden if method == "prune" else min(self.m, self.hidden, self.n)
            return max(1, min(cap, (self.params - fixed) // slope))
        if method == "prune":
            return max(1, min(self.hidden, (self.params - self.n) // (self.m + 1 + self.n)))
        cap = min(self.m, self.hidden, self.n)
        fit = (self.params - self.hidden - self.n) // (self.m + 2 * self.hidden + self.n)
        return max(1, min(cap, fit))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _draw_tokens(key: jax.Array, N: int, S: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Indices into ``N`` calibration tokens: ``S`` sampling points, ``C = min(N, 8192)`` check
    tokens, and ``min(N - C, C)`` other tokens, none of them check tokens."""
    k_sample, k_check = jax.random.split(key)
    sample = jax.random.choice(k_sample, N, (S,), replace=False)
    check = jax.random.choice(k_check, N, (min(N, _CHECK_TOKENS),), replace=False)
    # The tokens outside the check set (drawn without changing the check draw), for fits whose
    # output error must be measured on tokens they did not see: in increasing order, as
    # ``setdiff1d`` gives them.
    outside_count = N - check.shape[0]
    take = min(outside_count, _CHECK_TOKENS)
    if not take:
        return sample, check, jnp.zeros((0,), check.dtype)
    is_check = jnp.zeros((N,), bool).at[check].set(True)
    outside = jnp.nonzero(~is_check, size=outside_count)[0]
    pick = jax.random.choice(jax.random.fold_in(k_check, 1), outside_count, (take,), replace=False)
    return sample, check, outside[pick]


def make_site(path: str, module: nnx.Module, spec: AnySpec | None, X_all: jax.Array, Y_all: jax.Array,
              num_samples: int | None, key: jax.Array, *, validate: bool = True) -> Site:
    """The :class:`Site` of the MLP ``module`` at ``path`` from its captured calls.

    Args:
      path: the module's path in the model (for messages).
      module: the MLP, a map ``(..., m) -> (..., n)`` applied token by token.
      spec: its :class:`MLPSpec` or :class:`GatedMLPSpec` (structured Jacobian, baselines), or None.
      X_all: ``(N, m)`` calibration tokens the module was called on.
      Y_all: ``(N, n)`` what it returned for them.
      num_samples: ``S``, sampling points drawn from ``X_all`` (None: ``min(N, 256)``).
      key: PRNG key of the draw of the sampling points and of the check tokens.
      validate: check that ``module`` (and ``spec``, if given) reproduce ``Y_all`` token by token.

    Returns:
      a :class:`Site` with ``X`` ``(S, m)``, ``F = module(X)`` ``(S, n)`` and the check tokens.

    Raises:
      ValueError: ``num_samples`` exceeds ``N``, or (with ``validate``) the module or spec does
        not reproduce its captured outputs.
    """
    N, m = X_all.shape
    n = Y_all.shape[1]
    S = min(N, 256) if num_samples is None else num_samples
    if S > N:
        raise ValueError(f"num_samples: {S} exceeds the {N} calibration tokens of {path!r}")
    sample, check, rest = (np.asarray(i) for i in _draw_tokens(key, N, S))
    X = X_all[sample]
    check_X, check_Y = X_all[check], Y_all[check]
    if validate:
        # Token by token: the module must reproduce what it computed inside the model (this
        # rejects e.g. attention, which mixes tokens and is no (..., m) -> (..., n) map).
        probe = check[: min(64, check.shape[0])]
        try:
            out = _apply_module(module, X_all[probe])
        except Exception as err:  # noqa: BLE001 — any failure means the contract does not hold
            raise ValueError(f"mlps: {path!r} cannot be applied to (S, {m}) token vectors: {err}") from err
        if out.shape != (probe.shape[0], n) or not _close(out, Y_all[probe]):
            raise ValueError(f"mlps: {path!r} does not map (..., {m}) -> (..., {n}) token by token "
                             "(applied to its own inputs alone it gives other outputs)")
        if spec is not None:
            spec.kernels(module, path)
            if not _close(_apply_spec(spec, module, X_all[probe]), Y_all[probe]):
                raise ValueError(f"mlp_specs: {path!r} does not compute {spec.describe()} on the calibration tokens")
    hidden = spec.kernels(module, path)[0].shape[1] if spec is not None else None
    biases = spec.biases(module, path) if isinstance(spec, GatedMLPSpec) else None
    return Site(path=path, module=module, spec=spec, m=int(m), n=int(n), hidden=hidden,
                params=count_params(module), X=X, F=_apply_module(module, X), check_X=check_X, check_Y=check_Y,
                fit_X=X_all[rest], fit_Y=Y_all[rest], biases=biases)


@nnx.jit
def _apply_module(module: nnx.Module, X: jax.Array) -> jax.Array:
    # One compiled program per module structure and shape, not a dispatch (and a compile) per op.
    return module(X)


@nnx.jit(static_argnums=0)
def _apply_spec(spec: AnySpec, module: nnx.Module, X: jax.Array) -> jax.Array:
    return spec.apply(module, X)


def _param_dtype(module: nnx.Module, default) -> Any:
    """The dtype of the module's parameters (the replacement keeps it), or ``default``."""
    leaves = jax.tree_util.tree_leaves(nnx.state(module, nnx.Param))
    return leaves[0].dtype if leaves else default


def _close(a, b, rtol: float = 1e-3) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.all(np.isfinite(a)) and np.linalg.norm(a - b) <= rtol * max(np.linalg.norm(b), 1e-30))


def _gated_jacobian(X: jax.Array, kernels, spec: GatedMLPSpec) -> GatedJacobian:
    """The :class:`~jaxbsd.gated.GatedJacobian` at ``X (S, m)`` of the gated MLP with
    ``kernels = (Kg, bg, Ku, bu, Kd, bd)`` (Flax layout), all cast to ``X``'s dtype."""
    Kg, bg, Ku, bu, Kd, _ = (None if a is None else jnp.asarray(a, X.dtype) for a in kernels)
    return gated_mlp_jacobian(X, Kg.T, Ku.T, Kd.T, spec.h, gate_bias=bg, up_bias=bu,
                              activation_derivative=spec.h_prime)


def _jacobian(site: Site):
    """Structured (with a spec) or dense ``(S, n, m)`` Jacobian of the site at its samples."""
    if isinstance(site.spec, GatedMLPSpec):
        return _gated_jacobian(site.X, site.spec.kernels(site.module, site.path), site.spec), "structured"
    if site.spec is not None:
        K1, b1, K2, _ = site.spec.kernels(site.module, site.path)
        b1 = jnp.zeros((K1.shape[1],), K1.dtype) if b1 is None else b1
        # The solver needs one dtype: the samples' (float64 tokens of a float32 model, say).
        K1, b1, K2 = (jnp.asarray(a, site.X.dtype) for a in (K1, b1, K2))
        return mlp_jacobian(site.X, K1.T, b1, K2.T, site.spec.h_prime), "structured"
    graphdef, state = nnx.split(site.module)
    J, _ = module_jacobians(graphdef, state, site.X, min(256, site.X.shape[0]))
    return J, "dense"


def _lowrank_error_J(jac: StructuredJacobian, new: baselines.LowRankMLP | baselines.PrunedMLP, X: jax.Array,
                     h_prime) -> float:
    """Error(𝒥) of a low-rank or pruned MLP against a structured Jacobian, from Gram products only.

    Either is itself an MLP, so its Jacobian is ``[[V1', V0'ᵀ, D']]`` too, and
    ``‖𝒥 − 𝒥'‖² = ‖𝒥‖² − 2⟨𝒥, 𝒥'⟩ + ‖𝒥'‖²`` with ``⟨[[A,B,C]], [[A',B',C']]⟩ = Σ AᵀA' ∘ BᵀB' ∘ CᵀC'``.
    """
    if isinstance(new, baselines.PrunedMLP):
        K1, K2 = new.fc1.kernel[...], new.fc2.kernel[...]
    else:
        K1 = new.fc1.A[...] @ new.fc1.B[...]
        K2 = new.fc2.A[...] @ new.fc2.B[...]
    V0, V1 = K1.T, K2.T
    D = h_prime(X @ K1 + new.fc1.bias[...][None, :])
    inner = jnp.sum((jac.V1.T @ V1) * (jac.V0 @ V0.T) * (jac.D.T @ D))
    ref = jac.sq_norm()
    return float((ref - 2 * inner + cpd_sq_norm(V0, V1, D)) / ref)


def _gated_error_J(jac: GatedJacobian, new, X: jax.Array, spec: GatedMLPSpec) -> float:
    """Error(𝒥) of a low-rank or pruned gated MLP: its Jacobian is a gated one too, so
    ``‖𝒥 − 𝒥'‖² = ‖𝒥‖² − 2⟨𝒥, 𝒥'⟩ + ‖𝒥'‖²`` by :meth:`~jaxbsd.gated.GatedJacobian.inner`."""
    other = _gated_jacobian(X, new.kernels(), spec)
    ref = jac.sq_norm()
    return float((ref - 2 * jac.inner(other) + other.sq_norm()) / ref)


@nnx.jit
def _output_error(module, X, Y):
    # One compiled program (not op-by-op dispatch) for up to 8192 tokens.
    return metrics.relative_error(Y, module(X))


def build_replacement(site: Site, method: str, rank: int, config: CMTFConfig, key: jax.Array, *,
                      restarts: int = 1, jacobian=None, warm_start: bool | None = False,
                      selection: str = "objective") -> tuple[nnx.Module, dict[str, Any]]:
    """One MLP's replacement at ``rank`` (the model is not changed).

    ``"bsd"``: R-CMTF-BSD on the site's samples (``config`` with its rank replaced), returned
    as a :class:`~jaxbsd.models.decoupled_mlp.DecoupledMLP` in the samples' dtype.
    ``"svd"``/``"drone"``: a :class:`~jaxbsd.baselines.LowRankMLP` (a
    :class:`~jaxbsd.baselines.LowRankGatedMLP` for a gated spec; needs a spec).
    ``"prune"``: a :class:`~jaxbsd.baselines.PrunedMLP` keeping ``rank`` hidden units, chosen and
    refitted (:func:`~jaxbsd.baselines.prune_weights`) on the calibration tokens outside the check
    set (``fit_X``/``fit_Y``) when there are at least ``4 (rank + 1)`` of them, so its output
    error is held out (``info["fit_tokens"] = "held-out"``); else on the check tokens themselves,
    as DRONE always does (``"check"``: the output error is then in-sample). In the module's
    dtype; needs a spec.

    For ``"bsd"``, ``warm_start=True`` adds one restart beside the random ones, started from the
    pruned MLP written as a decoupling (:func:`warm_init`); ``selection`` picks the restart kept:
    ``"objective"`` (the solver's training objective, :func:`jaxbsd.decouple`'s choice) or
    ``"output"`` (the relative output error on the selection tokens, :func:`selection_tokens`).
    ``warm_start=None``: the warm start where the site can be pruned (a two-layer
    :class:`MLPSpec` and ``rank − 1`` at most its hidden width, calibration enough to refit),
    else the random restarts alone, with the reason in ``info["warm_start_skipped"]``.

    Returns:
      ``(module, info)``; info holds ``error_J``, ``error_F`` (on the S samples; Error(𝒥) of the
      baselines only with a structured Jacobian, else None), ``output_error`` (relative squared
      error on up to 8192 calibration tokens), ``jacobian`` (``"structured"``/``"dense"``),
      ``seconds``, and for bsd ``status``, ``iterations`` and the restart chosen: ``selection``,
      ``restart`` (its index; the warm one is the last), ``restart_warm``, ``restart_by_objective``,
      ``restart_by_output``, ``output_error_heldout`` (the chosen restart's error on the
      selection tokens), ``restart_output_errors`` (every restart's) and ``selection_tokens``.
    """
    start = time.perf_counter()
    info: dict[str, Any] = {}
    if method == "bsd":
        jac, kind = _jacobian(site) if jacobian is None else jacobian
        config = dataclasses.replace(config, rank=int(rank))
        if warm_start is None:  # compress_model's default: warm-start wherever the MLP can be pruned
            init, skipped = _default_warm_init(site, int(rank), config)
            if skipped:
                info["warm_start_skipped"] = skipped
        else:
            init = _warm_init(site, int(rank), config) if warm_start else None
        res = decouple(jac, site.F, site.X, config, key=key, restarts=restarts, init=init)
        model, chosen = _chosen_restart(res, site, selection, warm=init is not None, info=info)
        module = DecoupledMLP.from_decoupled(model, dtype=_param_dtype(site.module, site.X.dtype))
        pick = lambda a: a[chosen]  # noqa: E731
        info.update(error_J=float(pick(res.restarts.error_J)), error_F=float(pick(res.restarts.error_F)),
                    status=int(pick(res.restarts.status)), iterations=int(pick(res.restarts.iterations)),
                    jacobian=kind)
    else:
        if site.spec is None:
            raise ValueError(f"mlp_specs: method {method!r} factors the nnx.Linear layers of an MLP; "
                             f"{site.path!r} ({type(site.module).__name__}) needs an MLPSpec or a GatedMLPSpec "
                             f"({site.spec_status})")
        if site.gated:
            module, extra = _gated_baseline(site, method, int(rank))
            info.update(extra)
            jac, kind = _jacobian(site) if jacobian is None else jacobian
            error_J = _gated_error_J(jac, module, site.X, site.spec) if isinstance(jac, GatedJacobian) else None
            info.update(error_J=error_J, error_F=float(metrics.error_F(site.F, _apply_module(module, site.X))), jacobian=kind)
            info["output_error"] = float(_output_error(module, site.check_X, site.check_Y))
            info["seconds"] = time.perf_counter() - start
            return module, info
        K1, b1, K2, b2 = site.spec.kernels(site.module, site.path)
        if method == "prune":
            fit_X, fit_Y, where = _prune_tokens(site, int(rank))
            try:
                module, pruning = baselines.prune_mlp(K1, b1, K2, b2, site.spec.activation, int(rank), fit_X, fit_Y)
            except ValueError as err:
                raise ValueError(f"calibration: pruning {site.path!r}: {err}") from err
            info.update(kept=pruning.kept.tolist(), fit_tokens=where)
        else:
            module = baselines.lowrank_mlp(K1, b1, K2, b2, site.spec.activation, int(rank), method=method,
                                           X=site.check_X if method == "drone" else None)
        jac, kind = _jacobian(site) if jacobian is None else jacobian
        info.update(error_J=_lowrank_error_J(jac, module, site.X, site.spec.h_prime),
                    error_F=float(metrics.error_F(site.F, _apply_module(module, site.X))), jacobian=kind)
    info["output_error"] = float(_output_error(module, site.check_X, site.check_Y))
    info["seconds"] = time.perf_counter() - start
    return module, info


def _prune_tokens(site: Site, rank: int):
    """``(X, Y, "held-out" | "check")``: the tokens pruning fits on (see :func:`build_replacement`)."""
    held_out = site.fit_X is not None and site.fit_X.shape[0] >= _PRUNE_TOKENS_PER_COEF * (rank + 1)
    return (site.fit_X, site.fit_Y, "held-out") if held_out else (site.check_X, site.check_Y, "check")


def _gated_baseline(site: Site, method: str, rank: int) -> tuple[nnx.Module, dict[str, Any]]:
    """The ``"svd"``/``"drone"``/``"prune"`` replacement of a gated site, and its extra info."""
    kernels = site.spec.kernels(site.module, site.path)
    if method == "prune":
        fit_X, fit_Y, where = _prune_tokens(site, rank)
        try:
            module, pruning = baselines.prune_gated_mlp(*kernels, site.spec.activation, rank, fit_X, fit_Y)
        except ValueError as err:
            raise ValueError(f"calibration: pruning {site.path!r}: {err}") from err
        return module, {"kept": pruning.kept.tolist(), "fit_tokens": where}
    module = baselines.lowrank_gated_mlp(*kernels, site.spec.activation, rank, method=method,
                                         X=site.check_X if method == "drone" else None)
    return module, {}


# ----------------------------------------------------------------------------- warm start, selection, auto

#: Restarts are chosen on the held-out tokens (``fit_X``) only when there are at least this many.
_SELECTION_MIN_TOKENS = 64


def selection_tokens(site: Site) -> tuple[jax.Array, jax.Array, str]:
    """``(X, Y, kind)``: the tokens on which restarts are compared by output error.

    ``kind = "held-out"``: the site's ``fit_X``/``fit_Y``, calibration tokens outside the check
    set (so the reported ``output_error``, on the check tokens, stays independent of the choice;
    up to ``S`` of them may be among the solver's samples). ``kind = "check"`` when there are
    fewer than 64 of those (small calibration sets, where every token is a check token): the
    check tokens themselves, and ``output_error`` is then the one the choice minimised.
    """
    if site.fit_X is not None and site.fit_X.shape[0] >= _SELECTION_MIN_TOKENS:
        return site.fit_X, site.fit_Y, "held-out"
    return site.check_X, site.check_Y, "check"


def warm_init(site: Site, rank: int, config: CMTFConfig):
    """The warm start of a rank-``rank`` decoupling of ``site``: its MLP pruned to ``rank − 1``
    hidden units (:func:`jaxbsd.baselines.prune_mlp`, fitted on the same tokens as
    ``method="prune"``) plus one constant internal function for the output bias, written as a
    :class:`~jaxbsd.Decoupled` by :func:`jaxbsd.warm_start.decoupled_from_pruned` on the solver's
    samples — so, before any sweep, it is that pruned MLP up to the basis's approximation of the
    activation. At rank 1: one unit, its output bias projected on its output column.

    Returns:
      ``(Decoupled, PrunedMLP)``.

    Raises:
      ValueError: naming ``mlp_specs`` without a spec, ``ranks`` when ``rank − 1`` exceeds the
        hidden width.
    """
    from jaxbsd.warm_start import decoupled_from_pruned

    if site.spec is None:
        raise ValueError(f"mlp_specs: a warm start prunes the two nnx.Linear layers of an MLP; {site.path!r} "
                         f"({type(site.module).__name__}) needs an MLPSpec ({site.spec_status})")
    k = max(1, rank - 1)
    if k > site.hidden:
        raise ValueError(f"ranks[{site.path!r}] = {rank}: a warm start keeps rank - 1 = {k} hidden units, "
                         f"but there are {site.hidden}")
    K1, b1, K2, b2 = site.spec.kernels(site.module, site.path)
    held_out = site.fit_X is not None and site.fit_X.shape[0] >= _PRUNE_TOKENS_PER_COEF * (k + 1)
    fit_X, fit_Y = (site.fit_X, site.fit_Y) if held_out else (site.check_X, site.check_Y)
    try:
        pruned, _ = baselines.prune_mlp(K1, b1, K2, b2, site.spec.activation, k, fit_X, fit_Y)
    except ValueError as err:
        raise ValueError(f"calibration: pruning {site.path!r} for a warm start: {err}") from err
    return decoupled_from_pruned(pruned, site.X, config.basis, rank=rank), pruned


def _warm_init(site: Site, rank: int, config: CMTFConfig):
    return warm_init(site, rank, config)[0]


def _default_warm_init(site: Site, rank: int, config: CMTFConfig):
    """``(init or None, why none)``: the warm start of ``warm_start=None`` (the default of
    ``compress_model``'s ``"bsd"``), skipped where the MLP cannot be pruned to ``rank − 1`` units."""
    if site.spec is None or site.gated:
        return None, f"no two-layer MLPSpec ({site.spec_status})"
    try:
        return _warm_init(site, rank, config), None
    except ValueError as err:
        return None, str(err)


def _chosen_restart(res, site: Site, selection: str, *, warm: bool, info: dict):
    """The restart kept (by ``selection``) and what to report about the choice (into ``info``)."""
    from jaxbsd.warm_start import choose_restart, restart_output_errors

    X, Y, kind = selection_tokens(site)
    errors = restart_output_errors(res, X, Y)
    chosen = choose_restart(res, selection, errors)
    by_output = choose_restart(res, "output", errors)
    count = errors.shape[0]
    info.update(selection=selection, restart=chosen, restart_warm=bool(warm and chosen == count - 1),
                restart_by_objective=int(res.best_restart), restart_by_output=by_output,
                output_error_heldout=float(errors[chosen]) if np.isfinite(errors[chosen]) else None,
                # None for a restart whose model is not finite (JSON-able records, no inf).
                restart_output_errors=tuple(float(e) if np.isfinite(e) else None for e in errors),
                selection_tokens=kind)
    return res.restart_model(chosen), chosen


#: How ``method="auto"`` judges its two candidates (:func:`build_auto`): ``"model"``, the whole
#: model's outputs with each candidate in place; ``"block"``, the MLP's own output on check tokens.
AUTO_JUDGES = ("model", "block")


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
    flags = _mode_flags(model)
    try:
        model.eval()
        out = inputs(model) if callable(inputs) else _forward(model, inputs)
    finally:
        _restore_mode_flags(flags)
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
    :func:`build_auto`'s ``judge``."""
    def judge(module: nnx.Module) -> float:
        old = get_submodule(model, path)
        set_submodule(model, path, module)
        try:
            out = model_outputs(model, inputs)
        finally:
            set_submodule(model, path, old)
        return float(metrics.relative_error(reference, out))

    return judge


def auto_prune_rank(site: Site, bsd_rank: int, dof: int) -> int:
    """Hidden units of the pruned candidate beside a rank-``bsd_rank`` decoupling: the most
    whose :class:`~jaxbsd.baselines.PrunedMLP` has no more parameters than the decoupling
    (at least 1, at most ``H``)."""
    return max(1, min(site.hidden, _largest_rank(site, "prune", dof, site.params_at("bsd", bsd_rank, dof))))


def auto_ranks(sites: Sequence[Site], dof: int, budget: int) -> list[tuple[int, int]]:
    """``(bsd rank, pruned units)`` per site for ``method="auto"``: one parameter share per site.

    As :func:`uniform_ranks`: the largest fraction ``f`` such that, with each candidate at the
    largest rank whose parameters are ``≤ f · P_i`` (at least 1), the sites fit ``budget`` even
    if every one keeps its larger candidate (``Σ_i max(P_bsd, P_prune) ≤ budget``). Both
    candidates of a site thus live within the same share ``f · P_i``, and whichever is kept,
    the budget holds.
    """
    def pairs(f):
        return [(max(1, _largest_rank(s, "bsd", dof, f * s.params)), max(1, _largest_rank(s, "prune", dof, f * s.params)))
                for s in sites]

    def cost(ps):
        return sum(max(s.params_at("bsd", r, dof), s.params_at("prune", k, dof)) for s, (r, k) in zip(sites, ps))

    if cost(pairs(1.0)) <= budget:
        return pairs(1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cost(pairs(mid)) <= budget else (lo, mid)
    return pairs(lo)


def _check_auto_budget(sites: Sequence[Site], dof: int, budget: int, reduction: float) -> None:
    floor = sum(max(s.params_at("bsd", 1, dof), s.params_at("prune", 1, dof)) for s in sites)
    if floor > budget:
        raise ValueError(
            f"reduction={reduction} cannot be met by method 'auto': the compressed MLPs may hold {budget} "
            f"parameters in all, but rank 1 everywhere (the larger of a rank-1 decoupling and one pruned unit) "
            f"already needs {floor} (compress more MLPs or ask for less)")


def build_auto(site: Site, bsd_rank: int, prune_rank: int, config: CMTFConfig, key: jax.Array, *,
               restarts: int = 1, selection: str = "output",
               judge: Callable[[nnx.Module], float] | None = None) -> tuple[nnx.Module, dict[str, Any]]:
    """``method="auto"`` for one MLP: the better of a warm-started decoupling and a pruned MLP.

    Builds the rank-``bsd_rank`` decoupling (random restarts plus the warm start from the pruned
    MLP, :func:`warm_init`; restart chosen by ``selection``) and the pruned MLP with
    ``prune_rank`` units, and keeps the one with the lower error:

    * ``judge`` given (``auto_judge="model"``, e.g. :func:`output_judge`): ``judge(candidate)``,
      the whole model's output error with the candidate in place;
    * ``judge=None`` (``auto_judge="block"``): the MLP's relative output error on the check
      tokens — held out from both fits: the decoupling is fitted on the ``S`` samples and its
      restart chosen on ``fit_X``; the pruned MLP is fitted on ``fit_X`` when there are
      ``4 (k + 1)`` of them (else on the check tokens: ``info["auto"]["prune"]["fit_tokens"]``
      says ``"check"`` and its error is in-sample).

    Ties go to pruning (no solver needed), and so does a decoupling whose error is not finite.

    Returns:
      ``(module, info)``: the kept candidate's :func:`build_replacement` info with
      ``method`` (``"bsd"`` or ``"prune"``), ``rank``, and ``auto``: ``{"kept", "reason",
      "judge", "bsd": {...}, "prune": {...}}`` with each candidate's rank, parameters, output
      error and (with ``judge``) ``model_output_error``.
    """
    start = time.perf_counter()
    jacobian = _jacobian(site)
    bsd, bsd_info = build_replacement(site, "bsd", bsd_rank, config, key, restarts=restarts, jacobian=jacobian,
                                      warm_start=True, selection=selection)
    pruned, prune_info = build_replacement(site, "prune", prune_rank, config, key, jacobian=jacobian)
    if judge is None:
        what, e_bsd, e_prune = "held-out output error", bsd_info["output_error"], prune_info["output_error"]
    else:
        what, e_bsd, e_prune = "model output error", judge(bsd), judge(pruned)
    better = bool(np.isfinite(e_bsd) and (e_bsd < e_prune or not np.isfinite(e_prune)))
    kept = "bsd" if better else "prune"
    module, info = (bsd, dict(bsd_info)) if kept == "bsd" else (pruned, dict(prune_info))
    relation = "<" if better else ">="

    def summary(rank, mod, i, e_model):
        return dict(rank=int(rank), params=count_params(mod), output_error=i["output_error"],
                    **({} if judge is None else {"model_output_error": e_model}),
                    **{k: i[k] for k in ("fit_tokens", "restart", "restart_warm", "output_error_heldout",
                                         "selection_tokens") if k in i})

    info.update(method=kept, rank=int(bsd_rank if kept == "bsd" else prune_rank), auto=dict(
        kept=kept, judge="block" if judge is None else "model",
        reason=f"{what}: bsd {e_bsd:.4g} {relation} prune {e_prune:.4g}",
        bsd=summary(bsd_rank, bsd, bsd_info, e_bsd), prune=summary(prune_rank, pruned, prune_info, e_prune)))
    info["seconds"] = time.perf_counter() - start
    return module, info


# ----------------------------------------------------------------------------- budgets


def _largest_rank(site: Site, method: str, dof: int, budget: float) -> int:
    """Largest rank in ``[0, max_rank]`` whose replacement has at most ``budget`` parameters."""
    lo, hi = 0, site.max_rank(method, dof)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if site.params_at(method, mid, dof) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_budget(sites: Sequence[Site], method: str, dof: int, budget: int, reduction: float) -> None:
    """Raise ``ValueError`` if ``budget`` parameters cannot hold every site at rank 1 (the
    smallest replacement), i.e. if ``reduction`` cannot be met by ``method`` with ``dof``."""
    floor = sum(s.params_at(method, 1, dof) for s in sites)
    if floor > budget:
        raise ValueError(
            f"reduction={reduction} cannot be met: the compressed MLPs may hold {budget} parameters "
            f"in all, but rank 1 everywhere already needs {floor} (compress more MLPs or ask for less)"
        )


def uniform_ranks(sites: Sequence[Site], method: str, dof: int, budget: int) -> list[int]:
    """The same parameter fraction everywhere: the largest ``f`` for which the ranks
    ``r_i = max(1, largest rank with params_i(r) ≤ f · P_i)`` fit ``budget`` in all.

    For MLPs of one shape (a transformer's blocks) that is the same rank everywhere, the
    paper's setting. Assumes rank 1 everywhere fits (see :func:`check_budget`).
    """
    def ranks(f):
        return [max(1, _largest_rank(s, method, dof, f * s.params)) for s in sites]

    def cost(rs):
        return sum(s.params_at(method, r, dof) for s, r in zip(sites, rs))

    if cost(ranks(1.0)) <= budget:
        return ranks(1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):  # ranks are integers: 60 halvings pin the last breakpoint exactly
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cost(ranks(mid)) <= budget else (lo, mid)
    return ranks(lo)


def greedy_candidates(site: Site, method: str, dof: int, uniform: int, budget_alone: int) -> list[int]:
    """Ranks tried for one MLP by the greedy allocation: multiples of its uniform rank."""
    cap = min(site.max_rank(method, dof), max(1, _largest_rank(site, method, dof, budget_alone)))
    return sorted({min(cap, max(1, round(uniform * s))) for s in GREEDY_SCALES} | {min(uniform, cap)})


def greedy_ranks(sites: Sequence[Site], method: str, dof: int, budget: int,
                 errors: Sequence[Mapping[int, float]], uniform: Sequence[int]) -> list[int]:
    """Share ``budget`` where the summed error falls fastest per parameter.

    Args:
      errors: per site, ``{rank: relative output error}`` at its candidate ranks (including
        its uniform rank).
      uniform: the uniform ranks (a feasible fallback).

    Starting from each site's smallest candidate, repeatedly take the upgrade (any larger
    candidate of one site) with the largest error decrease per added parameter that still fits,
    until none helps. The result is compared with the uniform allocation and the one with the
    smaller summed error is returned, so greedy is never worse than uniform on these errors.
    """
    def p(i, r):
        return sites[i].params_at(method, r, dof)

    current = [min(e) for e in errors]
    total = sum(p(i, r) for i, r in enumerate(current))
    while True:
        best = None
        for i, e in enumerate(errors):
            for r in e:
                if r <= current[i] or total - p(i, current[i]) + p(i, r) > budget:
                    continue
                gain = (e[current[i]] - e[r]) / (p(i, r) - p(i, current[i]))
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, i, r)
        if best is None:
            break
        _, i, r = best
        total += p(i, r) - p(i, current[i])
        current[i] = r
    greedy_sum = sum(e[r] for e, r in zip(errors, current))
    uniform_sum = sum(e[r] for e, r in zip(errors, uniform))
    return current if greedy_sum < uniform_sum else list(uniform)


# ----------------------------------------------------------------------------- reports


@dataclasses.dataclass(frozen=True)
class MLPReport:
    """What happened to one MLP.

    Attributes:
      path: its dotted path; method: ``"bsd"``, ``"svd"``, ``"drone"`` or ``"prune"``; rank: the
        rank used (for ``"prune"``: the hidden units kept).
      in_features, out_features: ``m``, ``n``.
      params_before, params_after: trainable parameters of the original and the replacement.
      error_J, error_F: Error(𝒥) and Error(F) on the S sampling points (Error(𝒥) None for a
        baseline without a structured Jacobian).
      output_error: ``‖Y − Ŷ‖²/‖Y‖²`` on the calibration tokens (up to 8192), before fine-tuning.
      jacobian: ``"structured"`` or ``"dense"``.
      seconds: wall time of capture, Jacobian and solve; seconds_finetune: of ``finetune``.
      kept: for ``"prune"``, the indices of the kept hidden units (ascending); else None.
      fit_tokens: for ``"prune"``, ``"held-out"`` (refitted on calibration tokens outside the
        check set: ``output_error`` is held out) or ``"check"`` (too few of those: refitted on
        the check tokens, ``output_error`` in-sample); else None.
      spec: how the MLP was read: ``"given"`` (``mlp_specs``), ``"known: jaxbsd MLP (…)"``,
        ``"known: jaxbsd gated MLP (…)"``, ``"found: <activation>: <first> -> <second> (…)"``
        (gated: ``<gate> -> <up> -> <down>``) or ``"not found: <reason>"`` (then the Jacobian
        is dense).
      selection: for a decoupling, how its restart was chosen: ``"objective"`` (training
        objective on the samples) or ``"output"`` (output error on the selection tokens); else
        None. The fields below are None for the other methods.
      restart: the index of the restart kept (random ones first, the warm start last);
        restart_warm: whether it is the warm start; restart_by_objective, restart_by_output: the
        restart each criterion picks (both are reported whichever was used).
      output_error_heldout: the kept restart's relative output error on the selection tokens.
      selection_tokens: ``"held-out"`` (``Site.fit_X``, calibration tokens outside the check
        set) or ``"check"`` (fewer than 64 of those: the check tokens).
      auto: for ``method="auto"``, ``{"kept": "bsd" | "prune", "reason": …, "bsd": {rank,
        params, output_error, restart_warm}, "prune": {rank, params, output_error,
        fit_tokens}}``: both candidates and why one was kept; else None.
      warm_start_skipped: with ``warm_start=None`` (the default), why this decoupling had no
        warm start (no two-layer spec, ``rank − 1`` above the hidden width, …); else None.
    """

    path: str
    method: str
    rank: int
    in_features: int
    out_features: int
    params_before: int
    params_after: int
    error_J: float | None
    error_F: float | None
    output_error: float
    jacobian: str
    seconds: float
    seconds_finetune: float
    kept: tuple[int, ...] | None = None
    fit_tokens: str | None = None
    spec: str = "given"
    selection: str | None = None
    restart: int | None = None
    restart_warm: bool | None = None
    restart_by_objective: int | None = None
    restart_by_output: int | None = None
    output_error_heldout: float | None = None
    selection_tokens: str | None = None
    auto: dict[str, Any] | None = None
    warm_start_skipped: str | None = None


@dataclasses.dataclass(frozen=True)
class CompressionReport:
    """The result of :func:`compress_model`.

    Attributes:
      mlps: one :class:`MLPReport` per MLP, in the order they were replaced.
      params_before, params_after: ``nnx.Param`` scalars of the whole model.
      reduction: achieved, ``1 − params_after / params_before``.
      target_reduction: the ``reduction`` asked for (None with explicit ``ranks``).
      allocation, method: as given.
    """

    mlps: tuple[MLPReport, ...]
    params_before: int
    params_after: int
    reduction: float
    target_reduction: float | None
    allocation: str
    method: str

    @property
    def total_output_error(self) -> float:
        """Summed relative output error over the MLPs (what ``"greedy"`` minimises)."""
        return sum(r.output_error for r in self.mlps)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- driver


def _validate(model, mlps, reduction, ranks, method, allocation, order, num_samples, mlp_specs, restarts,
              warm_start=None, selection=None, auto_judge="model"):
    if not isinstance(model, nnx.Module):
        raise ValueError(f"model must be a flax.nnx.Module, got {type(model).__name__}")
    if isinstance(mlps, str) or not isinstance(mlps, Sequence) or not mlps:
        raise ValueError(f"mlps must be a non-empty list of dotted paths, got {mlps!r}")
    mlps = list(mlps)
    for p in mlps:
        parse_path(p)
    if len(set(mlps)) != len(mlps):
        raise ValueError(f"mlps lists a path twice: {mlps}")
    for a in mlps:
        for b in mlps:
            if a != b and b.startswith(a + "."):
                raise ValueError(f"mlps: {b!r} lies inside {a!r}; list each MLP once")
    if (reduction is None) == (ranks is None):
        raise ValueError("give exactly one of reduction and ranks")
    if reduction is not None:
        if isinstance(reduction, bool) or not isinstance(reduction, (int, float)) or not 0 <= reduction < 1:
            raise ValueError(f"reduction must be a number in [0, 1), got {reduction!r}")
    else:
        if not isinstance(ranks, Mapping) or set(ranks) != set(mlps):
            raise ValueError(f"ranks must map every path of mlps to a rank, got {ranks!r}")
        for p, r in ranks.items():
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
                raise ValueError(f"ranks[{p!r}] must be an int >= 1, got {r!r}")
        if allocation != "uniform":
            raise ValueError(f"allocation={allocation!r} shares a reduction budget; it cannot be used with ranks")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}")
    if isinstance(order, str):
        if order not in ("back-to-front", "front-to-back"):
            raise ValueError(f"order must be 'back-to-front', 'front-to-back' or a list of the paths, got {order!r}")
    elif sorted(order) != sorted(mlps):
        raise ValueError(f"order must list the paths of mlps, each once, got {order!r}")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1):
        raise ValueError(f"num_samples must be a positive int or None, got {num_samples!r}")
    if not isinstance(restarts, int) or restarts < 1:
        raise ValueError(f"restarts must be a positive int, got {restarts!r}")
    if warm_start is not None and not isinstance(warm_start, bool):
        raise ValueError(f"warm_start must be True, False or None, got {warm_start!r}")
    if warm_start and method not in ("bsd", "auto"):
        raise ValueError(f"warm_start=True starts a decoupling from the pruned MLP: it needs method 'bsd' or "
                         f"'auto', got {method!r}")
    if warm_start is False and method == "auto":
        raise ValueError("warm_start=False: method 'auto' always warm-starts its decoupling from the pruned MLP")
    if selection is not None and selection not in ("objective", "output"):
        raise ValueError(f"selection must be 'objective', 'output' or None, got {selection!r}")
    if auto_judge not in AUTO_JUDGES:
        raise ValueError(f"auto_judge must be one of {AUTO_JUDGES}, got {auto_judge!r}")
    if method == "auto" and allocation != "uniform":
        raise ValueError(f"allocation={allocation!r}: method 'auto' shares the budget uniformly "
                         "(each MLP's two candidates within one share); use allocation='uniform'")
    if mlp_specs is not None and not isinstance(mlp_specs, (MLPSpec, GatedMLPSpec)):
        if not isinstance(mlp_specs, Mapping) or not set(mlp_specs) <= set(mlps):
            raise ValueError(f"mlp_specs must be an MLPSpec, a GatedMLPSpec or a dict from paths of mlps to "
                             f"those, got {mlp_specs!r}")
        for p, s in mlp_specs.items():
            if not isinstance(s, (MLPSpec, GatedMLPSpec)):
                raise ValueError(f"mlp_specs[{p!r}] must be an MLPSpec or a GatedMLPSpec, got {s!r}")
    return mlps


def compress_model(
    model: nnx.Module,
    calibration,
    *,
    mlps: Sequence[str],
    reduction: float | None = None,
    ranks: Mapping[str, int] | None = None,
    method: str = "bsd",
    allocation: str = "uniform",
    config: CMTFConfig | None = None,
    finetune: Callable[[nnx.Module], None] | None = None,
    order: str | Sequence[str] = "back-to-front",
    num_samples: int | None = None,
    key: jax.Array,
    mlp_specs: AnySpec | Mapping[str, AnySpec] | None = None,
    restarts: int = 1,
    warm_start: bool | None = None,
    selection: str | None = None,
    auto_judge: str = "model",
) -> tuple[nnx.Module, CompressionReport]:
    """Replace MLP submodules of any Flax NNX model by compressed ones, in place.

    Each submodule at a path of ``mlps`` must map ``(..., m) -> (..., n)`` token by token. Its
    inputs are captured by running the model on ``calibration`` in eval mode with the submodule
    temporarily wrapped by a recorder (the train/eval flags are restored afterwards); ``S`` of
    the flattened input tokens are drawn at random with ``key``; the Jacobians there are
    structured for a recognised two-layer or gated MLP and dense (``jax.vmap(jax.jacfwd)``) otherwise;
    and the submodule is replaced — one MLP at a time, in ``order``, capturing again on the
    current model before each, and calling ``finetune(model)`` after each.

    **Budget.** With ``reduction=ρ`` the returned model has at most ``(1 − ρ)·P`` parameters,
    ``P`` the number of scalars in all ``nnx.Param`` leaves of the original model (the paper's
    "Reduction" = ``1 − P_new / P``, §6.5): only the listed MLPs shrink, so they share
    ``(1 − ρ)·P − (P − Σ P_mlp)`` parameters. A decoupling of rank ``r`` has
    ``r (m + n + ν)`` parameters (``P_BSD``; knots are not trained, and it has no biases: the
    B-splines carry constants, and the output bias enters the decoupling through ``F``); a
    low-rank MLP has ``k (m + H) + k (H + n) + H + n``; a pruned MLP keeping ``k`` hidden units
    has ``k (m + 1) + n (k + 1)`` (both layers with their biases, as the original MLP). For a
    gated MLP, the low-rank one has ``2k (m + H) + k (H + n)`` and the pruned one
    ``2km + kn``, each plus the biases the original has (``H`` or ``k`` for gate and for up,
    ``n`` for down).

    Args:
      model: any ``flax.nnx.Module``; changed in place (and returned).
      calibration: a batch of model inputs, used as ``model(calibration)``; or a callable
        ``calibration(model)`` that runs the forward pass (several arguments, keywords).
      mlps: dotted paths of the submodules to replace, e.g. ``["encoder.layers.3.ffn"]``
        (attribute names; integers index lists, ``nnx.List`` included).
      reduction: ``ρ`` in ``[0, 1)``, the fraction of the model's parameters to remove.
      ranks: instead of ``reduction``, ``{path: rank}`` for every path (exactly one of the two).
      method: ``"bsd"`` (R-CMTF-BSD), ``"auto"`` (per MLP, the better of a warm-started
        decoupling and a pruned MLP; see below), ``"svd"`` (truncated SVD of both layers, or of all
        three of a gated MLP), ``"drone"``
        (data-aware low rank, fed the calibration tokens) or ``"prune"`` (keep the ``k`` hidden
        units of largest ``‖V1[:, j]‖ · RMS(h_j)`` on the calibration tokens and refit the output
        layer by least squares; ``rank`` is ``k``; see :func:`jaxbsd.baselines.prune_weights`;
        for a gated MLP ``h_j`` is the gated unit ``h(gate x)_j · (up x)_j`` and ``down`` is
        refitted, see :func:`jaxbsd.baselines.prune_gated_weights`).
        The baselines need a recognised MLP.
      allocation: how ``reduction`` is shared. ``"uniform"``: every MLP keeps the same fraction
        of its parameters (the same rank for MLPs of one shape, as in the paper).
        ``"greedy"``: each MLP is compressed at a few candidate ranks (multiples of its uniform
        rank) on the original model, then parameters go where the relative output error on the
        calibration tokens falls fastest per parameter; the uniform allocation is kept if it
        has the smaller summed error. Same budget rule either way.
      config: a :class:`~jaxbsd.CMTFConfig` template for ``"bsd"`` (basis, λ, iterations…);
        its rank is replaced per MLP. Default: cubic B-splines with ν = 4, 300 sweeps.
      finetune: ``None`` or ``finetune(model) -> None``, called after each replacement.
      order: ``"back-to-front"`` (reverse order of the first calls in the forward pass; the
        paper's BF), ``"front-to-back"`` or a list of the paths.
      num_samples: ``S``, tokens sampled per MLP (default ``min(256, available)``).
      key: a ``jax.random`` key (token draws and solver restarts).
      mlp_specs: how to read user MLPs as ``fc2(h(fc1(x)))`` (:class:`MLPSpec`) or
        ``down(h(gate(x)) ⊙ up(x))`` (:class:`GatedMLPSpec`) for structured Jacobians and the
        baselines: one spec for all paths, or ``{path: spec}``; it always wins.
        jaxbsd's own :class:`~jaxbsd.models.layers.MLP` and :class:`~jaxbsd.models.lm.GatedMLP`
        need none, and for any other module :func:`jaxbsd.specs.find_spec` looks for one (two or
        three ``nnx.Linear`` and a known activation that reproduces the calibration outputs;
        ``report.mlps[i].spec`` says what it found).
        Without a spec, ``"bsd"`` uses dense Jacobians (``S·n·m`` floats) and the baselines
        raise ``ValueError`` with the reason.
      restarts: solver restarts per MLP (``"bsd"``, ``"auto"``).
      warm_start: ``True`` adds one restart beside the random ones, started from the MLP pruned
        to ``rank − 1`` units plus a constant unit for its output bias
        (:func:`warm_init`; an error where that is impossible); ``False``: the random restarts
        alone (the behaviour before issue 24). None (the default): the warm start for every
        MLP that can be pruned (a two-layer MLP with a spec and ``rank − 1`` at most its hidden
        width), the random restarts alone for the others (``report.mlps[i].warm_start_skipped``
        says why); ``"auto"`` always warm-starts.
      selection: how a decoupling's restart is chosen: ``"objective"`` (the solver's training
        objective on the samples) or ``"output"`` (relative output error on held-out
        calibration tokens, :func:`selection_tokens`). None (the default): ``"output"``. The
        report gives the restart both would pick. The knob ablation (ViT/Fashion-MNIST, no
        fine-tuning, 3 seeds; ``experiments/knobs.py``) chose these defaults: the warm start with
        held-out selection raised accuracy by 0.31 points at ρ = 0.2 and 0.62 at ρ = 0.5, winning
        on all 6 paired seeds; ν = 8, ``S = max(128, 4r)`` and fewer sweeps did not pay on top.
      auto_judge: ``method="auto"`` only: ``"model"`` (default) or ``"block"``, how the two
        candidates of each MLP are compared (see below).

    ``method="auto"``: each MLP gets one parameter share (:func:`auto_ranks`; with ``ranks``,
    the rank is the decoupling's and the pruned candidate keeps the most units that fit in the
    decoupling's parameters, :func:`auto_prune_rank`); within it a warm-started decoupling and a
    pruned MLP are built and the one judged better is kept (:func:`build_auto`;
    ``report.mlps[i].method`` says which and ``.auto`` why). ``auto_judge="model"`` (the
    default) judges them by what users measure: the whole model's outputs on ``calibration``
    with the candidate in place (the MLPs compressed before it included), against the original
    model's outputs (:func:`output_judge`; the fits use tokens of these inputs, both
    candidates alike). ``auto_judge="block"``: the MLP's own output error on its check tokens,
    held out from both fits (the rule before the end-to-end judge).

    Returns:
      ``(model, report)``: the same model with the submodules replaced (``DecoupledMLP``,
      ``LowRankMLP``/``LowRankGatedMLP`` or ``PrunedMLP``/``PrunedGatedMLP``, all jittable and
      differentiable) and a :class:`CompressionReport`.

    Raises:
      ValueError: naming the argument: a path that does not exist or is not a token-wise
        ``(..., m) -> (..., n)`` module (``mlps``), both or neither of ``reduction`` and
        ``ranks``, a budget the MLPs alone cannot meet (``reduction``), a wrong spec
        (``mlp_specs``), a bad ``method``/``allocation``/``order``/``num_samples``.

    Example:
      >>> model, report = jb.compress_model(model, x_calib, mlps=["blocks.0.mlp", "blocks.1.mlp"],
      ...                                   reduction=0.3, key=jax.random.key(0))
      >>> report.reduction >= 0.3
      True
    """
    mlps = _validate(model, mlps, reduction, ranks, method, allocation, order, num_samples, mlp_specs, restarts,
                     warm_start, selection, auto_judge)
    warm = True if method == "auto" else warm_start  # None: warm-start each MLP that can be pruned
    selection = "output" if selection is None else selection
    build = functools.partial(build_replacement, restarts=restarts, warm_start=warm, selection=selection)
    typed = isinstance(key, jax.Array) and key.shape == () and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    legacy = isinstance(key, jax.Array) and key.shape == (2,) and key.dtype == jnp.uint32
    if not (typed or legacy):
        raise ValueError(f"key must be a jax.random key (jax.random.key(seed)), got {key!r}")
    config = DEFAULT_CONFIG if config is None else config
    if not isinstance(config, CMTFConfig):
        raise ValueError(f"config must be a jaxbsd.CMTFConfig, got {type(config).__name__}")
    dof = config.basis.num_coef
    site_keys = {p: jax.random.fold_in(key, i) for i, p in enumerate(mlps)}

    def site_at(path, tokens):
        X_all, Y_all = tokens[path]
        module = get_submodule(model, path)
        # The spec: given, jaxbsd's MLP, or found on these tokens (jaxbsd.specs imports this module).
        from jaxbsd.specs import choose_spec

        spec, status = choose_spec(module, path, mlp_specs, X_all, Y_all)
        site = make_site(path, module, spec, X_all, Y_all, num_samples, jax.random.fold_in(site_keys[path], 0))
        return dataclasses.replace(site, spec_status=status)

    params_before = count_params(model)
    tokens, first_calls = capture_calls(model, calibration, mlps)
    sites = [site_at(p, tokens) for p in mlps]  # validates every path before any work
    # "auto" judged by the model: the original model's outputs, before any replacement.
    reference = model_outputs(model, calibration) if method == "auto" and auto_judge == "model" else None
    if method != "bsd":
        for s in sites:
            if s.spec is None:
                raise ValueError(
                    f"mlp_specs: method {method!r} factors the nnx.Linear layers of an MLP, and no spec "
                    f"was found for {s.path!r} ({type(s.module).__name__}): {s.spec_status.removeprefix('not found: ')}. "
                    f"If it is one, give it: mlp_specs={{{s.path!r}: jb.MLPSpec(fc1=..., fc2=..., activation=...)}} "
                    f"(or jb.GatedMLPSpec(gate=..., up=..., down=..., activation=...) for a gated MLP)")
    cache: dict[tuple[str, int], tuple[Site, nnx.Module, dict]] = {}
    if reduction is not None:
        budget = math.floor((1 - reduction) * params_before) - (params_before - sum(s.params for s in sites))
        if method == "auto":
            _check_auto_budget(sites, dof, budget, reduction)
            chosen = auto_ranks(sites, dof, budget)
        else:
            check_budget(sites, method, dof, budget, reduction)
            chosen = uniform_ranks(sites, method, dof, budget)
        if allocation == "greedy":
            floor = sum(s.params_at(method, 1, dof) for s in sites)
            errors = []
            for s, u in zip(sites, chosen):
                alone = budget - floor + s.params_at(method, 1, dof)
                errs = {}
                for r in greedy_candidates(s, method, dof, u, alone):
                    module, info = build(s, method, r, config, jax.random.fold_in(site_keys[s.path], 1))
                    cache[(s.path, r)] = (s, module, info)
                    errs[r] = info["output_error"]
                errors.append(errs)
            chosen = greedy_ranks(sites, method, dof, budget, errors, chosen)
        rank_of = dict(zip(mlps, chosen))
    else:
        rank_of = {p: int(r) for p, r in ranks.items()}
        for s in sites:
            if method == "prune" and rank_of[s.path] > s.hidden:
                raise ValueError(f"ranks[{s.path!r}] = {rank_of[s.path]} exceeds the {s.hidden} hidden units "
                                 f"for method 'prune'")
            elif method in ("svd", "drone") and rank_of[s.path] > min(s.m, s.hidden, s.n):
                raise ValueError(f"ranks[{s.path!r}] = {rank_of[s.path]} exceeds min(m, H, n) = "
                                 f"{min(s.m, s.hidden, s.n)} for method {method!r}")
            elif method == "auto":
                rank_of[s.path] = (rank_of[s.path], auto_prune_rank(s, rank_of[s.path], dof))

    if isinstance(order, str):
        executed = first_calls if order == "front-to-back" else first_calls[::-1]
    else:
        executed = list(order)
    reports = []
    for step, path in enumerate(executed):
        start = time.perf_counter()
        # Capture again: earlier replacements and fine-tuning change what this MLP sees.
        site = sites[mlps.index(path)] if step == 0 else site_at(path, capture_calls(model, calibration, [path])[0])
        rank = rank_of[path]
        hit = cache.get((path, rank))
        if hit is not None and _same_site(hit[0], site):
            module, info = hit[1], hit[2]  # greedy already built exactly this replacement
        elif method == "auto":
            module, info = build_auto(site, *rank, config, jax.random.fold_in(site_keys[path], 1),
                                      restarts=restarts, selection=selection,
                                      judge=None if reference is None else output_judge(model, path, calibration,
                                                                                         reference))
        else:
            module, info = build(site, method, rank, config, jax.random.fold_in(site_keys[path], 1))
        set_submodule(model, path, module)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        if finetune is not None:
            finetune(model)
        reports.append(MLPReport(
            path=path, method=info.get("method", method), rank=int(info.get("rank", rank)),
            in_features=site.m, out_features=site.n,
            params_before=site.params, params_after=count_params(module), error_J=info.get("error_J"),
            error_F=info.get("error_F"), output_error=info["output_error"], jacobian=info["jacobian"],
            seconds=seconds, seconds_finetune=time.perf_counter() - start,
            kept=tuple(info["kept"]) if "kept" in info else None, fit_tokens=info.get("fit_tokens"), spec=site.spec_status,
            **{f: info.get(f) for f in _SELECTION_FIELDS},
        ))
    params_after = count_params(model)
    report = CompressionReport(
        mlps=tuple(reports), params_before=params_before, params_after=params_after,
        reduction=1 - params_after / params_before, target_reduction=reduction,
        allocation=allocation if reduction is not None else "explicit", method=method,
    )
    if reduction is not None:
        assert params_after <= (1 - reduction) * params_before, (params_after, params_before, reduction)
    return model, report


#: The :class:`MLPReport` fields about the choice of a restart (and ``auto``), copied from ``info``.
_SELECTION_FIELDS = ("selection", "restart", "restart_warm", "restart_by_objective", "restart_by_output",
                     "output_error_heldout", "selection_tokens", "auto", "warm_start_skipped")


def _same_site(a: Site, b: Site) -> bool:
    """Same module and the very same sampled and check tokens (so a cached build is exact)."""
    same = (a.module is b.module and a.X.shape == b.X.shape and a.check_X.shape == b.check_X.shape)
    # Fine-tuning may have changed the module's weights in place: compare outputs too.
    return same and all((u is None and v is None) or (u is not None and v is not None and bool(jnp.array_equal(u, v)))
                        for u, v in ((a.X, b.X), (a.F, b.F), (a.check_X, b.check_X), (a.check_Y, b.check_Y),
                                     (a.fit_X, b.fit_X), (a.fit_Y, b.fit_Y)))
