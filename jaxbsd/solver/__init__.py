"""The solver core: R-CMTF-BSD and everything it stands on; imports nothing of models, data or compression.

* :mod:`~jaxbsd.solver.cmtf` — the algorithm: :class:`CMTFConfig`, the stepwise solver
  (:func:`begin`, :func:`advance`, :func:`finish`, :func:`sweep`, :func:`solve`, :func:`select_best`);
* :mod:`~jaxbsd.solver.linalg` — the ALS updates' certified solves and minimum-norm least squares;
* :mod:`~jaxbsd.solver.driver` — :func:`decouple` (restarts batched in one program) and :func:`problem`;
* :mod:`~jaxbsd.solver.jacobians` — the Jacobian operators (dense, an MLP's, a gated MLP's);
* :mod:`~jaxbsd.solver.bases`, :mod:`~jaxbsd.solver.bspline` — the univariate bases;
* :mod:`~jaxbsd.solver.decoupled` — the decoupled function ``W1 g(W0 x)``;
* :mod:`~jaxbsd.solver.metrics`, :mod:`~jaxbsd.solver.sampling` — errors, parameter counts, samples;
* :mod:`~jaxbsd.solver.fingerprint` — the solver's numerical fingerprint (what staleness is judged by).
"""

from jaxbsd.solver import bases, bspline, jacobians, metrics
from jaxbsd.solver.bases import Augmented, Basis, BSpline, Polynomial, ReLU
from jaxbsd.solver.cmtf import (
    CMTFConfig,
    DecouplingResult,
    HeldOut,
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
from jaxbsd.solver.decoupled import Decoupled
from jaxbsd.solver.driver import configure_cpu_threads, decouple, problem
from jaxbsd.solver.jacobians import (
    DenseJacobian,
    GatedJacobian,
    JacobianOperator,
    StructuredJacobian,
    gated_mlp,
    gated_mlp_jacobian,
)
from jaxbsd.solver.sampling import sample

__all__ = [
    "bases", "bspline", "jacobians", "metrics",
    "Augmented", "Basis", "BSpline", "Polynomial", "ReLU",
    "CMTFConfig", "DecouplingResult", "HeldOut", "Iteration", "Problem", "RestartResult", "SolverState", "Status",
    "advance", "begin", "finish", "init_state", "select_best", "solve", "sweep",
    "Decoupled", "configure_cpu_threads", "decouple", "problem",
    "DenseJacobian", "GatedJacobian", "JacobianOperator", "StructuredJacobian", "gated_mlp", "gated_mlp_jacobian",
    "sample",
]
