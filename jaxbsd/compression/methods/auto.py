"""``method="auto"``: per MLP, the better of a warm-started decoupling and a pruned MLP.

Both candidates are built within one parameter share (the rank is a pair: the decoupling's rank
and the pruned units), and the one judged better is kept: by the whole model's output error with
the candidate in place (``judge="model"``, the engine supplies the judge) or by the MLP's own
output error on its check tokens, held out from both fits (``judge="block"``). Ties go to
pruning (no solver needed), and so does a decoupling whose error is not finite.

**Deprecated** (issue 58): ``bsd`` contains pruning now (its sweep 0 is the pruned MLP and it keeps the
iterate with the lowest held-out error), so ``auto``'s fallback is inside ``bsd``; measured, ``auto``
scored as ``bsd`` in every cell but one, within noise there, for a second build and a judge
(``docs/which-method.md``). Constructing an :class:`Auto` (``method="auto"``, ``jb.Auto(...)``,
``CompressionConfig(method="auto")``, ``--method auto``) warns with :data:`DEPRECATION`, a
``FutureWarning``; it behaves as before, so committed studies reproduce. It goes in jaxbsd 0.2.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from typing import Callable

import jax
import numpy as np
from flax import nnx

from jaxbsd.compression.methods.base import Built, Method, largest_rank, refuse_options, register
from jaxbsd.compression.methods.bsd import BSD, DEFAULT_CONFIG
from jaxbsd.compression.methods.prune import Prune
from jaxbsd.compression.sites import Site
from jaxbsd.models import count_params

__all__ = ["Auto", "JUDGES", "DEFAULT_JUDGE", "DEPRECATION"]

#: How the two candidates are compared: ``"model"``, the whole model's outputs with each
#: candidate in place; ``"block"``, the MLP's own output error on its check tokens.
JUDGES = ("model", "block")
DEFAULT_JUDGE = "model"

#: What constructing an :class:`Auto` warns (a ``FutureWarning``: shown to users by default).
DEPRECATION = ("method 'auto' is deprecated and goes in jaxbsd 0.2: method 'bsd' contains pruning (it starts from "
               "the pruned MLP and keeps the sweep with the lowest held-out error, sweep 0 included), so auto's "
               "fallback to pruning is inside it; measured, auto scored as bsd at a second build's cost "
               "(docs/which-method.md). Use method='bsd' (or 'prune')")


@dataclasses.dataclass(frozen=True)
class Auto(Method):
    """The better of ``bsd`` (a decoupling, warm-started from the pruned MLP wherever that is
    possible) and ``prune`` at one parameter share per MLP. **Deprecated**: use ``BSD`` (which
    contains pruning); constructing one warns with :data:`DEPRECATION`.

    Attributes:
      bsd: the decoupling candidate (its ``warm_start`` None: warm-started wherever the MLP can
        be pruned to ``rank − 1`` units; elsewhere — a gated MLP, a rank above the hidden width —
        from the random restarts alone, said in the report).
      prune: the pruning candidate.
      judge: ``"model"`` (default) or ``"block"``.
    """

    bsd: BSD = BSD()
    prune: Prune = Prune()
    judge: str = DEFAULT_JUDGE

    name = "auto"
    refines_candidates = True
    uneven = False  # both candidates live in one share; greedy shares are per candidate

    def __post_init__(self):
        super().__post_init__()
        warnings.warn(DEPRECATION, FutureWarning, stacklevel=_outside_package())
        if self.judge not in JUDGES:
            raise ValueError(f"auto_judge must be one of {JUDGES}, got {self.judge!r}")

    @property
    def judges_by_model(self) -> bool:  # type: ignore[override]
        return self.judge == "model"

    def check_site(self, site: Site) -> None:
        self.bsd.check_site(site)
        self.prune.check_site(site)

    def params(self, site: Site, rank) -> int:
        # Whichever candidate is kept, the budget must hold: count the larger.
        r, k = rank
        return max(self.bsd.params(site, r), self.prune.params(site, k))

    def max_rank(self, site: Site):
        return (self.bsd.max_rank(site), self.prune.max_rank(site))

    def min_rank(self, site: Site):
        return (1, 1)

    def rank_within(self, site: Site, share: float):
        return (self.bsd.rank_within(site, share), self.prune.rank_within(site, share))

    def check_rank(self, site: Site, rank: int):
        """``ranks[path] = r`` is the decoupling's rank; the pruned candidate keeps the most units
        whose parameters do not exceed the decoupling's (at least 1, at most ``H``)."""
        r = self.bsd.check_rank(site, rank)
        return (r, max(1, min(site.hidden, largest_rank(self.prune, site, self.bsd.params(site, r)))))

    def sample_rank(self, rank) -> int:
        return int(rank[0])

    def build(self, site: Site, rank, key: jax.Array, *,
              judge: Callable[[nnx.Module], float] | None = None,
              refine: Callable[[nnx.Module], tuple] | None = None) -> Built:
        start = time.perf_counter()
        bsd_rank, prune_rank = rank
        bsd = self.bsd.build(site, bsd_rank, key)
        pruned = self.prune.build(site, prune_rank, key)
        if refine is not None:  # both candidates refined (same tokens, same split) before the judge
            bsd, pruned = (_refined(b, refine(b.module)) for b in (bsd, pruned))
        return self._choose(rank, bsd, pruned, judge, refine is not None, start)

    def build_group(self, sites, ranks, keys, *, judges=None, refiners=None, refine_group=None,
                    devices=None):
        """Both candidates of every site of a group: the decouplings as one program
        (:meth:`BSD.build_group`), the prunings on the host, the refinements of each kind as one
        program (``refine_group``), then each site's judge as in :meth:`build`. The block judge is
        exact; what the model judge sees in a group is the engine's (:mod:`jaxbsd.compression.grouped`)."""
        start = time.perf_counter()
        judges = judges or [None] * len(sites)
        refining = refiners is not None and all(r is not None for r in refiners)
        bsds = self.bsd.build_group(sites, [r[0] for r in ranks], keys, devices=devices)
        pruneds = self.prune.build_group(sites, [r[1] for r in ranks], keys, devices=devices)
        if refining:
            def refined_all(builds):
                modules = [b.module for b in builds]
                refined = (refine_group(modules, refiners) if refine_group is not None
                           else [r(m) for m, r in zip(modules, refiners)])
                return [_refined(b, r) for b, r in zip(builds, refined)]

            bsds, pruneds = refined_all(bsds), refined_all(pruneds)
        share = (time.perf_counter() - start) / len(sites)
        out = []
        for rank, b, p, judge in zip(ranks, bsds, pruneds, judges):
            built = self._choose(rank, b, p, judge, refining, time.perf_counter())
            out.append(built.replace(seconds=built.seconds + share))
        return out

    def _choose(self, rank, bsd: Built, pruned: Built, judge, refined: bool, start: float) -> Built:
        """The candidate judged better, with the report of both."""
        bsd_rank, prune_rank = rank
        if self.judge == "block" or judge is None:
            if not refined:
                what, e_bsd, e_prune = "held-out output error", bsd.output_error, pruned.output_error
            else:  # the check tokens trained the refinement: compare on its held-out tokens
                what = "refined held-out output error"
                e_bsd, e_prune = bsd.refine["error_after"], pruned.refine["error_after"]
            judge = None
        else:
            what, e_bsd, e_prune = "model output error", judge(bsd.module), judge(pruned.module)
        better = bool(np.isfinite(e_bsd) and (e_bsd < e_prune or not np.isfinite(e_prune)))
        kept = "bsd" if better else "prune"
        relation = "<" if better else ">="

        def summary(r, built: Built, e_model):
            fields = built.report()
            return dict(rank=int(r), params=count_params(built.module), output_error=built.output_error,
                        **({} if judge is None else {"model_output_error": e_model}),
                        **{k: fields[k] for k in ("fit_tokens", "restart", "restart_warm", "output_error_heldout",
                                                  "selection_tokens", "warm_start_skipped", "refine") if k in fields})

        auto = dict(kept=kept, judge="block" if judge is None else "model",
                    reason=f"{what}: bsd {e_bsd:.4g} {relation} prune {e_prune:.4g}",
                    bsd=summary(bsd_rank, bsd, e_bsd), prune=summary(prune_rank, pruned, e_prune))
        return (bsd if better else pruned).replace(method=kept, rank=int(bsd_rank if better else prune_rank),
                                                   auto=auto, seconds=time.perf_counter() - start)


def _from_options(config=None, restarts=1, warm_start=None, selection=None, auto_judge=DEFAULT_JUDGE, contain=True,
                  **options):
    refuse_options("auto", options, ())
    selection = "output" if selection is None else selection
    if warm_start is False:
        raise ValueError("warm_start=False: method 'auto' always warm-starts its decoupling from the pruned MLP")
    bsd = BSD(config=DEFAULT_CONFIG if config is None else config, restarts=restarts, warm_start=None,
              selection=selection, contain=contain)
    return Auto(bsd=bsd, prune=Prune(), judge=auto_judge)


register("auto", _from_options)


#: jaxbsd's own folder: frames whose files are under it are the library's, not the caller's.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def _outside_package() -> int:
    """The ``stacklevel`` of the first frame outside jaxbsd (the user's line that asked for ``auto``,
    through ``get_method``, ``CompressionConfig`` or ``compress_model``), seen from :meth:`Auto.__post_init__`."""
    frame, level = sys._getframe(3), 3  # 1: __post_init__, 2: the dataclass's generated __init__
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE)
                                 or frame.f_code.co_name == "__init__" and frame.f_code.co_filename.startswith("<")):
        frame, level = frame.f_back, level + 1
    return level


def _refined(built: Built, refined: tuple) -> Built:
    """``built`` after the engine's refinement ``refined = (module, refine report)``."""
    module, report = refined
    return built.replace(module=module, refine=report)
