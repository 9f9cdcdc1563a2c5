"""The compression engine (``jaxbsd.compression``) on small NNX models written here, with their own
attribute names: every method wherever it is feasible (issue 35, item 4), a calibration the engine
must refuse with the model untouched, quality bounds that can fail (item 5), and method objects
against their string shortcuts (item 2). Resume after a kill is in ``tests/test_resume.py``.

Cost: most of this file's time is XLA compiling the solver, once per (Jacobian kind, decoupling
rank, number of samples ``S``, warm start or not): the matrix's 16 decouplings (two kinds × four
reductions × two calibrations) are most of it, and the other tests reuse the matrix's runs and
ranks where they can (:func:`outcome` caches every run of the matrix). The default run keeps the
two-layer MLP's decouplings with the many-token calibration at the heaviest reduction (the runs the
quality bounds judge too); the rest of the matrix, the gated MLP's decouplings among them, runs in
the slow step.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression.surgery import get_submodule
from jaxbsd.models import count_params
from jaxbsd.models.decoupled_mlp import DecoupledMLP

D_IN, M, H = 5, 12, 32  # model input width, the MLPs' width m = n, hidden width H
FAST = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=20)
METHODS = ("bsd", "svd", "drone", "prune", "auto")
KINDS = ("two-layer", "gated")
#: "few": one sequence of 4 tokens, fewer than the hidden units pruning keeps at any reduction of
#: the matrix (at least 9 of H = 32); "many": 16 sequences of 8 tokens.
TOKENS = {"few": (1, 4), "many": (16, 8)}
REDUCTIONS = (0.05, 0.2, 0.35, 0.6)
#: The matrix's middle reductions run in the slow step (the default run keeps the extremes).
SLOW = pytest.mark.slow


def _reductions(values=REDUCTIONS, slow=(0.2, 0.35)):
    return [pytest.param(r, marks=SLOW) if r in slow else r for r in values]
#: Beyond what the MLP alone can give (it holds 88 % of a two-layer model's parameters, 92 % of a
#: gated one's): every method must refuse it naming ``reduction``.
INFEASIBLE = 0.95
#: Arguments a refusal may name (the message must name one).
ARGUMENTS = ("reduction", "ranks", "calibration", "mlps", "mlp_specs", "method", "config", "num_samples")


class FeedForward(nnx.Module):
    """A user's two-layer MLP: its own attribute names, exact GELU called inline."""

    def __init__(self, dim, hidden, *, rngs):
        self.inp = nnx.Linear(dim, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, dim, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.gelu(self.inp(x), approximate=False))


class GatedFeedForward(nnx.Module):
    """A user's gated MLP (SwiGLU) with biases, under other names than Llama's."""

    def __init__(self, dim, hidden, *, rngs):
        self.w_gate = nnx.Linear(dim, hidden, rngs=rngs)
        self.w_up = nnx.Linear(dim, hidden, rngs=rngs)
        self.w_down = nnx.Linear(hidden, dim, rngs=rngs)

    def __call__(self, x):
        return self.w_down(jax.nn.silu(self.w_gate(x)) * self.w_up(x))


MLP_CLASSES = {"two-layer": FeedForward, "gated": GatedFeedForward}


class Net(nnx.Module):
    """``(B, T, 5) -> (B, T, 3)``: an input projection, a residual MLP at ``ffn``, a head."""

    def __init__(self, kind, *, seed=0):
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Linear(D_IN, M, rngs=rngs)
        self.ffn = MLP_CLASSES[kind](M, H, rngs=rngs)
        self.head = nnx.Linear(M, 3, rngs=rngs)

    def __call__(self, x):
        h = self.embed(x)
        return self.head(h + self.ffn(h))


#: A module applied as one compiled program (eager, each op of each compressed model compiles on its own).
apply = nnx.jit(lambda module, x: module(x))


def calibration(tokens, seed=1):
    return jax.random.normal(jax.random.key(seed), (*TOKENS[tokens], D_IN), jnp.float32)


def method_options(method):
    return {"config": FAST} if method in ("bsd", "auto") else {}


def names_an_argument(err: ValueError) -> bool:
    return any(re.search(rf"\b{a}\b", str(err)) for a in ARGUMENTS)


def _snapshot(model):
    return [np.array(leaf) for leaf in jax.tree.leaves(nnx.state(model))]


def assert_untouched(model, original):
    """``model`` holds the original's modules and weights (``original``: freshly built alike)."""
    assert nnx.graphdef(model) == nnx.graphdef(original)
    before, after = _snapshot(original), _snapshot(model)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------ the feasibility matrix


@functools.cache
def outcome(kind, tokens, method, reduction):
    """``compress_model`` on a fresh ``Net(kind)``: ``(P, model, report, None)`` or ``(P, None, None, err)``
    for a ``ValueError`` (anything else propagates and fails the test that asked)."""
    model = Net(kind)
    P = count_params(model)
    try:
        model, report = jb.compress_model(model, calibration(tokens), mlps=["ffn"], reduction=reduction, method=jb.get_method(method, **method_options(method)),
                                          key=jax.random.key(0))
    except ValueError as err:
        return P, model, None, err  # the model as the refusal left it
    return P, model, report, None


def succeeded(kind, tokens, method, reduction) -> bool:
    return outcome(kind, tokens, method, reduction)[3] is None


#: The gated MLP's decouplings (bsd and auto) run in the slow step; its baselines and pruning in the default run.
SLOW_CASES = {
    "test_every_method_meets_the_budget_or_names_the_argument[gated-few-bsd-0.6]",
    "test_every_method_meets_the_budget_or_names_the_argument[gated-few-auto-0.6]",
    "test_auto_works_wherever_bsd_and_prune_work[gated-few-0.6]",
    "test_auto_on_a_gated_mlp_at_light_compression_is_within_budget[0.05-many]",
    "test_output_error_is_far_below_the_zero_replacement[gated-bsd-0.6]",
    "test_output_error_is_far_below_the_zero_replacement[gated-auto-0.6]",
    # prune's regularized refit: each kind once in the default run, one light and one heavy reduction
    "test_prune_refits_with_fewer_tokens_than_kept_units_and_says_so[two-layer-0.6]",
    "test_prune_refits_with_fewer_tokens_than_kept_units_and_says_so[gated-0.05]",
}
#: The settings of the default run: each kind once, each calibration once; the other two in the slow step.
#: The two-layer MLP with many tokens is also what test_output_error_is_far_below_the_zero_replacement
#: judges: the two share its runs through outcome's cache.
DEFAULT_SETTINGS = (("two-layer", "many"), ("gated", "few"))


@pytest.fixture(scope="module", params=[(k, t) if (k, t) in DEFAULT_SETTINGS else pytest.param((k, t), marks=SLOW)
                                        for k in KINDS for t in TOKENS], ids=lambda p: f"{p[0]}-{p[1]}")
def setting(request):
    """One (MLP kind, calibration) per fixture: its cases share the calibration batch and, through
    :func:`outcome`'s cache, the runs the cross-method tests look at again."""
    return request.param


def must_succeed(kind, tokens, method, reduction) -> bool:
    """The cases of the matrix that must return a compressed model: all of them but the infeasible
    budget. bsd, svd and drone always worked; the issue asks ``prune`` to work with fewer tokens than
    kept units (a regularized refit), ``auto`` wherever bsd and prune work (so everywhere here:
    measured, both work on every case) and on gated MLPs at ρ = 0.05–0.2 (where its decoupling's
    rank exceeds H)."""
    return reduction != INFEASIBLE


@pytest.mark.parametrize("method, reduction", [
    # the middle reductions, and bsd's and auto's lightest (their solves are the matrix's slowest), in the
    # slow step; auto's gated ρ = 0.05 case runs in test_auto_on_a_gated_mlp_at_light_compression_is_within_budget
    pytest.param(m, r, marks=SLOW) if r in (0.2, 0.35) or (m in ("bsd", "auto") and r == 0.05) else (m, r)
    for m in METHODS for r in (*REDUCTIONS, INFEASIBLE)])
def test_every_method_meets_the_budget_or_names_the_argument(setting, method, reduction):
    kind, tokens = setting
    P, model, report, err = outcome(kind, tokens, method, reduction)
    if err is not None:  # a refusal names the argument and leaves the model as it was
        assert not must_succeed(kind, tokens, method, reduction), \
            f"{method} on a {kind} MLP, {tokens} tokens, reduction {reduction}: {err}"
        assert names_an_argument(err), err
        assert_untouched(model, Net(kind))
        if reduction == INFEASIBLE:
            assert str(err).startswith(f"reduction={reduction} cannot be met"), err
        return
    assert reduction != INFEASIBLE, f"{method} met an infeasible budget: {report}"
    assert count_params(model) <= (1 - reduction) * P
    assert report.params_before == P and report.params_after == count_params(model)
    assert report.reduction >= reduction and report.target_reduction == reduction
    (mlp,) = report.mlps
    assert mlp.path == "ffn" and mlp.params_after < mlp.params_before
    assert np.isfinite(mlp.output_error)
    # The spec finder read the user's MLP (the baselines need it; bsd's Jacobian is structured).
    names = "inp -> out" if kind == "two-layer" else "w_gate -> w_up -> w_down"
    assert mlp.spec.startswith(f"found: {'gelu' if kind == 'two-layer' else 'silu'}: {names}"), mlp.spec
    assert mlp.jacobian == "structured"
    out = apply(model, calibration(tokens))
    assert out.shape == (*TOKENS[tokens], 3) and bool(jnp.all(jnp.isfinite(out)))


@pytest.mark.parametrize("reduction", _reductions(slow=(0.05, 0.2, 0.35)))  # ρ = 0.05: bsd's slowest solve
def test_auto_works_wherever_bsd_and_prune_work(setting, reduction):
    kind, tokens = setting
    # Not a condition (a failing bsd or prune would let this test pass without a check): both must
    # work on every case of the matrix (test_every_method_meets_the_budget_or_names_the_argument).
    assert succeeded(kind, tokens, "bsd", reduction) and succeeded(kind, tokens, "prune", reduction)
    P, model, report, err = outcome(kind, tokens, "auto", reduction)
    assert err is None, err
    (mlp,) = report.mlps
    assert mlp.method == mlp.auto["kept"] in ("bsd", "prune")
    assert count_params(model) <= (1 - reduction) * P
    # Both candidates were built within the one share; the kept one is what is in place.
    assert mlp.params_after == mlp.auto[mlp.method]["params"]
    for candidate in ("bsd", "prune"):
        assert mlp.auto[candidate]["params"] <= mlp.params_before


@pytest.mark.parametrize("reduction", _reductions())
@pytest.mark.parametrize("kind", KINDS)
def test_prune_refits_with_fewer_tokens_than_kept_units_and_says_so(kind, reduction):
    P, model, report, err = outcome(kind, "few", "prune", reduction)
    assert err is None, err
    (mlp,) = report.mlps
    n_tokens = int(np.prod(TOKENS["few"]))
    assert n_tokens < mlp.rank  # the case the issue names: fewer tokens than kept units
    assert len(mlp.kept) == mlp.rank
    # refinement (on by default) set a fifth of the tokens apart before the build, for its held-out error
    refit_tokens = n_tokens - max(1, round(0.2 * n_tokens))
    assert mlp.notes is not None and "regularized" in mlp.notes and f"{refit_tokens} calibration tokens" in mlp.notes
    # With many tokens the refit is the plain least squares, and nothing is noted.
    assert outcome(kind, "many", "prune", reduction)[2].mlps[0].notes is None


@pytest.mark.parametrize("tokens", ["many", pytest.param("few", marks=SLOW)])
@pytest.mark.parametrize("reduction", [0.05, pytest.param(0.2, marks=SLOW)])  # 0.05: the case that failed
def test_auto_on_a_gated_mlp_at_light_compression_is_within_budget(tokens, reduction):
    """The failure the issue reports: the decoupling's rank exceeds H on a gated MLP at ρ ≤ 0.2."""
    P, model, report, err = outcome("gated", tokens, "auto", reduction)
    assert err is None, err
    (mlp,) = report.mlps
    assert count_params(model) <= (1 - reduction) * P
    if reduction == 0.05:  # the case that failed: r (m + n + ν) vs 3 m H parameters, r > H
        assert mlp.auto["bsd"]["rank"] > H
    assert mlp.auto["prune"]["rank"] <= H
    assert bool(jnp.all(jnp.isfinite(apply(model, calibration(tokens)))))


@pytest.mark.slow  # auto's gated light-compression case (rank above H) stays in the default run
@pytest.mark.parametrize("kind", KINDS)
def test_auto_with_an_explicit_rank_above_the_hidden_width(kind):
    """``ranks`` beyond the pruned warm start's reach (``rank − 1 > H``): a decoupling of that rank and
    a pruned MLP within its parameters are built and judged — never an error (the gated case
    failed with "too many values to unpack" in ``warm_init``)."""
    # The ranks the matrix's bsd runs use at ρ = 0.05 (no new solver compile): 41 > H = 32 for
    # the gated MLP; the two-layer one at ρ = 0.05 decouples at 27 < H, so it takes H + 2.
    rank = outcome(kind, "many", "bsd", 0.05)[2].mlps[0].rank if kind == "gated" else H + 2
    assert rank - 1 > H
    model = Net(kind)
    model, report = jb.compress_model(model, calibration("many"), mlps=["ffn"], ranks={"ffn": rank}, method=jb.get_method("auto", config=FAST), key=jax.random.key(0))
    (mlp,) = report.mlps
    assert mlp.auto["bsd"]["rank"] == rank
    assert 1 <= mlp.auto["prune"]["rank"] <= H
    assert mlp.auto["prune"]["params"] <= jb.solver.metrics.params_bsd(M, M, rank, FAST.basis.num_coef)
    assert bool(jnp.all(jnp.isfinite(apply(model, calibration("many")))))


@pytest.mark.parametrize("method, rank", [("prune", H + 1), ("svd", M + 1), ("drone", M + 1)])
@pytest.mark.parametrize("kind", KINDS)
def test_an_infeasible_explicit_rank_names_ranks_and_leaves_the_model(kind, method, rank):
    model = Net(kind)
    with pytest.raises(ValueError, match=r"^ranks\['ffn'\] = "):
        jb.compress_model(model, calibration("many"), mlps=["ffn"], ranks={"ffn": rank}, method=method,
                          key=jax.random.key(0))
    assert_untouched(model, Net(kind))


@pytest.mark.parametrize("method", ["bsd", "auto"])
@pytest.mark.parametrize("tokens, num_samples, name", [((1, 3), None, "calibration"), ((16, 8), 3, "num_samples")],
                         ids=["3-tokens", "num_samples=3"])
def test_fewer_samples_than_the_basis_dof_names_the_argument(tokens, num_samples, name, method):
    """A decoupling needs ``S ≥ ν`` sampling points (ν = 4 here: the paper's basis, ``contain=False``): 3
    calibration tokens, or ``num_samples=3``, must be refused naming that argument, the model untouched.
    (``svd``, ``drone`` and ``prune`` compress the same 3 tokens; the decoupling that contains pruning has
    2 coefficients a unit, and is refused at 1.)"""
    model = Net("two-layer")
    x = jax.random.normal(jax.random.key(1), (*tokens, D_IN), jnp.float32)
    with pytest.raises(ValueError) as err:
        jb.compress_model(model, x, mlps=["ffn"], reduction=0.2, method=jb.get_method(method, num_samples=num_samples, contain=False, **method_options(method)), key=jax.random.key(0))
    assert_untouched(model, Net("two-layer"))
    assert str(err.value).startswith(name), str(err.value)
    with pytest.raises(ValueError, match="2 coefficients") as err:  # the default: Augmented(BSpline(0, 1), σ)
        jb.compress_model(model, x, mlps=["ffn"], reduction=0.2, key=jax.random.key(0),
                          method=jb.get_method(method, num_samples=1, **method_options(method)))
    assert_untouched(model, Net("two-layer"))


# ------------------------------------------------------------------------ quality that can fail


#: Upper bounds on the relative output error ``‖Y − Ŷ‖² / ‖Y‖²`` of the matrix's runs on the
#: many-token calibration (1.0 is replacing the MLP by zero), about 2x what was measured (the default
#: warm start and refinement on, ``FAST`` = 20 sweeps); measured (ρ = 0.05, 0.2, 0.35, 0.6):
#:   bsd   two-layer 0.025 0.025 0.033 0.068   gated 0.015 0.017 0.031 0.053
#:   prune two-layer 1.5e-4 1.5e-3 9.8e-3 0.047  gated 1.2e-4 2.6e-3 0.012 0.092
#:   auto  what it kept: prune, except bsd on the gated MLP at ρ = 0.6 (0.053)
#: A solver limited to one sweep gives (gated) 0.042 0.057 0.065 0.198 and fails the gated bounds at
#: ρ = 0.05 and 0.6 (the fast cases); on the two-layer MLP the warm start (the pruned MLP) and the
#: refinement make one sweep as good as 20 (0.021 0.027 0.028 0.063): no bound there can tell them
#: apart, and test_a_planted_decoupling_is_found checks the solver itself.
QUALITY_BOUNDS = {
    "bsd": {"two-layer": {0.05: 0.05, 0.2: 0.05, 0.35: 0.065, 0.6: 0.13},
            "gated": {0.05: 0.03, 0.2: 0.035, 0.35: 0.06, 0.6: 0.1}},
    "prune": {"two-layer": {0.05: 3e-4, 0.2: 3e-3, 0.35: 0.02, 0.6: 0.1},
              "gated": {0.05: 3e-4, 0.2: 5e-3, 0.35: 0.025, 0.6: 0.18}},
    "auto": {"two-layer": {0.05: 3e-4, 0.2: 3e-3, 0.35: 0.02, 0.6: 0.1},
             "gated": {0.05: 3e-4, 0.2: 5e-3, 0.35: 0.025, 0.6: 0.1}},
}


def mlp_output_error(kind, compressed, x):
    """The replaced MLP's relative output error on every token of ``x``, computed here: the MLP's
    inputs are ``embed(x)`` (the layer before it, unchanged), the reference a freshly built original."""
    original = Net(kind)
    h = apply(original.embed, x).reshape(-1, M)
    y, y_hat = (np.asarray(apply(mlp, h), np.float64) for mlp in (original.ffn, compressed.ffn))
    return float(np.sum((y - y_hat) ** 2) / np.sum(y ** 2))


@pytest.mark.parametrize("method, reduction", [
    # bsd's and auto's lightest reduction (their slowest solves) in the slow step, with the middle ones
    pytest.param(m, r, marks=SLOW) if r in (0.2, 0.35) or (m != "prune" and r == 0.05) else (m, r)
    for m in ("bsd", "prune", "auto") for r in REDUCTIONS])
@pytest.mark.parametrize("kind", KINDS)
def test_output_error_is_far_below_the_zero_replacement(kind, method, reduction):
    P, model, report, err = outcome(kind, "many", method, reduction)
    assert err is None, err
    error = mlp_output_error(kind, model, calibration("many"))
    # The report's output_error is this one (its check tokens are all 128 calibration tokens).
    np.testing.assert_allclose(report.mlps[0].output_error, error, rtol=1e-3, atol=1e-7)
    assert error < QUALITY_BOUNDS[method][kind][reduction], (report.mlps[0].method, error)


class TanhMLP(nnx.Module):
    """``second(tanh(first(x)))`` without an output bias: ``W1 tanh(W0 x + b)`` with ``H`` units is a
    decoupling of rank ``H``, up to the splines' approximation of ``tanh(· + b_i)`` on the sampled range."""

    def __init__(self, dim, hidden, *, rngs):
        self.first = nnx.Linear(dim, hidden, rngs=rngs)
        self.second = nnx.Linear(hidden, dim, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.second(jnp.tanh(self.first(x)))


class TanhNet(nnx.Module):
    def __init__(self, hidden, *, seed=0):
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Linear(D_IN, M, rngs=rngs)
        self.ffn = TanhMLP(M, hidden, rngs=rngs)
        self.head = nnx.Linear(M, 3, rngs=rngs)

    def __call__(self, x):
        h = self.embed(x)
        return self.head(h + self.ffn(h))


@pytest.mark.slow  # the solver's planted decouplings (tests/test_cmtf.py) run in the default step
def test_a_planted_decoupling_is_found():
    """An exactly decouplable MLP (``H = 4`` tanh units, no output bias) compressed at rank ``H``:
    measured output error 1.7e-4 with cubic B-splines of 8 coefficients (50 sweeps; 2.4e-2 with
    4 coefficients, a single cubic, for comparison), against 1.0 for the zero replacement and
    0.03–0.07 for the random GELU MLPs of the matrix at lower ranks. Bound: 2e-3."""
    hidden = 4
    x = calibration("many")
    config = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 8), max_iter=50)
    model, report = jb.compress_model(TanhNet(hidden), x, mlps=["ffn"], ranks={"ffn": hidden}, method=jb.get_method("bsd", config=config, contain=False), key=jax.random.key(0))
    (mlp,) = report.mlps
    assert mlp.spec.startswith("found: tanh: first -> second") and mlp.rank == hidden
    assert isinstance(model.ffn, DecoupledMLP)
    assert mlp.output_error < 2e-3
    original = TanhNet(hidden)
    h = original.embed(x).reshape(-1, M)
    y = original.ffn(h)
    assert float(jnp.sum((y - model.ffn(h)) ** 2) / jnp.sum(y ** 2)) < 2e-3


# ----------------------------------------------------------------- a calibration to refuse


def _bad_calibrations():
    x = calibration("many")
    nan = x.at[3, 2, 1].set(jnp.nan)
    inf = x.at[0, 0, 4].set(-jnp.inf)
    return {
        "nan": (x.at[3, 2, 1].set(jnp.nan), "NaN or inf"),
        "inf": (inf, "NaN or inf"),
        # A callable calibration is not checked up front: the MLP's captured inputs are.
        "nan-in-callable": (lambda model: model(nan), "NaN or inf"),
        "wrong-width": (jnp.ones((2, 4, D_IN + 1), jnp.float32), "forward pass fails"),
        "wrong-width-bare": ("bare", "forward pass fails"),
    }


class Bare(nnx.Module):
    """The MLP applied to the model's input itself: a wrong width reaches the MLP's Linear."""

    def __init__(self, kind):
        self.ffn = MLP_CLASSES[kind](M, H, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.ffn(x)


@pytest.mark.parametrize("method", ["bsd", "prune"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(_bad_calibrations()))
def test_bad_calibration_is_refused_naming_it_and_the_model_is_untouched(case, kind, method):
    batch, message = _bad_calibrations()[case]
    if isinstance(batch, str):
        model, batch = Bare(kind), jnp.ones((2, 4, M + 1), jnp.float32)
    else:
        model = Net(kind)
    before, mlp_type = _snapshot(model), type(model.ffn)
    layer_types = {name: type(getattr(model.ffn, name)) for name in vars(model.ffn) if not name.startswith("_")}
    with pytest.raises(ValueError, match=rf"^calibration\b.*{message}") as err:
        jb.compress_model(model, batch, mlps=["ffn"], reduction=0.2, method=jb.get_method(method, **method_options(method)),
                          key=jax.random.key(0))
    assert "token by token" not in str(err.value)  # not misreported as a module that is not an MLP
    after = _snapshot(model)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)
    assert type(get_submodule(model, "ffn")) is mlp_type
    assert {name: type(getattr(model.ffn, name)) for name in layer_types} == layer_types


# -------------------------------------------------------------- method objects and shortcuts


def _without_times(value):
    """A report's data without wall times (they differ from run to run)."""
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if not k.startswith("seconds")}
    if isinstance(value, (list, tuple)):
        return [_without_times(v) for v in value]
    return value


@pytest.mark.parametrize("name, obj", [
    pytest.param("bsd", jb.BSD(config=FAST, restarts=2, contain=True), marks=SLOW),
    pytest.param("auto", jb.Auto(bsd=jb.BSD(config=FAST, restarts=2, contain=True)), marks=SLOW),
], ids=["BSD", "Auto"])
def test_a_method_object_gives_what_its_string_shortcut_gives(name, obj):
    """``method=jb.BSD(config=…, restarts=2, contain=True)`` is ``method="bsd", config=…, restarts=2`` (the
    name contains pruning; the same for ``Auto``, whose decoupling candidate is such a BSD): same report,
    same weights."""
    x = calibration("many")
    rank = outcome("two-layer", "many", "bsd", 0.35)[2].mlps[0].rank  # the matrix's rank at ρ = 0.35
    runs = []
    for method in (obj, jb.get_method(name, config=FAST, restarts=2)):
        runs.append(jb.compress_model(Net("two-layer"), x, mlps=["ffn"], ranks={"ffn": rank}, method=method,
                                      key=jax.random.key(3)))
    (m1, r1), (m2, r2) = runs
    assert _without_times(r1.to_dict()) == _without_times(r2.to_dict())
    assert r1.method == name
    if name == "bsd":  # restarts chosen by held-out output error, the warm start among them (rank − 1 ≤ H)
        assert r1.mlps[0].selection == "output" and r1.mlps[0].restart_warm is not None
    for a, b in zip(_snapshot(m1), _snapshot(m2)):
        np.testing.assert_array_equal(a, b)


def test_options_beside_a_method_object_are_refused_naming_them():
    model = Net("two-layer")
    before = _snapshot(model)
    for options, name in [(dict(config=FAST), "config"), (dict(restarts=2), "restarts"),
                          (dict(selection="objective"), "selection"), (dict(warm_start=True), "warm_start"),
                          (dict(auto_judge="block"), "auto_judge")]:
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            jb.compress_model(model, calibration("many"), mlps=["ffn"], reduction=0.2,
                              method=jb.get_method(jb.BSD(config=FAST), **options), key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"^config\b"):
        jb.compress_model(model, calibration("many"), mlps=["ffn"], reduction=0.2,
                          method=jb.get_method(jb.Prune(), config=FAST), key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"^restarts=2: method 'prune' does not use it"):
        jb.get_method("prune", restarts=2)
    for a, b in zip(_snapshot(model), before):
        np.testing.assert_array_equal(a, b)
    assert isinstance(model.ffn, FeedForward)
