"""Formatters: table cells (:func:`md`, :func:`pm`, :func:`pval`, :func:`bench_value`) and the
figures of the prose (:func:`num`, :func:`pct`, :func:`sgn`, :func:`pv`, :func:`rng`, :func:`ratio`,
:func:`slash`, :func:`count`, :func:`secs`). Pure functions of numbers: no result is read here."""

from __future__ import annotations

from typing import Iterable

import numpy as np


def md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def pm(mean, std, digits=2) -> str:
    return "—" if mean is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def pval(p) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def bench_value(x, unit: str) -> str:
    """A measured benchmark value in its unit (times scaled to s, ms or µs)."""
    if x is None:
        return "—"
    if unit != "s":
        return f"{x:.2f} {unit}"
    return f"{x:.2f} s" if x >= 1 else f"{x * 1e3:.2f} ms" if x >= 1e-3 else f"{x * 1e6:.1f} µs"


def _minus(s: str) -> str:
    return s.replace("-", "−")


def num(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals (a minus sign, not a hyphen)."""
    return _minus(f"{x:.{digits}f}")


def pct(x: float, digits: int = 2) -> str:
    """An accuracy or share in percent: ``88.55 %``."""
    return num(x, digits) + " %"


def sgn(x: float, digits: int = 2) -> str:
    """A signed difference: ``+0.22``, ``−0.20``."""
    return _minus(f"{x:+.{digits}f}")


def pv(p: float) -> str:
    """A p-value as prose: ``p = 0.022`` (two significant digits), ``p < 0.001``."""
    if p is None or not np.isfinite(p):
        return "p n/a"
    return "p < 0.001" if p < 0.001 else f"p = {float(f'{p:.2g}'):g}"


def rng(values: Iterable[float], digits: int = 2, unit: str = "") -> str:
    """The range of ``values``: ``0.7–3.5`` (one value if they round alike), ``unit`` appended."""
    vals = sorted(float(v) for v in values)
    lo, hi = num(vals[0], digits), num(vals[-1], digits)
    return (lo if lo == hi else f"{lo}–{hi}") + unit


def ratio(x: float, digits: int = 1) -> str:
    """A speed-up or size ratio: ``5.8×``."""
    return num(x, digits) + "×"


def slash(values: Iterable[float], digits: int = 2, unit: str = " %") -> str:
    """Values side by side, one per seed or setting: ``95.12 / 95.37 / 95.32 %``."""
    return " / ".join(num(v, digits) for v in values) + unit


def count(k: int, n: int) -> str:
    """``k of n``."""
    return f"{k} of {n}"


def secs(x: float, digits: int = 1) -> str:
    """A duration in seconds: ``19.7 s``."""
    return num(x, digits) + " s"
