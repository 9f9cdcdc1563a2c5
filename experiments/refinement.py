"""A study's method setting as a typed record: the method as built and the refinement after it.

A :class:`Setting` is ``base`` (the method as built: ``"bsd"``, ``"prune"``, ``"bsd-warm"``,
``"auto"``...) and ``refine`` (a :class:`Refinement`: label-free refinement of every replacement,
:class:`jaxbsd.Refine`; ``steps == 0`` for none). The studies pass settings around; a setting's
name, the method label of its records, unit names and result files, is derived in one place,
:attr:`Setting.name`, and read back in one place, :meth:`Setting.parse` (a command line's
``--methods``, a committed result's ``method``). The two are inverse: ``Setting.parse(s.name) == s``.

The name is ``base``, then for a refinement ``-ref<n>`` (target ``"local"``) or ``-refc<n>``
(target ``"consistent"``), ``b<B>`` for minibatches of ``B`` tokens and ``lr<k>`` for learning rate
``k``·1e-4: ``prune-refc150b512lr20``. Without ``b<B>`` the refinement is full batch (whatever
:class:`jaxbsd.Refine`'s default), without ``lr<k>`` at :class:`jaxbsd.Refine`'s learning rate.

Standard library only: the results layer (``experiments/reporting``) reads names through it too.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["Refinement", "Setting"]

_SUFFIX = re.compile(r"-ref(c?)(\d+)(?:b(\d+))?(?:lr(\d+))?$")
_LR_UNIT = 1e-4


@dataclasses.dataclass(frozen=True)
class Refinement:
    """Label-free refinement after a method: ``steps`` Adam steps (0: none) towards ``target``
    (``"local"`` or ``"consistent"``), on minibatches of ``batch`` tokens (None: full batch), at
    ``learning_rate`` (None: :class:`jaxbsd.Refine`'s)."""

    steps: int = 0
    target: str = "local"
    batch: int | None = None
    learning_rate: float | None = None

    def __post_init__(self):
        if self.target not in ("local", "consistent"):
            raise ValueError(f"refinement target must be 'local' or 'consistent', got {self.target!r}")

    @property
    def suffix(self) -> str:
        """The name's ``-ref…`` suffix (``""`` for no refinement)."""
        if not self.steps:
            return ""
        return (f"-ref{'c' if self.target == 'consistent' else ''}{self.steps}"
                f"{f'b{self.batch}' if self.batch else ''}"
                f"{f'lr{round(self.learning_rate / _LR_UNIT)}' if self.learning_rate else ''}")


@dataclasses.dataclass(frozen=True)
class Setting:
    """A study's method: ``base`` as built, then ``refine``."""

    base: str
    refine: Refinement = Refinement()

    @property
    def name(self) -> str:
        """The method's name (``"prune-ref300"``): the one place it is derived."""
        return self.base + self.refine.suffix

    @property
    def refined(self) -> bool:
        return self.refine.steps > 0

    def with_refinement(self, steps: int, target: str = "local", batch: int | None = None,
                        learning_rate: float | None = None) -> "Setting":
        """This setting's base refined for ``steps`` (0: the base itself) towards ``target``..."""
        return Setting(self.base, Refinement(steps, target, batch, learning_rate))

    @classmethod
    def parse(cls, name: str) -> "Setting":
        """The setting a name stands for: ``"prune-ref150b512lr20"`` → ``Setting("prune",
        Refinement(150, "local", 512, 2e-3))``; a name without suffix → ``Setting(name)``."""
        m = _SUFFIX.search(name)
        if m is None or m.start() == 0:
            return cls(name)
        return cls(name[: m.start()], Refinement(int(m[2]), "consistent" if m[1] else "local",
                                                 int(m[3]) if m[3] else None,
                                                 int(m[4]) * _LR_UNIT if m[4] else None))

    def __str__(self) -> str:
        return self.name
