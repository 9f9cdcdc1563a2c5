"""Checkpoints on Orbax: round trips, compressed models in factored form, corruption, atomicity,
old-format files."""

import hashlib
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd import baselines, checkpoint
from jaxbsd.models import CONFIGS, build_model, config_to_dict
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.models.layers import MLP
from jaxbsd.train import load_checkpoint, read_checkpoint_header, save_checkpoint

forward = nnx.jit(lambda model, x: model(x))


def _images(n=8, size=8, channels=1, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(n, size, size, channels)).astype(np.float32))


def _decoupled_mlp(mlp, rank=4, seed=0, basis=jb.BSpline(degree=2, dof=4)):
    """A small R-CMTF decoupling of ``mlp`` (a few sweeps are enough to get factors)."""
    m = mlp.fc1.kernel[...].shape[0]
    X = jax.random.normal(jax.random.key(seed), (24, m), jnp.float32)
    f = lambda x: mlp(x)  # noqa: E731
    J, F = jb.sample(f, X)
    cfg = jb.CMTFConfig(rank=rank, basis=basis, max_iter=5)
    res = jb.decouple(J, F, X, cfg, key=jax.random.key(seed), restarts=1)
    return DecoupledMLP.from_decoupled(res.model, dtype=jnp.float32)


@pytest.fixture(scope="module")
def compressed_vit():
    """A tiny ViT (two blocks) with a DecoupledMLP in block 0 and an SVD LowRankMLP in block 1."""
    model = build_model("vit", CONFIGS["vit"].tiny(), seed=1)
    model.blocks[0].mlp = _decoupled_mlp(model.blocks[0].mlp)
    model.blocks[1].mlp = baselines.svd_mlp(model.blocks[1].mlp, rank=3)
    return model


# --- whole models ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["vit", "swin", "deit"])
def test_checkpoint_round_trip(kind, tmp_path):
    model = build_model(kind, CONFIGS[kind].tiny(), seed=3)
    path = tmp_path / "model"
    assert save_checkpoint(path, model, {"dataset": "synthetic", "acc": 0.5}) == path
    x = _images()
    restored, metadata = load_checkpoint(path)
    assert type(restored) is type(model) and restored.config == model.config
    assert metadata == {"dataset": "synthetic", "acc": 0.5}
    np.testing.assert_array_equal(forward(restored, x), forward(model, x))
    other = build_model(kind, CONFIGS[kind].tiny(), seed=4)  # load into an existing model
    load_checkpoint(path, other)
    np.testing.assert_array_equal(forward(other, x), forward(model, x))
    header = read_checkpoint_header(path)
    assert header["kind"] == kind and header["config"]["dim"] == 16 and header["version"] == 2
    # A second save replaces the first; one version directory is left, no temporary files.
    save_checkpoint(path, model, {"acc": 0.75})
    assert read_checkpoint_header(path)["metadata"] == {"acc": 0.75}
    assert sorted(p.name for p in path.iterdir() if not p.name.startswith("v")) == ["LATEST"]
    assert len([p for p in path.iterdir() if p.name.startswith("v")]) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_relative_paths_save_and_load(tmp_path, monkeypatch):
    """``checkpoints/model.npz`` relative to the working directory, as the CLI and scripts pass it."""
    model = build_model("vit", CONFIGS["vit"].tiny(), seed=5)
    monkeypatch.chdir(tmp_path)
    save_checkpoint(pathlib.Path("checkpoints") / "model.npz", model, {"acc": 0.5})
    monkeypatch.chdir(tmp_path / "checkpoints")  # a different directory than at save time
    restored, metadata = load_checkpoint("model.npz")
    assert metadata == {"acc": 0.5}
    np.testing.assert_array_equal(forward(restored, _images()), forward(model, _images()))


def test_header_is_read_without_the_weights(tmp_path, monkeypatch):
    model = build_model("vit", CONFIGS["vit"].tiny())
    save_checkpoint(tmp_path / "m", model, {"history": [1, 2]})

    def no_restore(*args, **kwargs):
        raise AssertionError("read_checkpoint_header must not read the weights")

    monkeypatch.setattr(checkpoint, "_restore_arrays", no_restore)
    header = read_checkpoint_header(tmp_path / "m")
    assert header["metadata"] == {"history": [1, 2]}
    assert header["variables"]["blocks.0.mlp.fc1.kernel"]["shape"] == [16, 32]


def test_checkpoint_of_modified_model(tmp_path):
    model = build_model("vit", CONFIGS["vit"].tiny())
    model.blocks[1].mlp = nnx.Linear(16, 16, rngs=nnx.Rngs(5))
    path = tmp_path / "surgery"
    save_checkpoint(path, model, {})
    with pytest.raises(ValueError, match="does not match") as err:
        load_checkpoint(path)  # a plain rebuilt ViT has an MLP there
    assert str(path) in str(err.value)
    skeleton = build_model("vit", CONFIGS["vit"].tiny(), seed=9)
    skeleton.blocks[1].mlp = nnx.Linear(16, 16, rngs=nnx.Rngs(0))
    load_checkpoint(path, skeleton)
    x = _images()
    np.testing.assert_array_equal(forward(skeleton, x), forward(model, x))


def test_bad_arguments(tmp_path):
    model = build_model("vit", CONFIGS["vit"].tiny())
    with pytest.raises(ValueError, match="metadata"):
        save_checkpoint(tmp_path / "bad", model, {"f": object()})
    with pytest.raises(ValueError, match="metadata"):
        save_checkpoint(tmp_path / "bad", model, ["not", "a", "dict"])
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="model"):
        jb.save_compressed(tmp_path / "bad", {"not": "a module"})
    with pytest.raises(ValueError, match="model"):
        jb.load_compressed(tmp_path / "bad", {"not": "a module"})
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="busy"):
        save_checkpoint(tmp_path / "busy", model)
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing")


# --- compressed models -------------------------------------------------------------------


def test_compressed_vit_round_trip(tmp_path, compressed_vit):
    x = _images()
    expected = np.asarray(forward(compressed_vit, x))
    path = jb.save_compressed(tmp_path / "vit-compressed", compressed_vit, {"note": "two replaced"})
    header = read_checkpoint_header(path)
    records = {tuple(r["path"]): r for r in header["replaced"]}
    assert set(records) == {("blocks", 0, "mlp"), ("blocks", 1, "mlp")}
    bsd, svd = records[("blocks", 0, "mlp")], records[("blocks", 1, "mlp")]
    assert bsd["kind"] == "DecoupledMLP" and bsd["rank"] == 4
    assert bsd["basis"] == {"kind": "BSpline", "degree": 2, "dof": 4}
    assert set(bsd["factors"]) == {"W0", "W1", "coef", "knots"}
    assert svd["kind"] == "LowRankMLP" and svd["rank"] == [3, 3] and svd["activation"] == "gelu"

    fresh = build_model("vit", CONFIGS["vit"].tiny(), seed=7)  # original, other weights
    restored = jb.load_compressed(path, fresh)
    assert restored is fresh
    assert isinstance(fresh.blocks[0].mlp, DecoupledMLP)
    assert isinstance(fresh.blocks[1].mlp, baselines.LowRankMLP)
    assert fresh.blocks[0].mlp.basis == compressed_vit.blocks[0].mlp.basis
    np.testing.assert_array_equal(forward(fresh, x), expected)  # bit-identical logits
    # load_checkpoint rebuilds the same model from the header alone.
    rebuilt, metadata = load_checkpoint(path)
    assert metadata == {"note": "two replaced"}
    np.testing.assert_array_equal(forward(rebuilt, x), expected)


def test_zero_size_arrays_round_trip(tmp_path, monkeypatch):
    """A polynomial basis has no knots (a zero-size array), which Orbax refuses to save. The
    refusal is emulated as well, so the test fails if one reaches Orbax whatever its version."""
    import orbax.checkpoint as ocp

    save = ocp.Checkpointer.save

    def strict_save(self, directory, item, *args, **kwargs):
        empty = [k for k, v in item.items() if np.size(v) == 0]
        if empty:
            raise ValueError(f"Cannot save arrays with zero size: {empty}")
        return save(self, directory, item, *args, **kwargs)

    monkeypatch.setattr(ocp.Checkpointer, "save", strict_save)
    model = build_model("vit", CONFIGS["vit"].tiny(), seed=2)
    model.blocks[1].mlp = _decoupled_mlp(model.blocks[1].mlp, basis=jb.Polynomial(3))
    assert model.blocks[1].mlp.knots[...].size == 0
    x = _images()
    path = jb.save_compressed(tmp_path / "pd", model)
    assert read_checkpoint_header(path)["variables"]["blocks.1.mlp.knots"]["shape"][-1] == 0
    fresh = jb.load_compressed(path, build_model("vit", CONFIGS["vit"].tiny(), seed=8))
    assert fresh.blocks[1].mlp.knots[...].shape == model.blocks[1].mlp.knots[...].shape
    np.testing.assert_array_equal(forward(fresh, x), forward(model, x))


class Expert(nnx.Module):
    def __init__(self, dim, hidden, rngs):
        self.ffn = MLP(dim, hidden, rngs=rngs)
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.scale = nnx.BatchStat(jnp.full((dim,), 0.5, jnp.float32))  # non-trainable state

    def __call__(self, x):
        return x + self.scale[...][None, :] * self.ffn(self.norm(x))


class Stage(nnx.Module):
    def __init__(self, dim, hidden, depth, rngs):
        self.experts = nnx.List([Expert(dim, hidden, rngs) for _ in range(depth)])

    def __call__(self, x):
        for e in self.experts:
            x = e(x)
        return x


class UserNet(nnx.Module):
    """Not a jaxbsd model: own classes, MLPs two lists deep."""

    def __init__(self, dim=6, hidden=12, seed=0):
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Linear(3, dim, rngs=rngs)
        self.stages = nnx.List([Stage(dim, hidden, 2, rngs), Stage(dim, hidden, 2, rngs)])
        self.head = nnx.Linear(dim, 2, rngs=rngs)

    def __call__(self, x):
        x = self.embed(x)
        for s in self.stages:
            x = s(x)
        return self.head(x)


def test_user_model_round_trip(tmp_path):
    model = UserNet(seed=0)
    model.stages[1].experts[0].ffn = _decoupled_mlp(model.stages[1].experts[0].ffn, rank=3)
    model.stages[0].experts[1].ffn.fc2 = baselines.LowRankLinear(  # a lone low-rank layer
        jnp.ones((12, 2)), 0.1 * jnp.ones((2, 6)), jnp.zeros(6))
    model.stages[0].experts[0].scale[...] = jnp.arange(6, dtype=jnp.float32)
    x = jax.random.normal(jax.random.key(1), (5, 3))
    expected = np.asarray(forward(model, x))
    path = jb.save_compressed(tmp_path / "user", model)
    paths = [r["path"] for r in read_checkpoint_header(path)["replaced"]]
    assert paths == [["stages", 0, "experts", 1, "ffn", "fc2"], ["stages", 1, "experts", 0, "ffn"]]
    assert read_checkpoint_header(path)["kind"] is None
    fresh = jb.load_compressed(path, UserNet(seed=5))
    assert isinstance(fresh.stages[1].experts[0].ffn, DecoupledMLP)
    assert isinstance(fresh.stages[0].experts[1].ffn.fc2, baselines.LowRankLinear)
    np.testing.assert_array_equal(forward(fresh, x), expected)
    with pytest.raises(ValueError, match="no known model kind"):
        load_checkpoint(path)  # a user model cannot be rebuilt from the header


def test_mismatched_model_is_rejected_and_left_untouched(tmp_path, compressed_vit):
    path = jb.save_compressed(tmp_path / "c", compressed_vit)
    wider = build_model("vit", CONFIGS["vit"].tiny(dim=24))
    before = nnx.state(wider)
    with pytest.raises(ValueError, match="does not match|expected") as err:
        jb.load_compressed(path, wider)
    assert str(path) in str(err.value)
    assert isinstance(wider.blocks[0].mlp, MLP)  # the failed load changed nothing
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), before, nnx.state(wider)))
    with pytest.raises(ValueError, match="holds a jaxbsd.models.vit.ViT") as err:
        jb.load_compressed(path, UserNet())
    assert str(path) in str(err.value)
    shallow = build_model("vit", CONFIGS["vit"].tiny(depth=1))
    with pytest.raises(ValueError, match=r"no submodule at blocks\[1\]") as err:
        jb.load_compressed(path, shallow)
    assert str(path) in str(err.value)


# --- corruption, atomicity, old files -------------------------------------------------------


def _data_files(root: pathlib.Path) -> list[pathlib.Path]:
    """The OCDBT data files of an Orbax tree (how many, and which holds what, varies)."""
    files = [p for p in root.rglob("*") if p.is_file() and p.parent.name == "d"]
    assert files
    return files


def test_truncated_corrupt_and_incomplete_checkpoints(tmp_path, compressed_vit):
    path = tmp_path / "good"
    jb.save_compressed(path, compressed_vit)
    x = _images()

    def fresh():
        return build_model("vit", CONFIGS["vit"].tiny())

    def damaged(name, damage):
        copy = tmp_path / name
        os.system(f"cp -r {path} {copy}")
        damage(copy)
        return copy

    def check(bad, match=None):
        with pytest.raises(ValueError, match=match) as err:
            jb.load_compressed(bad, fresh())
        assert str(bad) in str(err.value)
        with pytest.raises(ValueError):
            load_checkpoint(bad)

    def truncate(p):
        for f in _data_files(p / json.loads((p / "LATEST").read_text())["current"] / "state"):
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    def flip(p):
        for f in _data_files(p / json.loads((p / "LATEST").read_text())["current"] / "state"):
            raw = bytearray(f.read_bytes())
            mid = len(raw) // 2
            raw[mid : mid + 8] = bytes(255 - b for b in raw[mid : mid + 8])
            f.write_bytes(bytes(raw))

    def edit_header(p):
        h = p / json.loads((p / "LATEST").read_text())["current"] / "header.json"
        h.write_text(h.read_text().replace('"rank": 4', '"rank": 5'))

    def drop_state(p):
        state = p / json.loads((p / "LATEST").read_text())["current"] / "state"
        os.system(f"rm -r {state}")

    check(damaged("truncated", truncate), "truncated or corrupt|corrupt")
    check(damaged("flipped", flip), "corrupt")
    check(damaged("edited", edit_header), "SHA-256")
    check(damaged("no-state", drop_state), "missing")
    check(damaged("no-latest", lambda p: (p / "LATEST").unlink()), "LATEST")
    check(damaged("bad-latest", lambda p: (p / "LATEST").write_text("{not json")), "LATEST")
    with pytest.raises(ValueError, match="garbage"):
        (tmp_path / "garbage").write_bytes(b"not a checkpoint at all")
        load_checkpoint(tmp_path / "garbage")
    # The original is intact.
    np.testing.assert_array_equal(forward(jb.load_compressed(path, fresh()), x), forward(compressed_vit, x))


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = build_model("vit", CONFIGS["vit"].tiny(), seed=0)
    path = tmp_path / "ckpt"
    save_checkpoint(path, model, {"epoch": 1})
    x = _images()
    expected = np.asarray(forward(model, x))

    import orbax.checkpoint as ocp

    class Crash(Exception):
        pass

    real_save = ocp.Checkpointer.save

    def save_then_crash(self, directory, *args, **kwargs):
        real_save(self, directory, *args, **kwargs)  # the state is written ...
        raise Crash  # ... and the process dies before the header and LATEST

    changed = build_model("vit", CONFIGS["vit"].tiny(), seed=1)
    monkeypatch.setattr(ocp.Checkpointer, "save", save_then_crash)
    with pytest.raises(Crash):
        save_checkpoint(path, changed, {"epoch": 2})
    with pytest.raises(Crash):  # a first save that dies leaves nothing at its path
        save_checkpoint(tmp_path / "new", changed)
    assert not (tmp_path / "new").exists()

    def crash_on_latest(path, data):
        raise Crash

    monkeypatch.setattr(ocp.Checkpointer, "save", real_save)
    monkeypatch.setattr(checkpoint, "write_bytes_atomic", crash_on_latest)
    with pytest.raises(Crash):  # the new version is complete but LATEST was not flipped
        save_checkpoint(path, changed, {"epoch": 2})
    monkeypatch.undo()

    restored, metadata = load_checkpoint(path)
    assert metadata == {"epoch": 1}
    np.testing.assert_array_equal(forward(restored, x), expected)
    # The next save cleans up what the interrupted ones left behind.
    save_checkpoint(path, changed, {"epoch": 2})
    assert load_checkpoint(path)[1] == {"epoch": 2}
    assert len([p for p in path.iterdir() if p.name != "LATEST"]) == 1


def _write_old_format(path: pathlib.Path, model, metadata: dict) -> None:
    """A version-1 checkpoint, byte for byte what earlier jaxbsd.train.save_checkpoint wrote."""
    arrays, table = checkpoint.collect_arrays(model)
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    header = {"format": "jaxbsd-checkpoint", "version": 1, "kind": "vit", "config": config_to_dict(model.config),
              "metadata": metadata, "variables": table, "checksum": h.hexdigest()}
    blob = np.frombuffer(json.dumps(header).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, __header__=blob, **arrays)


def test_old_npz_checkpoints_are_read_and_migrated(tmp_path):
    model = build_model("vit", CONFIGS["vit"].tiny(drop_path=0.1), seed=2)
    old = tmp_path / "vit.npz"
    _write_old_format(old, model, {"history": [0.5]})
    x = _images()
    expected = np.asarray(forward(model, x))
    assert read_checkpoint_header(old)["metadata"] == {"history": [0.5]}
    restored, metadata = load_checkpoint(old)
    assert metadata == {"history": [0.5]}
    np.testing.assert_array_equal(forward(restored, x), expected)
    # Saving to the same path converts the file into the current format, in place.
    save_checkpoint(old, restored, metadata)
    assert old.is_dir() and read_checkpoint_header(old)["version"] == 2
    np.testing.assert_array_equal(forward(load_checkpoint(old)[0], x), expected)
    # Or explicitly.
    other = tmp_path / "other.npz"
    _write_old_format(other, model, {})
    checkpoint.migrate_checkpoint(other, tmp_path / "migrated")
    np.testing.assert_array_equal(forward(load_checkpoint(tmp_path / "migrated")[0], x), expected)
    # A damaged old file is still reported with its path.
    raw = other.read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="cut.npz"):
        load_checkpoint(tmp_path / "cut.npz")
