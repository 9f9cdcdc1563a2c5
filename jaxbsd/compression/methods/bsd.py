"""``method="bsd"``: the B-spline decoupling ``W1 g(W0 x)`` found by R-CMTF-BSD.

The solver fits the Jacobians and outputs of the MLP at the site's ``S`` samples
(:func:`jaxbsd.decouple`, restarts batched in one program); the restart kept is chosen by the
solver's objective or by the output error on held-out calibration tokens; optionally one restart
starts from the pruned MLP written as a decoupling (:func:`warm_init`). The result is a
:class:`~jaxbsd.models.decoupled_mlp.DecoupledMLP` with ``r (m + n + ν)`` parameters; in a basis of the
MLP's own activation beside a constant (:func:`mlp_form`, ``compress_model``'s ``"bsd"`` on a two-layer
MLP) it is an MLP, a :class:`~jaxbsd.models.compressed.PrunedMLP` with pruning's ``r (m + n + 1) + n``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.solver import metrics
from jaxbsd.solver.bases import AUGMENT_ACTIVATIONS, Augmented, BSpline
from jaxbsd.solver.cmtf import CMTFConfig, Status
from jaxbsd.compression.methods.base import IDENTITY, Built, Method, RestartChoice, refuse_options, register
from jaxbsd.compression.methods.prune import mlp_errors, pruned_mlp
from jaxbsd.compression.sites import Site, output_error, param_dtype, selection_tokens, site_jacobian
from jaxbsd.compression.devices import Devices, decouple_group
from jaxbsd.compression.progress import bars_wanted
from jaxbsd.solver.driver import check_init, decouple, problem
from jaxbsd.models.compressed import pruned_mlp_params
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.compression.methods.warm_start import (SELECTIONS, bias_residual, bias_tolerance, choose_restart,
                                                   decoupled_from_pruned, mlp_from_decoupled, restart_output_errors)

__all__ = ["BSD", "DEFAULT_CONFIG", "augmented", "exact_bias", "mlp_form", "warm_init"]

#: The solver template when none is given (the CLI's defaults: cubic splines, ν = 4, 300 sweeps).
DEFAULT_CONFIG = CMTFConfig(rank=1, basis=BSpline(3, 4), max_iter=300, tol=1e-8)


def mlp_form(site: Site, basis) -> bool:
    """Whether a decoupling of ``site`` in ``basis`` is an MLP of the site's own kind: ``basis`` is
    :class:`~jaxbsd.solver.bases.Augmented` with a constant inner basis
    (:attr:`~jaxbsd.solver.bases.Augmented.is_mlp`) and the activation of the site's two-layer MLP
    (by name). Such a decoupling is solved around the pruned MLP's output bias and built as a
    :class:`~jaxbsd.models.compressed.PrunedMLP` of ``rank`` units: pruning's parameters, exactly
    (:meth:`BSD.build`)."""
    return _own_activation(site, basis) and basis.is_mlp


def _own_activation(site: Site, basis) -> bool:
    """``basis`` is augmented with the activation of the site's two-layer MLP (by name)."""
    return (isinstance(basis, Augmented) and site.spec is not None and not site.gated
            and basis.activation == site.spec.activation)


def exact_bias(site: Site, rank: int, basis) -> bool:
    """Whether a rank-``rank`` warm start of ``site`` may keep ``rank`` units and carry the output
    bias in their constants: ``basis`` is :class:`~jaxbsd.solver.bases.Augmented` with the MLP's own
    activation (by name), and ``n ≤ rank ≤ H`` (at least the output width, so that ``b2`` is in the
    span of the kept units' output columns generically; at most the hidden width). Whether it is
    in that span is then checked on the pruned MLP (:func:`warm_init`)."""
    return _own_activation(site, basis) and site.n <= rank <= site.hidden


def warm_init(site: Site, rank: int, config: CMTFConfig):
    """The warm start of a rank-``rank`` decoupling of ``site``: its MLP pruned (fitted on the same
    tokens as ``method="prune"``) and written as a :class:`~jaxbsd.Decoupled` by
    :func:`jaxbsd.compression.methods.warm_start.decoupled_from_pruned` on the solver's samples — so,
    before any sweep, it is that pruned MLP up to the basis's approximation of the activation.

    * In an augmented basis with the MLP's activation at ``n ≤ rank ≤ H`` (:func:`exact_bias`):
      pruned to ``rank`` units, the output bias carried by the internal functions' constants
      (``c = argmin ‖K2ᵀ c − b2‖``), so the start is the rank-unit pruned MLP itself — when ``b2``
      is in the span of ``K2``'s rows to the solve dtype's precision
      (:func:`~jaxbsd.compression.methods.warm_start.bias_residual` at most
      :func:`~jaxbsd.compression.methods.warm_start.bias_tolerance`); otherwise as below.
    * Otherwise: pruned to ``rank − 1`` units, plus one constant internal function for the
      output bias. At rank 1: one unit, its output bias projected on its output column.

    Returns:
      ``(Decoupled, PrunedMLP)``.

    Raises:
      ValueError: naming ``mlp_specs`` without a two-layer spec, ``ranks`` when ``rank − 1``
        exceeds the hidden width.
    """
    if site.spec is None or site.gated:
        raise ValueError(f"mlp_specs: a warm start prunes the two nnx.Linear layers of an MLP; {site.path!r} "
                         f"({type(site.module).__name__}) needs a two-layer MLPSpec ({site.spec_status})")
    if exact_bias(site, rank, config.basis):
        pruned = pruned_mlp(site, rank, regularize=False, purpose=" for a warm start")[0]
        if bias_residual(pruned, site.X.dtype) <= bias_tolerance(site.X.dtype):
            return decoupled_from_pruned(pruned, site.X, config.basis, rank=rank), pruned
    k = max(1, rank - 1)
    if k > site.hidden:
        raise ValueError(f"ranks[{site.path!r}] = {rank}: a warm start keeps rank - 1 = {k} hidden units, "
                         f"but there are {site.hidden}")
    # Not regularized: with fewer tokens than coefficients the decoupling starts at random instead.
    pruned = pruned_mlp(site, k, regularize=False, purpose=" for a warm start")[0]
    return decoupled_from_pruned(pruned, site.X, config.basis, rank=rank), pruned


@dataclasses.dataclass(frozen=True)
class BSD(Method):
    """R-CMTF-BSD decoupling.

    Attributes:
      config: the solver template (basis, λ, sweeps…); its rank is replaced per MLP.
      restarts: random restarts, solved as one batched program; 0: the warm start alone (a
        ``warm_start`` of ``True`` or ``None``; where ``None`` finds no warm start, one random
        restart instead, the reason in ``warm_start_skipped``). With ``best_iterate`` that is the
        cheapest solve that can never end worse, on the selection tokens, than the pruned MLP it
        starts from.
      warm_start: ``True``: one more restart started from the pruned MLP (:func:`warm_init`; an
        error where that is impossible); ``False``: the random restarts alone; ``None``: the warm
        start wherever the MLP can be pruned to ``rank − 1`` units (a two-layer spec, ``rank − 1``
        at most its hidden width; ``rank`` units in an augmented basis where :func:`warm_init`
        says so), the random restarts alone elsewhere, with the reason in the report
        (``warm_start_skipped``).
      selection: the restart kept: ``"objective"`` (the solver's training objective on the
        samples) or ``"output"`` (the relative output error on held-out calibration tokens,
        :func:`~jaxbsd.compression.sites.selection_tokens`).
      best_iterate: ``True``: inside the solve, every restart keeps its iterate of lowest output
        error on those selection tokens (the warm start's initial one, the pruned MLP, included:
        ``jb.decouple(heldout=...)``), and ``config.patience`` (if set) stops it once that many
        sweeps have not improved on it; the report says which sweep was kept (``sweep_kept``) and
        why the solve stopped (``stopped``). Sites are then solved one at a time, never grouped.
        ``False`` (the default): each restart's lowest-objective iterate, as before.
      contain: ``True``: every MLP that can be written in the augmented basis exactly (a two-layer
        spec whose activation is a name of :data:`~jaxbsd.solver.bases.AUGMENT_ACTIVATIONS`) is
        solved as the decoupling that contains its pruned form, :func:`augmented` with its own
        activation and this ``config``'s other settings (:meth:`for_site`), so it is never worse
        on the selection tokens than pruning at its rank; every other MLP (gated, a dense
        Jacobian, a custom activation) as this object says. ``compress_model(method="bsd")`` has
        it on; ``False`` (the default of the class): every MLP as this object says.
    """

    config: CMTFConfig = DEFAULT_CONFIG
    restarts: int = 1
    warm_start: bool | None = None
    selection: str = "output"
    best_iterate: bool = dataclasses.field(default=False, metadata={IDENTITY: "unless-default"})
    contain: bool = dataclasses.field(default=False, metadata={IDENTITY: "unless-default"})

    name = "bsd"
    needs_spec = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.config, CMTFConfig):
            raise ValueError(f"config must be a jaxbsd.CMTFConfig, got {type(self.config).__name__}")
        if isinstance(self.restarts, bool) or not isinstance(self.restarts, int) or self.restarts < 0:
            raise ValueError(f"restarts must be an int >= 0, got {self.restarts!r}")
        if self.warm_start is not None and not isinstance(self.warm_start, bool):
            raise ValueError(f"warm_start must be True, False or None, got {self.warm_start!r}")
        if self.restarts == 0 and self.warm_start is False:
            raise ValueError("restarts=0 solves the warm start alone; it needs warm_start=True or None, "
                             "got warm_start=False")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if not isinstance(self.best_iterate, bool):
            raise ValueError(f"best_iterate must be True or False, got {self.best_iterate!r}")
        if not isinstance(self.contain, bool):
            raise ValueError(f"contain must be True or False, got {self.contain!r}")

    def for_site(self, site: Site) -> "BSD":
        """The decoupling ``site`` is solved with: with ``contain``, where its MLP is a two-layer
        MLP of a named activation the augmented basis has, :func:`augmented` with that activation
        (on this ``config``, ``patience`` 5 unless set); else this object."""
        spec = site.spec
        if (not self.contain or spec is None or site.gated or not isinstance(spec.activation, str)
                or spec.activation not in AUGMENT_ACTIVATIONS):
            return self
        return augmented(spec.activation, config=self.config, patience=self.config.patience or PATIENCE)

    @property
    def dof(self) -> int:
        return self.config.basis.num_coef

    def params(self, site: Site, rank) -> int:
        solved = self.for_site(site)
        if mlp_form(site, solved.config.basis):
            return pruned_mlp_params(site.m, rank, site.n)
        return metrics.params_bsd(site.m, site.n, rank, solved.dof)

    def max_rank(self, site: Site) -> int:
        if mlp_form(site, self.for_site(site).config.basis):
            return max(1, min(site.hidden, (site.params - site.n) // (site.m + site.n + 1)))
        return max(1, site.params // (site.m + site.n + self.for_site(site).dof))

    def check_site(self, site: Site) -> None:
        """The solver needs at least as many samples as the basis has coefficients."""
        super().check_site(site)
        S, dof = site.X.shape[0], self.for_site(site).dof
        if S < dof:
            tokens = site.check_X.shape[0] + (0 if site.fit_X is None else site.fit_X.shape[0])
            # S is all the tokens there are (the calibration is too small), or what num_samples asked for.
            name = "calibration" if S >= tokens else "num_samples"
            raise ValueError(f"{name}: {site.path!r} gets S = {S} sampling points from {tokens} calibration tokens, "
                             f"but a decoupling needs at least the basis's {dof} coefficients; calibrate on "
                             f"more tokens, sample more, or use a smaller basis")

    def random_restarts(self, init) -> int:
        """The random restarts beside the warm start ``init`` (None: none was built): ``restarts``,
        but one where ``restarts=0`` finds no warm start to solve alone."""
        return self.restarts if init is not None else max(self.restarts, 1)

    def _init(self, site: Site, rank: int, config: CMTFConfig) -> tuple[Any, str | None]:
        """``(warm start or None, why it was skipped or None)``."""
        if self.warm_start is None:  # wherever the MLP can be pruned to rank - 1 units
            if site.spec is None or site.gated:
                return None, f"no two-layer MLPSpec ({site.spec_status})"
            try:
                return warm_init(site, rank, config)[0], None
            except ValueError as err:
                return None, str(err)
        return (warm_init(site, rank, config)[0] if self.warm_start else None), None

    def prepare(self, site: Site, rank: int) -> tuple:
        """``(jacobian, kind, config, init, warm_start_skipped)``: what the solve of ``site`` at
        ``rank`` needs (the warm start built here, on the host), before the solver runs."""
        jac, kind = site_jacobian(site)
        config = dataclasses.replace(self.config, rank=int(rank))
        init, skipped = self._init(site, int(rank), config)
        return jac, kind, config, init, skipped

    def finish(self, site: Site, res, warm: bool, kind: str, skipped: str | None, start: float,
               output_errors: np.ndarray | None = None) -> Built:
        """The replacement from the solver's result ``res``: the restart kept by ``selection``,
        as a :class:`DecoupledMLP`, with its report fields (``output_errors``: the restarts'
        errors on the selection tokens where a program computed them already)."""
        choice = _choose_restart(res, site, self.selection, warm=warm, errors=output_errors)
        chosen = choice.restart
        module = DecoupledMLP.from_decoupled(res.restart_model(chosen), dtype=param_dtype(site.module, site.X.dtype))
        pick = lambda a: a[chosen]  # noqa: E731
        tracked = res.restarts.kept_sweep is not None
        status = int(pick(res.restarts.status))
        return Built(module, error_J=float(pick(res.restarts.error_J)), error_F=float(pick(res.restarts.error_F)),
                     jacobian=kind, output_error=float(output_error(module, site.check_X, site.check_Y)),
                     seconds=time.perf_counter() - start,
                     notes=sampling_notes(site, int(module.W0[...].shape[0])),  # W0: (rank, m)
                     choice=choice, status=status, iterations=int(pick(res.restarts.iterations)),
                     sweep_kept=int(pick(res.restarts.kept_sweep)) if tracked else None,
                     stopped=Status(status).name.lower() if tracked else None, warm_start_skipped=skipped)

    def build(self, site: Site, rank, key: jax.Array, *,
              judge: Callable[[nnx.Module], float] | None = None, refine=None) -> Built:
        solved = self.for_site(site)
        if solved is not self:
            return solved.build(site, rank, key, judge=judge, refine=refine)
        if mlp_form(site, self.config.basis):
            return self.build_mlp(site, int(rank), key)
        start = time.perf_counter()
        jac, kind, config, init, skipped = self.prepare(site, int(rank))
        # shard=None: one MLP's solve on one device, whatever the count. Spreading its samples or
        # restarts over the devices reorders the reductions, whose rounding the sweeps amplify: the
        # model would depend on the device count. Devices serve a grouped run's blocks instead.
        heldout = selection_tokens(site)[:2] if self.best_iterate else None
        res = decouple(jac, site.F, site.X, config, key=key, restarts=self.random_restarts(init), init=init,
                       shard=None, progress=bars_wanted(), heldout=heldout)  # the bar of Execution(progress=True)
        return self.finish(site, res, init is not None, kind, skipped, start)

    def build_mlp(self, site: Site, rank: int, key: jax.Array) -> Built:
        """The decoupling of ``site`` in an MLP-form basis (:func:`mlp_form`), as an MLP of ``rank`` units.

        The warm start is the MLP pruned to ``rank`` units without its output bias ``b2``
        (:func:`~jaxbsd.compression.methods.warm_start.decoupled_from_pruned`, exact at every rank);
        the solver fits the outputs less ``b2`` (and the held-out tokens' outputs less ``b2`` for
        the best iterate), and the iterate kept is written back as an MLP with ``b2`` added
        (:func:`~jaxbsd.compression.methods.warm_start.mlp_from_decoupled`): ``rank (m + n + 1) + n``
        parameters, pruning's count at every rank. Where the kept iterate is the warm start's
        sweep 0, the module is that pruned MLP itself. Without a warm start (``warm_start=False``,
        or ``None`` where the MLP cannot be pruned unregularized or ``rank`` exceeds its hidden width),
        random restarts and no ``b2``.
        """
        start = time.perf_counter()
        jac, kind = site_jacobian(site)
        config = dataclasses.replace(self.config, rank=rank)
        pruned, skipped = None, None
        if self.warm_start is not False:
            try:
                if rank > site.hidden:
                    raise ValueError(f"ranks[{site.path!r}] = {rank}: a warm start prunes to {rank} hidden units, "
                                     f"but there are {site.hidden}")
                pruned = pruned_mlp(site, rank, regularize=False, purpose=" for a warm start")[0]
            except ValueError as err:
                if self.warm_start:
                    raise
                skipped = str(err)
        dtype = site.F.dtype
        bias = jnp.zeros((site.n,), dtype) if pruned is None else jnp.asarray(pruned.fc2.bias[...], dtype)
        init = None if pruned is None else decoupled_from_pruned(pruned, site.X, config.basis, output_bias=False)
        X_sel, Y_sel, _ = selection_tokens(site)
        centred = Y_sel - bias[None, :].astype(Y_sel.dtype)
        res = decouple(jac, site.F - bias[None, :], site.X, config, key=key, restarts=self.random_restarts(init),
                       init=init, shard=None, progress=bars_wanted(),
                       heldout=(X_sel, centred) if self.best_iterate else None)
        # The restarts' errors on the selection tokens: the best-iterate solve measured them already (against
        # Y − b2); rescaled to the outputs themselves.
        measured = res.restarts.heldout_error
        errors = (restart_output_errors(res, X_sel, centred) if measured is None else np.asarray(measured, np.float64))
        errors = errors * float(jnp.sum(centred**2) / jnp.sum(Y_sel**2))
        choice = _choose_restart(res, site, self.selection, warm=init is not None, errors=errors)
        pick = lambda a: a[choice.restart]  # noqa: E731
        tracked = res.restarts.kept_sweep is not None
        if choice.restart_warm and tracked and int(pick(res.restarts.kept_sweep)) == 0:
            module = pruned  # the start kept: the pruned MLP, not its round trip through the decoupled form
        else:
            module = mlp_from_decoupled(res.restart_model(choice.restart), bias,
                                        dtype=param_dtype(site.module, site.X.dtype))
        error_J, error_F = mlp_errors(site, module, jac)
        status = int(pick(res.restarts.status))
        return Built(module, error_J=error_J, error_F=error_F, jacobian=kind,
                     output_error=float(output_error(module, site.check_X, site.check_Y)),
                     seconds=time.perf_counter() - start, notes=sampling_notes(site, rank), choice=choice,
                     status=status, iterations=int(pick(res.restarts.iterations)),
                     sweep_kept=int(pick(res.restarts.kept_sweep)) if tracked else None,
                     stopped=Status(status).name.lower() if tracked else None, warm_start_skipped=skipped)

    def group_inputs(self, sites, ranks) -> tuple[list, list, list]:
        """``(preps, problems, inits)`` of several sites: :meth:`prepare` of each, its validated
        :class:`~jaxbsd.solver.cmtf.Problem`, and its validated warm start (None where it has none)."""
        preps = [self.prepare(site, int(rank)) for site, rank in zip(sites, ranks)]
        problems = [problem(jac, site.F, site.X) for (jac, *_), site in zip(preps, sites)]
        inits = [None if p[3] is None else check_init(p[3], prob, p[2]) for p, prob in zip(preps, problems)]
        return preps, problems, inits

    def build_group(self, sites, ranks, keys, *, judges=None, refiners=None, refine_group=None,
                    devices=None) -> list[Built]:
        """The decouplings of several sites of one shape and rank, solved as one program with a
        leading block axis (:func:`jaxbsd.compression.devices.decouple_group`): restarts, warm
        starts and the objective's selection inside it; the held-out selection and the module per
        block after it, as :meth:`build` does. Sites whose problems differ in structure (a warm
        start for some only, say) are solved in one program per structure."""
        # The grouped program has no held-out tokens (a best-iterate solve, contain's too, runs one site at a
        # time) and builds decoupled modules (an MLP-form solve is built as an MLP by build_mlp).
        if self.best_iterate or any(self.for_site(site) is not self or mlp_form(site, self.config.basis)
                                    for site in sites):
            return [self.build(site, rank, key) for site, rank, key in zip(sites, ranks, keys)]
        start = time.perf_counter()
        preps, problems, inits = self.group_inputs(sites, ranks)
        buckets: dict = {}
        for i, (prep, prob, init) in enumerate(zip(preps, problems, inits)):
            signature = (jax.tree_util.tree_structure((prob, init)), prep[2],
                         tuple((a.shape, a.dtype) for a in jax.tree_util.tree_leaves((prob, init))))
            buckets.setdefault(signature, []).append(i)
        results: dict[int, object] = {}
        for members in buckets.values():
            solved = decouple_group([problems[i] for i in members], preps[members[0]][2], [keys[i] for i in members],
                                    None if inits[members[0]] is None else [inits[i] for i in members],
                                    restarts=self.random_restarts(inits[members[0]]),
                                    devices=devices if devices is not None else Devices())
            results.update(zip(members, solved))
        seconds = (time.perf_counter() - start) / len(sites)
        builds = []
        for i, (site, prep) in enumerate(zip(sites, preps)):
            built = self.finish(site, results[i], inits[i] is not None, prep[1], prep[4], time.perf_counter())
            builds.append(built.replace(seconds=built.seconds + seconds))  # the group's solve, shared evenly
        return builds


#: Sweeps without a better iterate after which :func:`augmented` stops.
PATIENCE = 5


def augmented(activation: str, inner=BSpline(0, 1), *, patience: int = PATIENCE, config: CMTFConfig = DEFAULT_CONFIG) -> BSD:
    """The decoupling that contains the pruned MLP it starts from: the basis
    ``Augmented(inner, activation)`` (``activation``: the MLP's own, by name), the warm start
    alone (``restarts=0``), the iterate of lowest error on the selection tokens kept
    (``best_iterate``, the warm start's sweep 0 included), stopped after ``patience`` sweeps without
    a better one; the other settings ``config``'s (:data:`DEFAULT_CONFIG`). With the constant inner
    basis (the default) the decoupling is an MLP of the site's kind (:func:`mlp_form`): solved
    around the pruned MLP's output bias, built as a :class:`~jaxbsd.models.compressed.PrunedMLP`,
    with pruning's parameters and units at every rank; a larger inner basis gives a
    :class:`~jaxbsd.models.decoupled_mlp.DecoupledMLP` with ``ν + 1`` coefficients a unit
    (``benchmarks/minilm.py`` measures those beside it)."""
    config = dataclasses.replace(config, basis=Augmented(inner, activation), patience=patience)
    return BSD(config=config, restarts=0, best_iterate=True)


def sampling_notes(site: Site, rank: int) -> str | None:
    """What the report must say when the ``S`` sampling points cannot determine a decoupling of
    ``rank``, or when its output error is measured on the samples themselves; None otherwise.

    Fewer samples than internal functions (``S < rank``): each ``g_i`` and the factors ``G``,
    ``R`` (``(S, rank)``) are fitted to fewer points than there are units, and the output error
    on other tokens grows fast. Measured on a 16 → 64 → 16 GELU MLP at rank 41 (50 sweeps, the
    warm start, no refinement; relative output error on 512 tokens): S = 4: 5.5 (550 %), 8: 0.32,
    16: 0.11, 41: 0.068, 164: 0.049.
    """
    S = int(site.X.shape[0])
    tokens = int(site.check_X.shape[0] + (0 if site.fit_X is None else site.fit_X.shape[0]))
    notes = []
    if S < rank:
        notes.append(f"S = {S} sampling points for rank {rank}: fewer samples than internal functions cannot "
                     f"determine the decoupling, and its output error on other tokens can be large; sample at "
                     f"least the rank (num_samples), or lower the rank")
    if S >= tokens:
        notes.append(f"output_error is in-sample: all {tokens} calibration token(s) are sampling points, none "
                     f"was held out; calibrate on more tokens for an out-of-sample figure")
    return "; ".join(notes) or None


def _choose_restart(res, site: Site, selection: str, *, warm: bool, errors=None) -> RestartChoice:
    """The restart kept (by ``selection``) and what to report about the choice; ``errors``: the
    restarts' output errors on the selection tokens, if computed already."""
    X, Y, kind = selection_tokens(site)
    errors = restart_output_errors(res, X, Y) if errors is None else np.where(np.isfinite(errors), errors, np.inf)
    chosen = choose_restart(res, selection, errors)
    by_output = choose_restart(res, "output", errors)
    count = errors.shape[0]
    return RestartChoice(
        selection=selection, restart=chosen, restart_warm=bool(warm and chosen == count - 1),
        restart_by_objective=int(res.best_restart), restart_by_output=by_output,
        output_error_heldout=float(errors[chosen]) if np.isfinite(errors[chosen]) else None,
        # None for a restart whose model is not finite (JSON-able records, no inf).
        restart_output_errors=tuple(float(e) if np.isfinite(e) else None for e in errors),
        selection_tokens=kind)


def _from_options(config=None, restarts=1, warm_start=None, selection=None, best_iterate=False, contain=True,
                  **options):
    refuse_options("bsd", options, ())
    selection = "output" if selection is None else selection
    return BSD(config=DEFAULT_CONFIG if config is None else config, restarts=restarts, warm_start=warm_start,
               selection=selection, best_iterate=best_iterate, contain=contain)


register("bsd", _from_options)
