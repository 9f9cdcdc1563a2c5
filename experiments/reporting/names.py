"""Methods by name: as a table shows them, as prose says them, and the ``-ref…`` suffix of a
refined unit (issue 37; parsed by ``experiments/refine_names.py``, shared with the studies)."""

from __future__ import annotations

from refine_names import refined as _refined_name, split_refine  # the studies' -ref… suffix (stdlib only)


NAMES = {"svd": "SVD", "drone": "DRONE", "bsd": "B-spline", "bsd-greedy": "B-spline (greedy)", "prune": "Pruning"}


def row_name(row: dict) -> str:
    """A summary row's method as displayed (the study records it; older results: by key)."""
    return row.get("name") or NAMES.get(row["method"], row["method"])


DISPLAY = {"bsd-warm": "B-spline (warm start)", "bsd": "B-spline", "prune": "Pruning", "auto": "Auto",
           "svd": "SVD", "drone": "DRONE"}


def display(method: str) -> str:
    """A method's short name in the refinement tables."""
    return DISPLAY.get(method, method)


PROSE_NAMES = {"bsd-warm": "the warm-started B-spline decoupling", "bsd": "the B-spline decoupling (old defaults)",
               "prune": "pruning", "auto": "`auto`", "svd": "SVD", "drone": "DRONE"}


def prose_name(method: str) -> str:
    """A method as prose: ``"pruning"``, ``"refined pruning"``, ``"the refined warm-started B-spline
    decoupling"``."""
    base, steps, target, batch, lr = split_refine(method)
    name = PROSE_NAMES.get(base, f"`{base}`")
    if not steps:
        return name
    tail = (f" ({steps} steps{f' of {batch} tokens' if batch else ''}{f', learning rate {lr:g}' if lr else ''}"
            f"{', consistent target' if target == 'consistent' else ''})"
            if steps != REFINE_STEPS or target != "local" or batch or lr else "")
    return (name.replace("the ", "the refined ", 1) if name.startswith("the ") else "refined " + name) + tail


#: The refinement every study and table below means unless it says otherwise (``-ref300``).
REFINE_STEPS = 300


def is_refined(method: str) -> bool:
    return split_refine(method)[1] > 0


def refined(method: str, steps: int = REFINE_STEPS, target: str = "local", batch: int | None = None,
            lr: float | None = None) -> str:
    """:func:`refine_names.refined`, ``steps`` defaulting to :data:`REFINE_STEPS`."""
    return _refined_name(method, steps, target, batch, lr)


def join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
