"""``method="prune"``: structured pruning of hidden units, with a least-squares refit of the output layer.

The ``k`` hidden units of largest ``‖V1[:, j]‖ · RMS(h_j)`` on the calibration tokens are kept and
the output layer is refitted (:func:`jaxbsd.compression.baselines.prune_weights`; for a gated MLP ``h_j`` is
the gated unit and ``down`` is refitted, :func:`jaxbsd.compression.baselines.prune_gated_weights`). The rank
is ``k``, the hidden units kept.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
from flax import nnx

from jaxbsd.compression import baselines
from jaxbsd.solver import metrics
from jaxbsd.compression.methods.base import Built, Method, Pruning, no_warm_start, register
from jaxbsd.compression.sites import (
    Site,
    apply_module,
    gated_error_J,
    mlp_error_J,
    output_error,
    site_jacobian,
)

__all__ = ["Prune", "fit_tokens", "mlp_errors", "pruned_mlp", "TOKENS_PER_COEF", "RIDGE"]

#: The refit uses held-out calibration tokens (outside the check set) only when they number at
#: least this many per coefficient of an output (``k + 1``); fewer would make a worse refit than
#: the check tokens give.
TOKENS_PER_COEF = 4
#: The relative weight of the pull towards the original output weights when the calibration has
#: fewer tokens than coefficients (``N < k + 1``): see :func:`jaxbsd.compression.baselines.prune_weights`.
RIDGE = 1e-2


def fit_tokens(site: Site, k: int):
    """``(X, Y, where)``: the tokens a pruning to ``k`` units refits on: the held-out ones
    (``fit_X``, so the output error on the check tokens is held out: ``"held-out"``) when there are
    at least ``4 (k + 1)`` of them, else the check tokens (``"check"``: the error is in-sample)."""
    held_out = site.fit_X is not None and site.fit_X.shape[0] >= TOKENS_PER_COEF * (k + 1)
    return (site.fit_X, site.fit_Y, "held-out") if held_out else (site.check_X, site.check_Y, "check")


def pruned_mlp(site: Site, k: int, *, regularize: bool = True,
               purpose: str = "") -> tuple[nnx.Module, Pruning, str | None]:
    """``(module, pruning, notes)``: the MLP of ``site`` pruned to ``k`` hidden units (two-layer or
    gated), the units it keeps and where it was refitted, and a note when the refit had to be
    regularized (else None).

    With fewer calibration tokens than coefficients per output (``N < k + 1``) the plain least
    squares is not determined: the refit is then regularized towards the original output weights
    (``ridge = RIDGE``, see :func:`jaxbsd.compression.baselines.prune_weights`), and ``notes`` says so; with
    ``regularize=False`` it is a ``ValueError`` naming ``calibration`` instead. ``purpose`` is
    added to that message (``" for a warm start"``).
    """
    X, Y, where = fit_tokens(site, k)
    ridge = RIDGE if regularize and X.shape[0] < k + 1 else None
    kernels = site.spec.kernels(site.module, site.path)
    prune = baselines.prune_gated_mlp if site.gated else baselines.prune_mlp
    try:
        module, pruning = prune(*kernels, site.spec.activation, int(k), X, Y, ridge=ridge)
    except ValueError as err:
        raise ValueError(f"calibration: pruning {site.path!r}{purpose}: {err}") from err
    notes = (f"pruning refit regularized (ridge {ridge:g} towards the original weights): "
             f"{X.shape[0]} calibration tokens < {k + 1} coefficients per output") if ridge else None
    return module, Pruning(kept=tuple(int(i) for i in pruning.kept), fit_tokens=where), notes


@dataclasses.dataclass(frozen=True)
class Prune(Method):
    """Structured pruning: keep ``rank`` hidden units, refit the output layer (needs a spec).

    A pruned two-layer MLP keeping ``k`` units has ``k (m + 1) + n (k + 1)`` parameters; a pruned
    gated one ``2km + kn`` plus the biases the original has.
    """

    name = "prune"

    def params(self, site: Site, rank) -> int:
        if site.gated:
            return baselines.pruned_gated_params(site.m, rank, site.n, site.biases)
        return baselines.pruned_mlp_params(site.m, rank, site.n)

    def max_rank(self, site: Site) -> int:
        fixed = self.params(site, 0)
        slope = self.params(site, 1) - fixed
        return max(1, min(site.hidden, (site.params - fixed) // slope))

    def check_rank(self, site: Site, rank: int) -> int:
        if rank > site.hidden:
            raise ValueError(f"ranks[{site.path!r}] = {rank} exceeds the {site.hidden} hidden units "
                             f"for method 'prune'")
        return int(rank)

    def build(self, site: Site, rank, key: jax.Array, *,
              judge: Callable[[nnx.Module], float] | None = None, refine=None) -> Built:
        start = time.perf_counter()
        module, kept, notes = pruned_mlp(site, int(rank))
        jac, kind = site_jacobian(site)
        error_J, error_F = mlp_errors(site, module, jac)
        return Built(module, error_J=error_J, error_F=error_F, jacobian=kind,
                     output_error=float(output_error(module, site.check_X, site.check_Y)),
                     seconds=time.perf_counter() - start, notes=notes, pruning=kept)


def mlp_errors(site: Site, module: nnx.Module, jac) -> tuple[float, float]:
    """``(Error(𝒥), Error(F))`` on the site's samples of a narrower MLP of its own kind (a
    :class:`~jaxbsd.models.compressed.PrunedMLP`, or a pruned gated MLP), ``jac`` the site's Jacobian."""
    if site.gated:
        error_J = gated_error_J(jac, module.kernels(), site.X, site.spec)
    else:
        error_J = mlp_error_J(jac, module.fc1.kernel[...], module.fc1.bias[...], module.fc2.kernel[...],
                              site.X, site.spec.h_prime)
    return error_J, float(metrics.error_F(site.F, apply_module(module, site.X)))


def _from_options(**options) -> Prune:
    no_warm_start("prune", **options)
    return Prune()


register("prune", _from_options)
