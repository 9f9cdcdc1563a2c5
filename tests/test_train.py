"""Training, evaluation, TrainConfig and its recipes, progress, and the CLI."""

import dataclasses
import json
import pathlib
import shlex

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbsd import cli
from jaxbsd.data import Dataset
from jaxbsd.models import CONFIGS, build_model, config_for_dataset, config_to_dict
from jaxbsd.checkpoint import load_checkpoint
from jaxbsd.evaluation import evaluate
from jaxbsd.training import RECIPES, TrainConfig, random_shift, train


def _synthetic(n_train=384, n_test=192, classes=3, seed=0, size=8):
    """Each class lights up its own 2-row band of an 8x8 image, plus noise."""
    rng = np.random.default_rng(seed)

    def make(n):
        y = rng.integers(0, classes, n).astype(np.int32)
        x = 0.3 * rng.normal(size=(n, size, size, 1)).astype(np.float32)
        for c in range(classes):
            x[y == c, 2 * c : 2 * c + 2] += 1.0
        return x, y

    return Dataset("digits", *make(n_train), *make(n_test), num_classes=classes)


@pytest.fixture(scope="module")
def data():
    return _synthetic()


def _params(model):
    return [np.asarray(a) for a in jax.tree.leaves(nnx.state(model, nnx.Param))]


# Tiny ViT with stochastic depth, shared by the tests below so the train step compiles once.
TINY = CONFIGS["vit"].tiny(drop_path=0.1)
forward = nnx.jit(lambda model, x: model(x))


def test_tiny_model_learns(data):
    model = build_model("vit", TINY)
    assert evaluate(model, data.test_images, data.test_labels) < 0.7
    history = train(model, data, epochs=8, lr=3e-3, batch_size=32, seed=0, progress=False)
    assert [h["epoch"] for h in history] == list(range(1, 9))
    assert set(history[0]) == {"epoch", "loss", "train_acc", "test_acc", "seconds"}
    assert history[-1]["loss"] < history[0]["loss"]
    acc = evaluate(model, data.test_images, data.test_labels, batch_size=50)
    assert acc == pytest.approx(history[-1]["test_acc"])
    assert acc > 0.9  # chance is 1/3


@pytest.mark.slow  # two more trainings; the seeded streams are asserted in the default run by tests/test_cmtf.py and test_refine.py
def test_same_seed_same_params(data):
    def run(seed):
        model = build_model("vit", TINY, seed=0)  # has stochastic depth: RNG streams too
        train(model, data, epochs=1, lr=3e-3, batch_size=32, seed=seed, progress=False)
        return _params(model)

    a, b, c = run(1), run(1), run(2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_stochastic_depth_is_active_in_training(data):
    model = build_model("vit", TINY)
    train(model, data, epochs=1, lr=3e-3, batch_size=32, seed=0, progress=False)
    counts = [int(v[...]) for _, v in nnx.to_flat_state(nnx.state(model, nnx.RngCount))]
    assert counts and all(c == 2 * (len(data.train_labels) // 32) for c in counts)  # 2 draws per step
    assert model.blocks[-1].drop_path.deterministic  # left in eval mode


class _ConstantTeacher(nnx.Module):
    """Always predicts class 2."""

    def __init__(self, classes):
        self.classes = classes

    def __call__(self, images):
        return jnp.broadcast_to(jax.nn.one_hot(2, self.classes), (images.shape[0], self.classes))


@pytest.mark.parametrize("shift", [0, pytest.param(1, marks=pytest.mark.slow)])  # teacher labels precomputed / per augmented batch
def test_deit_hard_distillation(data, shift):
    model = build_model("deit", CONFIGS["deit"].tiny())
    history = train(model, data, epochs=8, lr=3e-3, batch_size=32, seed=0, progress=False,
                    teacher=_ConstantTeacher(3), shift=shift)
    assert np.isfinite(history[-1]["loss"])
    x = jnp.asarray(data.test_images)
    cls_logits, dist_logits = nnx.jit(lambda m, x: m.heads(x))(model, x)
    # The distillation head follows the teacher, the class head the labels.
    assert np.mean(np.argmax(dist_logits, -1) == 2) > 0.9
    assert np.mean(np.argmax(cls_logits, -1) == data.test_labels) > 0.8
    with pytest.raises(ValueError, match="teacher"):
        train(build_model("vit", CONFIGS["vit"].tiny()), data, epochs=1, teacher=model, progress=False)


def test_train_after_surgery_only_trains_params(data):
    class Frozen(nnx.Module):
        """An MLP stand-in with a non-trainable buffer."""

        def __init__(self, dim):
            self.lin = nnx.Linear(dim, dim, rngs=nnx.Rngs(0))
            self.buffer = nnx.Variable(jnp.ones((dim,), jnp.float32))

        def __call__(self, x):
            return self.lin(x) * self.buffer[...].reshape((1,) * (x.ndim - 1) + (-1,))

    model = build_model("vit", CONFIGS["vit"].tiny())
    model.blocks[0].mlp = Frozen(16)
    kernel = np.asarray(model.blocks[0].mlp.lin.kernel[...])
    train(model, data, epochs=1, lr=1e-3, batch_size=64, seed=0, progress=False)
    assert not np.array_equal(model.blocks[0].mlp.lin.kernel[...], kernel)
    np.testing.assert_array_equal(model.blocks[0].mlp.buffer[...], np.ones(16))


def test_train_bad_input(data):
    model = build_model("vit", CONFIGS["vit"].tiny())
    with pytest.raises(ValueError, match="epochs"):
        train(model, data, epochs=0)
    with pytest.raises(ValueError, match="lr"):
        train(model, data, epochs=1, lr=-1.0, progress=False)
    with pytest.raises(ValueError, match="schedule"):
        train(model, data, epochs=1, schedule="step", progress=False)
    with pytest.raises(ValueError, match="labels"):
        evaluate(model, data.test_images, data.test_labels[:3])
    with pytest.raises(ValueError, match="weight_decay"):
        train(model, data, epochs=1, weight_decay=-1.0, progress=False)
    with pytest.raises(ValueError, match="label_smoothing"):
        train(model, data, epochs=1, label_smoothing=1.0, progress=False)
    with pytest.raises(ValueError, match="shift"):
        train(model, data, epochs=1, shift=-1, progress=False)


def test_random_shift_translates():
    images = np.random.default_rng(0).normal(size=(64, 6, 6, 2)).astype(np.float32)
    out = random_shift(images, 2, np.random.default_rng(1))
    assert out.shape == images.shape and out.dtype == images.dtype
    padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)), mode="edge")
    for b in range(64):  # each output is one crop of the edge-padded image
        crops = [padded[b, i : i + 6, j : j + 6] for i in range(5) for j in range(5)]
        assert any(np.array_equal(out[b], c) for c in crops)
    assert not np.array_equal(out, images)
    assert random_shift(images, 0, np.random.default_rng(1)) is images


def test_regularised_training_runs(data):
    model = build_model("vit", TINY)
    history = train(model, data, epochs=1, lr=3e-3, batch_size=32, seed=0, progress=False,
                    weight_decay=0.05, label_smoothing=0.1, shift=1)
    assert np.isfinite(history[0]["loss"])


# --- CLI ----------------------------------------------------------------------------------


@pytest.mark.slow  # the CLI end to end; training itself is tested in the fast suite
def test_cli_train(tmp_path, capsys, monkeypatch):
    import jaxbsd.models

    real = jaxbsd.models.config_for_dataset

    def tiny_for_dataset(kind, dataset, **overrides):  # the digits config at TINY's width and depth
        return dataclasses.replace(real(kind, dataset, **overrides), dim=TINY.dim, depth=TINY.depth,
                                   num_heads=TINY.num_heads, mlp_dim=TINY.mlp_dim)

    monkeypatch.setattr(jaxbsd.models, "config_for_dataset", tiny_for_dataset)
    parser = cli.build_parser()
    assert "train" in parser.subcommands.choices
    out = tmp_path / "vit"
    report = tmp_path / "run.json"
    status = cli.main(["train", "--model", "vit", "--dataset", "digits", "--epochs", "1",
                       "--limit", "300", "--lr", "1e-3", "--out", str(out), "--json", str(report),
                       "--no-progress"])
    assert status == 0
    text = capsys.readouterr().out
    assert "final test accuracy" in text
    model, metadata = load_checkpoint(out)
    assert metadata["dataset"] == "digits" and len(metadata["history"]) == 1
    assert model.config.dim == TINY.dim and model.config.num_classes == 10  # the real digits, the tiny model
    result = json.loads(report.read_text())
    assert 0.0 <= result["test_acc"] <= 1.0 and result["epochs"] == 1
    with pytest.raises(SystemExit):
        cli.main(["train", "--model", "resnet", "--dataset", "digits"])


# --- TrainConfig and the recipes --------------------------------------------------------------


def test_train_config_validates_each_field():
    assert TrainConfig() == TrainConfig(epochs=20, lr=1e-4, batch_size=128, schedule="constant")
    bad = {"epochs": 0, "lr": float("nan"), "batch_size": True, "seed": -1, "schedule": "step",
           "warmup_epochs": -1.0, "weight_decay": float("inf"), "label_smoothing": 1.0, "shift": 1.5,
           "drop_path": 1.0, "eval_batch_size": 0}
    for name, value in bad.items():
        with pytest.raises(ValueError, match=name):
            TrainConfig(**{name: value})
    with pytest.raises(ValueError, match="unknown TrainConfig fields.*'epoch'"):
        TrainConfig().replace(epoch=3)
    cfg = TrainConfig.recipe("vit", "digits").replace(epochs=3)
    assert cfg.epochs == 3 and cfg.lr == 1e-3 and cfg.schedule == "cosine"
    assert TrainConfig.recipe("swin", "digits") == TrainConfig()  # no recipe: the paper's defaults


def test_train_takes_a_config_or_keywords(data):
    cfg = TrainConfig(epochs=1, lr=3e-3, batch_size=32)
    a, b = build_model("vit", TINY), build_model("vit", TINY)
    train(a, data, cfg, progress=False)
    train(b, data, epochs=1, lr=3e-3, batch_size=32, progress=False)  # the old keyword form
    assert all(np.array_equal(x, y) for x, y in zip(_params(a), _params(b), strict=True))
    with pytest.raises(ValueError, match="config"):
        train(a, data, {"epochs": 1})
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        train(a, data, cfg, epoch=1)


def _recorded_runs():
    path = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "results" / "training.json"
    return json.loads(path.read_text())["runs"]


def test_recipes_match_training_json():
    """Each recorded run's command, parsed by the CLI, is exactly the (model, data set) recipe,
    and the recipe reproduces the recorded settings and model config."""
    runs = _recorded_runs()
    assert {(r["model"], r["dataset"]) for r in runs} <= set(RECIPES)
    parser = cli.build_parser()
    for run in runs:
        recipe = RECIPES[(run["model"], run["dataset"])]
        args = parser.parse_args(shlex.split(run["command"])[1:])
        from_flags = TrainConfig().replace(
            **{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)})
        assert from_flags == recipe, run["command"]
        assert cli.train_config_from_args(args) == recipe
        for name in ("epochs", "lr", "schedule", "batch_size", "seed"):
            assert getattr(recipe, name) == run[name], (run["command"], name)
        overrides = {} if recipe.drop_path is None else {"drop_path": recipe.drop_path}
        config = config_for_dataset(run["model"], run["dataset"], **overrides)
        assert config_to_dict(config)["drop_path"] == run["config"]["drop_path"]
        assert config.patch_size == run["config"]["patch_size"]


def test_cli_defaults_are_the_recipe():
    parser = cli.build_parser()
    args = parser.parse_args(["train", "--model", "vit", "--dataset", "digits"])
    assert cli.train_config_from_args(args) == RECIPES[("vit", "digits")]
    args = parser.parse_args(["train", "--model", "vit", "--dataset", "digits", "--epochs", "5", "--shift", "1"])
    assert cli.train_config_from_args(args) == RECIPES[("vit", "digits")].replace(epochs=5, shift=1)
    args = parser.parse_args(["train", "--model", "vit", "--dataset", "digits", "--label-smoothing", "2"])
    with pytest.raises(ValueError, match="label_smoothing"):
        cli.train_config_from_args(args)
    with pytest.raises(SystemExit) as exc:  # a one-line usage error (tests/test_cli.py)
        cli.main(["train", "--model", "vit", "--dataset", "digits", "--label-smoothing", "2"])
    assert exc.value.code == 2


# --- progress -------------------------------------------------------------------------------


def test_progress_bar_advances_through_the_batches(data, monkeypatch):
    import jaxbsd.training.loop as loop_mod
    from tqdm import tqdm

    bars = []

    class Recording(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.positions = []
            bars.append(self)

        def update(self, n=1):
            out = super().update(n)
            self.positions.append(self.n)
            return out

    monkeypatch.setattr(loop_mod, "tqdm", Recording)
    steps = []
    train(build_model("vit", TINY), data, epochs=2, lr=3e-3, batch_size=32, progress=True,
          on_step=lambda epoch, done: steps.append((epoch, done)), on_epoch=lambda r: None)
    per_epoch = len(data.train_labels) // 32
    assert [bar.total for bar in bars] == [per_epoch, per_epoch]
    for bar in bars:
        assert bar.positions == list(range(1, per_epoch + 1))  # one step at a time, not 0 then done
    assert steps == [(e, i) for e in (1, 2) for i in range(1, per_epoch + 1)]
