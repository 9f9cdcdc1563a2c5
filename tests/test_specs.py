"""Specs found, not written: ``jaxbsd.compression.specs.find_spec`` on MLP classes the package has never seen,
and ``jb.compress_model`` with no ``mlp_specs``."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression.baselines import LowRankMLP
from jaxbsd.compression.specs import GatedMLPSpec, choose_spec, find_spec, match_tolerance
from jaxbsd.compression.surgery import get_submodule

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_the_readme_example_runs_the_baselines_with_no_spec[svd]",
    "test_each_activation_is_found_with_other_attribute_names[True-gelu]",
}


ROOT = pathlib.Path(__file__).resolve().parents[1]
# The user's own activations, written as a user would (not jaxbsd's table).
USER_ACTS = {
    "gelu": lambda z: jax.nn.gelu(z, approximate=False),
    "gelu_tanh": jax.nn.gelu,  # jax's default GELU is the tanh form
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
}
FAST = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=20, tol=1e-12)


class WInOut(nnx.Module):
    """Other names; the activation stored as an attribute callable."""

    def __init__(self, m, h, n, act, *, use_bias=True, rngs):
        self.w_in = nnx.Linear(m, h, use_bias=use_bias, rngs=rngs)
        self.w_out = nnx.Linear(h, n, use_bias=use_bias, rngs=rngs)
        self.act = act
        if use_bias:  # non-zero biases, so a missing bias would show
            self.w_in.bias[...] = 0.3 * jax.random.normal(rngs.params(), (h,), jnp.float32)
            self.w_out.bias[...] = 0.3 * jax.random.normal(rngs.params(), (n,), jnp.float32)

    def __call__(self, x):
        return self.w_out(self.act(self.w_in(x)))


class Backwards(nnx.Module):
    """The Linear called last is created first; the activation is inline."""

    def __init__(self, m, h, n, *, rngs):
        self.dense_a = nnx.Linear(h, n, rngs=rngs)
        self.dense_b = nnx.Linear(m, h, rngs=rngs)

    def __call__(self, x):
        return self.dense_a(jax.nn.gelu(self.dense_b(x), approximate=False))


class SiLU(nnx.Module):
    def __call__(self, x):
        return x * jax.nn.sigmoid(x)


class Nested(nnx.Module):
    """The Linears one level down, in an nnx.List; the activation a submodule; no biases."""

    def __init__(self, m, h, n, *, rngs):
        self.act = SiLU()
        self.net = nnx.List([nnx.Linear(h, n, use_bias=False, rngs=rngs), nnx.Linear(m, h, use_bias=False, rngs=rngs)])

    def __call__(self, x):
        return self.net[0](self.act(self.net[1](x)))


class Inner(nnx.Module):
    def __init__(self, m, h, n, *, rngs):
        self.first = nnx.Linear(m, h, rngs=rngs)
        self.second = nnx.Linear(h, n, rngs=rngs)


class Wrapped(nnx.Module):
    """The Linears inside a child module that has no __call__ of its own."""

    def __init__(self, m, h, n, *, rngs):
        self.proj = Inner(m, h, n, rngs=rngs)

    def __call__(self, x):
        return self.proj.second(jax.nn.relu(self.proj.first(x)))


class Residual(nnx.Module):
    def __init__(self, d, h, *, rngs):
        self.fc1, self.fc2 = nnx.Linear(d, h, rngs=rngs), nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x):
        return x + self.fc2(jax.nn.gelu(self.fc1(x)))


class Normed(nnx.Module):
    def __init__(self, d, h, *, rngs):
        self.norm = nnx.LayerNorm(d, rngs=rngs)
        self.fc1, self.fc2 = nnx.Linear(d, h, rngs=rngs), nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(self.norm(x))))


class Deep(nnx.Module):
    def __init__(self, d, h, *, rngs):
        self.fc1, self.fc2, self.fc3 = nnx.Linear(d, h, rngs=rngs), nnx.Linear(h, h, rngs=rngs), nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x):
        return self.fc3(jax.nn.relu(self.fc2(jax.nn.relu(self.fc1(x)))))


class Gated(nnx.Module):
    """LLaMA's MLP with other names, the down projection created first."""

    def __init__(self, d, h, *, rngs):
        self.out = nnx.Linear(h, d, use_bias=False, rngs=rngs)
        self.lin_a = nnx.Linear(d, h, use_bias=False, rngs=rngs)
        self.lin_b = nnx.Linear(d, h, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.silu(self.lin_b(x)) * self.lin_a(x))


def tokens(m, N=512, seed=1, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), (N, m), dtype)


def found(module, X):
    return find_spec(module, X, module(X))


@pytest.mark.parametrize("act", sorted(USER_ACTS))
@pytest.mark.parametrize("use_bias", [True, False])
def test_each_activation_is_found_with_other_attribute_names(act, use_bias):
    module = WInOut(6, 20, 5, USER_ACTS[act], use_bias=use_bias, rngs=nnx.Rngs(0))
    X = tokens(6)
    det = found(module, X)
    assert det.spec == jb.MLPSpec(fc1="w_in", fc2="w_out", activation=act), det.reason
    assert str(det).startswith(f"found: {act}: w_in -> w_out")
    # Only the right activation fell within the tolerance (float32: 1e-5).
    assert det.tolerance == 1e-5 and sorted(k for k, e in det.errors.items() if e <= 1e-5) == [f"{act}: w_in -> w_out"]
    # The spec read from the kernels reproduces the module on fresh tokens.
    Z = tokens(6, 64, seed=9)
    np.testing.assert_allclose(det.spec.apply(module, Z), module(Z), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "make, fc1, fc2, act",
    [
        (lambda r: Backwards(6, 20, 5, rngs=r), "dense_b", "dense_a", "gelu"),
        (lambda r: Backwards(8, 8, 8, rngs=r), "dense_b", "dense_a", "gelu"),  # square: the outputs decide
        (lambda r: Nested(6, 20, 5, rngs=r), "net.1", "net.0", "silu"),
        (lambda r: Nested(8, 8, 8, rngs=r), "net.1", "net.0", "silu"),
        (lambda r: Wrapped(6, 20, 5, rngs=r), "proj.first", "proj.second", "relu"),
        (lambda r: WInOut(6, 20, 5, SiLU(), rngs=r), "w_in", "w_out", "silu"),  # activation as a submodule
    ],
)
def test_the_call_order_is_found_whatever_the_definition_order_and_nesting(make, fc1, fc2, act):
    module = make(nnx.Rngs(3))
    width = (module.dense_b if isinstance(module, Backwards) else
             module.net[1] if isinstance(module, Nested) else
             module.proj.first if isinstance(module, Wrapped) else module.w_in).in_features
    X = tokens(width)
    det = found(module, X)
    assert det.spec == jb.MLPSpec(fc1=fc1, fc2=fc2, activation=act), det.reason
    np.testing.assert_allclose(det.spec.apply(module, X), module(X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "module, words",
    [
        (Residual(8, 16, rngs=nnx.Rngs(0)), "no known activation"),
        (Normed(8, 16, rngs=nnx.Rngs(0)), "LayerNorm at 'norm'"),
        (Deep(8, 16, rngs=nnx.Rngs(0)), "do not chain"),
        (nnx.Sequential(*[nnx.Linear(8, 8, rngs=nnx.Rngs(i)) for i in range(4)]), "4 nnx.Linear"),
        (nnx.Linear(8, 8, rngs=nnx.Rngs(0)), "0 nnx.Linear"),
    ],
)
def test_what_is_not_an_mlp_gives_none_and_says_why(module, words):
    det = found(module, tokens(8))
    assert det.spec is None and words in det.reason, det.reason
    assert str(det).startswith("not found: ")


def test_a_degenerate_module_is_ambiguous_not_guessed():
    # The output does not depend on the activation: every one of them matches.
    module = WInOut(6, 20, 5, jax.nn.relu, rngs=nnx.Rngs(0))
    module.w_out.kernel[...] = jnp.zeros_like(module.w_out.kernel[...])
    det = found(module, tokens(6))
    assert det.spec is None and det.reason.startswith("ambiguous") and "relu" in det.reason and "tanh" in det.reason
    # Tiny pre-activations: exact and tanh GELU agree to rounding there, the others do not.
    module = WInOut(6, 20, 5, USER_ACTS["gelu"], use_bias=False, rngs=nnx.Rngs(0))
    module.w_in.kernel[...] = 1e-3 * module.w_in.kernel[...]
    det = found(module, tokens(6))
    assert det.spec is None and det.reason.startswith("ambiguous: gelu: w_in -> w_out, gelu_tanh: w_in -> w_out ")


@pytest.mark.parametrize("dtype, expected", [(jnp.float32, None), (jnp.float64, "gelu")])
def test_float64_tells_apart_what_float32_rounding_cannot(dtype, expected):
    # Pre-activations of about 0.05: the two GELUs differ by ~2e-6 relative, below float32's
    # tolerance (1e-5) but far above float64's (1e-8).
    module = WInOut(6, 20, 5, USER_ACTS["gelu"], use_bias=False, rngs=nnx.Rngs(0))
    nnx.update(module, jax.tree.map(lambda a: a.astype(dtype), nnx.state(module, nnx.Param)))
    module.w_in.kernel[...] = 0.05 * module.w_in.kernel[...]
    det = found(module, tokens(6, dtype=dtype))
    assert det.tolerance == match_tolerance(dtype) and 1e-7 < det.errors["gelu_tanh: w_in -> w_out"] < 1e-5
    assert (det.spec and det.spec.activation) == expected, det.reason


def test_a_gated_mlp_is_recognised_and_chosen():
    module = Gated(8, 16, rngs=nnx.Rngs(0))
    X = tokens(8)
    det = found(module, X)
    assert det.spec == GatedMLPSpec(gate="lin_b", up="lin_a", down="out", activation="silu"), det.reason
    np.testing.assert_allclose(det.spec.apply(module, X), module(X), rtol=1e-6)
    # The swapped roles give another function, so they did not match.
    assert det.errors["silu: lin_a -> lin_b -> out"] > 1e-2
    spec, status = choose_spec(module, "mlp", None, X, module(X))
    assert spec == det.spec and status.startswith("found: silu: lin_b -> lin_a -> out"), status


def test_the_tolerance_rule():
    assert match_tolerance(jnp.float32) == 1e-5 and match_tolerance(jnp.float64) == 1e-8
    assert match_tolerance(jnp.bfloat16) == 8 * float(jnp.finfo(jnp.bfloat16).eps)
    assert match_tolerance(jnp.float32, matmul_rounding=1e-4) == pytest.approx(1.6e-3)  # TF32-like products
    with pytest.raises(ValueError, match="dtype"):
        match_tolerance(jnp.int32)
    with pytest.raises(ValueError, match="X, Y"):
        find_spec(WInOut(6, 20, 5, jnp.tanh, rngs=nnx.Rngs(0)), tokens(6), tokens(5, N=7))


# ----------------------------------------------------------------------------- compress_model


def _readme_example():
    """The README's open-model example, as code (the classes, the calibration batch, the call)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Example: compress your own model", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL).group(1)
    assert "mlp_specs" not in code and 'method="bsd"' in code
    return code


@pytest.mark.parametrize("method", ["svd", "drone"])
def test_the_readme_example_runs_the_baselines_with_no_spec(method):
    scope = {}
    exec(_readme_example().replace('method="bsd"', f'method="{method}"').replace("print(", "(lambda *a: a)("), scope)
    report, model = scope["report"], scope["model"]
    assert report.reduction >= 0.3 and len(report.mlps) == 2
    for r in report.mlps:
        assert r.method == method and r.jacobian == "structured" and r.error_J is not None
        assert r.spec.startswith("found: gelu_tanh: up -> down"), r.spec  # jax.nn.gelu is the tanh form
        new = get_submodule(model, r.path)
        assert isinstance(new, LowRankMLP) and new.activation == "gelu_tanh"


def _readme_net(dtype):
    scope = {}
    code = _readme_example()
    exec(code[: code.index("\nx = ")], scope)  # the classes only
    net = scope["Net"](nnx.Rngs(0))
    nnx.update(net, jax.tree.map(lambda a: a.astype(dtype), nnx.state(net, nnx.Param)))
    x = jax.random.normal(jax.random.key(0), (8, 8, 16), dtype)
    return net, x


@pytest.mark.slow  # two compressions of a model: 7-9 s
def test_bsd_uses_the_found_spec_and_matches_the_explicit_one():
    net, x = _readme_net(jnp.float64)
    results = []
    for specs in (None, jb.MLPSpec(fc1="up", fc2="down", activation="gelu_tanh")):
        model, report = jb.compress_model(nnx.clone(net), x, mlps=["ffns.1"], ranks={"ffns.1": 3}, method=jb.get_method("bsd", config=FAST, num_samples=32), mlp_specs=specs, key=jax.random.key(1))
        results.append((model.ffns[1], report.mlps[0]))
    (found_mlp, a), (given_mlp, b) = results
    assert b.spec == "given" and a.spec.startswith("found: gelu_tanh: up -> down"), a.spec
    assert a.jacobian == b.jacobian == "structured"
    assert a.error_J == pytest.approx(b.error_J, rel=1e-10, abs=1e-14) and a.error_J < 1
    for u, v in zip(jax.tree.leaves(nnx.state(found_mlp, nnx.Param)), jax.tree.leaves(nnx.state(given_mlp, nnx.Param))):
        assert u.dtype == jnp.float64
        np.testing.assert_allclose(u, v, rtol=1e-9, atol=1e-12)


class Host(nnx.Module):
    def __init__(self, mlp, *, rngs):
        self.mlp = mlp
        self.head = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.head(self.mlp(x))


@pytest.mark.slow  # three compress_model runs, mostly eager ops inside the library: 20.6 s on a quiet machine
def test_without_a_spec_bsd_goes_dense_and_the_baselines_say_why():
    x = tokens(8, N=64).reshape(8, 8, 8)
    model = Host(Residual(8, 16, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
    _, report = jb.compress_model(model, x, mlps=["mlp"], ranks={"mlp": 2}, method=jb.get_method("bsd", config=FAST, num_samples=32), key=jax.random.key(0))
    assert report.mlps[0].jacobian == "dense" and report.mlps[0].spec.startswith("not found: no known activation")
    model = Host(Residual(8, 16, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
    with pytest.raises(ValueError, match=r"mlp_specs: method 'svd'.*no known activation.*mlp_specs=\{'mlp': jb.MLPSpec"):
        jb.compress_model(model, x, mlps=["mlp"], reduction=0.1, method="svd", key=jax.random.key(0))
    # A gated MLP is recognised, and the baselines use it (tests/test_gated_compress.py).
    model = Host(Gated(8, 16, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
    _, report = jb.compress_model(model, x, mlps=["mlp"], reduction=0.1, method="drone", key=jax.random.key(0))
    assert report.mlps[0].jacobian == "structured" and report.mlps[0].spec.startswith("found: silu: lin_b")


@pytest.mark.slow  # a costly program of this file; its claim's cheaper checks stay
def test_an_explicit_spec_wins_over_the_found_one():
    # The module uses exact GELU; the tanh form is within the spec check's 1e-3, so a user's
    # (slightly wrong) spec is accepted and used as given, not replaced by what would be found.
    x = tokens(8, N=64).reshape(8, 8, 8)
    model = Host(WInOut(8, 16, 8, USER_ACTS["gelu"], rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
    X, Y = x.reshape(-1, 8), model.mlp(x.reshape(-1, 8))
    assert find_spec(model.mlp, X, Y).spec.activation == "gelu"
    given = jb.MLPSpec("w_in", "w_out", "gelu_tanh")
    assert choose_spec(model.mlp, "mlp", {"mlp": given}, X, Y) == (given, "given")
    model, report = jb.compress_model(model, x, mlps=["mlp"], ranks={"mlp": 2}, method="svd", mlp_specs=given,
                                      key=jax.random.key(0))
    assert model.mlp.activation == "gelu_tanh" and report.mlps[0].spec == "given"


def test_jaxbsd_mlps_are_known_without_a_search(monkeypatch):
    from jaxbsd.compression import specs
    from jaxbsd.models.layers import MLP

    monkeypatch.setattr(specs, "find_spec", lambda *a: pytest.fail("searched although the class is known"))
    mlp = MLP(8, 16, activation="relu", rngs=nnx.Rngs(0))
    X = tokens(8, N=16)
    spec, status = choose_spec(mlp, "mlp", None, X, mlp(X))
    assert spec == jb.MLPSpec("fc1", "fc2", "relu") and status == "known: jaxbsd MLP (relu)"
