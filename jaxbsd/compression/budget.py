"""Sharing a parameter budget among MLPs: uniform and greedy allocation, for any method.

A method prices its ranks (:meth:`~jaxbsd.compression.methods.Method.params`); these functions
only compare prices with the budget, so they hold for every method alike.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

from flax import nnx

from jaxbsd.compression.methods import Method, largest_rank
from jaxbsd.compression.sites import Site
from jaxbsd.compression.specs import GatedMLPSpec, spec_for
from jaxbsd.compression.surgery import get_submodule
from jaxbsd.models import count_params

__all__ = ["ALLOCATIONS", "GREEDY_SCALES", "plan_ranks", "budget_for", "check_budget", "largest_reduction", "priced_sites",
           "uniform_ranks", "greedy_candidates", "greedy_ranks"]

#: How a ``reduction`` budget is shared among the MLPs.
ALLOCATIONS = ("uniform", "greedy")

#: Candidate ranks of the greedy allocation, as multiples of each MLP's uniform rank.
GREEDY_SCALES = (0.5, 0.75, 1.0, 1.5, 2.0)


def plan_ranks(plan, sites: Mapping[str, Site], params_total: int, *, samples: Callable[[str, int], int | None],
               build_key: Callable[[str], Any], redraw: Callable[[str, int], Site]) -> tuple[dict, dict]:
    """``({path: rank}, {(path, rank): (site, built)})``: the ranks of an engine's ``plan`` (explicit,
    or the budget of ``plan.reduction`` shared by ``plan.allocation``), and the builds the greedy
    allocation made to compare its candidates (reused where a step sees the same site).

    Args:
      plan: the engine's :class:`~jaxbsd.compression.engine.Plan`; sites: every MLP's planning site.
      params_total: the model's parameters.
      samples: ``(path, rank) -> S`` (None: the site's own draw) of a greedy candidate.
      build_key: ``path -> key`` of a candidate's build.
      redraw: ``(path, S) -> site`` drawn again from the same tokens with ``S`` samples (the same key:
        the same check tokens), when a candidate needs more samples than the site has.
    """
    method, cache = plan.method, {}
    if plan.reduction is None:
        return {p: method.check_rank(sites[p], int(r)) for p, r in plan.ranks.items()}, cache
    ordered = [sites[p] for p in plan.paths]
    budget = budget_for(plan.reduction, params_total, ordered)
    check_budget(method, ordered, budget, plan.reduction, params_total)
    chosen = uniform_ranks(method, ordered, budget)
    if plan.allocation == "greedy":
        floor = sum(method.params(s, method.min_rank(s)) for s in ordered)
        errors = []
        for s, uniform in zip(ordered, chosen):
            alone = budget - floor + method.params(s, method.min_rank(s))
            candidates = greedy_candidates(method, s, uniform, alone)
            # S may grow with the rank: draw the most any candidate needs (same key, so the same
            # check tokens), and give each candidate a prefix of it (a draw without replacement too).
            sizes = {r: samples(s.path, r) for r in candidates}
            widest = max((S for S in sizes.values() if S is not None), default=None)
            big = s if widest in (None, s.X.shape[0]) else redraw(s.path, widest)
            errs = {}
            for r in candidates:
                S = sizes[r]
                site = big if S is None or big.X.shape[0] == S else dataclasses.replace(big, X=big.X[:S], F=big.F[:S])
                built = method.build(site, r, build_key(s.path))
                cache[(s.path, r)] = (site, built)
                errs[r] = built.output_error
            errors.append(errs)
        chosen = greedy_ranks(method, ordered, budget, errors, chosen)
    return dict(zip(plan.paths, chosen)), cache


def budget_for(reduction: float, params_total: int, sites: Sequence[Site]) -> int:
    """Parameters the compressed MLPs may hold so the model keeps at most ``(1 − ρ)·P``: only the
    listed MLPs shrink, so they share ``⌊(1 − ρ)·P⌋ − (P − Σ P_mlp)``."""
    return math.floor((1 - reduction) * params_total) - (params_total - sum(s.params for s in sites))


def largest_reduction(method: Method, sites: Sequence[Site], params_total: int) -> float:
    """The largest ``ρ`` that ``method`` meets by compressing ``sites`` alone (the rest of the model's
    ``params_total`` parameters kept): every site at its smallest replacement,
    ``(Σ P_mlp − Σ P_smallest) / P`` (:func:`budget_for` is then at least the smallest ones' total)."""
    floor = sum(method.params(s, method.min_rank(s)) for s in sites)
    return (sum(s.params for s in sites) - floor) / params_total


def check_budget(method: Method, sites: Sequence[Site], budget: int, reduction: float, params_total: int) -> None:
    """``ValueError`` naming ``reduction`` if ``budget`` cannot hold the smallest replacement of
    every site, with the largest reduction that can be met (``params_total``: the model's parameters)."""
    floor = sum(method.params(s, method.min_rank(s)) for s in sites)
    if floor <= budget:
        return
    mlp_params = sum(s.params for s in sites)
    limit = math.floor(1e4 * largest_reduction(method, sites, params_total)) / 1e4
    raise ValueError(
        f"reduction={reduction} cannot be met by method {method.name!r}, which compresses only the {len(sites)} "
        f"MLP(s) ({mlp_params:,} of the model's {params_total:,} parameters): even at their smallest replacement "
        f"(rank 1, {floor:,} parameters in all) the model keeps {params_total - mlp_params + floor:,}. The largest "
        f"reduction it can meet is {limit:.4f}; ask for at most that")


def priced_sites(model: nnx.Module, paths: Sequence[str], mlp_specs=None) -> list[Site]:
    """The :class:`Site` of each MLP at ``paths`` with only what a method's price needs (widths,
    hidden units, biases, parameters; no tokens), from the module and its spec alone: a budget can
    be checked (:func:`check_budget`, :func:`largest_reduction`) before any calibration.

    Raises:
      ValueError: naming ``mlp_specs`` where a module's spec is neither given nor known (jaxbsd's
        own MLPs); such a spec is found on calibration tokens only.
    """
    sites = []
    for path in paths:
        module = get_submodule(model, path)
        spec = spec_for(module, path, mlp_specs)
        if spec is None:
            raise ValueError(f"mlp_specs: {path!r} ({type(module).__name__}) has no spec known before calibration; "
                             "give one to price its replacements")
        kernels = spec.kernels(module, path)
        gated = isinstance(spec, GatedMLPSpec)
        m, hidden = kernels[0].shape
        sites.append(Site(path=path, module=module, spec=spec, m=int(m), n=int(kernels[-2].shape[1]),
                          hidden=int(hidden), params=count_params(module), X=None, F=None, check_X=None,
                          check_Y=None, spec_status="known", biases=spec.biases(module, path) if gated else None))
    return sites


def uniform_ranks(method: Method, sites: Sequence[Site], budget: int) -> list:
    """The same parameter fraction everywhere: the largest ``f`` for which the ranks
    ``r_i = method.rank_within(site_i, f · P_i)`` fit ``budget`` in all.

    For MLPs of one shape (a transformer's blocks) that is the same rank everywhere, the
    paper's setting. Assumes the smallest replacements fit (see :func:`check_budget`). For
    ``auto`` the rank is a pair and its price the larger candidate's, so whichever is kept the
    budget holds.
    """
    def ranks(f):
        return [method.rank_within(s, f * s.params) for s in sites]

    def cost(rs):
        return sum(method.params(s, r) for s, r in zip(sites, rs))

    if cost(ranks(1.0)) <= budget:
        return ranks(1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):  # ranks are integers: 60 halvings pin the last breakpoint exactly
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cost(ranks(mid)) <= budget else (lo, mid)
    return ranks(lo)


def greedy_candidates(method: Method, site: Site, uniform: int, budget_alone: int) -> list[int]:
    """Ranks tried for one MLP by the greedy allocation: multiples of its uniform rank."""
    cap = min(method.max_rank(site), max(1, largest_rank(method, site, budget_alone)))
    return sorted({min(cap, max(1, round(uniform * s))) for s in GREEDY_SCALES} | {min(uniform, cap)})


def greedy_ranks(method: Method, sites: Sequence[Site], budget: int,
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
        return method.params(sites[i], r)

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
