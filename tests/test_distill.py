"""The distillation stage: the whole compressed model trained towards the original's outputs, no labels.

Oracles: the held-out loss a run reports is recomputed here in numpy from the returned model and the
held-out examples; each loss against its formula written in numpy; labels are garbage that must not
change a bit of the result; the structure and parameter count are compared with a run without
distillation; the compile count is read from the loop's trace counter.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression import distill as distill_mod
from jaxbsd.models import count_params

FAST = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=15, tol=1e-8)


class FFN(nnx.Module):
    def __init__(self, d, h, rngs):
        self.inp, self.out = nnx.Linear(d, h, rngs=rngs), nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.gelu(self.inp(x)))


class LabelledNet(nnx.Module):
    """Reads ``batch["x"]`` (N, T, d) and ignores ``batch["label"]``; returns logits (N, c)."""

    def __init__(self, d, h, depth, c, rngs):
        self.ffns = nnx.List([FFN(d, h, rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(d, rngs=rngs)
        self.head = nnx.Linear(d, c, rngs=rngs)

    def __call__(self, batch):
        x = batch["x"]
        for ffn in self.ffns:
            x = x + ffn(x)
        return self.head(self.norm(x).mean(axis=1))


D, H, DEPTH, C = 11, 27, 2, 5  # shapes no other test uses: this file's compiles happen here
PATHS = ["ffns.0", "ffns.1"]


def _batch(seed=0, n=30, label_seed=0):
    x = jax.random.normal(jax.random.key(seed), (n, 6, D), jnp.float32)
    labels = jax.random.randint(jax.random.key(1000 + label_seed), (n,), 0, 10**6)  # garbage
    return {"x": x, "label": labels}


def _net():
    return LabelledNet(D, H, DEPTH, C, nnx.Rngs(0))


def _params(model):
    return [np.asarray(v) for v in jax.tree.leaves(nnx.state(model, nnx.Param))]


def _relative_np(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.sum((out - ref) ** 2) / np.sum(ref ** 2)


CONFIG = jb.Distill(steps=24, learning_rate=3e-3, batch_size=8, holdout=0.25, eval_every=1)


def _compress(batch, distill=CONFIG, **kw):
    kw = dict(mlps=PATHS, reduction=0.3, method="prune", key=jax.random.key(1), refine=None, **kw)
    return jb.compress_model(_net(), batch, distill=distill, **kw)


def test_distillation_lowers_the_heldout_loss_reported_as_numpy_recomputes_it_and_keeps_the_structure():
    batch = _batch()
    plain, plain_report = _compress(batch, distill=None)
    model, report = _compress(batch)
    d = report.distill
    assert plain_report.distill is None and d is not None
    # the structure and the parameter count are those of the run without distillation
    assert report.params_after == plain_report.params_after == count_params(model)
    assert nnx.graphdef(model) == nnx.graphdef(plain)
    for r, p in zip(report.mlps, plain_report.mlps):
        assert type(jb.compression.get_submodule(model, r.path)) is type(jb.compression.get_submodule(plain, p.path))
    # never raises the held-out loss; here it lowers it (24 steps on 22 examples)
    assert d["loss_after"] < d["loss_before"] and 0 < d["steps_kept"] <= 24
    assert (d["examples_train"], d["examples_heldout"], d["batch_size"], d["evaluations"]) == (22, 8, 8, 24)
    # recomputed in numpy on the held-out examples: the original model's logits are the targets
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(1), distill_mod.DISTILL_STREAM), 0)
    _, held = distill_mod.split_examples(key, 30, 0.25)
    held_batch = {k: v[held] for k, v in batch.items()}
    teacher = _net()(held_batch)
    np.testing.assert_allclose(d["loss_before"], _relative_np(plain(held_batch), teacher), rtol=1e-4)
    np.testing.assert_allclose(d["loss_after"], _relative_np(model(held_batch), teacher), rtol=1e-4)
    # only the replaced MLPs' parameters moved ("replaced", the default)
    moved = {path: not np.array_equal(np.asarray(a[...]), np.asarray(b[...])) for (path, a), (_, b) in
             zip(nnx.to_flat_state(nnx.state(model, nnx.Param)), nnx.to_flat_state(nnx.state(plain, nnx.Param)))}
    assert any(moved.values())
    assert not any(m for path, m in moved.items() if path[0] != "ffns")


def test_labels_are_never_read_and_the_loop_compiles_once_for_a_model():
    before = distill_mod.trace_count()
    model_a, report_a = _compress(_batch(label_seed=1))
    model_b, report_b = _compress(_batch(label_seed=2))  # other garbage labels: the bit-identical model
    for a, b in zip(_params(model_a), _params(model_b)):
        np.testing.assert_array_equal(a, b)
    assert report_a.distill["loss_after"] == report_b.distill["loss_after"]
    # other images of the same shape: the same program
    _compress(_batch(seed=7, label_seed=3))
    assert distill_mod.trace_count() - before <= 1  # 0 where another test of this worker compiled it


def test_a_diverging_distillation_keeps_the_compressed_model():
    batch = _batch(seed=3)
    plain, _ = _compress(batch, distill=None)
    # the program of CONFIG (the learning rate is traced): no compile of its own
    model, report = _compress(batch, distill=dataclasses.replace(CONFIG, learning_rate=1e4))
    assert report.distill["steps_kept"] == 0 and report.distill["loss_after"] == report.distill["loss_before"]
    for a, b in zip(_params(model), _params(plain)):
        np.testing.assert_array_equal(a, b)


def _np_kl(o, t, tau):
    def log_softmax(z):
        z = z / tau
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))
    lp, lq = log_softmax(t), log_softmax(o)
    return tau ** 2 * np.mean(np.sum(np.exp(lp) * (lp - lq), -1))


def _np_cos(o, t):
    return np.mean(1 - np.sum(o * t, -1) / (np.linalg.norm(o, axis=-1) * np.linalg.norm(t, axis=-1)))


@pytest.mark.parametrize("kind", ["relative", "kl", "cosine", "callable"])
def test_each_loss_is_its_formula(kind):
    rng = np.random.default_rng(0)
    outputs = (rng.normal(size=(5, 3, 7)), rng.normal(size=(5, 4)))
    targets = (rng.normal(size=(5, 3, 7)), 3 * rng.normal(size=(5, 4)))
    tau = 2.5
    formulas = {
        "relative": lambda o, t: _relative_np(o, t),
        "kl": lambda o, t: _np_kl(o, t, tau),
        "cosine": _np_cos,
    }
    if kind == "callable":
        fn = lambda o, t: jnp.sum((o[0] - t[0]) ** 2) + jnp.sum(jnp.abs(o[1] - t[1]))  # noqa: E731
        expected = np.sum((outputs[0] - targets[0]) ** 2) + np.sum(np.abs(outputs[1] - targets[1]))
        loss = distill_mod._Loss(fn, 1.0)
    else:
        expected = np.mean([formulas[kind](o, t) for o, t in zip(outputs, targets)])
        loss = distill_mod._Loss(kind, tau)
    value = loss(jax.tree.map(jnp.asarray, outputs), jax.tree.map(jnp.asarray, targets))
    np.testing.assert_allclose(float(value), expected, rtol=1e-10)
    # each loss is 0 at the target (the KL and cosine ones up to rounding)
    if kind != "callable":
        np.testing.assert_allclose(float(loss(*(jax.tree.map(jnp.asarray, targets),) * 2)), 0.0, atol=1e-12)


@pytest.mark.parametrize("bad, field", [
    (dict(steps=-1), "steps"), (dict(steps=2.0), "steps"), (dict(learning_rate=0.0), "learning_rate"),
    (dict(holdout=1.0), "holdout"), (dict(holdout=0), "holdout"), (dict(batch_size=0), "batch_size"),
    (dict(eval_every=0), "eval_every"), (dict(loss="mse"), "loss"), (dict(temperature=0.0), "temperature"),
    (dict(trainable="norms"), "trainable"), (dict(batch_size=True), "batch_size"),
    (dict(schedule="linear"), "schedule"), (dict(warmup=-1), "warmup"), (dict(schedule="constant", warmup=5), "warmup"),
    (dict(schedule="cosine", steps=10, warmup=10), "warmup"),
])
def test_bad_settings_name_the_field(bad, field):
    with pytest.raises(ValueError, match=f"distill: {field}"):
        jb.Distill(**bad)


# one case in the default run (warm-up and cosine both): each case compiles its own loop
@pytest.mark.parametrize("schedule, warmup", [pytest.param("cosine", 0, marks=pytest.mark.slow), ("cosine", 3),
                                              pytest.param("constant", 0, marks=pytest.mark.slow)])
def test_the_loop_takes_the_steps_of_optax_adam_on_its_own_schedule(schedule, warmup):
    """The held-out losses of the loop, step by step, against a plain Python loop of ``optax.adam``
    on optax's own schedule (``warmup_cosine_decay_schedule``), full batch, evaluated every step."""
    import optax

    steps, lr = 12, 2e-2
    batch = _batch(seed=5, n=20)
    teacher, student = _net(), LabelledNet(D, H, DEPTH, C, nnx.Rngs(9))  # another draw: something to learn
    targets = distill_mod.teacher_outputs(teacher, batch)
    config = jb.Distill(steps=steps, learning_rate=lr, batch_size=None, holdout=0.25, eval_every=1, loss="relative",
                        trainable="all", schedule=schedule, warmup=warmup)
    key = jax.random.key(4)
    train, held = distill_mod.split_examples(jax.random.fold_in(key, 0), 20, 0.25)
    graphdef, params, rest = nnx.split(nnx.clone(student), nnx.Param, ...)

    def loss(p, idx):
        out = nnx.merge(graphdef, p, rest)({k: v[idx] for k, v in batch.items()})
        return _relative_np(out, np.asarray(targets)[idx])

    rate = (optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, 0.0) if warmup else
            optax.cosine_decay_schedule(lr, steps) if schedule == "cosine" else lr)
    tx, p = optax.adam(rate), params
    state, held_losses = tx.init(p), [loss(p, held)]
    for _ in range(steps):
        grads = jax.grad(lambda q: distill_mod._Loss("relative", 1.0)(
            nnx.merge(graphdef, q, rest)({k: v[train] for k, v in batch.items()}), targets[train]))(p)
        updates, state = tx.update(grads, state, p)
        p = optax.apply_updates(p, updates)
        held_losses.append(loss(p, held))
    report = distill_mod.distill_model(student, batch, targets, [], config, key)
    kept = int(np.argmin(held_losses))
    assert report["steps_kept"] == kept and report["schedule"] == schedule
    np.testing.assert_allclose(report["loss_after"], held_losses[kept], rtol=2e-4)
    np.testing.assert_allclose(_relative_np(student({k: v[held] for k, v in batch.items()}), np.asarray(targets)[held]),
                               held_losses[kept], rtol=2e-4)


def test_compress_model_checks_distill_and_the_calibration_before_compressing():
    with pytest.raises(ValueError, match="distill must be"):
        _compress(_batch(), distill=300)
    with pytest.raises(ValueError, match="calibration: distillation holds out examples"):
        _compress(_batch(n=1), distill=CONFIG)


def test_a_state_saved_under_another_distillation_is_not_resumed(tmp_path):
    batch = _batch(seed=4)
    _compress(batch, distill=CONFIG, execution=jb.Execution(state_dir=tmp_path))
    with pytest.raises(ValueError, match="state_dir"):
        _compress(batch, distill=dataclasses.replace(CONFIG, learning_rate=1e-3), execution=jb.Execution(state_dir=tmp_path))
    with pytest.raises(ValueError, match="state_dir"):
        _compress(batch, distill=None, execution=jb.Execution(state_dir=tmp_path))


# ----------------------------------------------------------------------------- slower: real model kinds


class ViTCalib:
    """A calibration callable closing over garbage labels it never uses: returns (logits, features)."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __call__(self, model):
        return model(self.images), model.features(self.images)[:, 1:]


def _features_and_logits_loss(outputs, targets):
    logits, feats = outputs
    t_logits, t_feats = targets
    return (distill_mod.per_leaf_loss("kl", 2.0, logits, t_logits)
            + distill_mod.per_leaf_loss("relative", 1.0, feats, t_feats))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["bsd", "prune", "svd", "drone", "auto"])
@pytest.mark.parametrize("kind", ["vit", "lm"])
def test_every_method_on_a_toy_vit_and_a_gated_lm(method, kind):
    if kind == "vit":
        from jaxbsd.models import ViT, ViTConfig
        make = lambda: ViT(ViTConfig.tiny(), rngs=nnx.Rngs(0))  # noqa: E731
        images = jax.random.normal(jax.random.key(0), (24, 8, 8, 1), jnp.float32)
        calibration = ViTCalib(images, np.random.default_rng(0).integers(0, 3, 24))
        config = jb.Distill(steps=30, learning_rate=2e-3, batch_size=8, loss=_features_and_logits_loss)
        check = lambda m: m(images)  # noqa: E731
    else:
        from jaxbsd.models.lm import LM, LMConfig
        make = lambda: LM(LMConfig.tiny(), rngs=nnx.Rngs(0))  # noqa: E731
        calibration = jax.random.randint(jax.random.key(0), (24, 16), 0, 11)
        config = jb.Distill(steps=30, learning_rate=2e-3, batch_size=8, loss="kl", temperature=2.0,
                            trainable="replaced+norms")
        check = lambda m: m(calibration)  # noqa: E731
    paths = ["blocks.0.mlp", "blocks.1.mlp"]
    kw = dict(mlps=paths, reduction=0.3, method=jb.get_method(method, config=None if method in ("svd", "drone", "prune") else FAST), key=jax.random.key(2), refine=jb.Refine(steps=10))
    plain, plain_report = jb.compress_model(make(), calibration, **kw)
    model, report = jb.compress_model(make(), calibration, distill=config, **kw)
    d = report.distill
    assert d["loss_after"] <= d["loss_before"] and d["steps_kept"] <= 30
    assert report.params_after == plain_report.params_after == count_params(model)
    assert [r.method for r in report.mlps] == [r.method for r in plain_report.mlps]  # auto's judge unchanged
    assert nnx.graphdef(model) == nnx.graphdef(plain)
    assert np.all(np.isfinite(np.asarray(check(model))))
    if kind == "vit":  # the callable's labels: garbage of another draw gives the same model
        other = ViTCalib(calibration.images, np.random.default_rng(1).integers(0, 3, 24))
        again, _ = jb.compress_model(make(), other, distill=config, **kw)
        for a, b in zip(_params(model), _params(again)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("method", [pytest.param("prune", marks=pytest.mark.slow), "svd"])  # 12 s: prune slow
def test_a_swin_distils_after_its_replacements(method):
    """Swin (windowed attention, patch merging between stages): every MLP replaced, then the
    logits distilled; the held-out loss recomputed from the returned model in numpy, the structure
    and parameter count unchanged."""
    from jaxbsd.models.swin import Swin, SwinConfig

    make = lambda: Swin(SwinConfig.tiny(), rngs=nnx.Rngs(0))  # noqa: E731
    images = jax.random.normal(jax.random.key(0), (24, 8, 8, 1), jnp.float32)
    kw = dict(mlps=None, reduction=0.3, method=method, key=jax.random.key(2), refine=jb.Refine(steps=10))
    plain, plain_report = jb.compress_model(make(), images, **kw)
    config = jb.Distill(steps=40, batch_size=8, loss="kl", temperature=2.0)
    model, report = jb.compress_model(make(), images, distill=config, **kw)
    d = report.distill
    assert len(report.mlps) >= 2 and d["loss_after"] <= d["loss_before"]  # every MLP found and replaced
    assert nnx.graphdef(model) == nnx.graphdef(plain) and report.params_after == count_params(model)
    # the held-out loss before and after, recomputed in numpy (KL at T = 2) from the models and the original's logits
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(2), distill_mod.DISTILL_STREAM), 0)
    _, held = distill_mod.split_examples(key, 24, config.holdout)
    teacher = np.asarray(make()(images[held]), np.float64)
    for loss, m in ((d["loss_before"], plain), (d["loss_after"], model)):
        np.testing.assert_allclose(loss, _np_kl(np.asarray(m(images[held]), np.float64), teacher, 2.0), rtol=1e-3)  # float32


# ----------------------------------------------------------------------------- the paper's run and the CLI


def test_compression_config_and_cli_take_distillation_and_old_run_ids_stay_valid():
    from jaxbsd.cli import build_parser
    from jaxbsd.cli.compress import validate_compress_args
    from jaxbsd.compression import blockwise

    flat = lambda fields: blockwise.CompressionConfig.from_flat(**fields)  # noqa: E731  (the flat keywords)
    assert "distill_steps" not in blockwise.CompressionConfig().to_dict()
    # without steps the other settings mean nothing: the same identity
    assert flat({"distill_lr": 1e-2}).to_dict() == blockwise.CompressionConfig().to_dict()
    assert blockwise.CompressionConfig(distill=jb.Distill(steps=0)).distill is None
    config = flat({"distill_steps": 50, "distill_loss": "relative"})
    assert config.distill == jb.Distill(steps=50, loss="relative", temperature=2.0)
    assert blockwise.CompressionConfig(distill=config.distill).to_dict() == config.to_dict()
    assert config.to_dict()["distill_steps"] == 50 and blockwise.CompressionConfig().distill is None
    args = build_parser().parse_args(["compress", "--distill-steps", "40", "--distill-images", "4096",
                                      "--distill-trainable", "replaced+norms", "--distill-batch", "0"])
    config = validate_compress_args(args)
    assert config.distill == jb.Distill(steps=40, batch_size=None, loss="kl", temperature=2.0,
                                        trainable="replaced+norms")
    assert config.distill_images == 4096
    # a schedule: in the identity only when it is not the constant one runs before it had
    args = build_parser().parse_args(["compress", "--distill-steps", "40", "--distill-schedule", "cosine",
                                      "--distill-warmup", "5"])
    config = validate_compress_args(args)
    assert config.distill == jb.Distill(steps=40, loss="kl", temperature=2.0, schedule="cosine", warmup=5)
    assert config.to_dict()["distill_schedule"] == "cosine"
    # the default is now the cosine (the study's evidence): in the identity; a constant one is not,
    # so the runs saved before the schedule existed keep their identity
    assert flat({"distill_steps": 40}).to_dict()["distill_schedule"] == "cosine"
    assert "distill_schedule" not in flat({"distill_steps": 40, "distill_schedule": "constant"}).to_dict()
    assert jb.Distill().to_dict()["schedule"] == "cosine" and "schedule" not in jb.Distill(schedule="constant").to_dict()
    for bad, field in ((dict(distill_steps=-1), "distill_steps"), (dict(distill_images=1), "distill_images"),
                       (dict(distill_steps=5, distill_loss="mse"), "distill: loss"),
                       (dict(distill_steps=5, distill_schedule="constant", distill_warmup=2), "distill: warmup")):
        with pytest.raises(ValueError, match=field):
            flat(bad)


@pytest.mark.slow
def test_the_blockwise_run_distills_after_its_last_step_on_unlabeled_training_images():
    from jaxbsd.compression import blockwise
    from jaxbsd.data import Dataset
    from jaxbsd.models import ViTConfig, build_model
    from jaxbsd.evaluation import evaluate

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 144).astype(np.int32)
    images = rng.normal(size=(144, 8, 8, 1)).astype(np.float32)
    images[np.arange(144), labels % 8, :, 0] += 2.0
    ds = Dataset("toy", images[:96], labels[:96], images[96:], labels[96:], 10)
    garbage = Dataset("toy", images[:96], rng.permutation(labels[:96]), images[96:], labels[96:], 10)
    make = lambda: build_model("vit", ViTConfig(image_size=8, channels=1, patch_size=4, dim=8, depth=3,  # noqa: E731
                                                num_heads=2, mlp_dim=16), seed=0)
    config = blockwise.CompressionConfig(method="svd", reduction=0.25, num_samples=16, capture_images=16,
                                         finetune_epochs=0, val_fraction=0.0, distill_images=40,
                                         distill=jb.Distill(steps=20, batch_size=8, learning_rate=3e-3, loss="kl",
                                                            temperature=2.0))
    model = make()
    steps = blockwise.compress(model, ds, order="bf", config=config, progress=False)
    d = steps[-1]["distill"]
    assert "distill" not in steps[0] and d["images"] == 40 and d["examples_heldout"] == 8
    assert d["loss_after"] <= d["loss_before"] and d["acc_before"] == steps[-1]["acc_ft"]
    assert d["acc_after"] == evaluate(model, ds.test_images, ds.test_labels, 48)
    # the training labels are never read (fine-tuning is off): permuted labels, the same model
    again = make()
    blockwise.compress(again, garbage, order="bf", config=config, progress=False)
    for a, b in zip(_params(model), _params(again)):
        np.testing.assert_array_equal(a, b)


def _logits_and_blocks(model, images):
    """A ViT's logits and every block's output tokens (TinyBERT-style targets), in one pass."""
    x, blocks = model.embed(images), []
    for block in model.blocks:
        x = block(x)
        blocks.append(x)
    return model.head(model.norm(x)[:, 0]), tuple(blocks)


def _kl_and_blocks(outputs, targets):
    return (distill_mod.per_leaf_loss("kl", 2.0, outputs[0], targets[0])
            + sum(distill_mod.per_leaf_loss("relative", 1.0, o, t) for o, t in zip(outputs[1], targets[1])))


@pytest.mark.slow
def test_a_forward_matches_logits_and_block_outputs_and_the_reported_loss_is_recomputed():
    from jaxbsd.models import ViT, ViTConfig

    make = lambda: ViT(ViTConfig.tiny(), rngs=nnx.Rngs(0))  # noqa: E731
    images = jax.random.normal(jax.random.key(0), (30, 8, 8, 1), jnp.float32)
    np.testing.assert_allclose(np.asarray(_logits_and_blocks(make(), images)[0]), np.asarray(make()(images)),
                               rtol=1e-5, atol=1e-6)  # the forward is the model's own pass
    config = jb.Distill(steps=30, learning_rate=2e-3, batch_size=8, forward=_logits_and_blocks, loss=_kl_and_blocks)
    key = jax.random.key(3)
    model, report = jb.compress_model(make(), images, mlps=["blocks.0.mlp", "blocks.1.mlp"], reduction=0.3,
                                      method="prune", key=key, refine=None, distill=config)
    d = report.distill
    assert d["loss"].startswith("callable:") and d["loss_after"] < d["loss_before"]
    _, held = distill_mod.split_examples(jax.random.fold_in(jax.random.fold_in(key, distill_mod.DISTILL_STREAM), 0),
                                         30, 0.2)
    out = jax.tree.map(lambda a: np.asarray(a, np.float64), _logits_and_blocks(model, images[held]))
    ref = jax.tree.map(lambda a: np.asarray(a, np.float64), _logits_and_blocks(make(), images[held]))
    expected = _np_kl(out[0], ref[0], 2.0) + sum(_relative_np(o, t) for o, t in zip(out[1], ref[1]))
    np.testing.assert_allclose(d["loss_after"], expected, rtol=1e-4)


# bsd in the slow step: the default run distils a decoupling in test_every_method_on_a_toy_vit_and_a_gated_lm
@pytest.mark.parametrize("method", ["prune", pytest.param("bsd", marks=pytest.mark.slow)])
def test_a_bert_encoder_distils_its_embeddings_and_numpy_recomputes_the_cosine_loss(tmp_path, method):
    """The BERT encoder of issue 42 (embeddings, a calibration callable over padded sequences,
    ``mlps=None``): the cosine loss it reports is ``mean(1 - cos)`` of the returned model's embeddings
    against the original's on the held-out sequences, written here in numpy."""
    from bert_reference import tiny_vocab, write_tiny_bert

    from jaxbsd.models import bert as B

    path = write_tiny_bert(tmp_path / "bert", hidden=16, intermediate=32, layers=2)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, len(tiny_vocab()), (24, 10)).astype(np.int32)
    mask = (np.arange(10)[None, :] < rng.integers(4, 11, (24, 1))).astype(np.int32)  # padded sequences
    calibration = lambda m: m(ids, mask)  # noqa: E731
    config = jb.Distill(steps=25, learning_rate=1e-3, holdout=0.25, eval_every=1, loss="cosine")
    kw = dict(mlps=None, reduction=0.3, method=jb.get_method(method, config=FAST if method == "bsd" else None), key=jax.random.key(3), refine=None)
    plain, plain_report = jb.compress_model(B.from_pretrained(path), calibration, **kw)
    model, report = jb.compress_model(B.from_pretrained(path), calibration, distill=config, **kw)
    d = report.distill
    assert [r.path for r in report.mlps] == ["bert.layers.1.mlp", "bert.layers.0.mlp"]  # found, back to front
    assert d["loss_after"] < d["loss_before"] and 0 < d["steps_kept"] <= 25
    assert report.params_after == plain_report.params_after == count_params(model)
    assert nnx.graphdef(model.bert) == nnx.graphdef(plain.bert)  # (each load has its own tokenizer object)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(3), distill_mod.DISTILL_STREAM), 0)
    _, held = distill_mod.split_examples(key, 24, 0.25)
    teacher = np.asarray(B.from_pretrained(path)(ids, mask), np.float64)[held]

    def cosine_loss(m):
        out = np.asarray(m(ids, mask), np.float64)[held]
        cos = np.sum(out * teacher, -1) / (np.linalg.norm(out, axis=-1) * np.linalg.norm(teacher, axis=-1))
        return np.mean(1 - cos)

    np.testing.assert_allclose(d["loss_before"], cosine_loss(plain), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(d["loss_after"], cosine_loss(model), rtol=1e-4, atol=1e-7)
