"""GatedJacobian: every protocol method against the dense Jacobian of the gated MLP (``jax.jacrev``)
and the DenseJacobian operator; the solver on it against the dense solve; validation."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd.solver import jacobians as gated

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_solve_on_the_operator_equals_the_dense_solve[gelu]",
    # the public decouple on the operator (test_decouple_on_the_operator_equals_the_dense_decouple) stays
    "test_solve_on_the_operator_equals_the_dense_solve[gelu_tanh]",
    "test_every_method_matches_the_dense_jacobian[True-gelu]",
}


ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu": lambda z: jax.nn.gelu(z, approximate=False),
    "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
}
# (S, n, m, H), n != m. One shape for the file: every new shape compiles each eager primitive afresh
# (the suite's time), and the methods' claims do not depend on the sizes; the blocked Gram sums vary
# the block against this H instead of H against the block.
S0, N0, M0, H0 = 8, 3, 4, 10


def weights(S, n, m, H, biases, seed=0):
    """Fan-in scaled gated-MLP weights, unit-normal inputs; biases ``None`` when absent."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((S, m))
    gate = rng.standard_normal((H, m)) / np.sqrt(m)
    up = rng.standard_normal((H, m)) / np.sqrt(m)
    down = rng.standard_normal((n, H)) / np.sqrt(H)
    b = (0.3 * rng.standard_normal(H), 0.3 * rng.standard_normal(H), 0.3 * rng.standard_normal(n))
    if not biases:
        b = (None, None, None)
    return X, gate, up, down, *b


def reference_f(gate, up, down, bg, bu, bd, act):
    """The gated MLP of one vector, written from the definition (the oracle's function)."""
    zero = lambda k: 0.0 if k is None else k  # noqa: E731

    def f(x):
        return down @ (act(gate @ x + zero(bg)) * (up @ x + zero(bu))) + zero(bd)

    return f


def case(S, n, m, H, act_name, biases, seed=0):
    X, gate, up, down, bg, bu, bd = weights(S, n, m, H, biases, seed)
    act = ACTIVATIONS[act_name]
    f = reference_f(gate, up, down, bg, bu, bd, act)
    # The oracle as one compiled program (op by op, each jacrev/vmap primitive compiles alone).
    J, F = (np.asarray(a) for a in jax.jit(lambda X: (jax.vmap(jax.jacrev(f))(X), jax.vmap(f)(X)))(jnp.asarray(X)))
    op = jb.solver.gated_mlp_jacobian(X, gate, up, down, act, gate_bias=bg, up_bias=bu)
    return op, J, F, X


def random_factors(S, n, m, r, seed=1):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((r, m))), jnp.asarray(rng.standard_normal((n, r))),
            jnp.asarray(rng.standard_normal((S, r))))


@pytest.mark.parametrize("act_name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("biases", [True, False])
def test_every_method_matches_the_dense_jacobian(act_name, biases):
    S, n, m = S0, N0, M0
    op, J, _, _ = case(S0, N0, M0, H0, act_name, biases)
    dense = jb.solver.DenseJacobian.from_dense(jnp.asarray(J))
    assert op.shape == J.shape == (S, n, m)
    assert op.dtype == jnp.float64
    np.testing.assert_allclose(op.dense(), J, rtol=1e-12, atol=1e-14)
    W0, W1, G = random_factors(S, n, m, r=3)
    tol = dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(op.mttkrp_w1(W0, G), dense.mttkrp_w1(W0, G), **tol)
    np.testing.assert_allclose(op.mttkrp_w0(W1, G), dense.mttkrp_w0(W1, G), **tol)
    np.testing.assert_allclose(op.mttkrp_g(W0, W1), dense.mttkrp_g(W0, W1), **tol)
    U = op.contract_w1(W1)  # the sweep's shared contraction
    np.testing.assert_allclose(op.mttkrp_w0_from(U, G), dense.mttkrp_w0(W1, G), **tol)
    np.testing.assert_allclose(op.mttkrp_g_from(U, W0), dense.mttkrp_g(W0, W1), **tol)
    np.testing.assert_allclose(op.sq_norm(), np.sum(J**2), rtol=1e-12)
    np.testing.assert_allclose(op.residual_sq_norm(W0, W1, G), dense.residual_sq_norm(W0, W1, G), rtol=1e-10)
    # A residual that is not dominated by ‖Ĵ‖²: factors scaled to the tensor's size.
    small = (W0 * 0.1, W1 * 0.1, G * 0.1)
    np.testing.assert_allclose(op.residual_sq_norm(*small), dense.residual_sq_norm(*small), rtol=1e-10)


def test_the_default_derivative_equals_a_given_one():
    from jaxbsd.models.layers import ACTIVATION_DERIVATIVES

    X, gate, up, down, bg, bu, _ = weights(S0, N0, M0, H0, biases=True)
    jvp = jb.solver.gated_mlp_jacobian(X, gate, up, down, jax.nn.silu, gate_bias=bg, up_bias=bu)
    given = jb.solver.gated_mlp_jacobian(X, gate, up, down, jax.nn.silu, gate_bias=bg, up_bias=bu,
                                  activation_derivative=ACTIVATION_DERIVATIVES["silu"])
    for a, b in zip(jvp, given):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    # and a wrong derivative is seen (the check can fail)
    wrong = jb.solver.gated_mlp_jacobian(X, gate, up, down, jax.nn.silu, gate_bias=bg, up_bias=bu,
                                  activation_derivative=jax.nn.sigmoid)
    assert not np.allclose(wrong.Dg, jvp.Dg)


@pytest.mark.parametrize("block", [4, 3, 5, 16])  # H0 = 10: ragged (3 blocks), ragged (4), exact, block > H
def test_blocked_norm_equals_the_dense_norm(block, monkeypatch):
    op, J, _, _ = case(S0, N0, M0, H0, "silu", True)
    monkeypatch.setattr(gated, "GRAM_BLOCK", block)
    np.testing.assert_allclose(op.sq_norm(), np.sum(J**2), rtol=1e-12)
    np.testing.assert_allclose(jax.jit(lambda o: o.sq_norm())(op), np.sum(J**2), rtol=1e-12)


@pytest.mark.parametrize("block", [64, 4])
def test_inner_product_of_two_gated_jacobians(block, monkeypatch):
    monkeypatch.setattr(gated, "GRAM_BLOCK", block)
    a, Ja, _, X = case(S0, N0, M0, H0, "silu", True, seed=0)
    _, gate, up, down, bg, bu, _ = weights(S0, N0, M0, 7, biases=True, seed=5)  # other hidden width
    b = jb.solver.gated_mlp_jacobian(X, gate, up, down, ACTIVATIONS["silu"], gate_bias=bg, up_bias=bu)
    Jb = np.asarray(jax.jit(jax.vmap(jax.jacrev(reference_f(gate, up, down, bg, bu, None, ACTIVATIONS["silu"]))))(X))
    np.testing.assert_allclose(a.inner(b), np.sum(Ja * Jb), rtol=1e-12)
    np.testing.assert_allclose(b.inner(a), np.sum(Ja * Jb), rtol=1e-12)
    np.testing.assert_allclose(a.inner(a), np.sum(Ja**2), rtol=1e-12)
    with pytest.raises(ValueError, match="other"):
        a.inner(b.map_samples(lambda d: d[:5]))


def test_residual_of_the_planted_exact_fit_is_zero():
    # 𝒥 is the rank-2H CPD [[ [V1 V1], [Vg; Vu]ᵀ, [Dg Du] ]]: fitting it with those factors is exact.
    op, J, _, _ = case(S0, N0, M0, H0, "gelu", True)
    W1 = jnp.concatenate([op.V1, op.V1], axis=1)
    W0 = jnp.concatenate([op.Vg, op.Vu], axis=0)
    G = jnp.concatenate([op.Dg, op.Du], axis=1)
    np.testing.assert_allclose(np.einsum("ai,si,ib->sab", W1, G, W0), J, rtol=1e-12, atol=1e-14)
    value = float(op.residual_sq_norm(W0, W1, G))
    assert 0.0 <= value <= 1e-12 * float(op.sq_norm())
    # a perturbed fit is not exact, and the operator sees how far it is
    W0p = W0.at[0, 0].add(1e-3)
    expected = np.sum((J - np.einsum("ai,si,ib->sab", W1, G, W0p)) ** 2)
    np.testing.assert_allclose(op.residual_sq_norm(W0p, W1, G), expected, rtol=1e-5)


def test_constructor_and_methods_under_jit_and_vmap():
    X, gate, up, down, bg, bu, _ = weights(S0, N0, M0, H0, biases=True)
    build = jax.jit(lambda X: jb.solver.gated_mlp_jacobian(X, gate, up, down, jax.nn.silu, gate_bias=bg, up_bias=bu))
    eager = jb.solver.gated_mlp_jacobian(X, gate, up, down, jax.nn.silu, gate_bias=bg, up_bias=bu)
    for a, b in zip(build(X), eager):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    # vmap over two sets of samples: a batched operator
    Xs = jnp.stack([X, 2 * X])
    norms = jax.vmap(lambda X: build(X).sq_norm())(Xs)
    expected = [jnp.sum(jb.solver.gated_mlp_jacobian(x, gate, up, down, jax.nn.silu, gate_bias=bg, up_bias=bu).dense() ** 2)
                for x in Xs]
    np.testing.assert_allclose(norms, expected, rtol=1e-12)


def test_gated_mlp_outputs_match_the_definition():
    X, gate, up, down, bg, bu, bd = weights(S0, N0, M0, H0, biases=True)
    act = ACTIVATIONS["gelu_tanh"]
    f = reference_f(gate, up, down, bg, bu, bd, act)
    F = jb.solver.gated_mlp(X, gate, up, down, act, gate_bias=bg, up_bias=bu, down_bias=bd)
    np.testing.assert_allclose(F, jax.vmap(f)(jnp.asarray(X)), rtol=1e-13)
    z = X @ gate.T + bg
    numpy_F = (0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3))) * (X @ up.T + bu)) @ down.T + bd
    np.testing.assert_allclose(F, numpy_F, rtol=1e-12)


def test_map_samples_restricts_to_those_samples():
    op, J, _, _ = case(S0, N0, M0, H0, "silu", True)
    idx = jnp.asarray([0, 3, 4, 7])
    sub = op.map_samples(lambda a: a[idx])
    assert sub.shape == (4, N0, M0)
    np.testing.assert_allclose(sub.dense(), J[np.asarray(idx)], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sub.sq_norm(), np.sum(J[np.asarray(idx)] ** 2), rtol=1e-12)
    # weights are not sample arrays: untouched
    assert sub.V1 is op.V1 and sub.Vg is op.Vg and sub.Vu is op.Vu


CONFIG = jb.CMTFConfig(rank=3, basis=jb.BSpline(3, 5), max_iter=6, tol=0.0)


@pytest.mark.slow  # restarts of both: 8 s (the single-solve equality below stays in the fast suite)
def test_decouple_on_the_operator_equals_the_dense_decouple():
    op, J, F, X = case(40, 4, 5, 12, "silu", False)
    key = jax.random.key(3)
    ours = jb.decouple(op, F, X, CONFIG, key=key, restarts=2)
    ref = jb.decouple(J, F, X, CONFIG, key=key, restarts=2)
    assert int(ref.iterations) == int(ours.iterations) == CONFIG.max_iter
    for field in ("W0", "W1", "G", "R", "coef", "knots"):
        np.testing.assert_allclose(getattr(ours.restarts.state, field), getattr(ref.restarts.state, field),
                                   rtol=1e-7, atol=1e-10, err_msg=field)
    np.testing.assert_allclose(ours.history["error_J"], ref.history["error_J"], rtol=1e-8)
    np.testing.assert_allclose(ours.restarts.error_J, ref.restarts.error_J, rtol=1e-8)
    np.testing.assert_allclose(ours.restarts.error_F, ref.restarts.error_F, rtol=1e-8)


@pytest.mark.parametrize("act_name", ["gelu", "gelu_tanh"])  # the second reuses the compiled solves
def test_solve_on_the_operator_equals_the_dense_solve(act_name):
    op, J, F, X = case(40, 4, 5, 12, act_name, True)
    key = jax.random.key(4)
    one = jb.solver.solve(key, jb.solver.problem(op, F, X), CONFIG)
    one_dense = jb.solver.solve(key, jb.solver.problem(J, F, X), CONFIG)
    assert int(one.iterations) == int(one_dense.iterations) == CONFIG.max_iter
    for field in ("W0", "W1", "G", "coef"):
        np.testing.assert_allclose(getattr(one.state, field), getattr(one_dense.state, field),
                                   rtol=1e-7, atol=1e-10, err_msg=field)
    np.testing.assert_allclose(one.history_J, one_dense.history_J, rtol=1e-8)
    np.testing.assert_allclose(one.error_J, one_dense.error_J, rtol=1e-8)
    assert float(one.error_J) < 0.9  # the fit is not trivial: six sweeps did reduce Error(J)


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, {tests!r})
    from test_gated import case, CONFIG
    import jaxbsd as jb
    assert len(jax.devices()) == 4, jax.devices()
    op, J, F, X = case(40, 4, 5, 12, "silu", True)
    res = jb.decouple(op, F, X, CONFIG, key=jax.random.key(0), restarts=2, shard="samples")
    print(json.dumps({{"W0": res.restarts.state.W0.tolist(), "history": res.history["error_J"].tolist()}}))
    """
)


@pytest.mark.slow  # a subprocess with four host devices: ~80 s on the shared 2-core machine
def test_sample_sharding_over_four_devices_matches_one_device():
    op, _, F, X = case(40, 4, 5, 12, "silu", True)
    single = jb.decouple(op, F, X, CONFIG, key=jax.random.key(0), restarts=2)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    script = SCRIPT.format(tests=os.path.dirname(__file__))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(out["W0"], single.restarts.state.W0, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(out["history"], single.history["error_J"], rtol=1e-7, atol=1e-12)


def test_built_from_three_nnx_linear_layers():
    # The recipe the compress_model integration will use: kernels are (in, out), so transpose.
    m, H, n, S = M0, H0, N0, S0
    rngs = nnx.Rngs(0)
    gate_l = nnx.Linear(m, H, use_bias=False, rngs=rngs, param_dtype=jnp.float64)
    up_l = nnx.Linear(m, H, use_bias=False, rngs=rngs, param_dtype=jnp.float64)
    down_l = nnx.Linear(H, n, use_bias=True, rngs=rngs, param_dtype=jnp.float64)
    X = jax.random.normal(jax.random.key(1), (S, m), jnp.float64)
    f = lambda x: down_l(jax.nn.silu(gate_l(x)) * up_l(x))  # noqa: E731
    J = jax.jit(jax.vmap(jax.jacrev(f)))(X)
    op = jb.solver.gated_mlp_jacobian(X, gate_l.kernel[...].T, up_l.kernel[...].T, down_l.kernel[...].T, jax.nn.silu)
    np.testing.assert_allclose(op.dense(), J, rtol=1e-12, atol=1e-14)
    F = jb.solver.gated_mlp(X, gate_l.kernel[...].T, up_l.kernel[...].T, down_l.kernel[...].T, jax.nn.silu,
                     down_bias=down_l.bias[...])
    np.testing.assert_allclose(F, f(X), rtol=1e-12)


# --------------------------------------------------------------------------- validation

def bad(**changes):
    X, gate, up, down, bg, bu, _ = weights(6, 3, 4, 5, biases=True)
    args = dict(X=X, gate=gate, up=up, down=down, activation=jax.nn.silu, gate_bias=bg, up_bias=bu)
    args.update(changes)
    return args


def nan_at(a):
    a = np.array(a)
    a.flat[1] = np.nan
    return a


@pytest.mark.parametrize(
    "changes,name",
    [
        (dict(X=np.ones((6, 5))), "gate"),  # m from X disagrees with the gate's
        (dict(X=np.ones(6)), "X"),
        (dict(X=np.ones((6, 4), np.int32)), "X"),
        (dict(gate=np.ones((5, 3))), "gate"),
        (dict(up=np.ones((6, 4))), "up"),
        (dict(up=np.ones((5, 3))), "up"),
        (dict(down=np.ones((3, 6))), "down"),
        (dict(down=np.ones(3)), "down"),
        (dict(gate_bias=np.ones(4)), "gate_bias"),
        (dict(up_bias=np.ones((5, 1))), "up_bias"),
        (dict(X=np.ones((6, 4), np.float32)), "dtype"),
        (dict(activation="silu"), "activation"),
        (dict(activation=lambda z: jnp.log(z)), "activation"),  # NaN at negative pre-activations
        (dict(activation=lambda z: jnp.sum(z, axis=1)), "activation"),  # not elementwise
    ],
)
def test_bad_input_raises_naming_the_argument(changes, name):
    with pytest.raises(ValueError, match=name):
        jb.solver.gated_mlp_jacobian(**bad(**changes))


@pytest.mark.parametrize("field", ["X", "gate", "up", "down", "gate_bias", "up_bias"])
def test_nan_input_raises_naming_the_argument(field):
    args = bad()
    args[field] = nan_at(args[field])
    with pytest.raises(ValueError, match=f"^{field} contains NaN"):
        jb.solver.gated_mlp_jacobian(**args)


def test_problem_validates_a_hand_built_operator():
    op, _, F, X = case(S0, N0, M0, H0, "silu", True)
    jb.solver.problem(op, F, X)  # consistent: accepted
    with pytest.raises(ValueError, match="J: gated factors disagree"):
        jb.solver.problem(op._replace(Vu=op.Vu[:, :3]), F, X)
    with pytest.raises(ValueError, match="J: gated factors disagree"):
        jb.solver.problem(op._replace(Du=op.Du[:7]), F, X)
    with pytest.raises(ValueError, match="J.Dg contains NaN"):
        jb.solver.problem(op._replace(Dg=op.Dg.at[0, 0].set(jnp.nan)), F, X)
    with pytest.raises(ValueError, match="^F must have shape"):
        jb.solver.problem(op, F[:, :2], X)
    with pytest.raises(ValueError, match="^J must have shape"):
        jb.solver.problem(op, F, X[:, :3])
