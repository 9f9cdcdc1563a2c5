"""Sites: one MLP to compress, with its sampled tokens, check tokens and Jacobian.

A :class:`Site` is what every method builds from: the module and its spec, its widths, ``S``
sampling points with the outputs there (the solver's data), and calibration tokens held apart
for the output error (``check_X``) and for fits that must be measured on other tokens
(``fit_X``), and, when the replacement is refined, the refinement's held-out tokens
(``held_X``), which no build sees. :func:`make_site` draws them from the tokens captured in a
forward pass;
:func:`site_jacobian` gives the structured (two-layer or gated spec) or dense Jacobian.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.solver import metrics
from jaxbsd.compression.specs import AnySpec, GatedMLPSpec, apply_module
from jaxbsd.solver.jacobians import GatedJacobian, gated_mlp_jacobian
from jaxbsd.models import count_params
from jaxbsd.models.capture import module_jacobians
from jaxbsd.solver.jacobians import StructuredJacobian, cpd_sq_norm, mlp_jacobian

__all__ = ["Site", "make_site", "site_jacobian", "gated_site_jacobian", "selection_tokens", "output_error",
           "apply_module", "param_dtype", "mlp_error_J", "gated_error_J", "CHECK_TOKENS", "same_site", "refined_error_tokens"]

#: Calibration tokens on which the relative output error is measured (and DRONE's inputs).
CHECK_TOKENS = 8192


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
      held_X, held_Y: ``(R, m)``, ``(R, n)``: tokens reserved for the refinement's held-out
        error (``reserve`` of :func:`make_site`), none of them among the sampling points (when
        the other tokens number at least ``S``), check or fit tokens, so no build fits on them.
        None when none are reserved.
      check_idx, fit_idx, held_idx: the indices of the check, fit and held tokens among the ``N``
        captured ones (so targets computed elsewhere for the same tokens can be matched to them).
      spec_status: how the spec was obtained (see :func:`jaxbsd.compression.specs.choose_spec`).
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
    check_idx: np.ndarray | None = None
    fit_idx: np.ndarray | None = None
    held_X: jax.Array | None = None
    held_Y: jax.Array | None = None
    held_idx: np.ndarray | None = None

    @property
    def gated(self) -> bool:
        return isinstance(self.spec, GatedMLPSpec)

    @functools.cached_property
    def jacobian(self):
        """``(jacobian, kind)``, computed on first use (see :func:`site_jacobian`)."""
        return _compute_jacobian(self)



@functools.partial(jax.jit, static_argnums=(1, 2))
def _draw_tokens(key: jax.Array, N: int, S: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Indices into ``N`` calibration tokens: ``S`` sampling points, ``C = min(N, 8192)`` check
    tokens, and ``min(N - C, C)`` other tokens, none of them check tokens."""
    k_sample, k_check = jax.random.split(key)
    sample = jax.random.choice(k_sample, N, (S,), replace=False)
    check = jax.random.choice(k_check, N, (min(N, CHECK_TOKENS),), replace=False)
    # The tokens outside the check set (drawn without changing the check draw), for fits whose
    # output error must be measured on tokens they did not see: in increasing order, as
    # ``setdiff1d`` gives them.
    outside_count = N - check.shape[0]
    take = min(outside_count, CHECK_TOKENS)
    if not take:
        return sample, check, jnp.zeros((0,), check.dtype)
    is_check = jnp.zeros((N,), bool).at[check].set(True)
    outside = jnp.nonzero(~is_check, size=outside_count)[0]
    pick = jax.random.choice(jax.random.fold_in(k_check, 1), outside_count, (take,), replace=False)
    return sample, check, outside[pick]


def make_site(path: str, module: nnx.Module, spec: AnySpec | None, X_all: jax.Array, Y_all: jax.Array,
              num_samples: int | None, key: jax.Array, *, validate: bool = True, reserve: int = 0) -> Site:
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
      reserve: tokens set apart first (``held_X``) for the refinement's held-out error: the check
        and fit tokens are drawn from the others, and the sampling points too when the others
        number at least ``S`` (else from all ``N``: a decoupling fits Jacobians there, not
        outputs). 0 (no refinement): the draws are those of a site without reserve.

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
    if not 0 <= reserve < N:
        raise ValueError(f"reserve: expected 0 <= reserve < {N} (the calibration tokens of {path!r}), got {reserve}")
    held = (np.sort(np.asarray(jax.random.choice(jax.random.fold_in(key, 3), N, (reserve,), replace=False)))
            if reserve else np.zeros((0,), np.int64))
    keep = np.setdiff1d(np.arange(N), held)
    sample, check, rest = (np.asarray(i) for i in _draw_tokens(key, keep.size, min(S, keep.size)))
    check, rest = keep[check], keep[rest]
    if keep.size >= S:
        sample = keep[sample]
    else:  # too few tokens outside the reserve for the S sampling points: draw them from all N
        sample = np.asarray(_draw_tokens(key, N, S)[0])
    probe = check[: min(64, check.shape[0])]
    X, (check_X, check_Y), (fit_X, fit_Y), (held_X, held_Y), (probe_X, probe_Y) = _take_rows(
        X_all, Y_all, sample, check, rest, held, probe)
    params = count_params(module)
    if validate:
        # Token by token: the module must reproduce what it computed inside the model (this
        # rejects e.g. attention, which mixes tokens and is no (..., m) -> (..., n) map).
        try:
            out = apply_module(module, probe_X)
        except Exception as err:  # noqa: BLE001 — any failure means the contract does not hold
            raise ValueError(f"mlps: {path!r} cannot be applied to (S, {m}) token vectors: {err}") from err
        if out.shape != (probe.shape[0], n) or not _close(out, probe_Y):
            raise ValueError(f"mlps: {path!r} does not map (..., {m}) -> (..., {n}) token by token "
                             "(applied to its own inputs alone it gives other outputs)")
        if spec is not None:
            spec.kernels(module, path)
            if not _close(_apply_spec(spec, module, probe_X), probe_Y):
                raise ValueError(f"mlp_specs: {path!r} does not compute {spec.describe()} on the calibration tokens")
    hidden = spec.kernels(module, path)[0].shape[1] if spec is not None else None
    biases = spec.biases(module, path) if isinstance(spec, GatedMLPSpec) else None
    return Site(path=path, module=module, spec=spec, m=int(m), n=int(n), hidden=hidden,
                params=params, X=X, F=apply_module(module, X), check_X=check_X, check_Y=check_Y,
                fit_X=fit_X, fit_Y=fit_Y, biases=biases, check_idx=check, fit_idx=rest,
                **({"held_X": held_X, "held_Y": held_Y, "held_idx": held} if reserve else {}))


@jax.jit
def _take_rows(X_all, Y_all, sample, check, rest, held, probe):
    """The site's token sets as one program: ``X_all[sample]`` and the ``(X, Y)`` rows of the check,
    fit, held-out and probe tokens (each an eager gather would compile on its own, per shape)."""
    return (X_all[sample], *((X_all[i], Y_all[i]) for i in (check, rest, held, probe)))


@nnx.jit(static_argnums=0)
def _apply_spec(spec: AnySpec, module: nnx.Module, X: jax.Array) -> jax.Array:
    return spec.apply(module, X)


def param_dtype(module: nnx.Module, default) -> Any:
    """The dtype of the module's parameters (the replacement keeps it), or ``default``."""
    leaves = jax.tree_util.tree_leaves(nnx.state(module, nnx.Param))
    return leaves[0].dtype if leaves else default


def _close(a, b, rtol: float = 1e-3) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.all(np.isfinite(a)) and np.linalg.norm(a - b) <= rtol * max(np.linalg.norm(b), 1e-30))


@functools.partial(jax.jit, static_argnums=2)
def gated_site_jacobian(X: jax.Array, kernels, spec: GatedMLPSpec) -> GatedJacobian:
    """The :class:`~jaxbsd.solver.jacobians.GatedJacobian` at ``X (S, m)`` of the gated MLP with
    ``kernels = (Kg, bg, Ku, bu, Kd, bd)`` (Flax layout), all cast to ``X``'s dtype (one program
    per shape)."""
    Kg, bg, Ku, bu, Kd, _ = (None if a is None else jnp.asarray(a, X.dtype) for a in kernels)
    return gated_mlp_jacobian(X, Kg.T, Ku.T, Kd.T, spec.h, gate_bias=bg, up_bias=bu,
                              activation_derivative=spec.h_prime)


def site_jacobian(site: Site):
    """``(jacobian, kind)``: the structured (with a spec) or dense ``(S, n, m)`` Jacobian of the site
    at its samples, ``kind`` ``"structured"`` or ``"dense"``. Computed once per site (both candidates
    of ``method="auto"`` share it)."""
    return site.jacobian


def _compute_jacobian(site: Site):
    if isinstance(site.spec, GatedMLPSpec):
        return gated_site_jacobian(site.X, site.spec.kernels(site.module, site.path), site.spec), "structured"
    if site.spec is not None:
        K1, b1, K2, _ = site.spec.kernels(site.module, site.path)
        return _structured_jacobian(site.X, K1, b1, K2, site.spec.h_prime), "structured"
    graphdef, state = nnx.split(site.module)
    J, _ = module_jacobians(graphdef, state, site.X, min(256, site.X.shape[0]))
    return J, "dense"


@functools.partial(jax.jit, static_argnums=4)
def _structured_jacobian(X, K1, b1, K2, h_prime) -> StructuredJacobian:
    """The two-layer MLP's structured Jacobian at ``X (S, m)`` as one program (kernels in Flax layout)."""
    b1 = jnp.zeros((K1.shape[1],), K1.dtype) if b1 is None else b1
    # The solver needs one dtype: the samples' (float64 tokens of a float32 model, say).
    K1, b1, K2 = (jnp.asarray(a, X.dtype) for a in (K1, b1, K2))
    return mlp_jacobian(X, K1.T, b1, K2.T, h_prime)


def mlp_error_J(jac: StructuredJacobian, K1: jax.Array, b1: jax.Array, K2: jax.Array, X: jax.Array, h_prime) -> float:
    """Error(𝒥) of a two-layer MLP ``K2ᵀ h(K1ᵀ x + b1)`` (a low-rank or pruned replacement, kernels in
    Flax layout ``K1 (m, k)``, ``K2 (k, n)``) against a structured Jacobian, from Gram products only.

    It is itself an MLP, so its Jacobian is ``[[V1', V0'ᵀ, D']]`` too, and
    ``‖𝒥 − 𝒥'‖² = ‖𝒥‖² − 2⟨𝒥, 𝒥'⟩ + ‖𝒥'‖²`` with ``⟨[[A,B,C]], [[A',B',C']]⟩ = Σ AᵀA' ∘ BᵀB' ∘ CᵀC'``.
    """
    return float(_mlp_error_J(jac, K1, b1, K2, X, h_prime))


@functools.partial(jax.jit, static_argnums=5)
def _mlp_error_J(jac: StructuredJacobian, K1, b1, K2, X, h_prime) -> jax.Array:
    # One program per shape: run eagerly, its dozen products would each compile on their own.
    V0, V1 = K1.T, K2.T
    D = h_prime(X @ K1 + b1[None, :])
    inner = jnp.sum((jac.V1.T @ V1) * (jac.V0 @ V0.T) * (jac.D.T @ D))
    ref = jac.sq_norm()
    return (ref - 2 * inner + cpd_sq_norm(V0, V1, D)) / ref


def gated_error_J(jac: GatedJacobian, kernels, X: jax.Array, spec: GatedMLPSpec) -> float:
    """Error(𝒥) of a gated replacement with ``kernels = (Kg, bg, Ku, bu, Kd, bd)``: its Jacobian is a
    gated one too, so ``‖𝒥 − 𝒥'‖² = ‖𝒥‖² − 2⟨𝒥, 𝒥'⟩ + ‖𝒥'‖²`` by :meth:`~jaxbsd.solver.jacobians.GatedJacobian.inner`."""
    other = gated_site_jacobian(X, kernels, spec)
    ref = jac.sq_norm()
    return float((ref - 2 * jac.inner(other) + other.sq_norm()) / ref)


def refined_error_tokens(site: Site) -> tuple[jax.Array, jax.Array]:
    """``(X, Y)``: the tokens a refined replacement's ``output_error`` is measured on, the check
    tokens and the refinement's reserved held-out ones together (with up to 8192 captured tokens,
    every one of them, as for an unrefined replacement): refinement trained on the check tokens."""
    if site.held_X is None:
        return site.check_X, site.check_Y
    return jnp.concatenate([site.check_X, site.held_X]), jnp.concatenate([site.check_Y, site.held_Y])


@nnx.jit
def output_error(module, X, Y):
    """Relative squared output error of ``module`` on ``X (N, m)`` against ``Y (N, n)``."""
    # One compiled program (not op-by-op dispatch) for up to 8192 tokens.
    return metrics.relative_error(Y, module(X))


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



def same_site(a: Site, b: Site) -> bool:
    """Same module and the very same sampled and check tokens (so a cached build is exact)."""
    same = (a.module is b.module and a.X.shape == b.X.shape and a.check_X.shape == b.check_X.shape)
    # Fine-tuning may have changed the module's weights in place: compare outputs too.
    return same and all((u is None and v is None) or (u is not None and v is not None and bool(jnp.array_equal(u, v)))
                        for u, v in ((a.X, b.X), (a.F, b.F), (a.check_X, b.check_X), (a.check_Y, b.check_Y),
                                     (a.fit_X, b.fit_X), (a.fit_Y, b.fit_Y), (a.held_X, b.held_X)))
