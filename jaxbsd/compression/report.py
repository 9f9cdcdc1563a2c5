"""What a compression run reports: one :class:`MLPReport` per MLP and a :class:`CompressionReport`."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["MLPReport", "CompressionReport", "REPORT_FIELDS"]


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
      sweep_kept: for a decoupling solved with ``BSD(best_iterate=True)`` (or an early-stopping
        ``config.patience``), the sweep whose iterate the kept restart returned (0: its initial
        state, the warm start's pruned MLP); else None.
      stopped: with ``sweep_kept``, why the kept restart's solve stopped: the lower-case name of
        its :class:`~jaxbsd.Status` (``"early_stopped"``, ``"max_iterations"``, ``"converged"``…).
      auto: for ``method="auto"``, ``{"kept": "bsd" | "prune", "reason": …, "bsd": {rank,
        params, output_error, restart_warm}, "prune": {rank, params, output_error,
        fit_tokens}}``: both candidates and why one was kept; else None.
      warm_start_skipped: with ``warm_start=None`` (the default), why this decoupling had no
        warm start (no two-layer spec, ``rank − 1`` above the hidden width, …); else None.
      refine: what the refinement stage did (``target``, ``steps``, ``steps_kept``,
        ``error_before``/``error_after`` on its held-out tokens, token counts, ``batch_size``,
        ``evaluations``, ``seconds``, and ``output_error_built``: the ``output_error`` of the
        replacement as built, on the check tokens), or why it was ``skipped``; None without
        refinement. ``output_error`` is that of the replacement returned, refined, on the check
        tokens and the refinement's held-out tokens together (the held-out ones are set apart
        before the build, so no build and no refinement step fitted them).
      notes: what else the method says about this replacement (e.g. a pruning refit regularized
        because the calibration had fewer tokens than coefficients); else None.
      group: for a grouped run (:mod:`jaxbsd.compression.grouped`), the MLPs solved together with
        this one: ``{"index": g, "paths": [...], "devices": d}`` (``d`` devices the block axis was
        split over); or ``{"sequential": reason}`` when the run went one MLP at a time (front to
        back, fine-tuning between blocks). None: the report of a run before grouping existed.
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
    sweep_kept: int | None = None
    stopped: str | None = None
    auto: dict[str, Any] | None = None
    warm_start_skipped: str | None = None
    notes: str | None = None
    refine: dict[str, Any] | None = None
    group: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "MLPReport":
        """The report a :meth:`dataclasses.asdict` record describes (as a resumed run reads it back)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        record = {k: v for k, v in record.items() if k in fields}
        if record.get("kept") is not None:
            record["kept"] = tuple(record["kept"])
        return cls(**record)


@dataclasses.dataclass(frozen=True)
class CompressionReport:
    """The result of :func:`~jaxbsd.compression.engine.compress_model`.

    Attributes:
      mlps: one :class:`MLPReport` per MLP, in the order they were replaced.
      params_before, params_after: ``nnx.Param`` scalars of the whole model.
      reduction: achieved, ``1 − params_after / params_before``.
      target_reduction: the ``reduction`` asked for (None with explicit ``ranks``).
      allocation, method: as given.
      discovered: with ``mlps=None``, ``{path: "chosen: …" | "not chosen: …"}`` for every candidate
        submodule in model order (the chosen ones are the paths compressed); None when ``mlps`` was given.
      distill: what the distillation stage did (:func:`~jaxbsd.compression.distill.distill_model`'s
        report: loss, steps, ``steps_kept``, ``loss_before``/``loss_after`` on its held-out
        examples, example counts, ``seconds`` and ``seconds_targets``), or None without it.
    """

    mlps: tuple[MLPReport, ...]
    params_before: int
    params_after: int
    reduction: float
    target_reduction: float | None
    allocation: str
    method: str
    discovered: dict[str, str] | None = None
    distill: dict[str, Any] | None = None

    @property
    def total_output_error(self) -> float:
        """Summed relative output error over the MLPs (what ``"greedy"`` minimises)."""
        return sum(r.output_error for r in self.mlps)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """A short readable account: the budget, then one line per MLP (method, rank, parameters,
        relative output error, refinement, notes); ``str(report)`` gives the same. Each line says the
        tokens of its errors: ``output error`` on the calibration tokens (:attr:`MLPReport.output_error`),
        the refinement's ``held-out error`` on the tokens it set apart before the build."""
        target = "explicit ranks" if self.target_reduction is None else f"target {self.target_reduction:.3g}"
        lines = [f"{self.method}, {self.allocation}: {self.params_before:,} -> {self.params_after:,} parameters "
                 f"(reduction {self.reduction:.3f}, {target})"]
        for r in self.mlps:
            line = (f"  {r.path}: {r.method} rank {r.rank}, {r.params_before:,} -> {r.params_after:,} parameters, "
                    f"output error {r.output_error:.3g} on the calibration tokens")
            if r.refine:
                if r.refine.get("skipped"):
                    line += f"; refinement skipped ({r.refine['skipped']})"
                else:
                    line += (f"; refined: held-out error {r.refine['error_before']:.3g} -> "
                             f"{r.refine['error_after']:.3g} on the {r.refine.get('tokens_heldout', '?')} calibration "
                             f"tokens no build or step fitted (step {r.refine['steps_kept']} of {r.refine['steps']})")
            if r.notes:
                line += f"; note: {r.notes}"
            lines.append(line)
        return "\n".join(lines)

    __str__ = summary


#: The :class:`MLPReport` fields a method may fill from its build ``info`` (beyond the common ones).
REPORT_FIELDS = ("selection", "restart", "restart_warm", "restart_by_objective", "restart_by_output",
                 "output_error_heldout", "selection_tokens", "sweep_kept", "stopped", "auto", "warm_start_skipped", "notes", "refine",
                 "group")
