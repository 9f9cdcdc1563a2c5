"""Methods by name: as a table shows them, as prose says them, and the names of refined units.

A committed result names each unit's method setting by :attr:`refinement.Setting.name`; this module
reads such a name back through :meth:`refinement.Setting.parse` (:func:`setting`) and derives the
name of a refined unit through the same record (:func:`refined`), so the two cannot drift apart."""

from __future__ import annotations

from refinement import Refinement, Setting  # the studies' method settings (standard library only)


def setting(method: str) -> Setting:
    """The setting a committed result's method name stands for."""
    return Setting.parse(method)


NAMES = {"svd": "SVD", "drone": "DRONE", "bsd": "B-spline", "bsd-greedy": "B-spline (greedy)", "prune": "Pruning"}


def row_name(row: dict) -> str:
    """A summary row's method as displayed (the study records it; older results: by key)."""
    return row.get("name") or NAMES.get(row["method"], row["method"])


DISPLAY = {"bsd-warm": "B-spline (warm start)", "bsd": "B-spline", "prune": "Pruning", "auto": "Auto",
           "svd": "SVD", "drone": "DRONE", "bsd-aug": "B-spline (contains pruning)",
           "auto-aug": "Auto (contains pruning)"}


def display(method: str) -> str:
    """A method's short name in the refinement tables."""
    return DISPLAY.get(method, method)


PROSE_NAMES = {"bsd-warm": "the warm-started B-spline decoupling", "bsd": "the B-spline decoupling (old defaults)",
               "prune": "pruning", "auto": "`auto`", "svd": "SVD", "drone": "DRONE",
               "bsd-aug": "the decoupling that contains pruning", "auto-aug": "`auto` (containing pruning)"}


def prose_name(method: str) -> str:
    """A method as prose: ``"pruning"``, ``"refined pruning"``, ``"the refined warm-started B-spline
    decoupling"``."""
    s = setting(method)
    base, steps, target, batch, lr = s.base, s.refine.steps, s.refine.target, s.refine.batch, s.refine.learning_rate
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
    return setting(method).refined


def refined(method: str, steps: int = REFINE_STEPS, target: str = "local", batch: int | None = None,
            lr: float | None = None) -> str:
    """The name of ``method`` (a base) refined for ``steps`` (0: ``method`` itself) towards ``target``,
    on minibatches of ``batch`` tokens (None: full batch), at learning rate ``lr`` (None: the default)."""
    return Setting(method, Refinement(steps, target, batch, lr)).name


def join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
