"""Checkpoints on Orbax: round trips, compressed models in factored form, corruption, atomicity,
old formats refused."""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd import checkpoint
from jaxbsd.compression import baselines
from jaxbsd.models import CONFIGS, build_model
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.models.layers import MLP
from jaxbsd.checkpoint import load_checkpoint, read_checkpoint_header, save_checkpoint

forward = nnx.jit(lambda model, x: model(x))


def _images(n=8, size=8, channels=1, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(n, size, size, channels)).astype(np.float32))


def _decoupled_mlp(mlp, rank=4, seed=0, basis=jb.BSpline(degree=2, dof=4)):
    """A ``DecoupledMLP`` of ``mlp``'s sizes with random factors and the knots ``basis`` fits to their
    activations: a round trip needs a decoupled module, not a good one (no solve to compile)."""
    (m, _), (_, n) = mlp.fc1.kernel[...].shape, mlp.fc2.kernel[...].shape
    rng = np.random.default_rng(seed)
    W0, W1 = rng.normal(size=(rank, m)) / np.sqrt(m), rng.normal(size=(n, rank)) / np.sqrt(rank)
    knots = jax.jit(jax.vmap(basis.fit, in_axes=1))(jnp.asarray(rng.normal(size=(24, m)) @ W0.T))
    model = jb.Decoupled(W0=jnp.asarray(W0), W1=jnp.asarray(W1), coef=jnp.asarray(rng.normal(size=(rank, basis.num_coef))),
                         knots=knots, basis=basis)
    return DecoupledMLP.from_decoupled(model, dtype=jnp.float32)


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
    assert header["kind"] == kind and header["config"]["dim"] == 16 and header["version"] == 3
    # A second save replaces the first: one Orbax step is left, no temporary files.
    save_checkpoint(path, model, {"acc": 0.75})
    assert read_checkpoint_header(path)["metadata"] == {"acc": 0.75}
    assert [p.name for p in path.iterdir()] == ["2"]
    assert sorted(p.name for p in (path / "2").iterdir()) == ["_CHECKPOINT_METADATA", "commit_success.txt",
                                                               "header", "state"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_relative_paths_save_and_load(tmp_path, monkeypatch):
    """``checkpoints/model`` relative to the working directory, as the CLI and scripts pass it."""
    model = build_model("vit", CONFIGS["vit"].tiny(), seed=5)
    monkeypatch.chdir(tmp_path)
    save_checkpoint(pathlib.Path("checkpoints") / "model", model, {"acc": 0.5})
    monkeypatch.chdir(tmp_path / "checkpoints")  # a different directory than at save time
    restored, metadata = load_checkpoint("model")
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
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ValueError, match="file"):
        save_checkpoint(tmp_path / "file", model)
    assert (tmp_path / "file").read_text() == "mine"
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

    save = ocp.StandardCheckpointHandler.async_save

    async def strict_save(self, directory, *args, **kwargs):
        empty = [k for k, v in kwargs["args"].item.items() if np.size(v) == 0]
        calls.append(directory)
        if empty:
            raise ValueError(f"Cannot save arrays with zero size: {empty}")
        return await save(self, directory, *args, **kwargs)

    calls = []

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", strict_save)
    model = build_model("vit", CONFIGS["vit"].tiny(), seed=2)
    model.blocks[1].mlp = _decoupled_mlp(model.blocks[1].mlp, basis=jb.Polynomial(3))
    assert model.blocks[1].mlp.knots[...].size == 0
    x = _images()
    path = jb.save_compressed(tmp_path / "pd", model)
    assert read_checkpoint_header(path)["variables"]["blocks.1.mlp.knots"]["shape"][-1] == 0
    fresh = jb.load_compressed(path, build_model("vit", CONFIGS["vit"].tiny(), seed=8))
    assert fresh.blocks[1].mlp.knots[...].shape == model.blocks[1].mlp.knots[...].shape
    np.testing.assert_array_equal(forward(fresh, x), forward(model, x))
    assert calls  # the emulated refusal was in the path


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

    def __init__(self, dim=16, hidden=32, seed=0):
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
    model.stages[1].experts[0].ffn = _decoupled_mlp(model.stages[1].experts[0].ffn)
    model.stages[0].experts[1].ffn.fc2 = baselines.LowRankLinear(  # a lone low-rank layer
        jnp.ones((32, 2)), 0.1 * jnp.ones((2, 16)), jnp.zeros(16))
    model.stages[0].experts[0].scale[...] = jnp.arange(16, dtype=jnp.float32)
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
    assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),  # numpy: no compiles
                                     before, nnx.state(wider)))
    with pytest.raises(ValueError, match="holds a jaxbsd.models.vit.ViT") as err:
        jb.load_compressed(path, UserNet())
    assert str(path) in str(err.value)
    shallow = build_model("vit", CONFIGS["vit"].tiny(depth=1))
    with pytest.raises(ValueError, match=r"no submodule at blocks\[1\]") as err:
        jb.load_compressed(path, shallow)
    assert str(path) in str(err.value)


# --- corruption, atomicity, old formats ------------------------------------------------------


def _step(path: pathlib.Path) -> pathlib.Path:
    """The one finalized Orbax step directory of a checkpoint."""
    (step,) = [p for p in path.iterdir() if p.name.isdigit()]
    return step


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
        shutil.copytree(path, copy)
        damage(copy)
        return copy

    def check(bad, match):
        with pytest.raises(ValueError, match=match) as err:
            jb.load_compressed(bad, fresh())
        assert str(bad) in str(err.value)
        with pytest.raises(ValueError, match=match):
            load_checkpoint(bad)

    def truncate(p):
        for f in _data_files(_step(p) / "state"):
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    def flip(p):
        for f in _data_files(_step(p) / "state"):
            raw = bytearray(f.read_bytes())
            mid = len(raw) // 2
            raw[mid : mid + 8] = bytes(255 - b for b in raw[mid : mid + 8])
            f.write_bytes(bytes(raw))

    def other_weights(p):
        # A valid Orbax state holding one changed weight (what a bit flipped in the compressed
        # array data usually gives: Orbax restores it silently); only the SHA-256 notices.
        import orbax.checkpoint as ocp

        state = (_step(p) / "state").absolute()
        with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as checkpointer:
            arrays = checkpointer.restore(state)
            arrays["blocks.0.mlp.W0"] = np.asarray(arrays["blocks.0.mlp.W0"]).copy()
            arrays["blocks.0.mlp.W0"].flat[0] += 1e-3
            shutil.rmtree(state)
            checkpointer.save(state, arrays)

    def edit_header(p):
        h = _step(p) / "header" / "metadata"
        h.write_text(h.read_text().replace('"rank": 4', '"rank": 5'))

    check(damaged("truncated", truncate), "truncated or corrupt|corrupt")
    check(damaged("flipped", flip), "corrupt")
    check(damaged("other-weights", other_weights), "SHA-256")
    check(damaged("edited", edit_header), "SHA-256")
    check(damaged("no-state", lambda p: shutil.rmtree(_step(p) / "state")), "missing")
    check(damaged("no-header", lambda p: shutil.rmtree(_step(p) / "header")), "missing or corrupt header")
    check(damaged("bad-header", lambda p: (_step(p) / "header" / "metadata").write_text("{not json")),
          "corrupt header")
    check(damaged("unfinalized", lambda p: _step(p).rename(p / "2.orbax-checkpoint-tmp")), "no finished save")
    (tmp_path / "garbage").write_bytes(b"not a checkpoint at all")
    check(tmp_path / "garbage", "garbage.*not a directory")
    # The original is intact.
    np.testing.assert_array_equal(forward(jb.load_compressed(path, fresh()), x), forward(compressed_vit, x))


class Crash(BaseException):
    """A process dying: not an Exception, so nothing on the way may swallow it."""


@pytest.mark.parametrize("where", ["arrays", "header", "finalize"])
def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, where):
    import orbax.checkpoint as ocp

    model = build_model("vit", CONFIGS["vit"].tiny(), seed=0)
    path = tmp_path / "ckpt"
    save_checkpoint(path, model, {"epoch": 1})
    x = _images()
    expected = np.asarray(forward(model, x))

    async def crash(*args, **kwargs):
        raise Crash

    json_save = ocp.JsonCheckpointHandler.async_save

    async def header_then_crash(*args, **kwargs):
        await json_save(*args, **kwargs)  # the header is written, ...
        raise Crash  # ... and the process dies before the step is finalized

    patch = {"arrays": (ocp.StandardCheckpointHandler, "async_save", crash),
             "header": (ocp.JsonCheckpointHandler, "async_save", header_then_crash),
             "finalize": (ocp.path.atomicity.AtomicRenameTemporaryPath, "finalize", crash)}[where]
    changed = build_model("vit", CONFIGS["vit"].tiny(), seed=1)
    monkeypatch.setattr(*patch)
    with pytest.raises(Crash):
        save_checkpoint(path, changed, {"epoch": 2})
    assert [p for p in path.iterdir() if not p.name.isdigit()]  # an unfinalized step is left ...
    with pytest.raises(Crash):  # a first save that dies leaves nothing at its path
        save_checkpoint(tmp_path / "new", changed)
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()

    restored, metadata = load_checkpoint(path)  # ... and the previous checkpoint loads
    assert metadata == {"epoch": 1}
    np.testing.assert_array_equal(forward(restored, x), expected)
    # The next save cleans up what the interrupted one left behind.
    save_checkpoint(path, changed, {"epoch": 2})
    assert load_checkpoint(path)[1] == {"epoch": 2}
    assert [p.name for p in path.iterdir()] == [_step(path).name]


def test_crash_before_the_old_step_is_deleted(tmp_path):
    """Killed between finalizing the new step and deleting the old one: the new one loads, and
    the next save keeps one step."""
    old, new = (build_model("vit", CONFIGS["vit"].tiny(), seed=s) for s in (0, 1))
    save_checkpoint(tmp_path / "old", old, {"epoch": 1})
    save_checkpoint(tmp_path / "ckpt", new, {"epoch": 2})
    shutil.copytree(_step(tmp_path / "old"), tmp_path / "ckpt" / "0")  # an older finalized step
    restored, metadata = load_checkpoint(tmp_path / "ckpt")
    assert metadata == {"epoch": 2}
    np.testing.assert_array_equal(forward(restored, _images()), forward(new, _images()))
    save_checkpoint(tmp_path / "ckpt", old, {"epoch": 3})
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["2"]
    assert load_checkpoint(tmp_path / "ckpt")[1] == {"epoch": 3}


def test_old_formats_are_refused_naming_the_path(tmp_path):
    """Version 1 (one ``.npz`` file) and version 2 (``LATEST`` + ``v<time>/``) are no longer read."""
    model = build_model("vit", CONFIGS["vit"].tiny(), seed=2)
    v1 = tmp_path / "vit.npz"
    with open(v1, "wb") as f:
        np.savez(f, __header__=np.frombuffer(b'{"format": "jaxbsd-checkpoint", "version": 1}', np.uint8))
    v2 = tmp_path / "vit-v2"
    (v2 / "v1-abc" / "state").mkdir(parents=True)
    (v2 / "v1-abc" / "header.json").write_text(json.dumps({"format": "jaxbsd-checkpoint", "version": 2}))
    (v2 / "LATEST").write_text(json.dumps({"format": "jaxbsd-checkpoint", "version": 2, "current": "v1-abc"}))
    for old, match in [(v1, "not a directory"), (v2, "older format")]:
        for load in (read_checkpoint_header, load_checkpoint, lambda p: jb.load_compressed(p, model)):
            with pytest.raises(ValueError, match=match) as err:
                load(old)
            assert str(old) in str(err.value)
        with pytest.raises(ValueError, match="not a jaxbsd checkpoint"):  # and never overwritten
            save_checkpoint(old, model)
    assert v1.is_file() and (v2 / "LATEST").is_file()


# --- the CLI: a killed `jaxbsd compress` resumes from its state; the factored export reloads ----


@pytest.mark.slow
def test_cli_compress_resumes_from_its_state_and_exports(tmp_path, monkeypatch):
    from jaxbsd import cli
    from jaxbsd.compression.methods import BSD

    out = tmp_path / "run"
    argv = ["compress", "--dataset", "digits", "--train-epochs", "1", "--rank", "4", "--samples", "32",
            "--max-iter", "5", "--finetune-epochs", "1", "--out", str(out), "--no-progress"]
    real, calls = BSD.build, []
    block_of = lambda site: int(site.path.split(".")[1])  # noqa: E731  ("blocks.<i>.mlp")

    def killed_after_one_step(self, site, *args, **kwargs):
        if calls:
            raise Crash  # the process dies while compressing the second block
        calls.append(block_of(site))
        return real(self, site, *args, **kwargs)

    monkeypatch.setattr(BSD, "build", killed_after_one_step)
    with pytest.raises(Crash):
        cli.main(argv)
    assert read_checkpoint_header(out / "state" / "model")["metadata"]["steps"][0]["block"] == calls[0]
    monkeypatch.setattr(BSD, "build", lambda self, site, *a, **k: calls.append(block_of(site)) or
                        real(self, site, *a, **k))
    assert cli.main(argv) == 0
    depth = len(json.loads((out / "compression.json").read_text())["steps"])
    assert calls == [depth - 1, *range(depth - 2, -1, -1)]  # back to front; block depth-1 not redone
    result = json.loads((out / "compression.json").read_text())
    assert result["factored_checkpoint"]["logits_bit_identical"]
    assert [r["kind"] for r in read_checkpoint_header(out / "compressed")["replaced"]] == ["DecoupledMLP"] * depth
