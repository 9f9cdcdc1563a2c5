"""The compression engine: plan the ranks, then replace one MLP at a time.

:func:`run` is the algorithm both entry points share — :func:`compress_model` (any NNX model,
a calibration batch) and :func:`jaxbsd.compression.blockwise.compress` (the paper's block-by-block
run over a data set, fine-tuning after each step):

1. capture every MLP's tokens on the original model and build its :class:`~jaxbsd.compression.sites.Site`;
2. plan the ranks: explicit, or from the budget ``(1 − ρ)·P`` shared uniformly or greedily
   (:mod:`jaxbsd.compression.budget`), priced by the method;
3. resume after the last finished MLP of a saved state, if any;
4. for each MLP in order: capture again on the current model, build the replacement with the
   method, put it in place, run the caller's step (fine-tuning), save the state.

The engine never asks which method it holds (:mod:`jaxbsd.compression.methods.base`), and never how
the tokens are obtained: a :class:`CalibrationSource` gives them, with the keys of each draw.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.cmtf import CMTFConfig
from jaxbsd.compression import budget as budgets
from jaxbsd.compression.distill import DISTILL_STREAM, Distill, distill_model, teacher_outputs
from jaxbsd.compression import grouped
from jaxbsd.compression.devices import Devices, check_mesh, shard_batch
from jaxbsd.compression.methods import JUDGES, Method, get_method, method_names
from jaxbsd.compression.refine import Refine, refine_group, reserved_tokens, site_refiner
from jaxbsd.compression.report import REPORT_FIELDS, CompressionReport, MLPReport
from jaxbsd.compression.sites import Site, make_site, output_error, refined_error_tokens, same_site
from jaxbsd.compression.specs import AnySpec, GatedMLPSpec, MLPSpec, choose_spec, discover_mlps
from jaxbsd.compression.state import RunState, run_id
from jaxbsd.compression.surgery import capture_calls, get_submodule, model_outputs, output_judge, parse_path, set_submodule
from jaxbsd.models import count_params
from jaxbsd.warm_start import SELECTIONS

__all__ = ["compress_model", "resolve_method", "BatchCalibration", "CalibrationSource", "Plan", "Step", "PLAN", "run", "site_at",
           "execution_order", "METHODS", "ALLOCATIONS"]

#: The stage of the planning capture (on the original model); steps are numbered from 1.
PLAN = 0


class CalibrationSource(Protocol):
    """Where the engine's tokens, keys and judges come from.

    A stage is :data:`PLAN` (the original model, before any replacement) or a step number
    (1-based, the current model before that step's replacement).
    """

    #: Whether step 1 sees exactly the planning tokens (same inputs, same keys): its site is
    #: then the planning site, not a second capture.
    first_step_reuses_plan: bool

    def capture(self, model: nnx.Module, paths: Sequence[str], stage: int) -> tuple[dict, list[str]]:
        """``({path: (X (N, m), Y (N, n))}, paths in order of their first call)``."""

    def keys(self, path: str, stage: int) -> tuple[jax.Array, jax.Array]:
        """``(draw key, build key)``: the draw of the site's tokens, the method's randomness."""

    def num_samples(self, path: str, rank: int | None, stage: int) -> int | None:
        """``S`` at a rank (None: the planning draw; returning None means ``min(N, 256)``)."""

    def judge(self, model: nnx.Module, stage: int) -> tuple[Any, Any]:
        """``(inputs, reference outputs)`` on which the whole model judges candidates at a step
        (called on the original model, before any replacement)."""

    def reference(self, model: nnx.Module, path: str, stage: int) -> jax.Array:
        """``Y (N, n)``: the original model's outputs of ``path`` on the tokens a capture at
        ``stage`` gives, in the same order (called on the original model, before any
        replacement; refinement's ``"consistent"`` target)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to compress and how (the caller's validated arguments).

    Attributes:
      paths: the MLPs' dotted paths.
      method: a :class:`~jaxbsd.compression.methods.Method`.
      reduction: ``ρ`` (the budget), or None with ``ranks``.
      ranks: ``{path: rank}`` (explicit), or None with ``reduction``.
      allocation: ``"uniform"`` or ``"greedy"``.
      order: ``"back-to-front"``, ``"front-to-back"`` or the paths in order.
      mlp_specs: specs given by the caller (see :func:`jaxbsd.compression.specs.choose_spec`).
      structured: read recognised MLPs by their spec even where the method does not need it
        (structured Jacobians); ``False``: dense Jacobians for such methods.
      refine: the refinement stage (:class:`~jaxbsd.compression.refine.Refine`), or None.
      devices: None: one MLP at a time; a :class:`~jaxbsd.compression.devices.Devices`: the MLPs
        are independent (the caller says so: back to front, no step between them) and are solved
        in groups (:mod:`jaxbsd.compression.grouped`) on those devices.
    """

    paths: tuple[str, ...]
    method: Method
    reduction: float | None = None
    ranks: Mapping[str, int] | None = None
    allocation: str = "uniform"
    order: str | tuple[str, ...] = "back-to-front"
    mlp_specs: Any = None
    structured: bool = True
    refine: Refine | None = None
    devices: Devices | None = None


@dataclasses.dataclass(frozen=True)
class Step:
    """One finished replacement: what the caller's record is made from."""

    step: int
    path: str
    site: Site
    module: nnx.Module
    rank: Any
    info: dict[str, Any]
    seconds: float
    after: dict[str, Any]
    seconds_after: float


def execution_order(order, first_calls: list[str]) -> list[str]:
    if isinstance(order, str):
        return list(first_calls) if order == "front-to-back" else list(first_calls)[::-1]
    return list(order)


def _site(model, plan: Plan, source: CalibrationSource, path: str, tokens, stage: int, S: int | None) -> Site:
    """The site of ``path`` from its captured ``tokens = (X_all, Y_all)``, with ``S`` samples drawn
    by the stage's key, and its spec (given, known, or found on the tokens). When the plan refines,
    the refinement's held-out tokens are set apart first (:func:`~jaxbsd.compression.refine.reserved_tokens`):
    no build, greedy candidate or judge on block tokens sees them."""
    X_all, Y_all = tokens
    module = get_submodule(model, path)
    if plan.structured or plan.method.needs_spec:
        spec, status = choose_spec(module, path, plan.mlp_specs, X_all, Y_all)
    else:
        spec, status = None, "not used (structured=False)"
    site = make_site(path, module, spec, X_all, Y_all, S, source.keys(path, stage)[0],
                     reserve=reserved_tokens(plan.refine, int(X_all.shape[0])))
    return dataclasses.replace(site, spec_status=status)


def site_at(model, plan: Plan, source: CalibrationSource, path: str, stage: int, S: int | None) -> Site:
    """The site of ``path`` on the current model at ``stage``: its tokens captured anew, ``S`` samples."""
    return _site(model, plan, source, path, source.capture(model, [path], stage)[0][path], stage, S)


def _shorter(site: Site, S: int) -> Site:
    """The site with its first ``S`` samples (a prefix of a draw without replacement is one too)."""
    return site if site.X.shape[0] == S else dataclasses.replace(site, X=site.X[:S], F=site.F[:S])


def _plan_ranks(model, plan: Plan, source, tokens: dict, sites: dict[str, Site], params_total: int):
    """``({path: rank}, {(path, rank): (site, module, info)})``: the ranks, and the builds the
    greedy allocation already made (reused where step 1 sees the same site)."""
    method, cache = plan.method, {}
    if plan.reduction is None:
        return {p: method.check_rank(sites[p], int(r)) for p, r in plan.ranks.items()}, cache
    ordered = [sites[p] for p in plan.paths]
    budget = budgets.budget_for(plan.reduction, params_total, ordered)
    budgets.check_budget(method, ordered, budget, plan.reduction)
    chosen = budgets.uniform_ranks(method, ordered, budget)
    if plan.allocation == "greedy":
        floor = sum(method.params(s, method.min_rank(s)) for s in ordered)
        errors = []
        for s, uniform in zip(ordered, chosen):
            alone = budget - floor + method.params(s, method.min_rank(s))
            candidates = budgets.greedy_candidates(method, s, uniform, alone)
            # S may grow with the rank: draw the most any candidate needs (same key, so the same
            # check tokens), and give each candidate a prefix of it (a draw without replacement too).
            sizes = {r: source.num_samples(s.path, r, PLAN) for r in candidates}
            widest = max((S for S in sizes.values() if S is not None), default=None)
            big = s if widest in (None, s.X.shape[0]) else _site(model, plan, source, s.path, tokens[s.path],
                                                                  PLAN, widest)
            errs = {}
            for r in candidates:
                site = big if sizes[r] is None else _shorter(big, sizes[r])
                module, info = method.build(site, r, source.keys(s.path, PLAN)[1])
                cache[(s.path, r)] = (site, module, info)
                errs[r] = info["output_error"]
            errors.append(errs)
        chosen = budgets.greedy_ranks(method, ordered, budget, errors, chosen)
    return dict(zip(plan.paths, chosen)), cache


def model_digest(model: nnx.Module) -> str:
    """A hash of every variable of ``model`` (names, shapes, dtypes, values): part of a resumable
    run's identity, so a state is never loaded over another model of the same size."""
    h = hashlib.sha256()
    for path, var in sorted(nnx.to_flat_state(nnx.state(model)), key=lambda kv: tuple(map(str, kv[0]))):
        value = var[...]
        if isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        a = np.asarray(value)
        h.update(".".join(map(str, path)).encode() + str(a.shape).encode() + str(a.dtype).encode() + a.tobytes())
    return h.hexdigest()[:16]


def calibration_digest(tokens: dict) -> dict[str, str]:
    """A hash of each MLP's planning tokens (part of a resumable run's identity)."""
    out = {}
    for path, (X, _) in tokens.items():
        a = np.asarray(X)
        out[path] = hashlib.sha256(str(a.shape).encode() + str(a.dtype).encode() + a.tobytes()).hexdigest()[:16]
    return out


def run(
    model: nnx.Module,
    plan: Plan,
    source: CalibrationSource,
    *,
    record: Callable[[Step], dict],
    after_step: Callable[[nnx.Module, str, int], dict | None] | None = None,
    state: Callable[[dict], RunState | None] | None = None,
    on_record: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Compress ``model`` in place, one MLP at a time; the records of every step (resumed ones included).

    Args:
      model: any NNX module; changed in place.
      plan: what to compress and how (:class:`Plan`).
      source: tokens, keys and judges (:class:`CalibrationSource`).
      record: turns a finished :class:`Step` into the caller's JSON record.
      after_step: ``after_step(model, path, step) -> dict | None`` once the replacement is in
        place (fine-tuning and its keep-or-discard rule); what it returns is the step's ``after``.
      state: ``state(identity) -> RunState | None``: the run's state directory, given the run's
        identity (configuration, model size, calibration digest), or None (no resume).
      on_record: called with each record once it is saved.
    """
    method = plan.method
    params_total = count_params(model)
    digest = model_digest(model) if state is not None else None  # before anything is replaced
    # 1. Every MLP's tokens on the original model; its site (this validates every path first).
    tokens, first_calls = source.capture(model, plan.paths, PLAN)
    sites = {p: _site(model, plan, source, p, tokens[p], PLAN, source.num_samples(p, None, PLAN)) for p in plan.paths}
    for p in plan.paths:
        method.check_site(sites[p])
    order = execution_order(plan.order, first_calls)
    # Judges see the original model's outputs, before any replacement or resumed state.
    judges = {step: source.judge(model, step) for step in range(1, len(order) + 1)} if method.judges_by_model else {}
    refining = plan.refine is not None and plan.refine.steps > 0
    references = ({step: source.reference(model, path, step) for step, path in enumerate(order, start=1)}
                  if refining and plan.refine.target == "consistent" else {})
    # 2. The ranks, planned on the original model (a resumed run plans exactly what the first did).
    rank_of, cache = _plan_ranks(model, plan, source, tokens, sites, params_total)
    # 3. Resume.
    run_state = None if state is None else state({
        "method": method.to_dict(), "paths": list(plan.paths), "reduction": plan.reduction,
        "ranks": None if plan.ranks is None else dict(plan.ranks), "allocation": plan.allocation,
        "order": order, "structured": plan.structured, "params": params_total, "model": digest,
        "refine": None if not refining else plan.refine.to_dict(),
        "specs": {p: sites[p].spec_status for p in plan.paths}, "calibration": calibration_digest(tokens)})
    records = [] if run_state is None else run_state.load(model)
    # 4. The replacements, group by group: one MLP a group when they run one at a time.
    return execute(model, plan, source, order, sites, rank_of, cache, judges, references, records,
                   record=record, after_step=after_step, run_state=run_state, on_record=on_record)


def _batches(plan: Plan, todo: list[tuple[int, str]], sites: dict[str, Site], rank_of: dict) -> list[list]:
    """The ``(step, path)`` of ``todo`` as the loop runs them: groups of one shape and rank where the
    MLPs are independent (:func:`jaxbsd.compression.grouped.groups`), one MLP a group otherwise."""
    if plan.devices is None:
        return [[member] for member in todo]
    return grouped.groups(todo, sites, rank_of, plan.devices.chunk)


def _refine_skipped(plan: Plan, site: Site) -> dict:
    """The report of a refinement that could not run: too few tokens to hold one out."""
    tokens_seen = site.check_X.shape[0] + (0 if site.fit_X is None else site.fit_X.shape[0])
    return {"target": plan.refine.target, "steps": 0, "steps_kept": 0,
            "skipped": f"{tokens_seen} calibration token(s); refinement needs 2"}


def _build(model, plan: Plan, members, sites, rank_of, cache, judges, refiners, build_key) -> dict[int, tuple]:
    """``{step: (module, info)}``: each member's replacement as its method builds it, the greedy
    allocation's build reused where it is exactly this one; several members of a group built
    together (:func:`jaxbsd.compression.grouped.build_together`)."""
    method = plan.method
    builds: dict[int, tuple] = {}
    pending = []
    for step, path in members:
        hit = cache.get((path, rank_of[path]))
        if hit is not None and same_site(hit[0], sites[path]) and not (refiners[step] and method.refines_candidates):
            builds[step] = (hit[1], dict(hit[2]))  # the greedy allocation already built exactly this
        else:
            pending.append((step, path))
    if len(pending) == 1:  # one MLP: the program of one block at a time
        step, path = pending[0]
        judge = output_judge(model, path, *judges[step]) if step in judges else None
        builds[step] = method.build(sites[path], rank_of[path], build_key(path, step), judge=judge,
                                    refine=refiners[step] if method.refines_candidates else None)
    elif pending:
        builds.update(grouped.build_together(model, plan, pending, sites, rank_of, build_key, judges, refiners))
    return builds


def _refine_stage(plan: Plan, members, builds: dict[int, tuple], refiners) -> dict[int, tuple]:
    """The engine's refinement stage, the same for every method that does not refine its own
    candidates (and for builds that came back unrefined): one program for a group's replacements."""
    method = plan.method
    staged = [s for s, _ in members if refiners[s] is not None and not method.refines_candidates
              and "refine" not in builds[s][1]]
    if not staged:
        return builds
    modules, stage_refiners = [builds[s][0] for s in staged], [refiners[s] for s in staged]
    refined = ([stage_refiners[0](modules[0])] if len(staged) == 1
               else refine_group(modules, stage_refiners, plan.devices))
    out = dict(builds)
    for s, (module, refine_info) in zip(staged, refined):
        out[s] = (module, dict(builds[s][1], refine=refine_info))
    return out


def _reported(plan: Plan, site: Site, module, info: dict, refined: bool) -> dict:
    """The build's report as the run returns it: once refined, the output error of the module returned
    (and the error as built kept beside); a refinement that could not run said so."""
    if refined:
        info["refine"] = dict(info["refine"], output_error_built=info["output_error"])
        info["output_error"] = float(output_error(module, *refined_error_tokens(site)))
    elif plan.refine is not None and plan.refine.steps > 0:
        info["refine"] = _refine_skipped(plan, site)
    return info


def execute(model, plan: Plan, source, order, sites, rank_of, cache, judges, references, records, *,
            record, after_step=None, run_state=None, on_record=None) -> list[dict]:
    """The one compression loop: the MLPs of ``order`` not in ``records`` (a resumed state's), group by
    group (:func:`_batches`); each group's sites, replacements, refinement and report, then each
    replacement put in place, the caller's ``after_step``, its record, the state saved (by process 0)
    before the next group's captures and judges look at the model. The records in step order.

    One MLP at a time (``plan.devices`` None), each MLP's tokens are captured again on the current
    model (earlier replacements and fine-tuning change what it sees), but for step 1 of a source whose
    first step sees the planning tokens; grouped, every MLP's site is the planning capture's (the
    MLPs are independent: none is fed by another replaced before it)."""
    method = plan.method
    refining = plan.refine is not None and plan.refine.steps > 0
    build_key = lambda path, step: source.keys(path, step)[1]  # noqa: E731
    # A resumed state holds the first steps of a run one MLP at a time, and whole groups of a grouped one.
    done = set(order[:len(records)]) if plan.devices is None else {r["path"] for r in records}
    todo = [(step, path) for step, path in enumerate(order, start=1) if path not in done]
    resumed = bool(records)
    for index, members in enumerate(_batches(plan, todo, sites, rank_of)):
        start = time.perf_counter()
        here = dict(sites)
        if plan.devices is None:
            (step, path), = members
            if not (step == 1 and source.first_step_reuses_plan and not resumed):
                here[path] = site_at(model, plan, source, path, step,
                                     source.num_samples(path, method.sample_rank(rank_of[path]), step))
        refiners = {step: site_refiner(plan.refine, here[path], references.get(step),
                                       jax.random.fold_in(build_key(path, step), 2))
                    if refining else None for step, path in members}
        builds = _build(model, plan, members, here, rank_of, cache, judges, refiners, build_key)
        builds = _refine_stage(plan, members, builds, refiners)
        seconds = (time.perf_counter() - start) / len(members)
        paths = [p for _, p in members]
        for step, path in members:
            module, info = builds[step]
            info = _reported(plan, here[path], module, info, refiners[step] is not None)
            if plan.devices is not None:
                info["group"] = {"index": index, "paths": paths, "devices": plan.devices.size}
            set_submodule(model, path, module)
            start_after = time.perf_counter()
            after = (after_step(model, path, step) if after_step is not None else None) or {}
            records.append(record(Step(step=step, path=path, site=here[path], module=module, rank=rank_of[path],
                                       info=info, seconds=seconds, after=after,
                                       seconds_after=time.perf_counter() - start_after)))
        if run_state is not None and jax.process_index() == 0:
            run_state.save(model, records)
        if on_record is not None:
            for r in records[-len(members):]:
                on_record(r)
    if plan.devices is None:
        return records
    position = {p: i for i, p in enumerate(order)}
    return sorted(records, key=lambda r: position[r["path"]])


# ----------------------------------------------------------------------------- compress_model

ALLOCATIONS = ("uniform", "greedy")
#: The names ``method=`` accepts (each a registered :class:`~jaxbsd.compression.methods.Method`).
METHODS = method_names()


def _key_is_valid(key) -> bool:
    typed = isinstance(key, jax.Array) and key.shape == () and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    legacy = isinstance(key, jax.Array) and key.shape == (2,) and key.dtype == jnp.uint32
    return typed or legacy


def _check_finite(what: str, value) -> None:
    for leaf in jax.tree.leaves(value):
        a = np.asarray(leaf) if isinstance(leaf, (jax.Array, np.ndarray)) else None
        if a is not None and np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
            raise ValueError(f"calibration: {what} holds NaN or inf; calibrate on finite inputs")


class BatchCalibration:
    """The :class:`CalibrationSource` of :func:`compress_model`: one calibration batch (or a
    callable running the forward pass) for every stage, and per MLP the keys
    ``fold_in(fold_in(key, i), 0)`` (draw) and ``fold_in(fold_in(key, i), 1)`` (build)."""

    first_step_reuses_plan = True

    def __init__(self, calibration, paths: Sequence[str], key: jax.Array, num_samples: int | None):
        self.calibration = calibration
        self.samples = num_samples
        self.site_keys = {p: jax.random.fold_in(key, i) for i, p in enumerate(paths)}
        self._reference = None
        self._outputs: dict[str, jax.Array] = {}

    def capture(self, model, paths, stage):
        try:
            tokens, order = capture_calls(model, self.calibration, paths)
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 — the forward pass itself fails on this batch
            raise ValueError(f"calibration: the model's forward pass fails on it "
                             f"({type(err).__name__}: {err}); is it a batch of the model's inputs?") from err
        if stage == PLAN:  # checked once, on the original model (later stages see the same batch)
            for path, (X, Y) in tokens.items():
                _check_finite(f"the inputs of {path!r} in the forward pass", X)
                _check_finite(f"the outputs of {path!r} in the forward pass", Y)
                self._outputs.setdefault(path, Y)  # the original model's outputs ("consistent" target)
        return tokens, order

    def keys(self, path, stage):
        return jax.random.fold_in(self.site_keys[path], 0), jax.random.fold_in(self.site_keys[path], 1)

    def num_samples(self, path, rank, stage):
        return self.samples

    def judge(self, model, stage):
        if self._reference is None:  # the original model's outputs, once
            self._reference = model_outputs(model, self.calibration)
        return self.calibration, self._reference

    def reference(self, model, path, stage):
        if path not in self._outputs:  # every stage sees the same batch: capture once
            self._outputs[path] = self.capture(model, [path], stage)[0][path][1]
        return self._outputs[path]


def _teacher(model, calibration, forward):
    """``(targets, seconds)``: the original model's outputs for distillation (``ValueError`` naming
    ``calibration`` where the forward pass fails)."""
    start = time.perf_counter()
    try:
        targets = teacher_outputs(model, calibration, forward)
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 — the forward pass itself fails on this batch
        raise ValueError(f"calibration: the model's forward pass fails on it "
                         f"({type(err).__name__}: {err}); is it a batch of the model's inputs?") from err
    return targets, time.perf_counter() - start


def _validate(model, mlps, reduction, ranks, allocation, order, num_samples, mlp_specs) -> list[str]:
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
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}")
    if isinstance(order, str):
        if order not in ("back-to-front", "front-to-back", grouped.INDEPENDENT):
            raise ValueError(f"order must be 'back-to-front', 'front-to-back', 'independent' or a list of the paths, "
                             f"got {order!r}")
    elif sorted(order) != sorted(mlps):
        raise ValueError(f"order must list the paths of mlps, each once, got {order!r}")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1):
        raise ValueError(f"num_samples must be a positive int or None, got {num_samples!r}")
    if mlp_specs is not None and not isinstance(mlp_specs, (MLPSpec, GatedMLPSpec)):
        if not isinstance(mlp_specs, Mapping) or not set(mlp_specs) <= set(mlps):
            raise ValueError(f"mlp_specs must be an MLPSpec, a GatedMLPSpec or a dict from paths of mlps to "
                             f"those, got {mlp_specs!r}")
        for p, s in mlp_specs.items():
            if not isinstance(s, (MLPSpec, GatedMLPSpec)):
                raise ValueError(f"mlp_specs[{p!r}] must be an MLPSpec or a GatedMLPSpec, got {s!r}")
    return mlps


#: The keyword options of ``compress_model`` each built-in method honours beside ``warm_start`` (its
#: factory refuses ``warm_start=True`` where there is no decoupling), and what the others mean.
HONOURED = {"bsd": ("config", "restarts", "selection"), "auto": ("config", "restarts", "selection", "auto_judge"),
            "prune": (), "svd": (), "drone": ()}
_OPTION_MEANING = {
    "config": "a decoupling's solver settings (methods 'bsd' and 'auto')",
    "restarts": "a decoupling's random restarts (methods 'bsd' and 'auto')",
    "selection": "how a decoupling's restart is chosen (methods 'bsd' and 'auto')",
    "auto_judge": "how method 'auto' compares its candidates",
}


def _refuse_unhonoured(method: str, given: dict) -> None:
    """``ValueError`` naming the first option of ``given`` (the options set away from their
    defaults) that the built-in ``method`` would silently ignore."""
    if method not in HONOURED:  # a method registered later: its factory decides
        return
    for name in given:
        if name != "warm_start" and name not in HONOURED[method]:
            raise ValueError(f"{name}={given[name]!r}: method {method!r} does not use it ({name} sets "
                             f"{_OPTION_MEANING[name]}); leave it out")


def resolve_method(method, *, config=None, restarts=1, warm_start=None, selection=None, auto_judge="model") -> Method:
    """The method object for ``compress_model``'s ``method`` and its keyword options (the options of
    a name; a method object carries its own, and the keywords must stay at their defaults)."""
    options = dict(config=config, restarts=restarts, warm_start=warm_start, selection=selection, auto_judge=auto_judge)
    defaults = dict(config=None, restarts=1, warm_start=None, selection=None, auto_judge="model")
    if isinstance(method, Method):
        given = [k for k, v in options.items() if v is not defaults[k] and v != defaults[k]]
        if given:
            raise ValueError(f"{given[0]}: method is a method object, which carries its own options; "
                             f"give {given[0]} to it (e.g. jb.BSD({given[0]}=...))")
        return method
    if config is not None and not isinstance(config, CMTFConfig):
        raise ValueError(f"config must be a jaxbsd.CMTFConfig, got {type(config).__name__}")
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 1:
        raise ValueError(f"restarts must be a positive int, got {restarts!r}")
    if warm_start is not None and not isinstance(warm_start, bool):
        raise ValueError(f"warm_start must be True, False or None, got {warm_start!r}")
    if selection is not None and selection not in SELECTIONS:
        raise ValueError(f"selection must be 'objective', 'output' or None, got {selection!r}")
    if auto_judge not in JUDGES:
        raise ValueError(f"auto_judge must be one of {JUDGES}, got {auto_judge!r}")
    # Each method's factory takes the options it has and refuses those it cannot honour.
    resolved = get_method(method, config=config, restarts=restarts, warm_start=warm_start,
                          selection="output" if selection is None else selection, auto_judge=auto_judge)
    _refuse_unhonoured(method, {k: v for k, v in options.items() if v is not defaults[k] and v != defaults[k]})
    return resolved


def compress_model(
    model: nnx.Module,
    calibration,
    *,
    mlps: Sequence[str] | None = None,
    reduction: float | None = None,
    ranks: Mapping[str, int] | None = None,
    method: str | Method = "bsd",
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
    state_dir: str | os.PathLike | None = None,
    resume: bool = True,
    refine: Refine | bool | None = Refine(),
    distill: Distill | None = None,
    group: bool | int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    mesh_axis: str | None = None,
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
        (attribute names; integers index lists, ``nnx.List`` included). None: every submodule
        recognised as an MLP on the calibration batch, in model order
        (:func:`~jaxbsd.compression.specs.discover_mlps`: jaxbsd's own MLPs, and any module of two or
        three ``nnx.Linear`` whose spec is found); ``report.discovered`` lists what was looked at and
        why each was chosen or not.
      reduction: ``ρ`` in ``[0, 1)``, the fraction of the model's parameters to remove.
      ranks: instead of ``reduction``, ``{path: rank}`` for every path (exactly one of the two).
      method: a method object (:class:`~jaxbsd.compression.methods.BSD`, ``Prune``, ``SVD``, ``DRONE``,
        ``Auto``; it carries its own options, and ``config``/``restarts``/``warm_start``/``selection``/
        ``auto_judge`` must then be left at their defaults) or a name: ``"bsd"`` (R-CMTF-BSD), ``"auto"`` (per MLP, the better of a warm-started
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
        has the smaller summed error. These are the errors of the replacements as built: the
        allocation is made before ``refine`` runs, so the refined errors it reports may rank the
        two allocations otherwise. Same budget rule either way.
      config: a :class:`~jaxbsd.CMTFConfig` template for ``"bsd"`` (basis, λ, iterations…);
        its rank is replaced per MLP. Default: cubic B-splines with ν = 4, 300 sweeps.
      finetune: ``None`` or ``finetune(model) -> None``, called after each replacement.
      order: ``"back-to-front"`` (reverse order of the first calls in the forward pass; the
        paper's BF), ``"front-to-back"``, ``"independent"`` (every MLP compressed on the original
        model, solved in groups as back to front without ``finetune``; ``finetune`` is then refused)
        or a list of the paths (one at a time).
      num_samples: ``S``, tokens sampled per MLP (default ``min(256, available)``).
      key: a ``jax.random`` key (token draws and solver restarts).
      mlp_specs: how to read user MLPs as ``fc2(h(fc1(x)))`` (:class:`MLPSpec`) or
        ``down(h(gate(x)) ⊙ up(x))`` (:class:`GatedMLPSpec`) for structured Jacobians and the
        baselines: one spec for all paths, or ``{path: spec}``; it always wins.
        jaxbsd's own :class:`~jaxbsd.models.layers.MLP` and :class:`~jaxbsd.models.lm.GatedMLP`
        need none, and for any other module :func:`jaxbsd.compression.specs.find_spec` looks for one (two or
        three ``nnx.Linear`` and a known activation that reproduces the calibration outputs;
        ``report.mlps[i].spec`` says what it found).
        Without a spec, ``"bsd"`` uses dense Jacobians (``S·n·m`` floats) and the baselines
        raise ``ValueError`` with the reason.
      restarts: solver restarts per MLP (``"bsd"``, ``"auto"``).
      warm_start: ``True`` adds one restart beside the random ones, started from the MLP pruned
        to ``rank − 1`` units plus a constant unit for its output bias
        (:func:`~jaxbsd.compression.methods.warm_init`; an error where that is impossible); ``False``: the
        random restarts
        alone (the behaviour before issue 24). None (the default): the warm start for every
        MLP that can be pruned (a two-layer MLP with a spec and ``rank − 1`` at most its hidden
        width), the random restarts alone for the others (``report.mlps[i].warm_start_skipped``
        says why); ``"auto"`` always warm-starts.
      selection: how a decoupling's restart is chosen: ``"objective"`` (the solver's training
        objective on the samples) or ``"output"`` (relative output error on held-out
        calibration tokens, :func:`~jaxbsd.compression.sites.selection_tokens`). None (the default): ``"output"``. The
        report gives the restart both would pick. The knob ablation (ViT/Fashion-MNIST, no
        fine-tuning, 3 seeds; ``experiments/knobs.py``) chose these defaults: the warm start with
        held-out selection raised accuracy by 0.31 points at ρ = 0.2 and 0.62 at ρ = 0.5, winning
        on all 6 paired seeds; ν = 8, ``S = max(128, 4r)`` and fewer sweeps did not pay on top.
      auto_judge: ``method="auto"`` only: ``"model"`` (default) or ``"block"``, how the two
        candidates of each MLP are compared (see below).
      state_dir: a directory in which the model and the report are saved after each finished MLP
        (atomically, :mod:`jaxbsd.compression.state`); a rerun with the same arguments (and a
        freshly built original model) resumes after the last finished MLP and returns what an
        uninterrupted run would. A state of another configuration is refused (``ValueError``
        naming ``state_dir``). ``finetune`` is not part of the identity: rerun with the same one.
      resume: ``False``: discard any state in ``state_dir`` and start over.
      refine: a :class:`~jaxbsd.compression.refine.Refine` to train each replacement, once built,
        to reproduce the original MLP's outputs on the calibration tokens (no labels; the best
        step on held-out tokens is kept, tokens set apart before the build so that no build fits
        them; ``report.mlps[i].refine`` says what it did); ``"auto"``
        refines both candidates before judging them. **On by default** (``jb.Refine()``: 300
        Adam steps on minibatches of 512 tokens): without labels it raised every method's accuracy
        at ρ = 0.5 on both studied pairs and never lowered a mean significantly, at a fraction of
        the decoupling's time (the results page, "Label-free refinement"). None (or ``False``): no
        refinement, the method's replacement exactly as built; ``True``: ``jb.Refine()``.
      distill: a :class:`~jaxbsd.compression.distill.Distill` to train the compressed model, after
        the last replacement, to reproduce the original model's outputs on ``calibration`` (computed
        once, before any replacement: ``model(calibration)`` or what a calibration callable returns;
        no labels; the best step on held-out examples is kept; ``report.distill`` says what it did).
        Off by default (None). With ``state_dir``, the setting is part of the run's identity, and a
        resumed run distills again from the state after its last replacement.
      group: ``True``: where no MLP depends on another (back to front or
        ``"independent"``, no ``finetune``), the MLPs of one shape and rank are solved as one
        program with a leading block axis (:mod:`jaxbsd.compression.grouped`; the same models as
        one at a time, up to rounding); ``report.mlps[i].group`` says which were solved together,
        or why the run went one MLP at a time (front to back and ``finetune`` between blocks
        change what the next MLP is fed). ``False``: one MLP at a time. None (default): grouped
        when a ``mesh`` is given, else one MLP at a time — on this project's 2-core CPU a grouped run
        was not yet measured to be as fast as one at a time (``benchmarks/grouped.py``). A
        positive int ``k``: grouped, each device solving at most ``k`` MLPs in one program (a
        larger group runs in chunks of ``k`` per device): for a group that does not fit in a
        device's memory (:func:`jaxbsd.compression.devices.group_bytes` estimates a group's peak).
      mesh: a :class:`jax.sharding.Mesh`: a group's block axis is split over its axis
        ``mesh_axis`` (default: its first), and the calibration capture is data-parallel over the
        batch (when its leading size divides evenly; one process). Under ``jax.distributed``
        (every process runs the same script) give a mesh of all processes' devices: every
        process ends with the same model, and only process 0 writes ``state_dir``. None: the
        default device. See the docs' "Compressing on many devices".
      mesh_axis: the mesh axis the blocks are split over.

    ``method="auto"``: each MLP gets one parameter share, within which a decoupling (warm-started
    from the pruned MLP wherever that is possible) and a pruned MLP are built, and the one judged
    better is kept (:class:`~jaxbsd.compression.methods.Auto`; with ``ranks``, the rank is the
    decoupling's and the pruned candidate keeps the most units that fit in its parameters);
    ``report.mlps[i].method`` says which was kept and ``.auto`` why. ``auto_judge="model"`` (the
    default) judges them by what users measure: the whole model's outputs on ``calibration``
    with the candidate in place (the MLPs compressed before it included), against the original
    model's outputs (:func:`~jaxbsd.compression.surgery.output_judge`; the fits use tokens of
    these inputs, both candidates alike). ``auto_judge="block"``: the MLP's own output error on
    its check tokens, held out from both fits (the rule before the end-to-end judge).

    Returns:
      ``(model, report)``: the same model with the submodules replaced (``DecoupledMLP``,
      ``LowRankMLP``/``LowRankGatedMLP`` or ``PrunedMLP``/``PrunedGatedMLP``, all jittable and
      differentiable) and a :class:`CompressionReport`.

    Raises:
      ValueError: naming the argument: a calibration on which the forward pass fails or whose
        MLP inputs are not finite (``calibration``; the model is left untouched), a path that does
        not exist or is not a token-wise ``(..., m) -> (..., n)`` module (``mlps``), both or neither of ``reduction`` and
        ``ranks``, a budget the MLPs alone cannot meet (``reduction``), a wrong spec
        (``mlp_specs``), a bad ``method``/``allocation``/``order``/``num_samples``.

    Example:
      >>> model, report = jb.compress_model(model, x_calib, mlps=["blocks.0.mlp", "blocks.1.mlp"],
      ...                                   reduction=0.3, key=jax.random.key(0))
      >>> report.reduction >= 0.3
      True
    """
    discovered = None
    if mlps is None:
        if not isinstance(model, nnx.Module):
            raise ValueError(f"model must be a flax.nnx.Module, got {type(model).__name__}")
        if not callable(calibration):
            _check_finite("the batch", calibration)
        try:
            mlps, discovered = discover_mlps(model, calibration)
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 — the forward pass itself fails on this batch
            raise ValueError(f"calibration: the model's forward pass fails on it "
                             f"({type(err).__name__}: {err}); is it a batch of the model's inputs?") from err
        if not mlps:
            why = "; ".join(f"{p}: {s}" for p, s in discovered.items()) or "no submodule has 2 or 3 nnx.Linear"
            raise ValueError(f"mlps=None: no submodule of {type(model).__name__} is recognised as an MLP ({why}); "
                             "give mlps (and mlp_specs) explicitly")
    mlps = _validate(model, mlps, reduction, ranks, allocation, order, num_samples, mlp_specs)
    method = resolve_method(method, config=config, restarts=restarts, warm_start=warm_start, selection=selection,
                            auto_judge=auto_judge)
    if allocation != "uniform" and not method.uneven:
        raise ValueError(f"allocation={allocation!r}: method {method.name!r} shares the budget uniformly "
                         "(each MLP's candidates within one share); use allocation='uniform'")
    if not _key_is_valid(key):
        raise ValueError(f"key must be a jax.random key (jax.random.key(seed)), got {key!r}")
    if not callable(calibration):
        _check_finite("the batch", calibration)
    if refine is True or refine is False:  # the switch users reach for: on (the defaults) or off
        refine = Refine() if refine else None
    if refine is not None and not isinstance(refine, Refine):
        hint = (f"; for {refine} steps pass jaxbsd.Refine(steps={refine})" if isinstance(refine, int) else "")
        raise ValueError(f"refine must be a jaxbsd.Refine (jaxbsd.Refine() or True: the default refinement), "
                         f"or None or False to turn it off, got {refine!r}{hint}")
    if distill is not None and not isinstance(distill, Distill):
        raise ValueError(f"distill must be a jaxbsd.Distill or None, got {distill!r}")
    distilling = distill is not None and distill.steps > 0
    devices = check_mesh(mesh, mesh_axis)
    if group is None:  # grouped where it pays for sure: splitting the blocks over a mesh
        group = mesh is not None
    if not isinstance(group, bool):
        if not isinstance(group, int) or group < 1:
            raise ValueError(f"group must be True, False, None or a positive int (the most MLPs one device "
                             f"solves in one program), got {group!r}")
        devices, group = dataclasses.replace(devices, max_blocks=group), True
    if order == grouped.INDEPENDENT and finetune is not None:
        raise ValueError("finetune: order='independent' compresses every MLP on the original model; fine-tuning "
                         "between blocks would make each depend on the last. Give finetune=None and fine-tune the "
                         "returned model, or use order='back-to-front'")
    sequential = ("group=False" if not group else "finetune" if finetune is not None else
                  "order" if not isinstance(order, str) else "front-to-back" if order == "front-to-back" else None)
    if mesh is not None and sequential is not None:
        raise ValueError(f"mesh: a mesh splits the groups of a grouped run, and this run goes one MLP at a time "
                         f"({grouped.SEQUENTIAL_REASONS[sequential]})")
    plan = Plan(paths=tuple(mlps), method=method, reduction=reduction, ranks=ranks, allocation=allocation,
                order=order if isinstance(order, str) else tuple(order), mlp_specs=mlp_specs, refine=refine,
                devices=devices if sequential is None else None)
    sharded = shard_batch(calibration, devices)
    source = BatchCalibration(calibration if sharded is None else sharded, mlps, key, num_samples)
    params_before = count_params(model)

    def state(identity: dict) -> RunState | None:
        if state_dir is None:
            return None
        identity = {**identity, "num_samples": num_samples,
                    "key": np.asarray(jax.random.key_data(key)).tolist()}
        if distilling:  # absent without distillation: the ids of earlier runs stay valid
            identity["distill"] = distill.to_dict()
        return RunState(state_dir, run_id(identity), resume=resume)

    def record(step: Step) -> dict:
        info, site = step.info, step.site
        return dataclasses.asdict(MLPReport(
            path=step.path, method=info.get("method", method.name), rank=int(info.get("rank", step.rank)),
            in_features=site.m, out_features=site.n, params_before=site.params,
            params_after=count_params(step.module), error_J=info.get("error_J"), error_F=info.get("error_F"),
            output_error=info["output_error"], jacobian=info["jacobian"], seconds=step.seconds,
            seconds_finetune=step.seconds_after, kept=tuple(info["kept"]) if "kept" in info else None,
            fit_tokens=info.get("fit_tokens"), spec=site.spec_status,
            **{f: info.get(f) for f in REPORT_FIELDS if f != "group"},
            group=info.get("group") or {"sequential": grouped.SEQUENTIAL_REASONS[sequential or "group=False"]}))

    def after_step(model, path, step):
        if finetune is not None:
            finetune(model)

    targets = _teacher(model, calibration, distill.forward) if distilling else None  # before any replacement
    records = run(model, plan, source, record=record, after_step=after_step, state=state)
    distilled = None
    if distilling:  # the whole model, after the last replacement
        distilled = distill_model(model, calibration, targets[0], mlps, distill,
                                  jax.random.fold_in(key, DISTILL_STREAM))
        distilled["seconds_targets"] = targets[1]
    params_after = count_params(model)
    report = CompressionReport(
        mlps=tuple(MLPReport.from_dict(r) for r in records), params_before=params_before,
        params_after=params_after, reduction=1 - params_after / params_before, target_reduction=reduction,
        allocation=allocation if reduction is not None else "explicit", method=method.name,
        discovered=discovered, distill=distilled)
    if reduction is not None:
        assert params_after <= (1 - reduction) * params_before, (params_after, params_before, reduction)
    return model, report
