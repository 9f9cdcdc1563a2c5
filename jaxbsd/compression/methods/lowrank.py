"""``method="svd"`` and ``method="drone"``: low-rank factorizations of an MLP's layers (need a spec).

``"svd"`` truncates each kernel's SVD; ``"drone"`` (data-aware low rank) factors each layer for
its inputs on the check tokens. A gated MLP has its three kernels factored
(:func:`jaxbsd.compression.baselines.lowrank_gated_mlp`), a two-layer one its two
(:func:`jaxbsd.compression.baselines.lowrank_mlp`). The rank is the factors' inner dimension.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, ClassVar

import jax
from flax import nnx

from jaxbsd.compression import baselines
from jaxbsd.solver import metrics
from jaxbsd.compression.methods.base import Built, Method, no_warm_start, register
from jaxbsd.compression.sites import (
    Site,
    apply_module,
    gated_error_J,
    mlp_error_J,
    output_error,
    site_jacobian,
)

__all__ = ["LowRank", "SVD", "DRONE"]


@dataclasses.dataclass(frozen=True)
class LowRank(Method):
    """A low-rank MLP: every kernel ``K ≈ A B`` with inner dimension ``rank`` (``kind`` says how).

    A two-layer one has ``k (m + H) + k (H + n) + H + n`` parameters; a gated one
    ``2k (m + H) + k (H + n)`` plus the biases the original has.
    """

    kind: ClassVar[str] = "svd"

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.kind

    def params(self, site: Site, rank) -> int:
        if site.gated:
            return baselines.lowrank_gated_params(site.m, site.hidden, rank, site.n, site.biases)
        return baselines.lowrank_mlp_params(site.m, site.hidden, rank, site.n)

    def max_rank(self, site: Site) -> int:
        # A factor cannot exceed its matrix's rank: at most min(m, H, n); and no more parameters
        # than the original. Both counts are affine in the rank: cost(r) = slope·r + fixed.
        fixed = self.params(site, 0)
        slope = self.params(site, 1) - fixed
        return max(1, min(site.m, site.hidden, site.n, (site.params - fixed) // slope))

    def check_rank(self, site: Site, rank: int) -> int:
        cap = min(site.m, site.hidden, site.n)
        if rank > cap:
            raise ValueError(f"ranks[{site.path!r}] = {rank} exceeds min(m, H, n) = {cap} for method {self.name!r}")
        return int(rank)

    def build(self, site: Site, rank, key: jax.Array, *,
              judge: Callable[[nnx.Module], float] | None = None, refine=None) -> Built:
        start = time.perf_counter()
        kernels = site.spec.kernels(site.module, site.path)
        X = site.check_X if self.kind == "drone" else None
        jac, jac_kind = site_jacobian(site)
        if site.gated:
            module = baselines.lowrank_gated_mlp(*kernels, site.spec.activation, int(rank), method=self.kind, X=X)
            error_J = gated_error_J(jac, module.kernels(), site.X, site.spec)
        else:
            module = baselines.lowrank_mlp(*kernels, site.spec.activation, int(rank), method=self.kind, X=X)
            error_J = mlp_error_J(jac, module.fc1.A[...] @ module.fc1.B[...], module.fc1.bias[...],
                                  module.fc2.A[...] @ module.fc2.B[...], site.X, site.spec.h_prime)
        return Built(module, error_J=error_J, error_F=float(metrics.error_F(site.F, apply_module(module, site.X))),
                     jacobian=jac_kind, output_error=float(output_error(module, site.check_X, site.check_Y)),
                     seconds=time.perf_counter() - start)


@dataclasses.dataclass(frozen=True)
class SVD(LowRank):
    """Truncated SVD of each kernel (data-free)."""

    kind: ClassVar[str] = "svd"


@dataclasses.dataclass(frozen=True)
class DRONE(LowRank):
    """DRONE: each layer factored for its inputs on the check tokens (data-aware)."""

    kind: ClassVar[str] = "drone"


def _factory(cls):
    def from_options(**options):
        no_warm_start(cls.kind, **options)
        return cls()
    return from_options


register("svd", _factory(SVD))
register("drone", _factory(DRONE))
