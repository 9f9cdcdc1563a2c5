"""``compress_model(method="bsd")`` contains pruning: every two-layer MLP of a named activation is
solved as the decoupling that contains its pruned form (``BSD(contain=True)``), so at a budget its
held-out output error is at most pruning's (issue 58's acceptance, on a toy); other MLPs keep the
paper's basis. The oracle is ``method="prune"`` at the same budget, on tokens neither saw."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression.methods.bsd import augmented
from jaxbsd.compression.sites import make_site
from jaxbsd.models.layers import MLP


def _site(spec, module, d=6, N=400, S=64):
    X = jax.random.normal(jax.random.key(0), (N, d), jnp.float64)
    return make_site("mlp", module, spec, X, module(X), S, jax.random.key(1))


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu"])
def test_the_default_bsd_solves_a_two_layer_mlp_in_the_augmented_basis_of_its_activation(activation):
    mlp = MLP(6, 16, activation=activation, rngs=nnx.Rngs(0, params=0))
    mlp = jax.tree.map(lambda a: a.astype(jnp.float64) if hasattr(a, "astype") else a, mlp)
    site = _site(jb.MLPSpec("fc1", "fc2", activation), mlp)
    default = jb.get_method("bsd")
    assert default.contain and not jb.BSD().contain  # the name contains pruning, the class keeps the paper's
    solved = default.for_site(site)
    assert solved == augmented(activation)
    # its parameter count: r (m + n + 2), one coefficient a unit more than pruning's bias
    assert default.params(site, 5) == 5 * (6 + 6 + 2) == jb.Prune().params(site, 5) - 6 + 5
    assert jb.get_method("bsd", contain=False).for_site(site) == jb.get_method("bsd", contain=False)
    assert jb.get_method("auto").bsd.contain and not jb.get_method("auto", contain=False).bsd.contain


def test_other_mlps_keep_the_paper_basis():
    """No spec (a dense Jacobian), a callable activation, a gated MLP: the object itself."""
    default = jb.get_method("bsd")
    mlp = MLP(6, 16, rngs=nnx.Rngs(0))
    assert default.for_site(_site(None, mlp)) is default
    assert default.for_site(_site(jb.MLPSpec("fc1", "fc2", jax.nn.gelu), mlp)) is default
    assert default.dof == 4 and default.params(_site(None, mlp), 5) == 5 * (6 + 6 + 4)
    with pytest.raises(ValueError, match="contain must be True or False"):
        jb.BSD(contain=1)
    # in a run's identity only where set (runs saved before the option keep theirs)
    assert "contain" not in jb.BSD().to_dict() and jb.BSD(contain=True).to_dict()["contain"] == "True"


class _MLP(nnx.Module):
    """A float64 two-layer GELU MLP."""

    def __init__(self, width, hidden, rngs):
        self.fc1 = nnx.Linear(width, hidden, rngs=rngs, param_dtype=jnp.float64)
        self.fc2 = nnx.Linear(hidden, width, rngs=rngs, param_dtype=jnp.float64)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class _Stack(nnx.Module):
    def __init__(self, width, hidden, blocks, seed):
        rngs = nnx.Rngs(seed)
        self.norms = nnx.List([nnx.LayerNorm(width, rngs=rngs, param_dtype=jnp.float64) for _ in range(blocks)])
        self.mlps = nnx.List([_MLP(width, hidden, rngs) for _ in range(blocks)])
        rng = np.random.default_rng(seed)
        for mlp in self.mlps:  # biases that matter, so the output bias must be carried
            mlp.fc1.bias[...] = jnp.asarray(0.5 * rng.normal(size=hidden))
            mlp.fc2.bias[...] = jnp.asarray(0.3 * rng.normal(size=width))

    def __call__(self, x):
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return x


@pytest.mark.parametrize("reduction", [0.3, 0.6])
def test_the_default_bsd_is_never_worse_than_pruning_at_the_same_budget(reduction):
    """Issue 58's acceptance on a toy: ``compress_model(method="bsd")`` (no refinement) against
    ``method="prune"`` at the same reduction of a two-block residual GELU stack, back to front:
    per MLP the held-out output error (reported by the run, on tokens no solve saw) is at most
    1.01 × pruning's, at no more parameters than pruning keeps plus one a unit; and the whole
    model's output on fresh inputs is no further from the original's than pruning's (× 1.01)."""
    width, hidden = 8, 32
    x = jax.random.normal(jax.random.key(3), (96, 6, width), jnp.float64)
    fresh = jax.random.normal(jax.random.key(4), (64, 6, width), jnp.float64)
    original = _Stack(width, hidden, 2, 0)
    y = original(fresh)
    runs = {}
    for method in ("bsd", "prune"):
        model, report = jb.compress_model(_Stack(width, hidden, 2, 0), x, mlps=None, reduction=reduction,
                                          method=method, key=jax.random.key(0), refine=None)
        runs[method] = (model, report)
    (bsd, rb), (pruned, rp) = runs["bsd"], runs["prune"]
    assert rb.params_after <= rb.params_before * (1 - reduction) + 1e-9
    for a, b in zip(rb.mlps, rp.mlps):
        assert a.path == b.path and a.method == "bsd" and a.sweep_kept is not None
        assert a.output_error <= 1.01 * b.output_error, (a.path, a.output_error, b.output_error)
    error = lambda m: float(jnp.linalg.norm(m(fresh) - y) / jnp.linalg.norm(y))  # noqa: E731
    assert error(bsd) <= 1.01 * error(pruned)
