"""Compatibility module: ``compress_model`` and its pieces now live in :mod:`jaxbsd.compression`.

``from jaxbsd.compress_model import MLPSpec, get_submodule, ...`` keeps working for the public
names below; new code imports from :mod:`jaxbsd.compression` (or uses ``jb.compress_model``).
"""

from jaxbsd.compression.engine import ALLOCATIONS, METHODS, compress_model  # noqa: F401
from jaxbsd.compression.methods import DEFAULT_CONFIG  # noqa: F401
from jaxbsd.compression.report import CompressionReport, MLPReport  # noqa: F401
from jaxbsd.compression.specs import GatedMLPSpec, MLPSpec, spec_for  # noqa: F401
from jaxbsd.compression.surgery import (  # noqa: F401
    capture_calls,
    get_submodule,
    model_outputs,
    output_judge,
    parse_path,
    set_submodule,
)

__all__ = ["ALLOCATIONS", "METHODS", "compress_model", "DEFAULT_CONFIG", "CompressionReport", "MLPReport",
           "GatedMLPSpec", "MLPSpec", "spec_for", "capture_calls", "get_submodule", "model_outputs", "output_judge",
           "parse_path", "set_submodule"]
