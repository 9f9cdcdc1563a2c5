"""A tiny model of several residual MLP blocks for the grouped-compression tests (imported by
``tests/test_grouped.py`` and by the subprocesses it starts, which set their devices first)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression.surgery import get_submodule

D_IN, M = 5, 12


class FeedForward(nnx.Module):
    def __init__(self, dim, hidden, dtype, *, rngs):
        self.inp = nnx.Linear(dim, hidden, rngs=rngs, param_dtype=dtype)
        self.out = nnx.Linear(hidden, dim, rngs=rngs, param_dtype=dtype)

    def __call__(self, x):
        return self.out(jax.nn.gelu(self.inp(x), approximate=False))


class Net(nnx.Module):
    """``(B, T, 5) -> (B, T, 3)``: an input projection, residual MLPs of the given hidden widths, a head."""

    def __init__(self, hidden=(32, 32, 32), dtype=jnp.float64, seed=0):
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Linear(D_IN, M, rngs=rngs, param_dtype=dtype)
        self.blocks = nnx.List([FeedForward(M, h, dtype, rngs=rngs) for h in hidden])
        self.head = nnx.Linear(M, 3, rngs=rngs, param_dtype=dtype)

    def __call__(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


FAST = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=15)


def calibration(dtype=jnp.float64):
    return jax.random.normal(jax.random.key(1), (16, 8, D_IN), dtype)


def probe(dtype=jnp.float64):
    """Tokens on which two compressed MLPs are compared (not the calibration's)."""
    return jax.random.normal(jax.random.key(5), (64, M), dtype)


def run(method="bsd", *, hidden=(32, 32, 32), dtype=jnp.float64, refine=True, seed=0, **kwargs):
    """``(model, report)`` of a small compression of :class:`Net` (``seed``: the compression's key)."""
    model = Net(hidden, dtype)
    # contain=False: the grouped program is the paper-basis decoupling's (a contained one is solved per site);
    # "bsd-contain": compress_model's own "bsd", which contains pruning.
    contain = method == "bsd-contain"
    method = "bsd" if contain else method
    options = dict(config=FAST, restarts=2, contain=contain) if method in ("bsd", "auto") else {}
    if method == "auto":
        options["auto_judge"] = "block"
    paths = [f"blocks.{i}" for i in range(len(hidden))]
    return jb.compress_model(model, calibration(dtype), mlps=paths, reduction=0.5, key=jax.random.key(seed),
                             method=jb.get_method(method, **options), refine=jb.Refine(steps=10) if refine else None,
                             execution=jb.Execution(**kwargs))


def outputs(model, dtype=jnp.float64) -> np.ndarray:
    """``(blocks, 64, M)``: every compressed MLP on the probe tokens."""
    z = probe(dtype)
    return np.stack([np.asarray(get_submodule(model, f"blocks.{i}")(z)) for i in range(len(model.blocks))])


def relative_errors(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per MLP: ``‖a − b‖ / ‖b‖``."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm((a - b).reshape(len(a), -1), axis=1) / np.linalg.norm(b.reshape(len(b), -1), axis=1)
