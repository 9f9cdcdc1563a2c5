"""Sharing a parameter budget among MLPs: uniform and greedy allocation, for any method.

A method prices its ranks (:meth:`~jaxbsd.compression.methods.Method.params`); these functions
only compare prices with the budget, so they hold for every method alike.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from jaxbsd.compression.methods import Method, largest_rank
from jaxbsd.compression.sites import Site

__all__ = ["ALLOCATIONS", "GREEDY_SCALES", "budget_for", "check_budget", "uniform_ranks", "greedy_candidates", "greedy_ranks"]

#: How a ``reduction`` budget is shared among the MLPs.
ALLOCATIONS = ("uniform", "greedy")

#: Candidate ranks of the greedy allocation, as multiples of each MLP's uniform rank.
GREEDY_SCALES = (0.5, 0.75, 1.0, 1.5, 2.0)


def budget_for(reduction: float, params_total: int, sites: Sequence[Site]) -> int:
    """Parameters the compressed MLPs may hold so the model keeps at most ``(1 − ρ)·P``: only the
    listed MLPs shrink, so they share ``⌊(1 − ρ)·P⌋ − (P − Σ P_mlp)``."""
    return math.floor((1 - reduction) * params_total) - (params_total - sum(s.params for s in sites))


def check_budget(method: Method, sites: Sequence[Site], budget: int, reduction: float) -> None:
    """``ValueError`` naming ``reduction`` if ``budget`` cannot hold the smallest replacement of
    every site."""
    floor = sum(method.params(s, method.min_rank(s)) for s in sites)
    if floor > budget:
        raise ValueError(
            f"reduction={reduction} cannot be met by method {method.name!r}: the compressed MLPs may hold "
            f"{budget} parameters in all, but the smallest replacement everywhere (rank 1) already needs "
            f"{floor} (compress more MLPs or ask for less)")


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
