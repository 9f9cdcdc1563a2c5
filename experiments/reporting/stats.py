"""Statistics recomputed from the per-seed runs of a result: :class:`Paired` (a paired t-test
over seeds), :class:`Result` (one committed JSON) and :class:`Study` (runs per method, ρ and
seed), and issue 37's rule for ``auto`` (:class:`AutoRule`). numpy and scipy only."""

from __future__ import annotations

from typing import Iterable

import numpy as np
from refinement import Refinement

from .formats import count, num, pct, pv, sgn, slash
from .names import REFINE_STEPS, join, prose_name, refined, setting


class Paired:
    """Method ``a`` against ``b`` paired over seeds: ``diff`` (mean of a − b), ``p`` (paired
    t-test, scipy), ``verdict`` ("holds" if a is higher with p < 0.05, "does not hold" if lower
    with p < 0.05, else "within noise"), ``wins``/``losses``/``n``. ``d``, ``pv`` and ``dp``
    render the difference, the p-value and both."""

    def __init__(self, a: list[float], b: list[float], alpha: float = 0.05, digits: int = 2):
        from scipy import stats

        diffs = np.asarray(a, float) - np.asarray(b, float)
        self.n, self.diffs, self.digits = len(diffs), diffs, digits
        self.diff = float(diffs.mean()) if self.n else float("nan")
        self.wins, self.losses = int((diffs > 0).sum()), int((diffs < 0).sum())
        if self.n > 1 and np.ptp(diffs) > 0:
            self.p = float(stats.ttest_rel(a, b).pvalue)
        else:
            self.p = float("nan") if self.n < 2 or self.diff == 0 else 0.0
        self.verdict = ("holds" if self.diff > 0 and self.p < alpha else
                        "does not hold" if self.diff < 0 and self.p < alpha else "within noise")

    @property
    def d(self) -> str:
        return sgn(self.diff, self.digits)

    @property
    def pv(self) -> str:
        return "identical on every seed" if self.n and not self.diffs.any() else pv(self.p)

    @property
    def dp(self) -> str:
        return f"{self.d}, {self.pv}"

    def __str__(self) -> str:
        return f"{self.d} ({self.pv})"

    def says(self, a: str, b: str) -> str:
        """The verdict as prose naming the two sides: "**a is better** (+0.30, p = 0.01)", "**b is
        better** (...)" or "**within noise** (...)"."""
        word = {"holds": f"{a} is better", "does not hold": f"{b} is better"}.get(self.verdict, self.verdict)
        return f"**{word}** ({self.dp})"


class Result:
    """One committed result: ``r["key"]`` reads its JSON; studies add helpers."""

    def __init__(self, payload: dict):
        self.json = payload

    def __getitem__(self, key):
        """``r["key"]``, or a path: ``r["results", "paper", "mean"]`` (no ``][`` in a page's
        source, which Markdown would read as a reference link)."""
        value = self.json
        for k in key if isinstance(key, tuple) else (key,):
            value = value[k]
        return value


class Study(Result):
    """A study with ``runs`` per (method, ρ, seed) and an ``accuracy`` each (comparison,
    training-free, knobs): means and paired tests recomputed from the per-seed runs."""

    key = "accuracy"

    def _runs(self, method, rho, setting=None) -> dict:
        return {r["seed"]: r for r in self.json["runs"] if r["method"] == method and r["reduction"] == rho
                and r.get("status", "ok") == "ok" and (setting is None or r.get("setting") == setting)}

    def seeds(self, method: str, rho: float, key: str | None = None, setting=None) -> list[float]:
        """Per-seed values (``key``, default accuracy), in seed order."""
        runs = self._runs(method, rho, setting)
        return [runs[s][key or self.key] for s in sorted(runs)]

    def mean(self, method: str, rho: float, key: str | None = None, setting=None) -> float:
        return float(np.mean(self.seeds(method, rho, key, setting)))

    acc = mean

    def vs(self, a: str, b: str, rho: float, key: str | None = None, setting=None, digits: int = 2) -> Paired:
        """``a`` against ``b`` at ρ, paired over their common seeds."""
        ra, rb = self._runs(a, rho, setting), self._runs(b, rho, setting)
        common = sorted(set(ra) & set(rb))
        k = key or self.key
        return Paired([ra[s][k] for s in common], [rb[s][k] for s in common], digits=digits)

    def verdicts(self, a: str, b: str, rhos: Iterable[float] | None = None, key: str | None = None,
                 setting=None, digits: int = 2) -> str:
        """``a`` against ``b`` over ρ as prose, grouped by verdict: "**holds** at ρ = 0.1 (+0.22,
        p = 0.022) and 0.5 (...); **within noise** at ρ = 0.2 (...)". A flipped verdict moves its ρ."""
        rhos = [r for r in (rhos or self.json["plan"]["budgets"]) if self._runs(a, r, setting) and self._runs(b, r, setting)]
        groups: dict[str, list[str]] = {}
        for r in rhos:
            v = self.vs(a, b, r, key, setting, digits)
            groups.setdefault(v.verdict, []).append(f"{r:g} ({v.d}, {v.pv})")
        parts = []
        for verdict, items in groups.items():
            items = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
            parts.append(f"**{verdict}** at ρ = {items}")
        return "; ".join(parts)

    def pm(self, method: str, rho: float, key: str | None = None, digits: int = 2) -> str:
        """Mean ± std over seeds (population std, as in the tables)."""
        v = self.seeds(method, rho, key)
        return f"{num(np.mean(v), digits)} ± {num(np.std(v), digits)}"

    def param_gap(self, a: str, b: str, rho: float) -> float:
        """How many percent fewer parameters ``a`` keeps than ``b`` at ρ (means)."""
        return 100 * (1 - self.mean(a, rho, "params") / self.mean(b, rho, "params"))

    def reduction_gap(self, a: str, b: str, rho: float) -> float:
        """How many more percent of the model's parameters ``a`` removes than ``b`` at ρ (means)."""
        return 100 * (self.mean(a, rho, "reduction_achieved") - self.mean(b, rho, "reduction_achieved"))

    def kept(self, method: str, rho: float, candidate: str = "bsd") -> str:
        """How many blocks ``auto``'s judge gave to ``candidate`` over all seeds: ``9 of 18``."""
        steps = [s for r in self._runs(method, rho).values() for s in r["steps"]]
        return count(sum(s["method"] == candidate for s in steps), len(steps))

    def lower_block_error(self, method: str, rho: float, candidate: str = "prune") -> str:
        """In how many of ``auto``'s choices ``candidate`` had the lower output error of the block."""
        autos = [s["auto"] for r in self._runs(method, rho).values() for s in r["steps"] if s.get("auto")]
        other = {"prune": "bsd", "bsd": "prune"}[candidate]
        return count(sum(a[candidate]["output_error"] < a[other]["output_error"] for a in autos), len(autos))

    def row(self, method: str, rho: float, setting=None) -> dict:
        """The study's summary row of ``method`` at ρ (and ``setting``)."""
        return next(r for r in self.json["rows"] if r["method"] == method and r["reduction"] == rho
                    and (setting is None or r.get("setting") == setting))

    def best(self, rho: float, methods: Iterable[str], key: str | None = None) -> str:
        """The method with the highest mean at ρ among ``methods``."""
        return max(methods, key=lambda m: self.mean(m, rho, key))

    # Label-free refinement: a refined unit is its method with ``-ref<n>`` / ``-refc<n>``.

    def has(self, *methods: str, rho: float | None = None) -> bool:
        """Whether each of ``methods`` has a finished run (at ρ, or at any ρ)."""
        return all(any(r["method"] == m and r.get("status", "ok") == "ok" and (rho is None or r["reduction"] == rho)
                       for r in self.json["runs"]) for m in methods)

    def budgets(self, *methods: str) -> list[float]:
        """The study's ρ at which each of ``methods`` has runs."""
        return [r for r in self.json["plan"]["budgets"] if self.has(*methods, rho=r)]

    def gain(self, method: str, rho: float, steps: int = REFINE_STEPS, target: str = "local", key: str | None = None,
             setting=None, digits: int = 2) -> Paired:
        """What refinement changes: ``method`` refined (``steps`` towards ``target``) − ``method``,
        paired over seeds."""
        return self.vs(refined(method, steps, target), method, rho, key, setting, digits)

    def best_refined(self, rho: float, methods: Iterable[str] | None = None, steps: int = REFINE_STEPS) -> str:
        """The refined method (``-ref<steps>``) with the highest mean at ρ, among ``methods``'
        refined units (default: every refined unit at ρ)."""
        names = ([refined(m, steps) for m in methods] if methods is not None else
                 sorted({r["method"] for r in self.json["runs"] if setting(r["method"]).refine == Refinement(steps)}))
        return self.best(rho, [m for m in names if self.has(m, rho=rho)])

    def changes(self, a: str, b: str, a0: str, b0: str, setting=None) -> str:
        """Whether the verdict of ``a`` against ``b`` differs from that of ``a0`` against ``b0``
        (say, both refined against both unrefined) at any ρ where all four ran: "at no ρ" or
        "at ρ = 0.2 and 0.35"."""
        rhos = [r for r in self.budgets(a, b, a0, b0)
                if self.vs(a, b, r, setting=setting).verdict != self.vs(a0, b0, r, setting=setting).verdict]
        return "at no ρ" if not rhos else "at ρ = " + join([f"{r:g}" for r in rhos])

    def auto_rule(self, rho: float, steps: int = REFINE_STEPS) -> "AutoRule":
        """Issue 37's rule for ``auto`` at ρ (:class:`AutoRule`)."""
        return AutoRule(self, rho, steps)

    def moves(self, method: str, rho: float, steps: int = REFINE_STEPS, target: str = "local") -> str:
        """``from 85.32 % to 86.90 % (+1.58, p = 0.0031)``: ``method`` before and after refinement."""
        after = refined(method, steps, target)
        return f"from {pct(self.mean(method, rho))} to {pct(self.mean(after, rho))} ({self.gain(method, rho, steps, target).dp})"

    def gap(self, method: str, rho: float) -> str:
        """``1.52 points below the original (88.42 %)``: ``method``'s mean against the original model."""
        x = self.mean(method, rho) - self["accuracy_original"]
        return f"{num(abs(x))} points {'below' if x < 0 else 'above'} the original ({pct(self['accuracy_original'])})"

    def curve(self, method: str, rho: float, steps: Iterable[int]) -> str:
        """Mean top-1 after each number of refinement steps: ``85.32 / 86.10 / 86.90 %``."""
        return slash(self.mean(refined(method, n), rho) for n in steps)


#: Issue 37's rule for ``auto``: at least max(B-spline, pruning) − this, or not significantly below.
AUTO_MARGIN = 0.1


class AutoRule:
    """Issue 37's rule for ``auto`` at one ρ: ``auto`` (refined) against the better (by mean) of
    the refined B-spline decoupling and refined pruning, paired over seeds; ``holds`` when auto ≥
    that − :data:`AUTO_MARGIN` or the paired difference is not significant (p ≥ 0.05).
    ``auto``, ``candidates`` and ``setting`` name other units (issue 43: distilled ``auto``
    against every single method distilled, in one variant)."""

    def __init__(self, study: "Study", rho: float, steps: int = REFINE_STEPS, *, auto: str | None = None,
                 candidates: Iterable[str] | None = None, setting=None):
        auto = auto or refined("auto", steps)
        candidates = list(candidates) if candidates is not None else [refined(m, steps) for m in ("bsd-warm", "prune")]
        self.rho, self.auto = rho, auto
        self.against = max(candidates, key=lambda m: study.mean(m, rho, setting=setting))
        self.paired = study.vs(auto, self.against, rho, setting=setting)
        self.diff = study.mean(auto, rho, setting=setting) - study.mean(self.against, rho, setting=setting)
        # Means of accuracies with two decimals: compare at the precision they carry.
        self.holds = bool(round(self.diff, 6) >= -AUTO_MARGIN or not self.paired.p < 0.05)

    def __str__(self) -> str:
        return f"{sgn(self.diff)} against {prose_name(self.against)}, {self.paired.pv}"


def pmax(paired: Iterable[Paired]) -> str:
    """The largest p-value of several paired tests, as prose: ``p < 0.001``, ``p ≤ 0.0069``."""
    worst = max(v.p for v in paired)
    return "p < 0.001" if worst < 0.001 else f"p ≤ {float(f'{worst:.2g}'):g}"
