"""``jb.compress_model`` on an NNX model that is not one of jaxbsd's: budgets, methods, errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from flat_options import call_with
from jaxbsd.compression.baselines import LowRankMLP
from jaxbsd.compression import budget
from jaxbsd.compression.sites import make_site, site_jacobian
from jaxbsd.compression.surgery import capture_calls, get_submodule, set_submodule
from jaxbsd.models import count_params
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.models.compressed import PrunedMLP, pruned_mlp_params

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_reduction_meets_the_budget_and_the_model_still_runs[svd]",
    "test_compress_save_and_reload_a_user_model_round_trips[svd]",
}


PATHS = ["encoder.layers.0.ffn", "encoder.layers.2.ffn"]
SPEC = jb.MLPSpec(fc1="up", fc2="down", activation="gelu")
FAST = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=30, tol=1e-8)
# Each decoupling rank (and S) compiles its own solver programs: the tests reuse the ranks that
# reduction=0.3 gives (12 on both MLPs, with the default S = 64 calibration tokens) and the greedy
# candidates around it (6, 12, 18), and the shapes of ``calibration()``.
RANK = 12


class FeedForward(nnx.Module):
    """A user MLP: its own attribute names, biases, the activation called inline."""

    def __init__(self, dim, hidden, *, scale=1.0, rngs):
        self.up = nnx.Linear(dim, hidden, rngs=rngs)
        self.down = nnx.Linear(hidden, dim, rngs=rngs)
        self.up.kernel[...] = self.up.kernel[...] * scale
        self.up.bias[...] = jax.random.normal(rngs.params(), (hidden,), jnp.float32) * 0.3

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x), approximate=False))


class Layer(nnx.Module):
    def __init__(self, dim, hidden, *, scale, rngs):
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.mix = nnx.Linear(dim, dim, rngs=rngs)
        self.ffn = FeedForward(dim, hidden, scale=scale, rngs=rngs)

    def __call__(self, x):
        x = x + self.mix(self.norm(x))
        return x + self.ffn(self.norm(x))


class Encoder(nnx.Module):
    def __init__(self, dim, hidden, scales, *, rngs):
        self.layers = nnx.List([Layer(dim, hidden, scale=s, rngs=rngs) for s in scales])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Pool(nnx.Module):
    """Not an MLP: (B, T, d) -> (B, d)."""

    def __call__(self, x):
        return jnp.mean(x, axis=-2)


class Net(nnx.Module):
    def __init__(self, *, dim=8, hidden=32, scales=(1.0, 1.0, 1.0), seed=0):
        rngs = nnx.Rngs(params=seed, dropout=seed + 1)
        self.embed = nnx.Linear(6, dim, rngs=rngs)
        self.encoder = Encoder(dim, hidden, scales, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.pool = Pool()
        self.head = nnx.Linear(dim, 3, rngs=rngs)

    def __call__(self, x):  # (B, T, 6) -> (B, 3)
        return self.head(self.pool(self.dropout(self.encoder(self.embed(x)))))


def calibration(n=16, seed=1):
    return jax.random.normal(jax.random.key(seed), (n, 4, 6), jnp.float32)


# One jitted forward for the whole file: a model of a structure seen before is not compiled again.
_forward = nnx.jit(lambda m, x: m(x))


def run(model, x):
    return _forward(model, x)


@pytest.fixture(scope="module", params=[pytest.param("bsd", marks=pytest.mark.slow), "svd", "drone"])
def compressed(request):
    """One compression per method, shared by the budget test and the save/reload round trip
    (each ``jb.compress_model`` configuration costs many compiles): two MLPs inside an
    ``nnx.List`` to 70 % of the parameters, compressed from train mode."""
    method = request.param
    model = Net()
    P = count_params(model)
    model.train()  # capture must run in eval mode and give the mode back
    model, report = jb.compress_model(model, calibration(), mlps=PATHS, reduction=0.3, method=jb.get_method(method, config=FAST if method == "bsd" else None), mlp_specs=SPEC, key=jax.random.key(0))
    deterministic_after = model.dropout.deterministic
    model.eval()
    return dataclasses.make_dataclass("Compressed", ["method", "P", "model", "report", "deterministic_after"])(
        method, P, model, report, deterministic_after)


def test_reduction_meets_the_budget_and_the_model_still_runs(compressed):
    method, P, model, report = compressed.method, compressed.P, compressed.model, compressed.report
    assert compressed.deterministic_after is False
    assert count_params(model) <= 0.7 * P
    assert report.params_before == P and report.params_after == count_params(model)
    assert report.reduction >= 0.3 and report.target_reduction == 0.3
    expected = PrunedMLP if method == "bsd" else LowRankMLP  # bsd contains pruning: an MLP of its units
    for path in PATHS:
        assert isinstance(get_submodule(model, path), expected)
    assert isinstance(model.encoder.layers[1].ffn, FeedForward)  # not listed, not touched
    out = run(model, calibration(4, seed=7))
    assert out.shape == (4, 3) and bool(jnp.all(jnp.isfinite(out)))
    for r in report.mlps:
        assert r.params_after == count_params(get_submodule(model, r.path)) < r.params_before
        assert np.isfinite(r.output_error) and np.isfinite(r.error_F) and r.jacobian == "structured"
    # differentiable through the replacements
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(calibration(2)) ** 2)))(model)
    leaves = jax.tree.leaves(nnx.state(grads, nnx.Param))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)



@pytest.mark.parametrize("method", [pytest.param("bsd", marks=pytest.mark.slow), "svd"])  # bsd: 6-7 s
def test_explicit_ranks(method):
    model = Net()
    ranks = {PATHS[0]: RANK // 2, PATHS[1]: RANK} if method == "bsd" else {PATHS[0]: 2, PATHS[1]: 3}
    model, report = jb.compress_model(model, calibration(), mlps=PATHS, ranks=ranks, method=jb.get_method(method, config=FAST if method == "bsd" else None), mlp_specs=SPEC, key=jax.random.key(0))
    got = {r.path: r.rank for r in report.mlps}
    assert got == ranks
    for path, r in ranks.items():
        new = get_submodule(model, path)
        if method == "bsd":
            # the name contains pruning: a constant plus the MLP's activation, an MLP of r units, pruning's count
            assert isinstance(new, PrunedMLP) and new.hidden == r and count_params(new) == pruned_mlp_params(8, r, 8)
        else:
            assert new.rank == r
    assert report.target_reduction is None and report.allocation == "explicit"


# Slow step: greedy allocation's budget is also asserted in the fast suite (test_compress.py).
@pytest.mark.slow
def test_greedy_respects_the_budget_and_beats_uniform(monkeypatch):
    # Fewer candidate ranks, fewer compiles.
    monkeypatch.setattr(budget, "GREEDY_SCALES", (0.5, 1.0, 1.5))

    def fresh():
        # The first MLP is exactly rank-1 decouplable, c φ(a·x): rank spent on it is wasted.
        net = Net()
        ffn = get_submodule(net, PATHS[0])
        k = jax.random.split(jax.random.key(5), 4)
        a, s = jax.random.normal(k[0], (8,)), jax.random.normal(k[1], (32,))
        c, s2 = jax.random.normal(k[2], (8,)), jax.random.normal(k[3], (32,)) * 0.3
        ffn.up.kernel[...] = (a[:, None] * s[None, :]).astype(jnp.float32)
        ffn.down.kernel[...] = (s2[:, None] * c[None, :]).astype(jnp.float32)
        ffn.down.bias[...] = jnp.zeros(8, jnp.float32)
        return net

    P = count_params(fresh())
    # Greedy ranks the errors of the built replacements; refinement, run after the allocation on
    # 64 tokens here, moves each MLP's error by more than the allocation gains (CI: 0.023 greedy
    # against 0.018 uniform once refined), so the allocation is judged on what it optimizes.
    common = dict(mlps=PATHS, reduction=0.3, method=jb.get_method("bsd", config=FAST), mlp_specs=SPEC, key=jax.random.key(3), refine=None)
    _, uniform = jb.compress_model(fresh(), calibration(), allocation="uniform", **common)
    model, greedy = jb.compress_model(fresh(), calibration(), allocation="greedy", **common)
    assert count_params(model) <= 0.7 * P and greedy.params_after == count_params(model)
    assert greedy.total_output_error < uniform.total_output_error
    assert {r.rank for r in uniform.mlps} == {uniform.mlps[0].rank}  # same shapes: same rank
    rank = {r.path: r.rank for r in greedy.mlps}
    assert rank[PATHS[0]] < uniform.mlps[0].rank < rank[PATHS[1]]
    assert bool(jnp.all(jnp.isfinite(run(model, calibration(2)))))


def test_finetune_is_called_once_per_mlp_back_to_front():
    seen = []

    def finetune(model):
        seen.append(tuple(p for p in PATHS if not isinstance(get_submodule(model, p), FeedForward)))  # replaced

    # The order is the engine's, the same for every method: pruning's, which has no solver to compile.
    jb.compress_model(Net(), calibration(), mlps=PATHS, reduction=0.3, method="prune", mlp_specs=SPEC, execution=jb.Execution(finetune=finetune), key=jax.random.key(0))
    assert seen == [(PATHS[1],), (PATHS[0], PATHS[1])]
    seen.clear()
    _, report = jb.compress_model(Net(), calibration(), mlps=PATHS, reduction=0.3, method="prune", mlp_specs=SPEC, execution=jb.Execution(finetune=finetune, order="front-to-back"), key=jax.random.key(0))
    assert seen == [(PATHS[0],), (PATHS[0], PATHS[1])]
    assert [r.path for r in report.mlps] == PATHS


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mlps=["encoder.layers.7.ffn"]), "mlps"),
        (dict(mlps=["encoder.layer.0.ffn"]), "mlps"),
        (dict(mlps=["pool"]), "mlps"),  # (B, T, d) -> (B, d): not an MLP
        (dict(reduction=0.95), "reduction"),
        (dict(reduction=None), "reduction and ranks"),
        (dict(ranks={PATHS[0]: 2, PATHS[1]: 2}), "reduction and ranks"),
        (dict(mlp_specs=jb.MLPSpec("up", "down", "relu")), "mlp_specs"),
        (dict(mlp_specs=jb.MLPSpec("fc1", "fc2")), "mlp_specs"),
        (dict(reduction=None, ranks={PATHS[0]: 2}), "ranks"),
        (dict(reduction=None, ranks={PATHS[0]: 9, PATHS[1]: 2}, method="svd", config=None), "ranks"),  # > min(m,H,n)
        (dict(mlps=[PATHS[0], PATHS[0]]), "mlps"),
        (dict(method="pruning"), "method"),
        (dict(allocation="best"), "allocation"),
        (dict(order=["encoder.layers.0.ffn"]), "order"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, match):
    args = dict(mlps=PATHS, reduction=0.3, method="bsd", config=FAST, mlp_specs=SPEC, key=jax.random.key(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        jb.compress_model(Net(), calibration(), **call_with(args))


def test_a_token_mixing_module_is_rejected():
    class Mixer(nnx.Module):  # (B, T, d) -> (B, T, d) but mixes tokens
        def __call__(self, x):
            return x - jnp.mean(x, axis=-2, keepdims=True)

    model = Net()
    model.encoder.layers[1].ffn = Mixer()
    with pytest.raises(ValueError, match="mlps.*token by token"):
        jb.compress_model(model, calibration(), mlps=["encoder.layers.1.ffn"], reduction=0.01, method=jb.get_method("bsd", config=FAST), key=jax.random.key(0))


def test_surgery_and_capture_leave_the_model_as_it_was():
    model = Net()
    model.eval()
    before = run(model, calibration(3))
    tokens, order = capture_calls(model, calibration(), list(reversed(PATHS)))
    assert order == PATHS  # first-call order, whatever order the paths were given in
    X, Y = tokens[PATHS[0]]
    assert X.shape == (64, 8) and Y.shape == (64, 8)
    assert isinstance(model.encoder.layers[0].ffn, FeedForward)
    np.testing.assert_allclose(run(model, calibration(3)), before)
    ffn = get_submodule(model, PATHS[0])
    set_submodule(model, "encoder.layers.0.ffn", ffn)
    assert model.encoder.layers[0].ffn is ffn


class ValueBranchNet(Net):
    """The same network, but its forward pass branches in Python on a value: it cannot be traced."""

    def __call__(self, x):
        if float(jnp.sum(x)) > 1e30:  # never true; forces a concrete value
            x = -x
        return super().__call__(x)


def test_capture_compiles_the_forward_pass_and_falls_back_to_eager_when_it_cannot():
    """The tokens are the MLP's true inputs and outputs (the MLP applied to the recorded inputs
    gives the recorded outputs) in both the compiled capture and the eager fallback, and they agree."""
    x = calibration()
    compiled, _ = capture_calls(Net(), x, PATHS)
    eager, _ = capture_calls(ValueBranchNet(), x, PATHS)  # same parameters (same seed)
    net = Net()
    for path in PATHS:
        (Xc, Yc), (Xe, Ye) = compiled[path], eager[path]
        assert Xc.shape == Xe.shape == (64, 8) and not isinstance(Xc, jax.core.Tracer)
        mlp = get_submodule(net, path)
        np.testing.assert_allclose(np.asarray(Yc), np.asarray(run(mlp, Xc)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(Ye), np.asarray(run(mlp, Xe)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(Xc), np.asarray(Xe), rtol=1e-5, atol=1e-6)


class Count(nnx.Variable):
    pass


class SpyNet(Net):
    """The same network, recording whether its forward pass was traced and counting its calls in
    a variable (state the pass changes)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = Count(jnp.zeros((), jnp.int32))
        self.traced = []

    def __call__(self, x):
        self.traced.append(isinstance(x, jax.core.Tracer))
        self.calls[...] = self.calls[...] + 1
        return super().__call__(x)


def test_capture_runs_one_compiled_program_that_keeps_nothing_alive():
    """The capture's forward pass is traced (not the eager fallback), the state it changes is put
    back as an eager pass would, and once the tokens and the model are dropped no array of theirs
    stays alive (a fresh ``nnx.jit`` per capture kept every recorded activation: ~45 MB per
    compression of a small ViT in a long study)."""
    import gc

    x = calibration()
    model = SpyNet()
    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    for _ in range(2):
        tokens, _ = capture_calls(model, x, PATHS)
        assert model.traced[-1] is True and len(tokens[PATHS[0]][0]) == 64
    assert int(model.calls[...]) == 2
    eager = ValueBranchNet()
    eager_tokens, _ = capture_calls(eager, x, PATHS)
    np.testing.assert_allclose(np.asarray(eager_tokens[PATHS[1]][1]), np.asarray(tokens[PATHS[1]][1]), rtol=1e-5,
                               atol=1e-6)
    del tokens, eager_tokens, model, eager
    gc.collect()
    left = [a for a in jax.live_arrays() if id(a) not in before]
    assert not left, [a.shape for a in left]


def _site(model, path, spec, S=None):
    tokens, _ = capture_calls(model, calibration(), [path])
    return make_site(path, get_submodule(model, path), spec, *tokens[path], S, jax.random.key(1))


@pytest.mark.slow  # the structured operator against dense Jacobians: tests/test_gated.py and test_cmtf.py, default run
def test_structured_and_dense_jacobians_agree_with_the_jacfwd_oracle(monkeypatch):
    # No spec found (FeedForward would be recognised, tests/test_specs.py): dense Jacobians.
    from jaxbsd.compression import specs

    monkeypatch.setattr(specs, "find_spec", lambda *a: specs.Detection(None, "switched off"))
    model = Net()
    structured = _site(model, PATHS[0], SPEC)
    dense = _site(model, PATHS[0], None)
    np.testing.assert_array_equal(structured.X, dense.X)
    graphdef, state = nnx.split(structured.module)
    oracle = jax.jit(jax.vmap(jax.jacfwd(lambda x: nnx.merge(graphdef, state)(x))))(structured.X)
    (js, ks), (jd, kd) = site_jacobian(structured), site_jacobian(dense)
    assert (ks, kd) == ("structured", "dense")
    np.testing.assert_allclose(js.dense(), oracle, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(jd, oracle, rtol=1e-5, atol=1e-6)
    # ... and the whole decoupling comes out the same both ways
    reports = []
    for spec in (SPEC, None):
        m, report = jb.compress_model(Net(), calibration(), mlps=[PATHS[0]], ranks={PATHS[0]: RANK}, method=jb.get_method("bsd", config=FAST, warm_start=False, contain=False), mlp_specs=spec, key=jax.random.key(2), refine=None)  # the claim is the decoupling's; refinement is tests/test_refine.py's
        reports.append((get_submodule(m, PATHS[0]), report.mlps[0]))
    (a, ra), (b, rb) = reports
    assert (ra.jacobian, rb.jacobian) == ("structured", "dense")
    assert ra.error_J == pytest.approx(rb.error_J, rel=1e-3)
    x = structured.check_X
    np.testing.assert_allclose(a(x), b(x), rtol=1e-3, atol=1e-4)


@pytest.mark.slow  # a costly program of this file; its claim's cheaper checks stay
def test_any_token_wise_module_falls_back_to_dense_jacobians():
    # A whole layer (norm, residuals, two MLP-like maps) is no two-layer MLP, but token-wise.
    model = Net()
    model, report = jb.compress_model(model, calibration(), mlps=["encoder.layers.1"], ranks={"encoder.layers.1": RANK}, method=jb.get_method("bsd", config=FAST), key=jax.random.key(0))
    assert report.mlps[0].jacobian == "dense" and isinstance(model.encoder.layers[1], DecoupledMLP)
    assert bool(jnp.all(jnp.isfinite(run(model, calibration(2)))))


@pytest.mark.slow  # a costly program of this file; its claim's cheaper checks stay
def test_jaxbsd_models_are_recognised_without_a_spec():
    from jaxbsd.models import ViTConfig, build_model

    vit = build_model("vit", ViTConfig(image_size=8, channels=1, patch_size=4, dim=8, depth=3, num_heads=2, mlp_dim=16))
    images = jax.random.normal(jax.random.key(0), (8, 8, 8, 1), jnp.float32)
    P = count_params(vit)
    vit, report = jb.compress_model(vit, images, mlps=["blocks.0.mlp", "blocks.2.mlp"], reduction=0.1,
                                    method="svd", key=jax.random.key(1))
    assert count_params(vit) <= 0.9 * P
    assert [r.path for r in report.mlps] == ["blocks.2.mlp", "blocks.0.mlp"]
    assert all(r.jacobian == "structured" and r.error_J is not None for r in report.mlps)
    assert bool(jnp.all(jnp.isfinite(run(vit, images))))


def test_compress_save_and_reload_a_user_model_round_trips(compressed, tmp_path):
    """Issue 12's acceptance path end to end on a model that is not jaxbsd's: compress two MLPs
    inside an ``nnx.List`` to 70 % of the parameters (the shared ``compressed`` fixture, whose
    budget the test above checks), run under ``nnx.jit``, export in factored form, reload into a
    freshly built original model: bit-identical logits."""
    model = compressed.model
    x = calibration(4, seed=7)
    logits = run(model, x)
    assert np.all(np.isfinite(np.asarray(logits)))
    jb.save_compressed(tmp_path / "ckpt", model)
    fresh = Net(seed=5)  # other random weights: everything must come from the checkpoint
    restored = jb.load_compressed(tmp_path / "ckpt", fresh)
    restored.eval()
    np.testing.assert_array_equal(np.asarray(run(restored, x)), np.asarray(logits))
    assert count_params(restored) == count_params(model)
