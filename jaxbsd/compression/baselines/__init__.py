"""The compared methods' algorithms: low rank (:mod:`~jaxbsd.compression.baselines.lowrank`: SVD, DRONE)
and structured pruning (:mod:`~jaxbsd.compression.baselines.pruning`); the modules they build live in
:mod:`jaxbsd.models.compressed` and are re-exported here."""

from jaxbsd.compression.baselines.lowrank import *  # noqa: F401,F403
from jaxbsd.compression.baselines.lowrank import __all__ as _lowrank
from jaxbsd.compression.baselines.pruning import *  # noqa: F401,F403
from jaxbsd.compression.baselines.pruning import __all__ as _pruning
from jaxbsd.models.compressed import *  # noqa: F401,F403
from jaxbsd.models.compressed import __all__ as _modules

__all__ = [*_modules, *_lowrank, *_pruning]
