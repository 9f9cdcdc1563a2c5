"""The front door: :func:`compress_model` and the object of its execution options, :class:`Execution`.

Each option of a compression belongs to one object: the method (:mod:`jaxbsd.compression.methods`:
its solver settings, restarts, warm start, selection, samples), a stage (:class:`~jaxbsd.compression.refine.Refine`,
:class:`~jaxbsd.compression.distill.Distill`) or :class:`Execution` (order, grouping, devices, a
state directory to resume from, fine-tuning between replacements). :func:`compress_model` checks
them all before anything compiles, then hands the algorithm to :func:`jaxbsd.compression.engine.run`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.compression import grouped
from jaxbsd.compression.devices import Devices, check_mesh
from jaxbsd.compression.distill import DISTILL_STREAM, Distill, distill_model, teacher_outputs
from jaxbsd.compression.engine import ALLOCATIONS, PLAN, Plan, Step, run
from jaxbsd.compression.methods import Method, get_method, method_names
from jaxbsd.compression.progress import MLPProgress, listener
from jaxbsd.compression.refine import Refine
from jaxbsd.compression.report import REPORT_FIELDS, CompressionReport, MLPReport
from jaxbsd.compression.specs import AnySpec, GatedMLPSpec, MLPSpec, discover_mlps
from jaxbsd.compression.state import RunState, run_id
from jaxbsd.compression.surgery import capture_calls, model_outputs, parse_path
from jaxbsd.models import count_params

__all__ = ["compress_model", "Execution", "BatchCalibration", "METHODS", "ORDERS"]

#: The names ``method=`` accepts (each a registered :class:`~jaxbsd.compression.methods.Method`).
METHODS = method_names()
#: The orders :class:`Execution` accepts by name (or a list of the paths).
ORDERS = ("back-to-front", "front-to-back", grouped.INDEPENDENT)


@dataclasses.dataclass(frozen=True)
class Execution:
    """How a compression is executed: the order of the replacements, grouping, devices, resume.

    Attributes:
      order: ``"back-to-front"`` (the paper's BF: reverse order of the first calls in the forward
        pass), ``"front-to-back"``, ``"independent"`` (every MLP compressed on the original model,
        grouped, back to front; refuses ``finetune``) or a list of the paths (one at a time).
      group: ``True``: where no MLP depends on another (back to front or ``"independent"``, no
        ``finetune``), the MLPs of one shape and rank are solved as one program with a leading block
        axis (:mod:`jaxbsd.compression.grouped`); ``False``: one MLP at a time; None: grouped when a
        ``mesh`` is given; a positive int ``k``: grouped, at most ``k`` MLPs per device and program.
      mesh: a :class:`jax.sharding.Mesh` whose axis ``mesh_axis`` (default: its first) splits a
        group's block axis (the calibration capture runs on one device: the same model on any count).
      mesh_axis: the mesh axis the blocks are split over.
      state_dir: a directory where the model and the report are saved after each finished MLP; a
        rerun with the same arguments resumes after the last one (a state of another configuration
        is refused, naming ``state_dir``).
      resume: ``False``: discard any state in ``state_dir`` and start over.
      finetune: ``finetune(model) -> None``, called after each replacement (one MLP at a time); not
        part of a resumable run's identity.
      progress: ``True``: a line on stderr as each MLP (or group) starts and as each finishes, and
        tqdm bars with an ETA inside the decoupling's sweeps and the refinement's steps where
        stderr is a terminal; a callable: ``progress(event)`` with each
        :class:`~jaxbsd.compression.progress.MLPProgress` instead; ``False``: silent. The numbers
        are the same either way.
    """

    order: str | Sequence[str] = "back-to-front"
    group: bool | int | None = None
    mesh: jax.sharding.Mesh | None = None
    mesh_axis: str | None = None
    state_dir: str | os.PathLike | None = None
    resume: bool = True
    finetune: Callable[[nnx.Module], None] | None = None
    progress: bool | Callable[[MLPProgress], None] = False

    def __post_init__(self):
        if isinstance(self.order, str) and self.order not in ORDERS:
            raise ValueError(f"order must be 'back-to-front', 'front-to-back', 'independent' or a list of the paths, "
                             f"got {self.order!r}")
        if not isinstance(self.group, bool) and self.group is not None and (
                not isinstance(self.group, int) or self.group < 1):
            raise ValueError(f"group must be True, False, None or a positive int (the most MLPs one device "
                             f"solves in one program), got {self.group!r}")
        if self.finetune is not None and not callable(self.finetune):
            raise ValueError(f"finetune must be None or a callable finetune(model), got {self.finetune!r}")
        if not isinstance(self.progress, bool) and not callable(self.progress):
            raise ValueError(f"progress must be True, False or a callable progress(event), got {self.progress!r}")
        if self.order == grouped.INDEPENDENT and self.finetune is not None:
            raise ValueError("finetune: order='independent' compresses every MLP on the original model; fine-tuning "
                             "between blocks would make each depend on the last. Give finetune=None and fine-tune "
                             "the returned model, or use order='back-to-front'")

    def devices(self) -> tuple[Devices | None, str | None]:
        """``(devices, sequential)``: where the groups run, or None with the reason
        (:data:`~jaxbsd.compression.grouped.SEQUENTIAL_REASONS`) the run goes one MLP at a time."""
        devices = check_mesh(self.mesh, self.mesh_axis)
        group = self.mesh is not None if self.group is None else self.group
        if not isinstance(group, bool):
            devices, group = dataclasses.replace(devices, max_blocks=group), True
        order = self.order
        sequential = ("group=False" if not group else "finetune" if self.finetune is not None else
                      "order" if not isinstance(order, str) else "front-to-back" if order == "front-to-back" else None)
        if self.mesh is not None and sequential is not None:
            raise ValueError(f"mesh: a mesh splits the groups of a grouped run, and this run goes one MLP at a time "
                             f"({grouped.SEQUENTIAL_REASONS[sequential]})")
        return (devices if sequential is None else None), sequential


def _key_is_valid(key) -> bool:
    typed = isinstance(key, jax.Array) and key.shape == () and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    legacy = isinstance(key, jax.Array) and key.shape == (2,) and key.dtype == jnp.uint32
    return typed or legacy


def _on_calibration(fn: Callable, *args):
    """``fn(*args)``, a call that runs the model on the calibration; a failure of the forward pass
    itself (anything but the ``ValueError`` of a check) becomes a ``ValueError`` naming ``calibration``."""
    try:
        return fn(*args)
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 — the forward pass itself fails on this batch
        raise ValueError(f"calibration: the model's forward pass fails on it "
                         f"({type(err).__name__}: {err}); is it a batch of the model's inputs?") from err


def _check_finite(what: str, value) -> None:
    for leaf in jax.tree.leaves(value):
        a = np.asarray(leaf) if isinstance(leaf, (jax.Array, np.ndarray)) else None
        if a is not None and np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
            raise ValueError(f"calibration: {what} holds NaN or inf; calibrate on finite inputs")


class BatchCalibration:
    """The :class:`CalibrationSource` of :func:`compress_model`: one calibration batch (or a
    callable running the forward pass) for every stage, and per MLP the keys
    ``fold_in(fold_in(key, i), 0)`` (draw) and ``fold_in(fold_in(key, i), 1)`` (build).

    ``keep_outputs``: keep the planning capture's outputs of each MLP until :meth:`reference` asks
    for them (the refinement's ``"consistent"`` target; handed over, not kept twice); ``False``
    where nothing will ask, so the planning outputs die with the planning. ``recorded``: what
    :func:`~jaxbsd.compression.specs.discover_mlps` recorded of ``paths`` on this batch (its
    ``keep``): the planning capture, with no forward pass of its own."""

    first_step_reuses_plan = True

    def __init__(self, calibration, paths: Sequence[str], key: jax.Array, num_samples: int | None, *,
                 keep_outputs: bool = True, recorded: dict | None = None):
        self.calibration = calibration
        self.samples = num_samples
        self.site_keys = {p: jax.random.fold_in(key, i) for i, p in enumerate(paths)}
        self.keep_outputs = keep_outputs
        self._reference = None
        self._outputs: dict[str, jax.Array] = {}
        self.plan_sequence: list[str] = []  # every call's path in the planning capture's forward pass
        # The discovery's forward pass on this batch (its tokens, order, sequence): the planning capture, once.
        self._recorded = recorded

    def capture(self, model, paths, stage):
        sequence = self.plan_sequence if stage == PLAN else None
        recorded, self._recorded = (self._recorded, None) if stage == PLAN else (None, self._recorded)
        if recorded is not None and set(recorded["tokens"]) == set(paths):  # mlps=None: recorded by the discovery
            tokens, order = {p: recorded["tokens"][p] for p in paths}, recorded["order"]
            self.plan_sequence[:] = recorded["sequence"]
        else:
            tokens, order = _on_calibration(functools.partial(capture_calls, sequence=sequence), model,
                                            self.calibration, paths)
        if stage == PLAN:  # checked once, on the original model (later stages see the same batch)
            for path, (X, Y) in tokens.items():
                _check_finite(f"the inputs of {path!r} in the forward pass", X)
                _check_finite(f"the outputs of {path!r} in the forward pass", Y)
                if self.keep_outputs:
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
        if path in self._outputs:  # every stage sees the same batch: the planning capture's, handed over
            return self._outputs.pop(path)
        return self.capture(model, [path], stage)[0][path][1]


def _distiller(calibration, distill: Distill, mlps: Sequence[str], key: jax.Array):
    """The engine's distillation stage (``Plan.distill``): ``teach(model) -> finish`` takes the
    original model's outputs on the calibration (``ValueError`` naming ``calibration`` where the
    forward pass fails), ``finish(model) -> report`` distills the compressed model towards them."""

    def teach(model):
        start = time.perf_counter()
        targets = _on_calibration(teacher_outputs, model, calibration, distill.forward)
        seconds = time.perf_counter() - start

        def finish(model) -> dict:
            info = distill_model(model, calibration, targets, mlps, distill, jax.random.fold_in(key, DISTILL_STREAM))
            info["seconds_targets"] = seconds
            return info

        return finish

    return teach


def _validate(mlps, reduction, ranks, allocation, order, mlp_specs) -> list[str]:
    """``mlps`` as a list, once every argument of the budget and the paths is checked."""
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
    if not isinstance(order, str) and sorted(order) != sorted(mlps):
        raise ValueError(f"order must list the paths of mlps, each once, got {order!r}")
    if mlp_specs is not None and not isinstance(mlp_specs, (MLPSpec, GatedMLPSpec)):
        if not isinstance(mlp_specs, Mapping) or not set(mlp_specs) <= set(mlps):
            raise ValueError(f"mlp_specs must be an MLPSpec, a GatedMLPSpec or a dict from paths of mlps to "
                             f"those, got {mlp_specs!r}")
        for p, s in mlp_specs.items():
            if not isinstance(s, (MLPSpec, GatedMLPSpec)):
                raise ValueError(f"mlp_specs[{p!r}] must be an MLPSpec or a GatedMLPSpec, got {s!r}")
    return mlps


def _discover(model, calibration, keep: dict | None = None) -> tuple[list[str], dict[str, str]]:
    """``mlps=None``: every submodule recognised as an MLP on the calibration, and why each candidate
    was chosen or not (``ValueError`` if none is); ``keep``: :func:`discover_mlps`'."""
    mlps, discovered = _on_calibration(functools.partial(discover_mlps, keep=keep), model, calibration)
    if not mlps:
        why = "; ".join(f"{p}: {s}" for p, s in discovered.items()) or "no submodule has 2 or 3 nnx.Linear"
        raise ValueError(f"mlps=None: no submodule of {type(model).__name__} is recognised as an MLP ({why}); "
                         "give mlps (and mlp_specs) explicitly")
    return mlps, discovered


def _check_stages(refine, distill) -> Refine | None:
    """``refine`` as a :class:`Refine` or None (``True``/``False``: on with the defaults, or off);
    ``ValueError`` naming a stage of the wrong type."""
    if refine is True or refine is False:  # the switch users reach for: on (the defaults) or off
        refine = Refine() if refine else None
    if refine is not None and not isinstance(refine, Refine):
        hint = (f"; for {refine} steps pass jaxbsd.Refine(steps={refine})" if isinstance(refine, int) else "")
        raise ValueError(f"refine must be a jaxbsd.Refine (jaxbsd.Refine() or True: the default refinement), "
                         f"or None or False to turn it off, got {refine!r}{hint}")
    if distill is not None and not isinstance(distill, Distill):
        raise ValueError(f"distill must be a jaxbsd.Distill or None, got {distill!r}")
    return refine


def _resolve_method(method, allocation: str) -> Method:
    """The method object of a name (with its defaults) or a method object, fit for ``allocation``."""
    method = get_method(method)
    if allocation != "uniform" and not method.uneven:
        raise ValueError(f"allocation={allocation!r}: method {method.name!r} shares the budget uniformly "
                         "(each MLP's candidates within one share); use allocation='uniform'")
    return method


def _recorder(method: Method, sequential: str | None) -> Callable[[Step], dict]:
    """Turns a finished step into its :class:`MLPReport` record."""

    def record(step: Step) -> dict:
        info, site = step.built.report(), step.site
        return dataclasses.asdict(MLPReport(
            path=step.path, method=info.get("method", method.name), rank=int(info.get("rank", step.rank)),
            in_features=site.m, out_features=site.n, params_before=site.params,
            params_after=count_params(step.module), error_J=info.get("error_J"), error_F=info.get("error_F"),
            output_error=info["output_error"], jacobian=info["jacobian"], seconds=step.seconds,
            seconds_finetune=step.seconds_after, kept=tuple(info["kept"]) if "kept" in info else None,
            fit_tokens=info.get("fit_tokens"), spec=site.spec_status,
            **{f: info.get(f) for f in REPORT_FIELDS if f != "group"},
            group=info.get("group") or {"sequential": grouped.SEQUENTIAL_REASONS[sequential or "group=False"]}))

    return record


def _state(execution: Execution, method: Method, key, distill: Distill | None):
    """``identity -> RunState | None``: the run's state directory, its identity completed by what the
    engine does not see (the samples, the key, the distillation)."""

    def state(identity: dict) -> RunState | None:
        if execution.state_dir is None:
            return None
        identity = {**identity, "num_samples": method.num_samples,
                    "key": np.asarray(jax.random.key_data(key)).tolist()}
        if distill is not None:  # absent without distillation: the ids of earlier runs stay valid
            identity["distill"] = distill.to_dict()
        return RunState(execution.state_dir, run_id(identity), resume=execution.resume)

    return state


def compress_model(
    model: nnx.Module,
    calibration,
    *,
    key: jax.Array,
    mlps: Sequence[str] | None = None,
    mlp_specs: AnySpec | Mapping[str, AnySpec] | None = None,
    reduction: float | None = None,
    ranks: Mapping[str, int] | None = None,
    allocation: str = "uniform",
    method: str | Method = "bsd",
    refine: Refine | bool | None = Refine(),
    distill: Distill | None = None,
    execution: Execution | None = None,
) -> tuple[nnx.Module, CompressionReport]:
    """Replace MLP submodules of any Flax NNX model by compressed ones, in place, under a budget.

    Each submodule at a path of ``mlps`` must map ``(..., m) -> (..., n)`` token by token; its tokens
    are captured by running the model on ``calibration`` in eval mode. With ``reduction=ρ`` the
    returned model has at most ``(1 − ρ)·P`` parameters (``P``: the ``nnx.Param`` scalars of the
    original; only the listed MLPs shrink). The options in full, and what each method's parameter
    count is: the docs' "Compress your own NNX model".

    Args:
      model: any ``flax.nnx.Module``; changed in place (and returned).
      calibration: a batch of model inputs (``model(calibration)``), or ``calibration(model)`` running
        the forward pass.
      key: a ``jax.random`` key (token draws, solver restarts, refinement).
      mlps: dotted paths of the submodules to replace (``"encoder.layers.3.ffn"``); None: every
        submodule recognised as an MLP on the calibration, in model order (``report.discovered`` says
        why each candidate was chosen or not).
      mlp_specs: how to read user MLPs (:class:`MLPSpec`, :class:`GatedMLPSpec`): one for all paths,
        or ``{path: spec}``; jaxbsd's own MLPs need none, and for others one is looked for.
      reduction: ``ρ`` in ``[0, 1)``, the fraction of the model's parameters to remove.
      ranks: instead of ``reduction``, ``{path: rank}`` for every path (exactly one of the two).
      allocation: ``"uniform"`` (every MLP keeps the same share) or ``"greedy"`` (parameters go where
        the output error falls fastest per parameter, among a few candidate ranks).
      method: a name of :data:`METHODS` (with its defaults) or a method object carrying its options:
        :class:`~jaxbsd.compression.methods.BSD` (solver ``config``, ``restarts``, ``warm_start``,
        ``selection``, ``contain``), ``Prune``, ``SVD``, ``DRONE``, ``Auto``; every one takes ``num_samples``.
        The name ``"bsd"`` (and ``"auto"``'s candidate) contains pruning: each two-layer MLP of a named
        activation is solved as :func:`~jaxbsd.compression.methods.bsd.augmented` with its activation
        (``BSD(contain=True)``); ``jb.get_method("bsd", contain=False)`` is the paper's basis everywhere.
      refine: the label-free refinement stage (:class:`Refine`, on by default; None or ``False``: the
        replacements as built; ``True``: ``Refine()``).
      distill: the label-free distillation of the whole model after the last replacement
        (:class:`Distill`), or None (default).
      execution: order, grouping, devices, resume and fine-tuning (:class:`Execution`); None: its
        defaults (back to front, one MLP at a time, no state).

    Returns:
      ``(model, report)``: the same model with the submodules replaced and a :class:`CompressionReport`.

    Raises:
      ValueError: before anything compiles, naming the argument (the model is left untouched): a
        forward pass that fails on the calibration or tokens that are not finite, a path that is not a
        token-wise module, both or neither of ``reduction`` and ``ranks``, a budget the MLPs alone
        cannot meet, a wrong spec, method, allocation, stage or execution option.
    """
    execution = Execution() if execution is None else execution
    if not isinstance(execution, Execution):
        raise ValueError(f"execution must be a jaxbsd.Execution or None, got {execution!r}")
    if not isinstance(model, nnx.Module):
        raise ValueError(f"model must be a flax.nnx.Module, got {type(model).__name__}")
    if not callable(calibration):
        _check_finite("the batch", calibration)
    discovered, recorded = None, {}
    if mlps is None:  # the discovery's forward pass records the chosen MLPs: it is the planning capture too
        mlps, discovered = _discover(model, calibration, keep=recorded)
    mlps = _validate(mlps, reduction, ranks, allocation, execution.order, mlp_specs)
    method = _resolve_method(method, allocation)
    if not _key_is_valid(key):
        raise ValueError(f"key must be a jax.random key (jax.random.key(seed)), got {key!r}")
    refine = _check_stages(refine, distill)
    distill = distill if distill is not None and distill.steps > 0 else None
    devices, sequential = execution.devices()
    order = execution.order
    plan = Plan(paths=tuple(mlps), method=method, reduction=reduction, ranks=ranks, allocation=allocation,
                order=order if isinstance(order, str) else tuple(order), mlp_specs=mlp_specs, refine=refine,
                devices=devices, distill=None if distill is None else _distiller(calibration, distill, mlps, key))
    # The capture runs on one device whatever the mesh (split over devices, programs of other shapes
    # round otherwise, and the decoupling and refinement amplify it: the model would depend on the count).
    consistent = refine is not None and refine.steps > 0 and refine.target == "consistent"
    source = BatchCalibration(calibration, mlps, key, method.num_samples, keep_outputs=consistent,
                              recorded=recorded or None)
    del recorded
    after_step = (lambda model, path, step: execution.finetune(model)) if execution.finetune is not None else None
    with listener(execution.progress) as progress:
        outcome = run(model, plan, source, record=_recorder(method, sequential), after_step=after_step,
                      state=None if execution.state_dir is None else _state(execution, method, key, distill),
                      progress=progress)
    before, after = outcome.params_before, outcome.params_after
    if reduction is not None:
        assert after <= (1 - reduction) * before, (after, before, reduction)
    return outcome.model, CompressionReport(
        mlps=tuple(MLPReport.from_dict(r) for r in outcome.records), params_before=before, params_after=after,
        reduction=1 - after / before, target_reduction=reduction,
        allocation=allocation if reduction is not None else "explicit", method=method.name,
        discovered=discovered, distill=outcome.distill)
