"""The protocol every compression method follows, and the registry of methods by name.

A method is a small frozen object that carries its own options (solver config, restarts, warm
start, the ``auto`` judge …) and answers three questions about a :class:`~jaxbsd.compression.sites.Site`:

* :meth:`Method.params` — what a rank costs in parameters there;
* :meth:`Method.max_rank` / :meth:`Method.check_rank` — which ranks are feasible there;
* :meth:`Method.build` — the replacement module at a rank, with its report fields (a :class:`Built`).

The engine plans budgets and walks the sites through this protocol only; it never asks which
method it holds. A "rank" is whatever the method sizes its replacement by (a decoupling's rank,
the hidden units a pruned MLP keeps, a low-rank factor's rank); :class:`~jaxbsd.compression.methods.auto.Auto`'s
is a pair. Strings stay shortcuts: :func:`get_method` turns ``"bsd"`` into ``BSD()``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
from flax import nnx

from jaxbsd.compression.sites import Site

__all__ = ["Method", "Built", "Pruning", "RestartChoice", "register", "get_method", "method_names", "largest_rank",
           "no_warm_start", "refuse_options"]


#: A method field's ``metadata`` key saying how :meth:`Method.to_dict` (a resumable run's identity) writes it:
#: ``"never"``, or ``"unless-default"`` (an option added after runs were saved: at its default, their
#: identities stay what they were); absent: always.
IDENTITY = "identity"


@dataclasses.dataclass(frozen=True)
class Pruning:
    """Which hidden units a pruned replacement keeps.

    Attributes:
      kept: the indices of the kept hidden units (ascending).
      fit_tokens: ``"held-out"`` (the output layer refitted on calibration tokens outside the check
        set) or ``"check"`` (too few of those: refitted on the check tokens).
    """

    kept: tuple[int, ...]
    fit_tokens: str


@dataclasses.dataclass(frozen=True)
class RestartChoice:
    """How a decoupling's restart was chosen (the fields of :class:`~jaxbsd.compression.report.MLPReport`
    of the same names)."""

    selection: str
    restart: int
    restart_warm: bool
    restart_by_objective: int
    restart_by_output: int
    output_error_heldout: float | None
    restart_output_errors: tuple[float | None, ...]
    selection_tokens: str


@dataclasses.dataclass(frozen=True)
class Built:
    """One replacement as a method built it, with what the report says of it (immutable: the
    engine adds its refinement and group with :meth:`replace`).

    Attributes:
      module: the replacement (an NNX module with the MLP's contract).
      error_J, error_F: Error(𝒥) and Error(F) on the ``S`` sampling points.
      jacobian: ``"structured"`` or ``"dense"``.
      output_error: relative output error on the check tokens (after refinement: on the check and
        the refinement's held-out tokens, see :class:`~jaxbsd.compression.report.MLPReport`).
      seconds: wall time of the build.
      notes: what else the method says about it, or None.
      pruning: for a pruned replacement, the units kept (:class:`Pruning`); else None.
      choice: for a decoupling, how its restart was chosen (:class:`RestartChoice`); else None.
      status, iterations: for a decoupling, the kept restart's solver status and sweeps; else None.
      sweep_kept, stopped: for a decoupling that tracked its iterates (``BSD(best_iterate=True)``
        or ``config.patience``), the sweep kept and the status's lower-case name; else None.
      warm_start_skipped: for a decoupling without the warm start it would have had, why; else None.
      method, rank, auto: for ``method="auto"``, the candidate kept, its rank and both candidates'
        report; else None.
      refine: the refinement stage's report (or why it was skipped); None without refinement.
      group: for a grouped run, the MLPs built together with this one; else None.
    """

    module: nnx.Module
    error_J: float | None
    error_F: float | None
    jacobian: str
    output_error: float
    seconds: float
    notes: str | None = None
    pruning: Pruning | None = None
    choice: RestartChoice | None = None
    status: int | None = None
    iterations: int | None = None
    sweep_kept: int | None = None
    stopped: str | None = None
    warm_start_skipped: str | None = None
    method: str | None = None
    rank: int | None = None
    auto: dict[str, Any] | None = None
    refine: dict[str, Any] | None = None
    group: dict[str, Any] | None = None

    def replace(self, **changes) -> "Built":
        return dataclasses.replace(self, **changes)

    def report(self) -> dict[str, Any]:
        """The report fields as JSON data: those every method has, then those this build has (a
        field at None that only some methods have is left out)."""
        out: dict[str, Any] = {}
        if self.warm_start_skipped is not None:
            out["warm_start_skipped"] = self.warm_start_skipped
        if self.choice is not None:
            out.update(dataclasses.asdict(self.choice))
        if self.pruning is not None:
            out.update(kept=list(self.pruning.kept), fit_tokens=self.pruning.fit_tokens)
        out.update(error_J=self.error_J, error_F=self.error_F)
        if self.status is not None:
            out.update(status=self.status, iterations=self.iterations)
        if self.sweep_kept is not None:
            out.update(sweep_kept=self.sweep_kept, stopped=self.stopped)
        out.update(jacobian=self.jacobian, output_error=self.output_error)
        if self.notes is not None:
            out["notes"] = self.notes
        out["seconds"] = self.seconds
        if self.auto is not None:
            out.update(method=self.method, rank=self.rank, auto=self.auto)
        for name in ("refine", "group"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclasses.dataclass(frozen=True)
class Method:
    """Base class of the compression methods (frozen dataclasses).

    Attributes:
      num_samples: ``S``, the calibration tokens sampled per MLP for its fit (the decoupling's
        sampling points, the baselines' fit tokens); None: ``min(256, available)``. Keyword only.

    Class attributes a method may override:

    * ``name``: its registry name (``"bsd"``);
    * ``needs_spec``: it reads the ``nnx.Linear`` layers of the MLP (a spec is required);
    * ``uneven``: it supports ``allocation="greedy"`` (integer ranks with a cost per rank);
    * ``judges_by_model``: it wants the whole model's output error as a judge (:meth:`build`'s ``judge``);
    * ``refines_candidates``: it applies the engine's refinement (:meth:`build`'s ``refine``) to the
      candidates it compares; for the other methods the engine refines what :meth:`build` returns.
    """

    name: ClassVar[str] = "?"
    needs_spec: ClassVar[bool] = True
    uneven: ClassVar[bool] = True
    judges_by_model: ClassVar[bool] = False
    refines_candidates: ClassVar[bool] = False

    # A run's identity records it beside the method.
    num_samples: int | None = dataclasses.field(default=None, kw_only=True, metadata={IDENTITY: "never"})

    def __post_init__(self):
        S = self.num_samples
        if S is not None and (isinstance(S, bool) or not isinstance(S, int) or S < 1):
            raise ValueError(f"num_samples must be a positive int or None, got {S!r}")

    # ------------------------------------------------------------------ sizes
    def params(self, site: Site, rank) -> int:
        """Parameters of the replacement of ``site`` at ``rank``."""
        raise NotImplementedError

    def max_rank(self, site: Site) -> int:
        """The largest rank worth considering at ``site`` (>= 1)."""
        raise NotImplementedError

    def min_rank(self, site: Site):
        """The smallest replacement (rank 1)."""
        return 1

    def rank_within(self, site: Site, share: float):
        """The largest rank whose replacement has at most ``share`` parameters (at least the smallest)."""
        return max(1, largest_rank(self, site, share))

    def check_rank(self, site: Site, rank: int):
        """The rank to build for an explicit ``ranks[path] = rank`` (``ValueError`` naming ``ranks`` if
        it is infeasible)."""
        return int(rank)

    def sample_rank(self, rank) -> int:
        """The rank that sizes the solver's samples (``S = samples_per_rank · rank``)."""
        return int(rank)

    # ------------------------------------------------------------------ building
    def check_site(self, site: Site) -> None:
        """``ValueError`` naming ``mlp_specs`` if this method cannot compress ``site``."""
        if self.needs_spec and site.spec is None:
            raise ValueError(
                f"mlp_specs: method {self.name!r} factors the nnx.Linear layers of an MLP, and no spec "
                f"was found for {site.path!r} ({type(site.module).__name__}): "
                f"{site.spec_status.removeprefix('not found: ')}. If it is one, give it: "
                f"mlp_specs={{{site.path!r}: jb.MLPSpec(fc1=..., fc2=..., activation=...)}} "
                f"(or jb.GatedMLPSpec(gate=..., up=..., down=..., activation=...) for a gated MLP)")

    def build(self, site: Site, rank, key: jax.Array, *,
              judge: Callable[[nnx.Module], float] | None = None,
              refine: Callable[[nnx.Module], tuple] | None = None) -> Built:
        """The replacement of ``site`` at ``rank`` (the model is not changed). ``judge``: the whole
        model's output error with a module in place; ``refine``: the engine's refinement stage
        (``refine(module) -> (refined, refine report)``), for methods that compare candidates."""
        raise NotImplementedError

    def build_group(self, sites: list[Site], ranks: list, keys: list[jax.Array], *,
                    judges: list[Callable[[nnx.Module], float] | None] | None = None,
                    refiners: list[Callable[[nnx.Module], tuple] | None] | None = None,
                    refine_group: Callable[[list[nnx.Module], list], list[tuple]] | None = None,
                    devices: Any = None) -> list[Built]:
        """The replacements of several independent sites of one shape (a group, see
        :mod:`jaxbsd.compression.grouped`), what :meth:`build` gives for each up to rounding.

        ``judges``/``refiners``: per site, as :meth:`build`'s ``judge``/``refine``;
        ``refine_group(modules, refiners)``: the refinement of several modules as one program (for
        methods that refine their candidates); ``devices``: where a grouped program runs
        (:class:`~jaxbsd.compression.devices.Devices`). This default builds one site at a time: a
        method whose build is a host computation (pruning's float64 least squares) has no program
        to group; a method with one (the decoupling) overrides it.
        """
        judges = judges or [None] * len(sites)
        refiners = refiners or [None] * len(sites)
        return [self.build(site, rank, key, judge=judge, refine=refine if self.refines_candidates else None)
                for site, rank, key, judge, refine in zip(sites, ranks, keys, judges, refiners)]

    def to_dict(self) -> dict[str, Any]:
        """The method and its options as JSON data (part of a resumable run's identity)."""
        out = {"method": self.name}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get(IDENTITY) == "never" or (f.metadata.get(IDENTITY) == "unless-default"
                                                         and value == f.default):
                continue
            out[f.name] = value.to_dict() if hasattr(value, "to_dict") else repr(value)
        return out


def largest_rank(method: Method, site: Site, budget: float) -> int:
    """Largest rank in ``[0, max_rank]`` whose replacement has at most ``budget`` parameters."""
    lo, hi = 0, method.max_rank(site)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if method.params(site, mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


_REGISTRY: dict[str, Callable[..., Method]] = {}


def register(name: str, factory: Callable[..., Method]) -> None:
    """Make ``method="<name>"`` a shortcut for ``factory(**options)``: the factory receives every
    option :func:`jaxbsd.compress_model` takes by keyword (``config``, ``restarts``,
    ``warm_start``, ``selection``, ``auto_judge``; unset ones at None or their defaults), uses
    those it has and raises ``ValueError`` naming an option it cannot honour."""
    _REGISTRY[name] = factory


#: The built-in methods first, in the order the documentation lists them.
_BUILT_IN = ("bsd", "svd", "drone", "prune", "auto")


#: What each option of the built-in factories sets (for the message refusing one a method lacks).
OPTION_MEANING = {
    "config": "a decoupling's solver settings (methods 'bsd' and 'auto')",
    "restarts": "a decoupling's random restarts (methods 'bsd' and 'auto')",
    "selection": "how a decoupling's restart is chosen (methods 'bsd' and 'auto')",
    "auto_judge": "how method 'auto' compares its candidates",
}


def refuse_options(name: str, options: dict, honoured: tuple[str, ...]) -> None:
    """``ValueError`` naming the first option of ``options`` that method ``name`` would silently
    ignore (an option at None is unset; ``restarts=1`` is the default)."""
    for option, value in options.items():
        unset = value is None or (option == "restarts" and value == 1) or (option == "auto_judge" and value == "model")
        if option not in honoured and option != "warm_start" and not unset:
            meaning = OPTION_MEANING.get(option, "nothing a built-in method knows")
            raise ValueError(f"{option}={value!r}: method {name!r} does not use it ({option} sets {meaning}); "
                             "leave it out")


def no_warm_start(name: str, warm_start=None, **options) -> None:
    """For the factories of methods without a decoupling: ``warm_start=True`` cannot be honoured,
    nor any decoupling's option."""
    if warm_start:
        raise ValueError(f"warm_start=True starts a decoupling from the pruned MLP: it needs method 'bsd' or "
                         f"'auto', got {name!r}")
    refuse_options(name, options, ())


def method_names() -> tuple[str, ...]:
    """The registered names: the built-in methods, then any registered later."""
    return tuple(sorted(_REGISTRY, key=lambda n: (_BUILT_IN.index(n) if n in _BUILT_IN else len(_BUILT_IN), n)))


def get_method(method: str | Method, *, num_samples: int | None = None, **options) -> Method:
    """The method object for ``method``: a registered name, built by its factory with ``options``
    (which refuses, naming it, an option it cannot honour); or a :class:`Method`, which carries its
    own options (``options`` must then be empty). ``num_samples`` set on the result where given.
    ``ValueError`` naming ``method`` otherwise."""
    if isinstance(method, Method):
        if options:
            name = next(iter(options))
            raise ValueError(f"{name}: method is a method object, which carries its own options; give {name} to "
                             f"it (e.g. jb.BSD({name}=...))")
        chosen = method
    elif not isinstance(method, str) or method not in _REGISTRY:
        raise ValueError(f"method must be one of {method_names()} or a jaxbsd method object "
                         f"(jb.BSD(...), jb.Prune(), ...), got {method!r}")
    else:
        chosen = _REGISTRY[method](**options)
    return chosen if num_samples is None else dataclasses.replace(chosen, num_samples=num_samples)
