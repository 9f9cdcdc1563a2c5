"""The compression engine: plan the ranks, then replace one MLP at a time.

:func:`run` is the algorithm both entry points share — :func:`compress_model` (any NNX model,
a calibration batch) and :func:`jaxbsd.compression.blockwise.compress` (the paper's block-by-block
run over a data set, fine-tuning after each step):

1. capture every MLP's tokens on the original model and draw its :class:`~jaxbsd.compression.sites.Site`
   (:func:`site_at`);
2. plan the ranks: explicit, or from the budget ``(1 − ρ)·P`` shared uniformly or greedily
   (:func:`jaxbsd.compression.budget.plan_ranks`), priced by the method;
3. resume after the last finished MLP of a saved state, if any;
4. for each MLP (or group) in order (:func:`execute`): capture again on the current model (or take
   its planning tokens, set aside on disk, where no earlier replacement feeds it), build the
   replacement with the method (:func:`jaxbsd.compression.grouped.build`), refine it
   (:mod:`jaxbsd.compression.refine`), put it in place, run the caller's step (fine-tuning), save the state;
5. the plan's distillation of the whole model, if any (``Plan.distill``); the :class:`Outcome`.

The engine never asks which method it holds (:mod:`jaxbsd.compression.methods.base`), and never how
the tokens are obtained: a :class:`CalibrationSource` gives them, with the keys of each draw.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import hashlib
import os
import tempfile
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.compression import budget as budgets
from jaxbsd.compression.budget import ALLOCATIONS
from jaxbsd.compression import grouped
from jaxbsd.compression.devices import Devices
from jaxbsd.compression.methods import Built, Method
from jaxbsd.compression.progress import MLPProgress
from jaxbsd.compression.refine import Refine, refine_stage, reported, site_refiner
from jaxbsd.compression.sites import Site, make_site
from jaxbsd.compression.specs import choose_spec
from jaxbsd.compression.state import RunState
from jaxbsd.compression.surgery import get_submodule, set_submodule, unfed_by
from jaxbsd.models import count_params

__all__ = ["CalibrationSource", "Plan", "Step", "Outcome", "PLAN", "ALLOCATIONS", "run", "execute", "site_at",
           "execution_order", "group_key", "groups", "release_host_memory", "without_tokens"]

#: The stage of the planning capture (on the original model); steps are numbered from 1.
PLAN = 0


def _malloc_trim() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)`` (hands the heap's free pages back to the OS), or None where the C
    library has none (macOS, musl, Windows)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


_TRIM = _malloc_trim()


def release_host_memory() -> None:
    """Free what nothing refers to any more and give the freed host memory back to the OS: a
    ``gc.collect()`` (buffers held only by reference cycles), then glibc's ``malloc_trim(0)`` where
    the C library has it (a no-op elsewhere). Freed buffers otherwise stay in the process's heap,
    and the resident set (what a user sees) keeps them. Called by :func:`run` after planning and
    after each MLP (or group)."""
    gc.collect()
    if _TRIM is not None:
        _TRIM()


_TOKEN_FIELDS = ("X", "F", "check_X", "check_Y", "fit_X", "fit_Y", "held_X", "held_Y")


def without_tokens(site: Site) -> Site:
    """``site`` with each token array (sampling points, check, fit and held-out tokens) replaced by
    its shape and dtype (a :class:`jax.ShapeDtypeStruct`): what a step that captures its own tokens
    still reads of its planning site (the module, its spec, widths, token counts and parameter
    counts, the rank and budget arithmetic), so the planning capture's arrays are not held for the
    whole run. Reading the values of a token array of such a site fails."""
    def shape(a):
        return None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype)

    return dataclasses.replace(site, **{f: shape(getattr(site, f)) for f in _TOKEN_FIELDS})



class SpilledTokens:
    """Planning tokens set aside on disk until their step (``.npy`` files in a temporary directory,
    removed by :meth:`close`): a step whose MLP no earlier replacement feeds takes them instead of
    capturing again, so the run holds one MLP's tokens in host memory and makes one forward pass,
    not one a step."""

    def __init__(self):
        self._dir = None
        self._paths: dict[str, tuple[str, str]] = {}

    def __contains__(self, path: str) -> bool:
        return path in self._paths

    def put(self, path: str, tokens: tuple) -> None:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="jaxbsd-tokens-")
        files = tuple(os.path.join(self._dir.name, f"{len(self._paths)}-{name}.npy") for name in ("X", "Y"))
        for file, a in zip(files, tokens):
            np.save(file, np.asarray(a))
        self._paths[path] = files

    def take(self, path: str) -> tuple[jax.Array, jax.Array]:
        """``(X_all, Y_all)`` of ``path`` as captured at planning (its files removed)."""
        arrays = []
        for file in self._paths.pop(path):
            arrays.append(jax.device_put(np.load(file)))  # device_put: jnp.asarray compiles a copy per shape
            os.remove(file)
        return tuple(arrays)

    def close(self) -> None:
        self._paths.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


class CalibrationSource(Protocol):
    """Where the engine's tokens, keys and judges come from.

    A stage is :data:`PLAN` (the original model, before any replacement) or a step number
    (1-based, the current model before that step's replacement).
    """

    #: Whether step 1 sees exactly the planning tokens (same inputs, same keys): its site is
    #: then the planning site, not a second capture.
    first_step_reuses_plan: bool
    #: Where every stage captures the planning batch with the planning keys: the path of every call
    #: of the planning capture's forward pass, in order (filled by :meth:`capture` at :data:`PLAN`),
    #: from which a step whose MLP no replacement before it feeds takes its planning tokens
    #: (:func:`jaxbsd.compression.surgery.unfed_by`); None: every step captures its own.
    plan_sequence: list[str] | None

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
      distill: the distillation of the whole model after the last replacement, or None:
        ``distill(model) -> finish``, called on the original model before any replacement (the
        teacher's outputs), then ``finish(model) -> report`` on the compressed model.
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
    distill: Callable[[nnx.Module], Callable[[nnx.Module], dict]] | None = None

    def reserve(self, N: int) -> int:
        """How many of ``N`` captured tokens are set apart for the refinement's held-out error before
        any build (:meth:`reserved_tokens` of the plan's refinement)."""
        return self.reserved_tokens(self.refine, N)

    @staticmethod
    def reserved_tokens(refine, N: int) -> int:
        """How many of ``N`` captured tokens a :class:`~jaxbsd.compression.refine.Refine` sets apart
        (``reserve`` of :func:`jaxbsd.compression.sites.make_site`): the ``holdout`` share of the
        tokens refinement uses, ``round(holdout · min(N, max_tokens))``, at least 1 and at most
        ``N - 1``; 0 without refinement or with fewer than 2 tokens."""
        if refine is None or refine.steps == 0 or N < 2:
            return 0
        return max(1, min(N - 1, int(round(refine.holdout * min(N, refine.max_tokens)))))


@dataclasses.dataclass(frozen=True)
class Step:
    """One finished replacement: what the caller's record is made from."""

    step: int
    path: str
    site: Site
    built: Built
    rank: Any
    seconds: float
    after: dict[str, Any]
    seconds_after: float

    @property
    def module(self) -> nnx.Module:
        """The replacement put in place."""
        return self.built.module


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What :func:`run` returns.

    Attributes:
      model: the model, changed in place.
      records: the caller's record of every step (resumed ones included), in step order.
      params_before, params_after: the model's ``nnx.Param`` scalars before and after the run.
      distill: the distillation's report (``Plan.distill``), or None.
    """

    model: nnx.Module
    records: list[dict]
    params_before: int
    params_after: int
    distill: dict | None = None


def execution_order(order, first_calls: list[str]) -> list[str]:
    if isinstance(order, str):
        return list(first_calls) if order == "front-to-back" else list(first_calls)[::-1]
    return list(order)


def site_at(model, plan: Plan, source: CalibrationSource, path: str, stage: int, S: int | None,
            tokens: tuple | None = None) -> Site:
    """The site of ``path`` on the current model at ``stage``, with ``S`` samples drawn by the stage's
    key, and its spec (given, known, or found on the tokens): from its captured ``tokens = (X_all,
    Y_all)``, or (None) its tokens captured anew. When the plan refines, the refinement's held-out
    tokens are set apart first (:meth:`Plan.reserve`): no build, greedy candidate or judge on block
    tokens sees them."""
    X_all, Y_all = source.capture(model, [path], stage)[0][path] if tokens is None else tokens
    reserve = plan.reserve(int(X_all.shape[0]))
    module = get_submodule(model, path)
    if plan.structured or plan.method.needs_spec:
        spec, status = choose_spec(module, path, plan.mlp_specs, X_all, Y_all)
    else:
        spec, status = None, "not used (structured=False)"
    site = make_site(path, module, spec, X_all, Y_all, S, source.keys(path, stage)[0], reserve=reserve)
    return dataclasses.replace(site, spec_status=status)


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
    progress: Callable[[MLPProgress], None] | None = None,
) -> Outcome:
    """Compress ``model`` in place, one MLP at a time (or group by group), then distill it if the
    plan says so; the :class:`Outcome` (the records of every step, resumed ones included).

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
      progress: called with an :class:`~jaxbsd.compression.progress.MLPProgress` as each MLP (or
        group) starts and as each MLP finishes.
    """
    method = plan.method
    distill = plan.distill(model) if plan.distill is not None else None  # the teacher, before any replacement
    digest = model_digest(model) if state is not None else None  # before anything is replaced
    # 1. Every MLP's tokens on the original model, in the order of their first calls.
    tokens, first_calls = source.capture(model, plan.paths, PLAN)
    order = execution_order(plan.order, first_calls)
    refining = plan.refine is not None and plan.refine.steps > 0
    references = ({step: source.reference(model, path, step) for step, path in enumerate(order, start=1)}
                  if refining and plan.refine.target == "consistent" else {})
    calibration = calibration_digest(tokens) if state is not None else None
    # Each MLP's site with S samples of its planning tokens (this validates every path first).
    planned = lambda path, S: site_at(model, plan, source, path, PLAN, S, tokens[path])  # noqa: E731
    # One MLP at a time, a step captures its own tokens (but a first step that reuses these), and
    # the ranks are priced on shapes alone (but the greedy allocation's candidates, built on the
    # planning tokens): each MLP's planning tokens and site arrays go as soon as its site is drawn.
    lean = plan.devices is None and not (plan.reduction is not None and plan.allocation == "greedy")
    keep = order[0] if source.first_step_reuses_plan else None
    # Back to front through a feed-forward model no replacement before an MLP's step feeds its
    # inputs, and without fine-tuning nothing else changes them: its planning tokens are what its
    # step would capture, set aside on disk until then (one forward pass for the run, not one a step).
    sequence = source.plan_sequence if after_step is None else None
    spilled = SpilledTokens()
    sites = {}
    for p in plan.paths:
        sites[p] = planned(p, source.num_samples(p, None, PLAN))
        if lean and p != keep:
            sites[p] = without_tokens(sites[p])
            if sequence and unfed_by(sequence, p, order[:order.index(p)]):
                spilled.put(p, tokens[p])
            del tokens[p]
    for p in plan.paths:
        method.check_site(sites[p])
    # Judges see the original model's outputs, before any replacement or resumed state.
    judges = {step: source.judge(model, step) for step in range(1, len(order) + 1)} if method.judges_by_model else {}
    # 2. The ranks, planned on the original model (a resumed run plans exactly what the first did).
    params_total = count_params(model)
    rank_of, cache = budgets.plan_ranks(plan, sites, params_total,
                                        samples=lambda path, rank: source.num_samples(path, rank, PLAN),
                                        build_key=lambda path: source.keys(path, PLAN)[1], redraw=planned)
    # The planning capture's tokens are done with (each site holds what its builds read), and so are
    # the greedy allocation's builds at ranks not chosen: only a step's own rank can reuse one.
    tokens = planned = None
    cache = {(p, r): hit for (p, r), hit in cache.items() if rank_of[p] == r}
    # 3. Resume.
    run_state = None if state is None else state({
        "method": method.to_dict(), "paths": list(plan.paths), "reduction": plan.reduction,
        "ranks": None if plan.ranks is None else dict(plan.ranks), "allocation": plan.allocation,
        "order": order, "structured": plan.structured, "params": params_total, "model": digest,
        "refine": None if not refining else plan.refine.to_dict(),
        "specs": {p: sites[p].spec_status for p in plan.paths}, "calibration": calibration})
    records = [] if run_state is None else run_state.load(model)
    if plan.devices is None:  # one MLP at a time: each step captures its own tokens, but a first step that reuses these
        keep = keep if not records else None
        sites = {p: site if p == keep else without_tokens(site) for p, site in sites.items()}
    release_host_memory()
    # 4. The replacements, group by group: one MLP a group when they run one at a time.
    try:
        records = execute(model, plan, source, order, sites, rank_of, cache, judges, references, records,
                          record=record, after_step=after_step, run_state=run_state, on_record=on_record,
                          progress=progress, spilled=spilled)
    finally:
        spilled.close()
    distilled = distill(model) if distill is not None else None  # the whole model, after the last replacement
    return Outcome(model=model, records=records, params_before=params_total, params_after=count_params(model),
                   distill=distilled)


def group_key(site: Site, rank) -> tuple:
    """MLPs with equal keys can share one program: module type, widths, hidden width, rank, samples
    and token counts, dtype (the method and the refinement split further by the programs' exact
    signatures)."""
    fit = None if site.fit_X is None else site.fit_X.shape[0]
    return (type(site.module).__name__, site.m, site.n, site.hidden, site.gated, repr(rank), site.X.shape,
            str(site.X.dtype), site.check_X.shape[0], fit)


def groups(todo: list[tuple[int, str]], sites: dict[str, Site], rank_of: dict[str, Any],
           chunk: int | None = None) -> list[list[tuple[int, str]]]:
    """The ``(step, path)`` of ``todo`` in groups of one :func:`group_key`, each in step order, the
    groups in the order of their first step; a group of more than ``chunk`` MLPs (None: no limit)
    split into consecutive chunks of ``chunk`` (the last one shorter)."""
    out: dict[tuple, list] = {}
    for step, path in todo:
        out.setdefault(group_key(sites[path], rank_of[path]), []).append((step, path))
    sizes = {key: chunk or len(members) for key, members in out.items()}
    return [members[i:i + sizes[key]] for key, members in out.items() for i in range(0, len(members), sizes[key])]


def execute(model, plan: Plan, source, order, sites, rank_of, cache, judges, references, records, *,
            record, after_step=None, run_state=None, on_record=None, progress=None,
            spilled: SpilledTokens | None = None) -> list[dict]:
    """The one compression loop: the MLPs of ``order`` not in ``records`` (a resumed state's), group by
    group (:func:`groups` where ``plan.devices`` is given, one MLP a group otherwise); each group's
    sites, replacements (:func:`jaxbsd.compression.grouped.build`), refinement and report
    (:func:`jaxbsd.compression.refine.refine_stage`, :func:`~jaxbsd.compression.refine.reported`),
    then each replacement put in place, the caller's ``after_step``, its record, the state saved (by
    process 0) before the next group's captures and judges look at the model. The records in step order.

    One MLP at a time (``plan.devices`` None), each MLP's tokens are captured again on the current
    model (earlier replacements and fine-tuning change what it sees), but for step 1 of a source whose
    first step sees the planning tokens, and for the MLPs whose planning tokens ``spilled`` holds (no
    earlier replacement feeds them); grouped, every MLP's site is the planning capture's (the
    MLPs are independent: none is fed by another replaced before it)."""
    method = plan.method
    refining = plan.refine is not None and plan.refine.steps > 0
    build_key = lambda path, step: source.keys(path, step)[1]  # noqa: E731

    def tell(kind: str, position: int, paths, here, **finished) -> None:
        if progress is not None:  # one MLPProgress event
            progress(MLPProgress(kind=kind, position=position, total=len(order), paths=tuple(paths),
                                 method=method.name, ranks=tuple(rank_of[p] for p in paths),
                                 params_before=sum(here[p].params for p in paths), **finished))

    # A resumed state holds the first steps of a run one MLP at a time, and whole groups of a grouped one.
    done = set(order[:len(records)]) if plan.devices is None else {r["path"] for r in records}
    todo = [(step, path) for step, path in enumerate(order, start=1) if path not in done]
    resumed = bool(records)
    if resumed:
        tell("resumed", len(records) + 1, [], sites)
    batches = [[m] for m in todo] if plan.devices is None else groups(todo, sites, rank_of, plan.devices.chunk)
    for index, members in enumerate(batches):
        tell("start", len(records) + 1, [p for _, p in members], sites)
        start = time.perf_counter()
        here = dict(sites)
        if plan.devices is None:
            (step, path), = members
            if not (step == 1 and source.first_step_reuses_plan and not resumed):
                here[path] = site_at(model, plan, source, path, step,
                                     source.num_samples(path, method.sample_rank(rank_of[path]), step),
                                     spilled.take(path) if spilled is not None and path in spilled else None)
        refiners = {step: site_refiner(plan.refine, here[path], references.get(step),
                                       jax.random.fold_in(build_key(path, step), 2))
                    if refining else None for step, path in members}
        builds = grouped.build(model, plan, members, here, rank_of, cache, judges, refiners, build_key)
        builds = refine_stage(method, members, builds, refiners, plan.devices)
        seconds = (time.perf_counter() - start) / len(members)
        paths = [p for _, p in members]
        for step, path in members:
            built = reported(plan.refine, here[path], builds[step], refiners[step] is not None)
            if plan.devices is not None:
                built = built.replace(group={"index": index, "paths": paths, "devices": plan.devices.size})
            set_submodule(model, path, built.module)
            start_after = time.perf_counter()
            after = (after_step(model, path, step) if after_step is not None else None) or {}
            records.append(record(Step(step=step, path=path, site=here[path], built=built, rank=rank_of[path],
                                       seconds=seconds, after=after, seconds_after=time.perf_counter() - start_after)))
            tell("done", len(records), [path], here, params_after=count_params(built.module),
                 output_error=float(built.output_error), seconds=seconds)
        if run_state is not None and jax.process_index() == 0:
            run_state.save(model, records)
        if on_record is not None:
            for r in records[-len(members):]:
                on_record(r)
        # What this group's steps needed is done with: its sites, targets, judges and cached builds
        # (held otherwise until the next group reassigns them, or the run's end).
        for step, path in members:
            sites[path] = without_tokens(sites[path])
            references.pop(step, None)
            judges.pop(step, None)
            cache.pop((path, rank_of[path]), None)
        del here, refiners, builds, built, after
        release_host_memory()
    if plan.devices is None:
        return records
    position = {p: i for i, p in enumerate(order)}
    return sorted(records, key=lambda r: position[r["path"]])
