"""Jacobian capture of a block's MLP at real token vectors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbsd.models import CONFIGS, build_model, capture, mlp_inputs
from jaxbsd.models.capture import mlp_function

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_capture_matches_finite_differences[vit-1]",
    "test_capture_matches_finite_differences[swin-2]",
}


def _float64(model):
    """Cast every parameter to float64 in place (so finite differences are accurate)."""
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda a: a.astype(jnp.float64), params))
    return model


def _images(config, batch, dtype=jnp.float64, seed=0):
    shape = (batch, config.image_size, config.image_size, config.channels)
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def _central_differences(f, points, eps=1e-6):
    """Central differences of a token-wise ``f`` at each of ``points`` (P, m): (P, n, m).

    All 2·P·m perturbed points go through ``f`` as two batches (two calls, not 2·P·m eager ones)."""
    P, m = points.shape
    steps = eps * jnp.eye(m, dtype=points.dtype)  # (m, m): row j = eps e_j
    plus = (points[:, None, :] + steps[None]).reshape(P * m, m)
    minus = (points[:, None, :] - steps[None]).reshape(P * m, m)
    diff = (f(plus) - f(minus)).reshape(P, m, -1) / (2 * eps)  # [p, j, :] = ∂f/∂x_j at points[p]
    return jnp.swapaxes(diff, 1, 2)


@pytest.mark.parametrize("kind,block", [("vit", 1), ("swin", 2), ("deit", 0)])
def test_capture_matches_finite_differences(kind, block, key):
    config = CONFIGS[kind].tiny()
    model = _float64(build_model(kind, config))
    images = _images(config, 6)
    X, J, F = capture(model, images, block, 12, key=key, batch_size=4)
    m = config.dim
    assert X.shape == (12, m) and J.shape == (12, m, m) and F.shape == (12, m)
    assert X.dtype == J.dtype == F.dtype == jnp.float64

    mlp = model.blocks[block].mlp
    np.testing.assert_allclose(F, mlp(X), rtol=1e-12, atol=1e-12)
    fd = jax.jit(lambda P: _central_differences(mlp, P))(X[::3])  # one compile, not one per op
    np.testing.assert_allclose(J[::3], fd, rtol=1e-6, atol=1e-8)

    # Samples are real MLP inputs, drawn without replacement.
    tokens = np.asarray(mlp_inputs(model, images, block)).reshape(-1, m)
    dists = np.abs(tokens[None, :, :] - np.asarray(X)[:, None, :]).max(axis=-1)
    assert np.all(dists.min(axis=1) == 0)
    assert len({int(i) for i in dists.argmin(axis=1)}) == 12


def test_capture_is_seeded(key):
    config = CONFIGS["vit"].tiny()
    model = build_model("vit", config)
    images = _images(config, 4, jnp.float32)
    X1, _, _ = capture(model, images, 0, 5, key=key)
    X2, _, _ = capture(model, images, 0, 5, key=key)
    X3, _, _ = capture(model, images, 0, 5, key=jax.random.key(7))
    np.testing.assert_array_equal(X1, X2)
    assert not np.array_equal(X1, X3)


def test_capture_after_surgery(key):
    config = CONFIGS["swin"].tiny()
    model = build_model("swin", config)
    linear = nnx.Linear(config.dim, config.dim, rngs=nnx.Rngs(3))
    model.blocks[1].mlp = linear
    X, J, F = capture(model, _images(config, 2, jnp.float32), 1, 7, key=key)
    expected = jnp.broadcast_to(linear.kernel[...].T, (7, config.dim, config.dim))
    np.testing.assert_allclose(J, expected, rtol=1e-6)
    np.testing.assert_allclose(F, linear(X), rtol=1e-5, atol=1e-6)
    f = mlp_function(linear)
    np.testing.assert_allclose(jax.jit(f)(X), linear(X), rtol=1e-6)


def test_capture_bad_input(key):
    config = CONFIGS["vit"].tiny()
    model = build_model("vit", config)
    images = _images(config, 2, jnp.float32)  # 2 images x 5 tokens
    with pytest.raises(ValueError, match="num_samples"):
        capture(model, images, 0, 11, key=key)
    with pytest.raises(ValueError, match="num_samples"):
        capture(model, images, 0, 0, key=key)
    with pytest.raises(ValueError, match="block_index"):
        capture(model, images, 2, 3, key=key)
    with pytest.raises(ValueError, match="images"):
        capture(model, images[0], 0, 3, key=key)
    with pytest.raises(ValueError, match="model"):
        capture(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), images, 0, 3, key=key)
