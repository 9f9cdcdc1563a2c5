"""The public functional core: a pytree config swept by vmap in one program, user-written
Jacobian operators, progress inside the compiled loop, validation on the device, and the
batched-LAPACK deadlock kept out of vmapped solves."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbsd as jb

#: The chex variant run without jit (its name is made by chex: no decorator reaches it) runs in the
#: slow step only (tests/conftest.py marks it); the jitted variant stays.
SLOW_CASES = {
    "test_sweep_jit_and_eager_agree__without_jit",
}


@jax.jit
def gelu_mlp(key, m=6, H=20, n=4, S=64):
    """A planted GELU MLP's Jacobians, outputs and inputs, built in one program (not eagerly)."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    V0 = jax.random.normal(k1, (H, m)) / np.sqrt(m)
    V1 = jax.random.normal(k2, (n, H)) / np.sqrt(H)
    b0 = 0.1 * jax.random.normal(k3, (H,))
    X = jax.random.normal(k4, (S, m))
    J, F = jb.solver.sample(lambda x: V1 @ jax.nn.gelu(V0 @ x + b0), X)
    return J, F, X


@pytest.fixture(scope="module")
def mlp():
    return gelu_mlp(jax.random.key(5))


CONFIG = jb.CMTFConfig(rank=3, basis=jb.BSpline(3, 6), max_iter=40)


class _CompileCounter:
    """Counts XLA backend compilations (an oracle outside the library)."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


_COUNTER = _CompileCounter()


def test_vmap_over_lambda_is_one_program_and_matches_separate_solves(mlp):
    problem = jb.solver.problem(*mlp)
    key = jax.random.key(0)
    study = jax.jit(jax.vmap(lambda lam: jb.solver.solve(key, problem, CONFIG.replace(lam=lam))))
    lams = [1e-6, 0.01, 0.25]
    first, second = jax.block_until_ready((jnp.array(lams), jnp.array([0.5, 1e-3, 0.1])))
    before = _COUNTER.count
    rows = jax.block_until_ready(study(first))
    assert _COUNTER.count - before == 1
    # New values of λ reuse the program.
    before = _COUNTER.count
    jax.block_until_ready(study(second))
    assert _COUNTER.count == before
    solve = jax.jit(jb.solver.solve)
    for i, lam in enumerate(lams):
        single = solve(key, problem, CONFIG.replace(lam=lam))
        assert float(single.objective) > 0
        # Two programs (batched and single) round differently over 40 sweeps: 1e-8 relative, and
        # 1e-9 absolute for the entries near zero of leaves of order one.
        chex.assert_trees_all_close(jax.tree_util.tree_map(lambda x: x[i], rows), single, rtol=1e-8, atol=1e-9)
    # A different λ changes the result (the leaf really is used).
    assert not np.allclose(rows.objective[0], rows.objective[2])


def test_numbers_of_the_config_are_traced_leaves_and_structure_is_static():
    leaves, treedef = jax.tree_util.tree_flatten(CONFIG)
    assert leaves == [CONFIG.lam, CONFIG.mu_w, CONFIG.mu_c, CONFIG.eps, CONFIG.tol, CONFIG.divergence]
    rebuilt = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(v) for v in leaves])
    assert rebuilt.rank == CONFIG.rank and rebuilt.basis == CONFIG.basis and rebuilt.max_iter == CONFIG.max_iter
    # replace validates concrete values, passes traced ones.
    with pytest.raises(ValueError, match="lam"):
        CONFIG.replace(lam=-1.0)
    with pytest.raises(ValueError, match="lam must be a scalar"):
        CONFIG.replace(lam=jnp.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="tol"):
        CONFIG.replace(tol="small")
    assert jax.jit(lambda t: CONFIG.replace(tol=t).tol * 2)(0.5) == 1.0


@pytest.mark.slow  # a costly program of this file; its claim's cheaper checks stay
def test_float64_hyperparameters_do_not_promote_a_float32_problem(mlp):
    J, F, X = (a.astype(jnp.float32) for a in mlp)
    problem = jb.solver.problem(J, F, X)
    out = jax.jit(jax.vmap(lambda lam: jb.solver.solve(jax.random.key(0), problem, CONFIG.replace(lam=lam))))(
        jnp.array([0.1, 0.2], jnp.float64))
    for leaf in jax.tree_util.tree_leaves(out.state):
        assert leaf.dtype == jnp.float32


class LowRankJacobian:
    """A user-written operator: 𝒥 = [[A, B, C]] given by its CP factors (never dense),
    ``A (n, q)``, ``B (m, q)``, ``C (S, q)``; written here from the protocol alone."""

    def __init__(self, A, B, C):
        self.A, self.B, self.C = A, B, C

    @property
    def shape(self):
        return (self.C.shape[0], self.A.shape[0], self.B.shape[0])

    @property
    def dtype(self):
        return self.C.dtype

    def mttkrp_w1(self, W0, G):
        return self.A @ ((self.B.T @ W0.T) * (self.C.T @ G))

    def contract_w1(self, W1):
        return self.A.T @ W1

    def mttkrp_w0_from(self, U, G):
        return self.B @ (U * (self.C.T @ G))

    def mttkrp_g_from(self, U, W0):
        return self.C @ (U * (self.B.T @ W0.T))

    def sq_norm(self):
        return jnp.sum((self.A.T @ self.A) * (self.B.T @ self.B) * (self.C.T @ self.C))

    def residual_sq_norm(self, W0, W1, G):
        dense = jnp.einsum("aq,sq,bq->sab", self.A, self.C, self.B)
        return jnp.sum((dense - jnp.einsum("ai,si,ib->sab", W1, G, W0)) ** 2)

    def map_samples(self, fn):
        return LowRankJacobian(self.A, self.B, fn(self.C))


jax.tree_util.register_pytree_node(
    LowRankJacobian, lambda op: ((op.A, op.B, op.C), None), lambda _, leaves: LowRankJacobian(*leaves)
)


def test_a_user_written_operator_gives_the_dense_result():
    k = jax.random.split(jax.random.key(9), 4)
    # tests/test_cmtf.py's planted sizes and SMALL configuration: the dense solve is its compiled program.
    S, n, m, q = 120, 3, 4, 8
    op = LowRankJacobian(jax.random.normal(k[0], (n, q)), jax.random.normal(k[1], (m, q)), jax.random.normal(k[2], (S, q)))
    assert isinstance(op, jb.solver.JacobianOperator)
    J = jnp.einsum("aq,sq,bq->sab", op.A, op.C, op.B)
    X = jax.random.normal(k[3], (S, m))
    F = jnp.einsum("sab,sb->sa", J, X)  # any outputs of the right shape
    config = jb.CMTFConfig(rank=2, basis=jb.BSpline(3, 5), max_iter=30)
    ours = jb.decouple(op, F, X, config, key=jax.random.key(1), restarts=3)
    dense = jb.decouple(J, F, X, config, key=jax.random.key(1), restarts=3)
    chex.assert_trees_all_close(ours.restarts.state, dense.restarts.state, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ours.error_J, dense.error_J, rtol=1e-8)
    with pytest.raises(ValueError, match=r"J.* contains NaN or inf"):
        jb.decouple(LowRankJacobian(op.A, op.B, op.C.at[0, 0].set(jnp.nan)), F, X, config, key=jax.random.key(1))


@pytest.mark.parametrize("batch", ["vmap", pytest.param("map", marks=pytest.mark.slow)])
def test_progress_is_reported_from_one_program_with_identical_results(mlp, batch):
    """Progress compiles one program with the hook (the quiet solve has none, so JAX's persistent
    cache can keep it), whoever listens and however often: the results are the quiet ones, bit for bit."""
    J, F, X = mlp
    config = CONFIG.replace(tol=0.0, max_iter=30)
    kw = dict(key=jax.random.key(2), restarts=3, batch=batch)
    quiet = jax.block_until_ready(jb.decouple(J, F, X, config, **kw))
    programs = _COUNTER.count
    jb.decouple(J, F, X, config, progress=lambda *a: None, progress_every=3, **kw)
    # the hooked program is a new one (the quiet solve holds no host callback), and only it
    assert _COUNTER.count == programs + 1
    programs = _COUNTER.count
    calls = []
    loud = jb.decouple(J, F, X, config, progress=lambda it, eJ, eF: calls.append((it, eJ.copy())),
                       progress_every=10, **kw)
    assert _COUNTER.count == programs  # another listener, another period: no new compilation
    for a, b in zip(jax.tree_util.tree_leaves(quiet), jax.tree_util.tree_leaves(loud)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    expected = [10, 20, 30] * (3 if batch == "map" else 1)
    assert [c[0] for c in calls] == expected
    final = calls[-1][1]
    np.testing.assert_allclose(final, np.asarray(loud.restarts.history_J)[:, -1])


@pytest.mark.parametrize("robust", [True, pytest.param(False, marks=pytest.mark.slow)])  # each a lowering
def test_vmapped_solves_contain_no_batched_lapack_call(mlp, robust):
    """jaxlib's batched CPU LAPACK kernels deadlock XLA's pool when two run at once; under
    vmap (restarts, λ) every LAPACK call must stay unbatched (a 2-d operand)."""
    problem = jb.solver.problem(*mlp)
    config = CONFIG.replace(robust=robust)
    fn = jax.vmap(jax.vmap(lambda k, lam: jb.solver.solve(k, problem, config.replace(lam=lam)), (0, None)), (None, 0))
    keys = jax.random.split(jax.random.key(0), 4)
    hlo = jax.jit(fn).lower(keys, jnp.array([0.1, 0.2])).as_text()
    lapack_lines = [line for line in hlo.splitlines() if "lapack_" in line and "custom_call" in line]
    assert lapack_lines, "expected LAPACK calls in the solve"
    for line in lapack_lines:
        assert re.search(r'num_batch_dims = "0"', line), line


def _while_loops(fn, *args, platform: str) -> int:
    """``stablehlo.while`` ops in ``fn`` exported for ``platform`` (lowered here, on the CPU)."""
    text = jax.export.export(jax.jit(fn), platforms=(platform,))(*args).mlir_module()
    return len(re.findall(r"stablehlo\.while", text))


@pytest.mark.slow  # a lowering check; the grouped solve's CUDA export stays in the default run
@pytest.mark.parametrize("robust", [True, False])
def test_on_accelerators_vmapped_solves_are_batched_not_looped(mlp, robust):
    """Exported for CUDA, 16 vmapped restarts and 3 vmapped λ hold exactly the single solve's
    loops (the sweep loop): no solve serialized over the batch. On the CPU the one-at-a-time
    workaround stays (more loops than the single solve)."""
    problem = jb.solver.problem(*mlp)
    config = CONFIG.replace(robust=robust, max_iter=3)
    key = jax.random.key(0)
    one = lambda k: jb.solver.solve(k, problem, config)  # noqa: E731
    restarts = (jax.vmap(one), jax.random.split(key, 16))
    lams = (jax.vmap(lambda lam: jb.solver.solve(key, problem, config.replace(lam=lam))), jnp.array([0.1, 0.25, 1.0]))
    single = _while_loops(one, key, platform="cuda")
    single_cpu = _while_loops(one, key, platform="cpu")
    assert single >= 1
    for fn, arg in (restarts, lams):
        assert _while_loops(fn, arg, platform="cuda") == single
        assert _while_loops(fn, arg, platform="cpu") > single_cpu


_SWEEP_JIT = jax.jit(jb.solver.sweep)  # the reference, compiled once for both variants


class SweepParityTest(chex.TestCase):
    """``jb.solver.sweep`` gives the same iterate jitted and eager (chex variants)."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_sweep_jit_and_eager_agree(self):
        problem = jb.solver.problem(*gelu_mlp(jax.random.key(5)))
        state = jax.jit(jb.solver.init_state)(jax.random.key(3), problem, CONFIG)  # only the sweep runs eagerly
        reference = _SWEEP_JIT(state, problem, CONFIG)
        new = self.variant(jb.solver.sweep)(state, problem, CONFIG)
        chex.assert_shape([new.W0, new.W1, new.G, new.coef, new.knots], [(3, 6), (4, 3), (64, 3), (3, 6), (3, 10)])
        chex.assert_trees_all_close(new, reference, rtol=1e-9, atol=1e-12)
