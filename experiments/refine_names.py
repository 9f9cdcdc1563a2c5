"""The ``-ref…`` suffix of a study's method name: what refinement a unit runs.

One parser for the studies (``comparison.py`` configures units from it) and for ``report.py``
(which reads results without importing JAX), so the two cannot drift apart. Standard library only.

Any method may end in ``-ref<n>`` (``n`` full-batch steps of label-free refinement of every
replacement, target ``"local"``) or ``-refc<n>`` (target ``"consistent"``), optionally followed by
``b<B>`` (minibatches of ``B`` tokens) and ``lr<k>`` (learning rate ``k``·1e-4). The bare
``-ref<n>`` is full batch (the loop before minibatches, so its committed units stay reproducible),
whatever :class:`jaxbsd.Refine`'s default.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["RefineSuffix", "split_refine", "refined"]

_SUFFIX = re.compile(r"-ref(c?)(\d+)(?:b(\d+))?(?:lr(\d+))?$")


class RefineSuffix(NamedTuple):
    """What a method name's ``-ref…`` suffix asks for (:func:`split_refine`)."""

    base: str
    steps: int
    target: str
    batch: int | None  # tokens per step; None: full batch
    learning_rate: float | None  # None: jaxbsd.Refine's (1e-3)


def split_refine(method: str) -> RefineSuffix:
    """``"prune-ref300"`` → ``("prune", 300, "local", None, None)``, ``"prune-refc300"`` →
    ``("prune", 300, "consistent", None, None)``, ``"prune-ref150b512lr20"`` → ``("prune", 150,
    "local", 512, 2e-3)``; no suffix: ``(method, 0, "local", None, None)``."""
    m = _SUFFIX.search(method)
    if m is None or m.start() == 0:
        return RefineSuffix(method, 0, "local", None, None)
    return RefineSuffix(method[: m.start()], int(m[2]), "consistent" if m[1] else "local",
                        int(m[3]) if m[3] else None, int(m[4]) * 1e-4 if m[4] else None)


def refined(method: str, steps: int, target: str = "local", batch: int | None = None,
            lr: float | None = None) -> str:
    """The name of ``method`` refined for ``steps`` (0: ``method`` itself) towards ``target``, on
    minibatches of ``batch`` tokens (None: full batch), at learning rate ``lr`` (None: the default):
    the inverse of :func:`split_refine`."""
    if not steps:
        return method
    return (f"{method}-ref{'c' if target == 'consistent' else ''}{steps}{f'b{batch}' if batch else ''}"
            f"{f'lr{round(lr / 1e-4)}' if lr else ''}")
