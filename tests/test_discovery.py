"""``compress_model(mlps=None)``: every submodule recognised as an MLP, in model order.

Oracles: the MLP paths each model's structure dictates (``blocks.{i}.mlp``, ``bert.layers.{i}.mlp``,
a user's ``encoder.layers.{i}.ffn``), written out here; and the run with those paths given
explicitly, which ``mlps=None`` must reproduce bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bert_reference import write_tiny_bert
from flax import nnx
from test_compress_model import Net, calibration

import jaxbsd as jb
from jaxbsd.compression.specs import discover_mlps
from jaxbsd.models import DeiTConfig, LMConfig, SwinConfig, ViTConfig, build_model
from jaxbsd.models import bert as B


def _images(n=4, size=8):
    return jax.random.normal(jax.random.key(3), (n, size, size, 1), jnp.float32)


MODELS = {
    "vit": (lambda: build_model("vit", ViTConfig.tiny()), _images, [f"blocks.{i}.mlp" for i in range(2)]),
    "deit": (lambda: build_model("deit", DeiTConfig.tiny()), _images, [f"blocks.{i}.mlp" for i in range(2)]),
    "swin": (lambda: build_model("swin", SwinConfig.tiny()), _images, None),
    "lm": (lambda: build_model("lm", LMConfig.tiny()),
           lambda: jax.random.randint(jax.random.key(3), (2, 8), 0, 11), [f"blocks.{i}.mlp" for i in range(2)]),
}


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k in ("deit", "swin") else k
                                  for k in sorted(MODELS)])
def test_every_model_of_jaxbsd_models_has_its_mlps_found_in_order(kind):
    make, data, expected = MODELS[kind]
    model = make()
    if expected is None:  # Swin: one MLP per block, however many blocks the tiny config has
        expected = [f"blocks.{i}.mlp" for i in range(len(model.blocks))]
    paths, status = discover_mlps(model, data())
    assert paths == expected
    assert all(status[p].startswith("chosen: known: jaxbsd") for p in paths)
    assert all(s.startswith("not chosen") for p, s in status.items() if p not in paths)


def test_bert_mlps_are_found_and_attention_is_not(tmp_path):
    enc = B.from_pretrained(write_tiny_bert(tmp_path / "m", layers=3))
    ids, mask, _ = enc.tokenize(["the weather is lovely today", "he drove"])
    paths, status = discover_mlps(enc, lambda m: m(ids, mask))
    assert paths == ["bert.layers.0.mlp", "bert.layers.1.mlp", "bert.layers.2.mlp"]
    assert set(status) == set(paths)  # BertAttention holds 4 Linears: never a candidate


@pytest.mark.parametrize("method", ["prune", pytest.param("svd", marks=pytest.mark.slow)])
def test_mlps_none_is_bit_identical_to_the_explicit_list(method):
    paths = [f"encoder.layers.{i}.ffn" for i in range(3)]
    runs = []
    for mlps in (None, paths):
        model, report = jb.compress_model(Net(), calibration(), mlps=mlps, reduction=0.3, method=method,
                                          key=jax.random.key(0), refine=jb.Refine(steps=5))
        runs.append((nnx.state(model, nnx.Param), report))
    (s0, r0), (s1, r1) = runs
    assert [m.path for m in r0.mlps] == [m.path for m in r1.mlps] == paths[::-1]
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), s0, s1))
    assert r0.discovered is not None and list(r0.discovered) == paths and r1.discovered is None
    assert r0.discovered["encoder.layers.1.ffn"].startswith("chosen: found: gelu: up -> down")  # a user MLP
    assert [m.output_error for m in r0.mlps] == [m.output_error for m in r1.mlps]


def test_a_model_without_mlps_gets_a_value_error_naming_mlps():
    class Plain(nnx.Module):
        def __init__(self):
            self.a = nnx.Linear(4, 4, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return self.a(x)

    with pytest.raises(ValueError, match="mlps=None: no submodule of Plain"):
        jb.compress_model(Plain(), jnp.ones((3, 4)), reduction=0.1, key=jax.random.key(0))


@pytest.mark.slow
def test_minilm_has_six_mlps():
    from jaxbsd.data import minilm_dir

    try:
        path = minilm_dir()
    except FileNotFoundError as err:
        pytest.skip(f"all-minilm-l6-v2 not installed: {err}")
    enc = B.from_pretrained(path)
    ids, mask, _ = enc.tokenize(["The weather is lovely today.", "He drove to the stadium."])
    paths, _ = discover_mlps(enc, lambda m: m(ids, mask))
    assert paths == [f"bert.layers.{i}.mlp" for i in range(6)]
