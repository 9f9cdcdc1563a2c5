"""ViT, Swin and DeiT: shapes, Swin's shifted windows, MLP surgery, modes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbsd.models import (
    ACTIVATION_DERIVATIVES,
    ACTIVATIONS,
    CONFIGS,
    MLP,
    DeiT,
    DeiTConfig,
    Swin,
    SwinConfig,
    ViTConfig,
    build_model,
    config_for_dataset,
    config_from_dict,
    config_to_dict,
    count_params,
    mlp_inputs,
    model_kind,
)
from jaxbsd.models.swin import WindowAttention, shift_mask

PRESETS = [
    ("vit", ViTConfig.mnist()),
    ("vit", ViTConfig.fashion_mnist()),
    ("vit", ViTConfig.usps()),
    ("vit", ViTConfig.digits()),
    ("vit", ViTConfig.cifar10()),
    ("vit", ViTConfig.svhn()),
    ("vit", ViTConfig.tiny()),
    ("swin", SwinConfig.cifar10()),
    ("swin", SwinConfig.svhn()),
    ("swin", SwinConfig.usps()),
    ("swin", SwinConfig.digits()),
    ("swin", SwinConfig.tiny()),
    ("deit", DeiTConfig.usps()),
    ("deit", DeiTConfig.tiny()),
]


def _images(config, batch=2, seed=0, dtype=jnp.float32):
    shape = (batch, config.image_size, config.image_size, config.channels)
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def _abstract(kind, config):
    """``(graphdef, state)`` of a model built with shapes only (no initialisation cost)."""
    return nnx.split(nnx.eval_shape(lambda: build_model(kind, config)))


# A jitted forward pass: compiled once per model structure and reused across tests,
# much cheaper than eager op-by-op dispatch on first use.
forward = nnx.jit(lambda model, x: model(x))


#: The default run builds the smallest and the largest preset of each family; the others in the slow step.
SLOW_CASES = {f"test_preset_shapes[{case}]" for case in ("vit-1", "vit-2", "vit-3", "vit-5", "swin-1", "swin-2", "swin-3")}


@pytest.mark.parametrize("kind,config", PRESETS, ids=lambda v: v if isinstance(v, str) else "")
def test_preset_shapes(kind, config):
    graphdef, state = _abstract(kind, config)
    x = jax.ShapeDtypeStruct((3, config.image_size, config.image_size, config.channels), jnp.float32)
    # Tracing only (no compilation) keeps the big presets cheap.
    out = jax.eval_shape(lambda st, images: nnx.merge(graphdef, st)(images), state, x)
    assert out.shape == (3, config.num_classes) and out.dtype == jnp.float32
    model = nnx.merge(graphdef, state)
    assert model_kind(model) == kind
    for i, block in enumerate(model.blocks):
        assert isinstance(block.mlp, MLP)
        assert block.mlp.fc1.kernel.shape == (config.dim, config.mlp_dim)
        assert block.mlp.fc2.kernel.shape == (config.mlp_dim, config.dim)
        assert block.mlp.fc1.kernel.dtype == jnp.float32

        def tokens_of(st, images, i=i):
            m = nnx.merge(graphdef, st)
            return m.blocks[i].mlp_input(m.block_input(images, i))

        tokens = jax.eval_shape(tokens_of, state, x)
        assert tokens.shape[0] == 3 and tokens.shape[-1] == config.dim


def test_paper_architectures():
    vit = ViTConfig.cifar10()
    assert (vit.dim, vit.num_heads, vit.mlp_dim, vit.depth, vit.patch_size) == (64, 8, 256, 3, 8)
    assert ViTConfig.mnist().patch_size == 7 and ViTConfig.usps().patch_size == 4
    assert ViTConfig.digits().patch_size == 4
    swin = SwinConfig.cifar10()
    assert (swin.dim, swin.num_heads, swin.window_size, swin.mlp_dim, swin.drop_path) == (64, 4, 4, 256, 0.1)
    assert swin.grid_sizes == (8, 4) and swin.depth == 3
    assert len(nnx.merge(*_abstract("swin", swin)).blocks) == 3
    # The documented DeiT/USPS size (paper: 668,650).
    assert count_params(nnx.merge(*_abstract("deit", DeiTConfig.usps()))) == 676_724
    assert config_for_dataset("vit", "usps") == ViTConfig.usps()
    assert config_for_dataset("swin", "cifar10") == SwinConfig.cifar10()


@pytest.mark.parametrize("kind", ["vit", "swin", "deit"])
def test_tiny_forward_and_mlp_inputs(kind):
    config = CONFIGS[kind].tiny()
    model = build_model(kind, config)
    x = _images(config)
    logits = forward(model, x)
    assert logits.shape == (2, config.num_classes)
    assert bool(jnp.all(jnp.isfinite(logits)))
    last = len(model.blocks) - 1  # its input has passed every earlier stage (Swin: merging)
    tokens = mlp_inputs(model, x, last)
    grid = config.image_size // config.patch_size
    expected = {"vit": grid**2 + 1, "deit": grid**2 + 2, "swin": (grid // 2) ** 2}[kind]
    assert tokens.shape == (2, expected, config.dim)


def test_mlp_activation_tables():
    u = jnp.linspace(-4.0, 4.0, 101, dtype=jnp.float64)
    for name, h in ACTIVATIONS.items():
        # Jitted: one compile per activation instead of one per eager primitive.
        auto = jax.jit(jax.vmap(jax.grad(lambda t, h=h: h(t))))(u)
        np.testing.assert_allclose(jax.jit(ACTIVATION_DERIVATIVES[name])(u), auto, atol=1e-12)
    # Exact (erf) GELU, not the tanh approximation.
    np.testing.assert_allclose(
        ACTIVATIONS["gelu"](u), jax.nn.gelu(u, approximate=False), atol=1e-15
    )
    mlp = MLP(4, 8, rngs=nnx.Rngs(0))
    assert mlp.activation == "gelu"
    x = jnp.ones((2, 3, 4), jnp.float32)
    assert mlp(x).shape == (2, 3, 4)
    with pytest.raises(ValueError, match="activation"):
        MLP(4, 8, activation="softsign", rngs=nnx.Rngs(0))


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="patch_size"):
        ViTConfig(image_size=28, patch_size=5)
    with pytest.raises(ValueError, match="num_heads"):
        ViTConfig(dim=10, num_heads=3)
    with pytest.raises(ValueError, match="depth"):
        ViTConfig(depth=0)
    with pytest.raises(ValueError, match="window_size"):
        SwinConfig(image_size=24, patch_size=4, window_size=4)  # 6x6 grid
    with pytest.raises(ValueError, match="kind"):
        build_model("resnet")
    with pytest.raises(ValueError, match="config"):
        build_model("swin", ViTConfig.tiny())
    with pytest.raises(ValueError, match="unknown fields"):
        config_from_dict(ViTConfig, {"dim": 8, "bogus": 1})
    assert config_from_dict(SwinConfig, config_to_dict(SwinConfig.tiny())) == SwinConfig.tiny()


# --- Swin shifted windows -----------------------------------------------------------------


def _wrapped(index, grid, shift):
    # After rolling by -shift, position index holds original position (index + shift) % grid,
    # which wrapped around iff index + shift >= grid.
    return index + shift >= grid


def test_shift_mask_matches_brute_force():
    grid, window, shift = 8, 4, 2
    mask = shift_mask(grid, window, shift)
    nw = grid // window
    assert mask.shape == (nw * nw, window * window, window * window)
    for w in range(nw * nw):
        wr, wc = divmod(w, nw)
        pos = [(wr * window + a // window, wc * window + a % window) for a in range(window * window)]
        for a, (ra, ca) in enumerate(pos):
            for b, (rb, cb) in enumerate(pos):
                same = (_wrapped(ra, grid, shift) == _wrapped(rb, grid, shift)) and (
                    _wrapped(ca, grid, shift) == _wrapped(cb, grid, shift)
                )
                assert (mask[w, a, b] == 0) == same
    assert not np.any(shift_mask(grid, window, 0))


def _affected(attn, x, position):
    """Boolean (H, W) map of outputs that change when the token at ``position`` changes."""
    y = np.asarray(forward(attn, x))  # jitted: one compile per attention layout, not per primitive
    x2 = np.array(x)
    x2[0, position[0], position[1]] += 10.0
    return np.any(np.asarray(forward(attn, jnp.asarray(x2)))[0] != y[0], axis=-1)


def test_window_attention_never_crosses_windows():
    dim, grid = 8, 8
    x = jax.random.normal(jax.random.key(1), (1, grid, grid, dim), jnp.float64)
    plain = WindowAttention(dim, 2, grid, 4, 0, rngs=nnx.Rngs(0))
    hit = _affected(plain, x, (0, 0))
    expected = np.zeros((grid, grid), bool)
    expected[:4, :4] = True
    np.testing.assert_array_equal(hit, expected)

    shifted = WindowAttention(dim, 2, grid, 4, 2, rngs=nnx.Rngs(0))
    # Original (0, 0) lands in the bottom-right shifted window with rows/cols {6, 7, 0, 1};
    # it may only mix with the non-wrapped part {0, 1} x {0, 1}, never with rows/cols 6, 7.
    hit = _affected(shifted, x, (0, 0))
    expected = np.zeros((grid, grid), bool)
    expected[:2, :2] = True
    np.testing.assert_array_equal(hit, expected)
    # An interior token: shifted window rows/cols 2..5 hold original 2..5 (no wrap).
    hit = _affected(shifted, x, (3, 4))
    expected = np.zeros((grid, grid), bool)
    expected[2:6, 2:6] = True
    np.testing.assert_array_equal(hit, expected)


def test_shift_disabled_when_window_covers_map():
    attn = WindowAttention(8, 2, 4, 8, 2, rngs=nnx.Rngs(0))
    assert attn.window == 4 and attn.shift == 0
    model = build_model("swin", SwinConfig.tiny())
    shifts = [block.attn.shift for block in model.blocks]
    grids = [block.attn.grid for block in model.blocks]
    assert shifts == [0, 2, 0] and grids == [8, 8, 4]
    assert model.blocks[2].attn.window == 4  # the whole 4x4 map: global attention
    x = jax.random.normal(jax.random.key(2), (1, 4, 4, 8), jnp.float64)
    assert np.all(_affected(attn, x, (0, 0)))


def test_swin_stochastic_depth_modes():
    config = SwinConfig.tiny(drop_path=0.5)
    model = build_model("swin", config)
    x = _images(config, batch=8)
    assert np.array_equal(forward(model, x), forward(model, x))  # eval mode after build
    model.train()
    a, b = forward(model, x), forward(model, x)
    assert not np.array_equal(a, b)
    model.eval()
    assert np.array_equal(forward(model, x), forward(model, x))


# --- surgery ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["vit", "swin", "deit"])
def test_mlp_surgery(kind):
    config = CONFIGS[kind].tiny()
    model = build_model(kind, config)
    x = _images(config)
    before = forward(model, x)
    tokens_before = mlp_inputs(model, x, 1)
    # A different MLP, then a module of a different kind with the same contract.
    model.blocks[1].mlp = MLP(config.dim, config.mlp_dim, rngs=nnx.Rngs(42))
    after = forward(model, x)
    assert after.shape == before.shape and not np.allclose(after, before)
    model.blocks[1].mlp = nnx.Linear(config.dim, config.dim, rngs=nnx.Rngs(1))
    assert forward(model, x).shape == before.shape
    # Inputs of a block's MLP do not depend on that MLP.
    np.testing.assert_array_equal(mlp_inputs(model, x, 1), tokens_before)


def test_deit_averages_heads():
    config = DeiTConfig.tiny()
    model = build_model("deit", config)
    assert isinstance(model, DeiT) and model.distilled
    x = _images(config)
    a, b = nnx.jit(lambda m, x: m.heads(x))(model, x)
    np.testing.assert_allclose(forward(model, x), 0.5 * (a + b), rtol=1e-6)
    assert isinstance(build_model("swin", SwinConfig.tiny()), Swin)
