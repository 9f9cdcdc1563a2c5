"""Progress in compiled chunks and multi-device sharding give the one-shot single-device result."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbsd as jb


def mlp_problem(S=64, m=6, H=16, seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    V0, b0 = jax.random.normal(k[0], (H, m)) / np.sqrt(m), 0.1 * jax.random.normal(k[1], (H,))
    V1 = jax.random.normal(k[2], (m, H)) / np.sqrt(H)
    X = jax.random.normal(k[3], (S, m))
    jac = jb.solver.jacobians.mlp_jacobian(X, V0, b0, V1, lambda z: 1 - jnp.tanh(z) ** 2)
    F = jnp.tanh(X @ V0.T + b0[None, :]) @ V1.T
    return jac, F, X


CONFIG = jb.CMTFConfig(rank=4, basis=jb.BSpline(3, 5), max_iter=40, tol=0.0)


@pytest.fixture(scope="module")
def single():
    """The one-shot single-device solve both tests compare against (one compile for the file)."""
    jac, F, X = mlp_problem()
    return jb.decouple(jac, F, X, CONFIG, key=jax.random.key(0), restarts=4)


@pytest.mark.slow  # progress from one compiled solve is asserted in the default run (tests/test_core_api.py)
def test_progress_in_chunks_matches_the_single_compiled_solve(single):
    jac, F, X = mlp_problem()
    one = single
    calls = []
    chunked = jb.decouple(jac, F, X, CONFIG, key=jax.random.key(0), restarts=4, progress_every=15,
                          progress=lambda it, eJ, eF: calls.append((it, eJ.shape, eF.shape)))
    assert [c[0] for c in calls] == [15, 30, 40]
    assert all(c[1] == c[2] == (4,) for c in calls)
    for a, b in zip(jax.tree_util.tree_leaves(one), jax.tree_util.tree_leaves(chunked)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="progress_every"):
        jb.decouple(jac, F, X, CONFIG, key=jax.random.key(0), progress=True, progress_every=0)


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, {tests!r})
    from test_scale import mlp_problem, CONFIG
    import jaxbsd as jb
    assert len(jax.devices()) == 4, jax.devices()
    jac, F, X = mlp_problem()
    out = {{}}
    for shard in ("restarts", "samples"):
        res = jb.decouple(jac, F, X, CONFIG, key=jax.random.key(0), restarts=4, shard=shard)
        out[shard] = {{"W0": res.restarts.state.W0.tolist(), "history": res.history["error_J"].tolist()}}
    print(json.dumps(out))
    """
)


@pytest.mark.slow  # a subprocess with four host devices
def test_sharding_over_four_devices_matches_one_device(single):
    # The subprocess keeps the suite's XLA options (tests/conftest.py) and adds the four host devices.
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    script = SCRIPT.format(tests=os.path.dirname(__file__))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for shard in ("restarts", "samples"):
        np.testing.assert_allclose(out[shard]["W0"], single.restarts.state.W0, rtol=1e-7, atol=1e-10, err_msg=shard)
        np.testing.assert_allclose(out[shard]["history"], single.history["error_J"], rtol=1e-7, atol=1e-12, err_msg=shard)
