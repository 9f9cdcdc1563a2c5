"""One process of ``tests/test_mesh_invariance.py``: compresses a model the other tests do not use
(four GELU blocks in ``nnx.Sequential``, LayerNorm and residuals, MLPs found by discovery, float32)
one MLP at a time (the default), grouped on one device (``group=True``) and with a mesh over every
device (``XLA_FLAGS`` set by the caller), for each ``METHOD:REFINE`` of ``CASES`` (``"prune:1,bsd:0"``),
and writes the models' outputs on a probe batch to ``OUT`` (``.npz``, keys ``<method>-<refine>-seq``,
``-one`` and ``-mesh``).

``python tests/mesh_invariance_worker.py OUT``
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxbsd as jb


class FeedForward(nnx.Module):
    def __init__(self, d: int, h: int, rngs: nnx.Rngs):
        self.up, self.down = nnx.Linear(d, h, rngs=rngs), nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x), approximate=False))


class Residual(nnx.Module):
    def __init__(self, d: int, h: int, rngs: nnx.Rngs):
        self.norm, self.ffn = nnx.LayerNorm(d, rngs=rngs), FeedForward(d, h, rngs)

    def __call__(self, x):
        return x + self.ffn(self.norm(x))


def build() -> nnx.Module:
    rngs = nnx.Rngs(0)
    return nnx.Sequential(*[Residual(16, 48, rngs) for _ in range(4)])


calibration = jax.random.normal(jax.random.key(1), (8, 24, 16), jnp.float32)
probe = jax.random.normal(jax.random.key(2), (4, 24, 16), jnp.float32)
mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("blocks",))
fast_bsd = jb.BSD(config=jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=40))
out = {"devices": len(jax.devices())}
for case in os.environ["CASES"].split(","):
    name, refined = case.split(":")
    method = {"bsd": fast_bsd, "auto": jb.Auto(bsd=fast_bsd), "prune": jb.Prune()}[name]
    refine = jb.Refine(steps=60) if refined == "1" else None
    for where, execution in (("seq", jb.Execution()), ("one", jb.Execution(group=True)),
                             ("mesh", jb.Execution(mesh=mesh))):
        model, _ = jb.compress_model(build(), calibration, key=jax.random.key(0), mlps=None, reduction=0.3,
                                     method=method, refine=refine, execution=execution)
        out[f"{case.replace(':', '-')}-{where}"] = np.asarray(model(probe))
np.savez(sys.argv[1], **out)
