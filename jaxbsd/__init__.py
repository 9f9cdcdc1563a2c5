"""jaxbsd: B-spline decoupling of multivariate functions (R-CMTF-BSD) in JAX.

``f(x) ≈ W1 g(W0 x)`` with univariate internal functions ``g_i`` (B-splines, polynomials or
ReLU sums), found by the robust coupled matrix–tensor factorization R-CMTF-BSD.

The public face: :func:`decouple` and its :class:`CMTFConfig`, the bases, :func:`compress_model`
with its methods, stages and :class:`Execution`, the paper's block-by-block :func:`compress`, and
saving and loading compressed models; JAX's persistent compilation cache
(:func:`enable_compilation_cache`). The stepwise solver and the Jacobian operators are under
:mod:`jaxbsd.solver`.
"""

from jaxbsd import solver
from jaxbsd.checkpoint import load_compressed, save_compressed
from jaxbsd.compile_cache import enable_compilation_cache
from jaxbsd.solver.bases import Augmented, Basis, BSpline, Polynomial, ReLU
from jaxbsd.solver.cmtf import CMTFConfig, DecouplingResult, Status
from jaxbsd.solver.decoupled import Decoupled
from jaxbsd.solver.driver import configure_cpu_threads, decouple

# Last: the compression engine imports the models (Flax).
from jaxbsd.compression import (  # noqa: E402
    BSD,
    DRONE,
    SVD,
    Auto,
    CompressionConfig,
    CompressionReport,
    Distill,
    Execution,
    GatedMLPSpec,
    Method,
    MLPReport,
    MLPSpec,
    Prune,
    Refine,
    compress,
    compress_model,
    get_method,
)

__version__ = "0.1.0"

__all__ = [
    # decoupling a function
    "decouple", "CMTFConfig", "DecouplingResult", "Decoupled", "Status", "configure_cpu_threads",
    # the bases
    "Augmented", "Basis", "BSpline", "Polynomial", "ReLU",
    # compressing a model
    "compress_model", "Execution", "Refine", "Distill", "CompressionReport", "MLPReport", "MLPSpec", "GatedMLPSpec",
    "Method", "BSD", "Prune", "SVD", "DRONE", "Auto", "get_method",
    # the paper's block-by-block run
    "compress", "CompressionConfig",
    # saving and loading
    "save_compressed", "load_compressed",
    # the persistent compilation cache (opt-in; the jaxbsd command turns it on)
    "enable_compilation_cache",
    # the stepwise solver, the Jacobian operators, metrics
    "solver",
]
