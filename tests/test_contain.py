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
from jaxbsd.compression.methods.bsd import augmented, exact_bias, mlp_form
from jaxbsd.compression.methods.warm_start import mlp_from_decoupled
from jaxbsd.models.compressed import PrunedMLP
from jaxbsd.solver.bases import Augmented, BSpline, Polynomial
from jaxbsd.solver.decoupled import Decoupled
from jaxbsd.compression.sites import make_site, selection_tokens
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
    # an MLP of r units: pruning's count r (m + n + 1) + n at every rank, below the output width too
    for rank in (1, 5, 6, 16):
        assert default.params(site, rank) == rank * (6 + 6 + 1) + 6 == jb.Prune().params(site, rank)
    assert default.max_rank(site) == jb.Prune().max_rank(site)
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
        assert a.rank == b.rank and a.params_after == b.params_after  # pruning's units and parameters, exactly
        assert a.output_error <= 1.01 * b.output_error, (a.path, a.output_error, b.output_error)
    error = lambda m: float(jnp.linalg.norm(m(fresh) - y) / jnp.linalg.norm(y))  # noqa: E731
    assert error(bsd) <= 1.01 * error(pruned)


@pytest.mark.parametrize("inner", [BSpline(0, 1), Polynomial(0)])
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu", "tanh"])
def test_a_decoupling_in_a_constant_augmented_basis_is_the_mlp_it_is_written_as(inner, activation):
    """``mlp_from_decoupled`` against the decoupled model's own evaluation (the basis's
    ``evaluate``, another code path), at any iterate: random scales, shifts, constants and weights."""
    r, m, n = 7, 5, 9  # fewer units than outputs
    keys = jax.random.split(jax.random.key(2), 6)
    basis = Augmented(inner, activation)
    inner_knots = jnp.broadcast_to(inner.fit(jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float64)), (r, inner.num_knots))
    state = jnp.stack([jax.random.uniform(keys[0], (r,), jnp.float64, 0.2, 3.0),
                       jax.random.normal(keys[1], (r,), jnp.float64)], axis=1)
    model = Decoupled(W0=jax.random.normal(keys[2], (r, m), jnp.float64),
                      W1=jax.random.normal(keys[3], (n, r), jnp.float64),
                      coef=jax.random.normal(keys[4], (r, 2), jnp.float64),
                      knots=jnp.concatenate([inner_knots, state], axis=1), basis=basis)
    bias = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float64)
    mlp = mlp_from_decoupled(model, bias)
    assert isinstance(mlp, PrunedMLP) and mlp.hidden == r and mlp.activation == activation
    x = 4.0 * jax.random.normal(keys[5], (50, m), jnp.float64)  # well outside the inner knots' range
    np.testing.assert_allclose(mlp(x), model(x) + bias[None, :], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="model must be in an Augmented basis"):
        mlp_from_decoupled(Decoupled(model.W0, model.W1, jnp.zeros((r, 5)), jnp.zeros((r, 3)), Augmented()), bias)


@pytest.mark.parametrize("rank", [3, 8, 12, 24])  # below, at and above the output width (8); 24: sweep 0 kept
def test_the_default_bsd_is_a_pruned_mlp_of_the_same_units_and_starts_from_pruning_exactly(rank):
    """At an explicit rank, below the output width too: the module is an MLP of ``rank`` units with
    pruning's parameters; kept at sweep 0 it is pruning's module (the same outputs, bit for bit);
    with the sweeps (``patience`` off) its held-out error is the lowest iterate's, at most pruning's."""
    width, hidden = 8, 32
    x = jax.random.normal(jax.random.key(3), (96, 6, width), jnp.float64)
    ranks = {"mlps.0": rank, "mlps.1": rank}
    runs = {method: jb.compress_model(_Stack(width, hidden, 2, 0), x, mlps=None, ranks=ranks, method=method,
                                      key=jax.random.key(0), refine=None) for method in ("bsd", "prune")}
    (bsd, rb), (pruned, rp) = runs["bsd"], runs["prune"]
    probe = jax.random.normal(jax.random.key(5), (40, width), jnp.float64)
    for i, (a, b) in enumerate(zip(rb.mlps, rp.mlps)):
        assert a.params_after == b.params_after == rank * (2 * width + 1) + width
        module = bsd.mlps[i]
        assert isinstance(module, PrunedMLP) and module.hidden == rank
        if a.sweep_kept == 0:  # pruning's module itself: its kernels, not a round trip through the decoupled form
            for ours, theirs in ((module.fc1, pruned.mlps[i].fc1), (module.fc2, pruned.mlps[i].fc2)):
                np.testing.assert_array_equal(ours.kernel[...], theirs.kernel[...])
                np.testing.assert_array_equal(ours.bias[...], theirs.bias[...])
            np.testing.assert_array_equal(module(probe), pruned.mlps[i](probe))
    if rank == 24:
        assert {a.sweep_kept for a in rb.mlps} == {0}  # the branch above is exercised
        assert a.output_error <= 1.01 * b.output_error


def test_a_grouped_run_builds_an_mlp_form_decoupling_as_an_mlp_too():
    """``Execution(group=True)``: a ``jb.BSD`` in the constant augmented basis without the best
    iterate (the grouped program's path otherwise) is built per MLP as an MLP, with pruning's count."""
    width, hidden, rank = 8, 32, 5
    x = jax.random.normal(jax.random.key(3), (96, 6, width), jnp.float64)
    config = jb.CMTFConfig(rank=1, basis=Augmented(BSpline(0, 1), "gelu"), max_iter=3, tol=0.0)
    method = jb.BSD(config=config, restarts=0)
    model, report = jb.compress_model(_Stack(width, hidden, 2, 0), x, mlps=None, method=method,
                                      ranks={"mlps.0": rank, "mlps.1": rank}, key=jax.random.key(0), refine=None,
                                      execution=jb.Execution(order="independent", group=True))
    assert all(isinstance(m, PrunedMLP) and m.hidden == rank for m in model.mlps)
    assert [r.params_after for r in report.mlps] == [rank * (2 * width + 1) + width] * 2


def test_a_rank_above_the_hidden_width_skips_the_warm_start_and_says_why():
    """``ranks`` above the hidden width: no pruned start (the MLP has fewer units), a random restart
    of the MLP form instead, its reason in the report; with ``warm_start=True`` an error naming ``ranks``."""
    width, hidden = 8, 32
    x = jax.random.normal(jax.random.key(3), (96, 6, width), jnp.float64)
    model, report = jb.compress_model(_Stack(width, hidden, 2, 0), x, mlps=["mlps.0"], ranks={"mlps.0": hidden + 2},
                                      method="bsd", key=jax.random.key(0), refine=None)
    (mlp,) = report.mlps
    assert isinstance(model.mlps[0], PrunedMLP) and model.mlps[0].hidden == hidden + 2
    assert "a warm start prunes to 34 hidden units, but there are 32" in mlp.warm_start_skipped
    assert not mlp.restart_warm and np.isfinite(mlp.output_error)
    config = jb.CMTFConfig(rank=1, basis=Augmented(BSpline(0, 1), "gelu"), max_iter=3)
    with pytest.raises(ValueError, match=r"ranks\['mlps.0'\] = 34: a warm start prunes"):
        jb.compress_model(_Stack(width, hidden, 2, 0), x, mlps=["mlps.0"], ranks={"mlps.0": hidden + 2}, refine=None,
                          method=jb.BSD(config=config, warm_start=True), key=jax.random.key(0))


def test_an_mlp_form_decoupling_is_never_fused():
    """The group's fused program builds decoupled modules: refused for an MLP-form basis even when forced."""
    from jaxbsd.compression import grouped
    from jaxbsd.compression.devices import Devices

    config = jb.CMTFConfig(rank=1, basis=Augmented(BSpline(0, 1), "gelu"), max_iter=3)
    assert not grouped.fuses(jb.BSD(config=config), True, Devices(), force=True)
    assert grouped.fuses(jb.BSD(), True, Devices(), force=True)


def test_the_mlp_form_and_the_exact_bias_need_the_sites_own_activation():
    """Only the site's own activation (by name) makes a constant-augmented basis an MLP of the site,
    and a larger augmented basis carry the output bias exactly (``n ≤ rank ≤ H``)."""
    mlp = MLP(6, 16, activation="gelu", rngs=nnx.Rngs(0, params=0))
    site = _site(jb.MLPSpec("fc1", "fc2", "gelu"), jax.tree.map(
        lambda a: a.astype(jnp.float64) if hasattr(a, "astype") else a, mlp))
    assert mlp_form(site, Augmented(BSpline(0, 1), "gelu"))
    assert not mlp_form(site, Augmented(BSpline(0, 1), "relu"))  # another activation: not this MLP's units
    assert not mlp_form(site, Augmented(BSpline(3, 4), "gelu"))  # splines beside it: not an MLP
    assert not mlp_form(site, BSpline(0, 1))
    assert [exact_bias(site, r, Augmented(BSpline(3, 4), "gelu")) for r in (5, 6, 16, 17)] == [False, True, True, False]
    assert not exact_bias(site, 8, Augmented(BSpline(3, 4), "silu"))


@pytest.mark.parametrize("rank", [3, 12])  # below and above the output width (8): b2 subtracted either way
def test_the_held_out_error_reported_is_the_kept_modules_on_the_selection_tokens(rank):
    """The best-iterate solve measures its iterates against the outputs less ``b2``; the report's
    ``output_error_heldout`` is the kept MLP's relative error against the outputs themselves, on the
    selection tokens (numpy oracle on the module that was built)."""
    width, hidden = 8, 32
    stack = _Stack(width, hidden, 1, 0)
    mlp = stack.mlps[0]
    X = jax.random.normal(jax.random.key(3), (600, width), jnp.float64)
    site = make_site("mlps.0", mlp, jb.MLPSpec("fc1", "fc2", "gelu"), X, mlp(X), 64, jax.random.key(1))
    built = jb.get_method("bsd").for_site(site).build(site, rank, jax.random.key(0))
    X_sel, Y_sel, _ = selection_tokens(site)
    Y_hat = np.asarray(built.module(X_sel), np.float64)
    Y_sel = np.asarray(Y_sel, np.float64)
    oracle = np.sum((Y_hat - Y_sel) ** 2) / np.sum(Y_sel ** 2)
    assert abs(float(np.linalg.norm(np.asarray(built.module.fc2.bias[...])))) > 0  # a b2 to subtract
    assert built.report()["output_error_heldout"] == pytest.approx(oracle, rel=1e-6)
