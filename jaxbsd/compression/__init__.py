"""The compression engine: replace the MLPs of a Flax NNX model by smaller ones, under a budget.

The modules, top to bottom (each uses only those below it):

* :mod:`~jaxbsd.compression.blockwise` — the paper's block-by-block run over a data set
  (:func:`compress`), an adapter of the engine;
* :mod:`~jaxbsd.compression.api` — :func:`compress_model` and :class:`Execution`;
* :mod:`~jaxbsd.compression.engine` — the algorithm both share (:func:`~jaxbsd.compression.engine.run`):
  plan, resume, replace one MLP (or group) at a time;
* :mod:`~jaxbsd.compression.grouped` — a group's builds, as one program where the MLPs are independent;
* :mod:`~jaxbsd.compression.state` — resume: the state directory of a run;
* :mod:`~jaxbsd.compression.refine` — the label-free refinement stage, the same for every method;
* :mod:`~jaxbsd.compression.distill` — label-free distillation of the whole compressed model from
  the original, after the last replacement;
* :mod:`~jaxbsd.compression.budget` — uniform and greedy sharing of a parameter budget;
* :mod:`~jaxbsd.compression.methods` — ``bsd``, ``svd``/``drone``, ``prune``, ``auto``: one
  protocol (parameters of a rank, feasible ranks, build);
* :mod:`~jaxbsd.compression.report` — what a run reports;
* :mod:`~jaxbsd.compression.sites` — one MLP's sampled tokens and Jacobian;
* :mod:`~jaxbsd.compression.specs` — how to read an MLP (:class:`MLPSpec`, :class:`GatedMLPSpec`)
  and finding it;
* :mod:`~jaxbsd.compression.surgery` — submodules by path, and capturing what they see.
"""

from jaxbsd.compression.blockwise import CompressionConfig, compress
from jaxbsd.compression.distill import Distill
from jaxbsd.compression.api import Execution, compress_model
from jaxbsd.compression.methods import BSD, DRONE, SVD, Auto, Method, Prune, get_method, register
from jaxbsd.compression.refine import Refine
from jaxbsd.compression.report import CompressionReport, MLPReport
from jaxbsd.compression.specs import GatedMLPSpec, MLPSpec
from jaxbsd.compression.surgery import capture_calls, get_submodule, set_submodule

__all__ = [
    "compress_model",
    "Execution",
    "compress",
    "CompressionConfig",
    "CompressionReport",
    "MLPReport",
    "MLPSpec",
    "GatedMLPSpec",
    "Method",
    "BSD",
    "SVD",
    "DRONE",
    "Prune",
    "Auto",
    "Refine",
    "Distill",
    "get_method",
    "register",
    "capture_calls",
    "get_submodule",
    "set_submodule",
]
