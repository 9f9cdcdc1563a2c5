"""How to read an MLP module: :class:`MLPSpec`, :class:`GatedMLPSpec`, and finding them.

A spec says which ``nnx.Linear`` children of a module compute ``fc2(h(fc1(x)))`` (or the gated
``down(h(gate(x)) ⊙ up(x))``), so its Jacobian is structured and the baselines can factor it.
jaxbsd's own MLPs need none (:func:`spec_for`), and for any other module :func:`find_spec`
usually finds one on the calibration tokens, so nobody has to write a spec by hand.

:func:`find_spec` looks at a module and at what it computed on the calibration tokens and
answers with a :class:`Detection`: an :class:`~jaxbsd.MLPSpec` (the object users write by hand,
so structured Jacobians and the ``"svd"``/``"drone"`` baselines just work), or ``None`` with the
reason. It recognises

* **two-layer MLPs** ``second(h(first(x)))``: exactly two ``nnx.Linear`` submodules, at any
  attribute names (in an ``nnx.List``/``nnx.Dict`` or a child module too), and no other
  parameters. Which Linear comes first follows from the shapes: ``first`` takes the module's
  input width ``m``, ``second`` gives its output width ``n``, and ``first.out_features ==
  second.in_features = H``; when both orders fit (``m = n = H``) both are tried.
* **gated MLPs** ``down(h(gate(x)) ⊙ up(x))`` (three ``nnx.Linear``, as in Llama and Qwen):
  a :class:`~jaxbsd.GatedMLPSpec` (structured :class:`~jaxbsd.solver.jacobians.GatedJacobian`, and the
  gated ``"svd"``/``"drone"``/``"prune"`` baselines). ``gate`` and ``up`` have the same shapes,
  so both role assignments are tried; the activation on the gate tells them apart.

The activation ``h`` is identified by recomputing the module's output from its own Linears
for each known activation (:data:`ACTIVATION_NAMES`: exact and tanh GELU, ReLU, SiLU, tanh,
sigmoid) and comparing with the output the module really produced.

**The matching rule.** A candidate (order of the Linears, activation) matches when the relative
error ``‖Ŷ − Y‖_F / ‖Y‖_F`` on the tokens is at most :func:`match_tolerance`:
``max(base, 16·ε_mm)`` with ``base = 1e-8`` if the outputs are float64 and ``max(1e-5, 8·eps)``
for narrower dtypes (``1e-5`` in float32), and ``ε_mm`` the relative rounding the platform's
matrix products show on these tokens (the first Linear against a float64 reference; on CPU
about 1e-7, larger where float32 products run in TF32). Exactly one match gives a spec; none,
or several (e.g. a degenerate module whose output does not depend on the activation, or
pre-activations so small that GELU's two forms agree to rounding) give ``None`` and say so.
Candidates are screened on at most 256 tokens and confirmed on at most 4096, spread evenly
over the calibration tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.compression import baselines
from jaxbsd.compression.surgery import capture_tokenwise, child, parse_path
from jaxbsd.models.layers import ACTIVATION_DERIVATIVES, ACTIVATIONS, MLP
from jaxbsd.models.lm import GatedMLP

__all__ = [
    "ACTIVATION_NAMES",
    "AnySpec",
    "Detection",
    "GatedMLPSpec",
    "MLPSpec",
    "choose_spec",
    "discover_mlps",
    "find_spec",
    "linear_children",
    "match_tolerance",
    "spec_for",
]



def _check_activation(activation) -> None:
    """``ValueError`` naming ``activation`` unless it is a known name or a callable."""
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a callable, got {activation!r}")
    elif not callable(activation):
        raise ValueError(f"activation must be a name or a callable, got {activation!r}")


@dataclasses.dataclass(frozen=True)
class MLPSpec:
    """Declares that a submodule computes ``fc2(h(fc1(x)))`` with two ``nnx.Linear`` children.

    With a spec the Jacobian is structured, ``J[s] = V1 diag(h'(V0 x + b0)) V0``, never
    materialized, and the low-rank baselines (``"svd"``, ``"drone"``) can factor the two
    kernels. jaxbsd's own :class:`~jaxbsd.models.layers.MLP` needs no spec, and for other
    modules :func:`find_spec` usually finds one on the calibration tokens.

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
        _check_activation(self.activation)

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
        layer = functools.reduce(lambda node, part: child(node, part, name), parse_path(name), module)
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
    the Jacobian is the structured :class:`~jaxbsd.solver.jacobians.GatedJacobian`, never materialized,
    and the baselines (``"svd"``, ``"drone"``, ``"prune"``) can factor or prune the three
    kernels. :func:`find_spec` usually finds it on the calibration tokens;
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
        _check_activation(self.activation)

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



#: The activations :func:`find_spec` tries, in the order it reports them.
ACTIVATION_NAMES = ("gelu", "gelu_tanh", "relu", "silu", "tanh", "sigmoid")
_SCREEN_TOKENS = 256
_CONFIRM_TOKENS = 4096


@dataclasses.dataclass(frozen=True)
class Detection:
    """What :func:`find_spec` concluded about one module.

    Attributes:
      spec: an :class:`~jaxbsd.MLPSpec` or :class:`GatedMLPSpec`, or None.
      reason: one line: what was found, or why nothing was.
      errors: relative output error of every candidate tried, keyed like
        ``"gelu_tanh: up -> down"`` (empty when the structure did not fit).
      tolerance: the match tolerance used (None when no candidate was tried).
    """

    spec: MLPSpec | GatedMLPSpec | None
    reason: str
    errors: Mapping[str, float] = dataclasses.field(default_factory=dict)
    tolerance: float | None = None

    def __str__(self) -> str:
        return ("found: " if self.spec is not None else "not found: ") + self.reason


# ----------------------------------------------------------------------------- structure


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def linear_children(module: nnx.Module) -> list[tuple[str, nnx.Linear]]:
    """Every ``nnx.Linear`` inside ``module`` (not itself), with its dotted path, once each
    (a Linear reachable under two names counts once), in graph order."""
    return [(_dotted(p), m) for p, m in nnx.iter_modules(module) if p and isinstance(m, nnx.Linear)]


def _foreign_params(module: nnx.Module, linears: list[tuple[str, nnx.Linear]]) -> list[str]:
    """``"Type at 'path'"`` for each submodule (or the module) holding an ``nnx.Param`` of its
    own that is not one of ``linears``: such a module computes more than the Linears do."""
    inside = {id(m) for _, m in linears}
    out = []
    for p, m in nnx.iter_modules(module):
        if id(m) in inside:
            continue
        if any(isinstance(v, nnx.Param) for v in vars(m).values()):
            out.append(f"{type(m).__name__} at {_dotted(p)!r}" if p else f"{type(m).__name__} itself")
    return out


def match_tolerance(dtype: Any, matmul_rounding: float = 0.0) -> float:
    """The largest relative output error that still counts as a match (see the module docs)."""
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"dtype: expected a floating dtype, got {dtype}")
    base = 1e-8 if dtype == jnp.float64 else max(1e-5, 8 * float(jnp.finfo(dtype).eps))
    return max(base, 16 * float(matmul_rounding))


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(np.float64).tiny))


def _matmul_rounding(linear: nnx.Linear, X: jax.Array) -> float:
    """Relative difference between the Linear as the platform computes it and a float64 product."""
    K = np.asarray(linear.kernel[...], np.float64)
    ref = np.asarray(X, np.float64) @ K
    if linear.bias is not None:
        ref = ref + np.asarray(linear.bias[...], np.float64)[None, :]
    return _rel(apply_module(linear, X), ref)


@nnx.jit
def apply_module(module: nnx.Module, X: jax.Array) -> jax.Array:
    """``module(X)`` as one compiled program per module structure and shape, not a dispatch (and
    a compile) per op."""
    return module(X)


@jax.jit
def _take_tokens(X: jax.Array, Y: jax.Array, rows, screen):
    """``(X[rows], Y[rows], X[rows][screen], Y[rows][screen])`` as one program (eager, each gather
    would compile on its own, per shape)."""
    Xc, Yc = X[rows], Y[rows]
    return Xc, Yc, Xc[screen], Yc[screen]


@nnx.jit
def _every_reading(layers: tuple[nnx.Linear, ...], X: jax.Array) -> jax.Array:
    """``(len(ACTIVATION_NAMES), N, n)``: the MLP ``layers`` reads as, one slice per known
    activation: ``second(h(first(X)))`` for two Linears, ``down(h(gate(X)) * up(X))`` for three.
    One program per layer structure and shape (not one dispatch per activation and op)."""
    if len(layers) == 2:
        first, second = layers
        pre = first(X)
        return jnp.stack([second(ACTIVATIONS[act](pre)) for act in ACTIVATION_NAMES])
    gate, up, down = layers
    pre, other = gate(X), up(X)
    return jnp.stack([down(ACTIVATIONS[act](pre) * other) for act in ACTIVATION_NAMES])


def _spread(n: int, k: int) -> np.ndarray:
    """``min(n, k)`` indices spread evenly over ``range(n)``."""
    return np.unique(np.linspace(0, n - 1, min(n, k)).round().astype(int))


# ----------------------------------------------------------------------------- detection


def find_spec(module: nnx.Module, X: jax.Array, Y: jax.Array) -> Detection:
    """Recognise ``module`` as a two-layer (or gated) MLP from its Linears and its outputs.

    Args:
      module: the submodule (any class).
      X: ``(N, m)`` calibration inputs of the module; Y: ``(N, n)`` what it returned on them.

    Returns:
      A :class:`Detection`: ``spec`` an :class:`~jaxbsd.MLPSpec` (two Linears) or a
      :class:`GatedMLPSpec` (three) when exactly one reading reproduces ``Y`` to
      :func:`match_tolerance`; else ``spec=None`` and ``reason`` says why.

    Raises:
      ValueError: naming ``X``/``Y`` if they are not ``(N, m)``/``(N, n)`` float arrays with
        the same ``N >= 1``.
    """
    X, Y = jnp.asarray(X), jnp.asarray(Y)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0] or X.shape[0] < 1:
        raise ValueError(f"X, Y: expected (N, m) inputs and (N, n) outputs, got {X.shape} and {Y.shape}")
    if not (jnp.issubdtype(X.dtype, jnp.floating) and jnp.issubdtype(Y.dtype, jnp.floating)):
        raise ValueError(f"X, Y: expected floating arrays, got {X.dtype} and {Y.dtype}")
    m, n = X.shape[1], Y.shape[1]
    linears = linear_children(module)
    if len(linears) not in (2, 3):
        return Detection(None, f"{type(module).__name__} has {len(linears)} nnx.Linear submodules; a two-layer "
                               "MLP has 2 (a gated one 3)")
    foreign = _foreign_params(module, linears)
    if foreign:
        return Detection(None, f"{type(module).__name__} holds parameters outside its nnx.Linear layers "
                               f"({', '.join(foreign)}), so it is more than an MLP")
    shapes = ", ".join(f"{p} ({lin.in_features} -> {lin.out_features})" for p, lin in linears)
    if len(linears) == 2:
        orders = [(a, b) for a, b in itertools.permutations(linears, 2)
                  if a[1].in_features == m and b[1].out_features == n and a[1].out_features == b[1].in_features]
        kind = "second(h(first(x)))"
    else:
        # down takes the hidden width and gives n; gate and up both map m -> H, in either role.
        orders = [(g, u, d) for g, u, d in itertools.permutations(linears, 3)
                  if g[1].in_features == u[1].in_features == m and d[1].out_features == n
                  and g[1].out_features == u[1].out_features == d[1].in_features]
        kind = "down(h(gate(x)) * up(x))"
    if not orders:
        return Detection(None, f"the shapes of {shapes} do not chain {m} -> H -> {n} as {kind}")

    rows = _spread(X.shape[0], _CONFIRM_TOKENS)
    screen = _spread(rows.shape[0], _SCREEN_TOKENS)
    Xc, Yc, Xs, Ys = _take_tokens(X, Y, rows, screen)
    rounding = _matmul_rounding(orders[0][0][1], Xs)
    narrow = [Y.dtype] + [lin.dtype for _, lin in linears if lin.dtype is not None]
    tol = match_tolerance(min(narrow, key=lambda d: jnp.finfo(d).bits), rounding)

    def label(order, act):
        return f"{act}: " + " -> ".join(p for p, _ in order)

    errors: dict[str, float] = {}
    matches = []
    for order in orders:
        layers = tuple(lin for _, lin in order)
        screened = _every_reading(layers, Xs)
        confirmed = None
        for i, act in enumerate(ACTIVATION_NAMES):
            err = _rel(screened[i], Ys)
            if err <= tol and screen.shape[0] < Xc.shape[0]:
                # Confirm on more tokens.
                confirmed = _every_reading(layers, Xc) if confirmed is None else confirmed
                err = _rel(confirmed[i], Yc)
            errors[label(order, act)] = err
            if err <= tol:
                matches.append((order, act))
    if not matches:
        best = min(errors, key=errors.get)
        return Detection(None, f"no known activation reproduces the output of {type(module).__name__} as "
                               f"{kind} (closest: {best}, relative error {errors[best]:.1e} > {tol:.0e})",
                         errors, tol)
    if len(matches) > 1:
        names = ", ".join(label(o, a) for o, a in matches)
        return Detection(None, f"ambiguous: {names} all reproduce the output of {type(module).__name__} to "
                               f"{tol:.0e} on these tokens", errors, tol)
    order, act = matches[0]
    if len(order) == 2:
        spec = MLPSpec(fc1=order[0][0], fc2=order[1][0], activation=act)
    else:
        spec = GatedMLPSpec(gate=order[0][0], up=order[1][0], down=order[2][0], activation=act)
    return Detection(spec, f"{label(order, act)} (relative error {errors[label(order, act)]:.0e})", errors, tol)


def choose_spec(module: nnx.Module, path: str, mlp_specs, X: jax.Array,
                Y: jax.Array) -> tuple[MLPSpec | GatedMLPSpec | None, str]:
    """The spec :func:`~jaxbsd.compression.engine.compress_model` uses at ``path``, and how it was obtained.

    An explicit spec (``mlp_specs``) wins; jaxbsd's own MLP and gated MLP are known; otherwise
    :func:`find_spec` on the calibration tokens ``X (N, m)``, ``Y (N, n)``.

    Returns:
      ``(spec or None, status)``, status one of ``"given"``, ``"known: jaxbsd MLP (…)"``,
      ``"known: jaxbsd gated MLP (…)"``, ``"found: <activation>: <first> -> <second> (...)"``
      (a gated one: ``<gate> -> <up> -> <down>``), ``"not found: <reason>"``.
    """
    spec = spec_for(module, path, mlp_specs)
    if spec is not None:
        given = isinstance(mlp_specs, (MLPSpec, GatedMLPSpec)) or bool(mlp_specs and path in mlp_specs)
        kind = "gated MLP" if isinstance(spec, GatedMLPSpec) else "MLP"
        return spec, "given" if given else f"known: jaxbsd {kind} ({spec.activation})"
    found = find_spec(module, X, Y)
    return found.spec, str(found)


# ----------------------------------------------------------------------------- discovery


def _candidate(module: nnx.Module) -> bool:
    """Whether ``module`` could be an MLP: jaxbsd's own (a known spec), or 2 or 3 ``nnx.Linear``
    inside it and no parameters of its own or of another submodule (cheap, before any capture)."""
    if isinstance(module, nnx.Linear):
        return False
    if spec_for(module, "", None) is not None:
        return True
    linears = linear_children(module)
    return len(linears) in (2, 3) and not _foreign_params(module, linears)


def discover_mlps(model: nnx.Module, calibration, *, keep: dict | None = None) -> tuple[list[str], dict[str, str]]:
    """Every submodule of ``model`` recognised as an MLP, in model order (``compress_model(mlps=None)``).

    Candidates are the submodules that could be MLPs by structure (:func:`_candidate`); one eval-mode
    forward pass on ``calibration`` records what each computes, and a candidate is chosen when it maps
    tokens ``(..., m) -> (..., n)`` and its spec is known or found (:func:`choose_spec`). A chosen
    module inside another chosen one is left to the outer one.

    ``keep``, if given, receives what that forward pass recorded of the chosen modules, what
    :func:`~jaxbsd.compression.surgery.capture_calls` of them would return: ``keep["tokens"]``
    (``{path: (X, Y)}``), ``keep["order"]`` (their first calls' order) and ``keep["sequence"]``
    (every recorded call's path, in order).

    Returns:
      ``(paths, status)``: the chosen dotted paths in model order (graph order of
      ``nnx.iter_modules``), and for every candidate a line saying what was concluded.
    """
    candidates = [".".join(str(p) for p in path) for path, m in nnx.iter_modules(model) if path and _candidate(m)]
    if not candidates:
        return [], {}
    sequence: list[str] = []
    tokens, status = capture_tokenwise(model, calibration, candidates, sequence=sequence)
    status = {p: "not chosen: " + why for p, why in status.items()}
    chosen = []
    for path in candidates:
        if path not in tokens:
            continue
        if any(path.startswith(outer + ".") for outer in chosen):
            status[path] = "not chosen: inside " + next(o for o in chosen if path.startswith(o + "."))
            continue
        X, Y = tokens[path]
        module = functools.reduce(lambda node, part: child(node, part, path), parse_path(path), model)
        spec, how = choose_spec(module, path, None, X, Y)
        status[path] = ("chosen: " if spec is not None else "not chosen: ") + how
        if spec is not None:
            chosen.append(path)
    if keep is not None:
        keep.update(tokens={p: tokens[p] for p in chosen}, sequence=sequence,
                    order=list(dict.fromkeys(p for p in sequence if p in chosen)))
    return chosen, {p: status[p] for p in candidates}
