"""jaxbsd: B-spline decoupling of multivariate functions (R-CMTF-BSD) in JAX.

``f(x) ≈ W1 g(W0 x)`` with univariate internal functions ``g_i`` (B-splines, polynomials or
ReLU sums), found by the robust coupled matrix–tensor factorization R-CMTF-BSD.
"""

from jaxbsd import bases, bspline, gated, metrics, tensor
from jaxbsd.bases import Basis, BSpline, Polynomial, ReLU
from jaxbsd.checkpoint import load_compressed, save_compressed
from jaxbsd.cmtf import (
    CMTFConfig,
    DecouplingResult,
    Iteration,
    Problem,
    RestartResult,
    SolverState,
    Status,
    advance,
    begin,
    finish,
    init_state,
    select_best,
    solve,
    sweep,
)
from jaxbsd.decoupled import Decoupled
from jaxbsd.driver import configure_cpu_threads, decouple, problem
from jaxbsd.sampling import sample
from jaxbsd.tensor import DenseJacobian, JacobianOperator, StructuredJacobian
from jaxbsd.gated import GatedJacobian, gated_mlp, gated_mlp_jacobian

# Last: the compression engine imports the models (Flax).
from jaxbsd.compression import (  # noqa: E402
    BSD,
    DRONE,
    SVD,
    Auto,
    CompressionConfig,
    Execution,
    CompressionReport,
    Distill,
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
    "Auto",
    "BSD",
    "CompressionConfig",
    "DRONE",
    "Distill",
    "Execution",
    "get_method",
    "Method",
    "Prune",
    "Refine",
    "SVD",
    "compress",
    "Basis",
    "Iteration",
    "JacobianOperator",
    "Problem",
    "RestartResult",
    "SolverState",
    "advance",
    "begin",
    "configure_cpu_threads",
    "finish",
    "init_state",
    "problem",
    "select_best",
    "solve",
    "sweep",
    "BSpline",
    "CompressionReport",
    "MLPReport",
    "MLPSpec",
    "CMTFConfig",
    "Decoupled",
    "DecouplingResult",
    "DenseJacobian",
    "GatedJacobian",
    "GatedMLPSpec",
    "Polynomial",
    "ReLU",
    "Status",
    "StructuredJacobian",
    "bases",
    "bspline",
    "compress_model",
    "decouple",
    "gated",
    "gated_mlp",
    "gated_mlp_jacobian",
    "load_compressed",
    "metrics",
    "sample",
    "save_compressed",
    "tensor",
]
