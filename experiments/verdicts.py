"""Statistics of the studies' per-seed runs: :func:`mean_std` and :func:`paired_verdict` (is one
method better than another, paired by seed; the verdict computed, never typed by hand)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["mean_std", "paired_verdict"]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and (population, ddof=0) standard deviation; ``(nan, nan)`` when empty."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std())


def paired_verdict(a: Sequence[float], b: Sequence[float], *, better: str, worse: str,
                   noise: str = "within noise", alpha: float = 0.05) -> dict:
    """Is ``a`` better than ``b``, paired by seed? The verdict is computed, never typed by hand.

    ``a[i]`` and ``b[i]`` come from the same seed (same sampling points, solver key, fine-tuning
    order). Tests: the paired t-test (``scipy.stats.ttest_rel``) and the two-sided sign test
    (``scipy.stats.binomtest`` on the non-zero differences). Verdict: ``better`` when the mean
    difference ``a − b`` is positive and the t-test's p < ``alpha``, ``worse`` when it is
    negative and p < ``alpha``, ``noise`` otherwise (fewer than 2 pairs, identical values, or
    p >= ``alpha``). The sign test is reported beside it (with n pairs its smallest two-sided p
    is 2^(1−n): 0.25 for 3 seeds, so it cannot decide alone at 3 seeds).

    Returns:
      ``{"n", "mean_a", "mean_b", "mean_diff", "diffs", "t", "p_ttest", "wins", "losses",
      "p_sign", "alpha", "verdict"}`` (p values None where a test is undefined).
    """
    from scipy import stats

    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be paired 1-D sequences, got shapes {a.shape} and {b.shape}")
    d = a - b
    n = int(d.size)
    wins, losses = int(np.sum(d > 0)), int(np.sum(d < 0))
    t = p_t = None
    if n >= 2:
        if np.all(d == d[0]):  # no spread: the t statistic is undefined (0/0) or infinite
            t, p_t = (None, 1.0) if d[0] == 0 else (float(np.sign(d[0]) * np.inf), 0.0)
        else:
            res = stats.ttest_rel(a, b)
            t, p_t = float(res.statistic), float(res.pvalue)
    p_sign = float(stats.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else None
    mean_diff = float(d.mean()) if n else float("nan")
    verdict = noise
    if p_t is not None and p_t < alpha and mean_diff > 0:
        verdict = better
    elif p_t is not None and p_t < alpha and mean_diff < 0:
        verdict = worse
    return {"n": n, "mean_a": float(a.mean()) if n else None, "mean_b": float(b.mean()) if n else None,
            "mean_diff": mean_diff, "diffs": d.tolist(), "t": t, "p_ttest": p_t, "wins": wins, "losses": losses,
            "p_sign": p_sign, "alpha": alpha, "verdict": verdict}

