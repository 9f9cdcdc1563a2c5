"""Compression: exact replacement, fine-tuning, baselines against closed-form optima, resume."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression import baselines
from jaxbsd.compression import blockwise as compress
from jaxbsd.compression.methods import BSD
from jaxbsd.data import Dataset
from jaxbsd.models import ViTConfig, build_model, count_params
from jaxbsd.models.capture import mlp_inputs
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.training import train

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_compress_meets_a_reduction_budget[greedy]",
    "test_finetuning_is_kept_only_if_validation_improves[-1.0-False]",
    "test_lowrank_replacement_counts_real_parameters[svd]",
}


def tiny_dataset(n_train=96, n_test=48, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n_train + n_test).astype(np.int32)
    images = rng.normal(size=(n_train + n_test, 8, 8, 1)).astype(np.float32)
    images[np.arange(len(labels)), labels % 8, :, 0] += 2.0  # a learnable signal
    return Dataset("toy", images[:n_train], labels[:n_train], images[n_train:], labels[n_train:], 10)


def tiny_vit(seed=0):
    return build_model("vit", ViTConfig(image_size=8, channels=1, patch_size=4, dim=8, depth=3, num_heads=2, mlp_dim=16), seed=seed)


# One jitted forward for the file: run eagerly, every layer's primitives compile one by one.
_forward = nnx.jit(lambda m, x: m(x))


def test_block_order():
    assert compress.block_order("front-to-back", 3) == (0, 1, 2)
    assert compress.block_order("bf", 3) == (2, 1, 0)
    assert compress.block_order([1, 0], 3) == (1, 0)
    for bad in ("sideways", [0, 0], [3], []):
        with pytest.raises(ValueError, match="order"):
            compress.block_order(bad, 3)


def test_truncated_svd_is_the_eckart_young_optimum():
    K = jax.random.normal(jax.random.key(0), (12, 30))
    A, B = baselines.truncated_svd_factors(K, 4)
    s = np.linalg.svd(np.asarray(K), compute_uv=False)
    np.testing.assert_allclose(np.linalg.norm(K - A @ B), np.sqrt(np.sum(s[4:] ** 2)), rtol=1e-10)


def test_drone_attains_the_data_aware_optimum():
    k0, k1 = jax.random.split(jax.random.key(1))
    # inputs concentrated in a few directions, as token representations are
    X = jax.random.normal(k0, (300, 10)) * jnp.array([5.0, 3.0, 2.0, 1, 0.5, 0.1, 0.1, 0.05, 0.01, 0.01])[None, :]
    K = jax.random.normal(k1, (10, 16))
    A, B = baselines.drone_factors(X, K, 3)
    residual = np.linalg.norm(X @ K - X @ (A @ B))
    s = np.linalg.svd(np.asarray(X @ K), compute_uv=False)  # best rank-3 approx of XK is attainable
    np.testing.assert_allclose(residual, np.sqrt(np.sum(s[3:] ** 2)), rtol=1e-8)
    A_svd, B_svd = baselines.truncated_svd_factors(K, 3)
    assert residual < np.linalg.norm(X @ K - X @ (A_svd @ B_svd))


@pytest.mark.parametrize("budget", [700, 1500, 5000])
def test_rank_for_budget_is_the_largest_that_fits(budget):
    m, H, dof = 8, 32, 4
    k = baselines.lowrank_rank_for_budget(m, H, budget)
    assert baselines.lowrank_mlp_params(m, H, k) <= budget < baselines.lowrank_mlp_params(m, H, k + 1)
    r = baselines.bsd_rank_for_budget(m, m, dof, budget)
    assert jb.solver.metrics.params_bsd(m, m, r, dof) <= budget < jb.solver.metrics.params_bsd(m, m, r + 1, dof)


@pytest.mark.parametrize("method", ["svd", "drone"])
def test_lowrank_replacement_counts_real_parameters(method):
    model = tiny_vit()
    images = jnp.asarray(tiny_dataset().train_images[:16])  # 80 tokens: enough for 32 samples
    config = compress.CompressionConfig(method=method, rank=3, num_samples=32)
    module, info = compress.compress_block(model, 0, images, config, jax.random.key(0))
    before = count_params(model)
    old = count_params(model.blocks[0].mlp)
    model.blocks[0].mlp = module
    assert count_params(model) == before - old + baselines.lowrank_mlp_params(8, 16, 3)
    assert np.isfinite(info["error_F"])


@pytest.mark.slow  # 600 sweeps x 4 restarts and an epoch of fine-tuning: 13 s
def test_exact_decoupling_leaves_logits_unchanged_and_finetuning_keeps_knots():
    model = tiny_vit(seed=3)
    ds = tiny_dataset()
    images = jnp.asarray(ds.train_images[:32])
    # Plant an exactly decouplable block MLP: cubic polynomial internal functions.
    k = jax.random.split(jax.random.key(4), 3)
    planted = jb.Decoupled(
        W0=jax.random.normal(k[0], (3, 8), jnp.float32) * 0.5,
        W1=jax.random.normal(k[1], (8, 3), jnp.float32) * 0.5,
        coef=jax.random.normal(k[2], (3, 4), jnp.float32) * 0.3,
        knots=jnp.zeros((3, 0), jnp.float32),
        basis=jb.Polynomial(3),
    )
    model.blocks[1].mlp = DecoupledMLP.from_decoupled(planted)
    logits = _forward(model, images)
    X, J, F = jb.models.capture(model, images, 1, 60, key=jax.random.key(5))
    X, J, F = (jnp.asarray(a, jnp.float64) for a in (X, J, F))
    res = jb.decouple(J, F, X, jb.CMTFConfig(rank=3, basis=jb.BSpline(3, 4), max_iter=600, tol=1e-14),
                      key=jax.random.key(6), restarts=4)
    assert float(res.error_J) < 1e-8
    model.blocks[1].mlp = DecoupledMLP.from_decoupled(res.model, dtype=jnp.float32)
    # Two exact representations of one function, each rounded to float32 (weights ~1e-7
    # relative) and pushed through two more blocks: logits of size ~2 agree to ~1e-5.
    np.testing.assert_allclose(_forward(model, images), logits, atol=3e-5, rtol=0)

    mlp = model.blocks[1].mlp
    before = {name: np.array(getattr(mlp, name)[...]) for name in ("W0", "W1", "coef", "knots")}
    train(model, ds, epochs=1, lr=1e-2, batch_size=32, progress=False)
    for name in ("W0", "W1", "coef"):
        assert not np.allclose(getattr(mlp, name)[...], before[name]), name
    np.testing.assert_array_equal(mlp.knots[...], before["knots"])


# One decoupling configuration (rank 4, BSpline(2, 4), 20 sweeps, S = 40 samples from 16 images) for
# the compress() runs that decouple: each new rank/S/basis compiles the solver anew.
BSD_RUN = compress.CompressionConfig(
    method=dataclasses.replace(compress.PAPER_BSD, config=dataclasses.replace(compress.PAPER_BSD.config,
                                                                              basis=jb.BSpline(2, 4), max_iter=20)),
    rank=4, num_samples=40, capture_images=16, finetune_epochs=1, batch_size=32)


# Four compress() runs (3 blocks each, fine-tuning, checkpointed state): 43 s on a quiet machine
# (20 s of it compiling train and solver programs), 137 s on the loaded shared one.
@pytest.mark.slow
def test_compress_records_and_resumes_after_interruption(tmp_path, monkeypatch):
    ds = tiny_dataset()
    config = BSD_RUN
    reference = compress.compress(tiny_vit(), ds, order="bf", config=config, progress=False)
    assert [r["block"] for r in reference] == [2, 1, 0]
    last = reference[-1]
    assert last["params_model"] == last["params_original"] - 3 * (last["params_mlp_old"] - last["params_mlp_new"])
    assert last["params_mlp_new"] == jb.solver.metrics.params_bsd(8, 8, 4, 4)
    assert last["savings_model"] == pytest.approx(100 * (1 - last["params_model"] / last["params_original"]))

    class Interrupt(Exception):
        pass

    def stop_after_first(record):
        if record["step"] == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        compress.compress(tiny_vit(), ds, order="bf", config=config, state_dir=tmp_path, progress=False,
                          on_step=stop_after_first)
    # the state's header alone says how far this run got (what jaxbsd compress checks first)
    assert compress.check_state(tmp_path, tiny_vit(), order="bf", config=config) == 1
    with pytest.raises(ValueError, match="different run"):
        compress.check_state(tmp_path, tiny_vit(), order="fb", config=config)
    calls = []
    real = BSD.build
    monkeypatch.setattr(BSD, "build", lambda self, site, *a, **kw: calls.append(int(site.path.split(".")[1]))
                        or real(self, site, *a, **kw))
    resumed = compress.compress(tiny_vit(), ds, order="bf", config=config, state_dir=tmp_path, progress=False)
    assert calls == [1, 0]  # step 1 (block 2) was not redone
    assert len(resumed) == 3
    assert compress.check_state(tmp_path, tiny_vit(), order="bf", config=config) == 3
    for a, b in zip(resumed, reference):
        assert a["acc_ft"] == pytest.approx(b["acc_ft"]) and a["params_model"] == b["params_model"]
    # a different configuration refuses to reuse the state
    with pytest.raises(ValueError, match="different run"):
        compress.compress(tiny_vit(), ds, order="fb", config=config, state_dir=tmp_path, progress=False)


@pytest.mark.parametrize("val_after, kept", [(-1.0, False), (2.0, True)])
def test_finetuning_is_kept_only_if_validation_improves(monkeypatch, val_after, kept):
    ds = tiny_dataset()
    seen = []

    def fake_train(model, fit, **kwargs):
        # fine-tuning sees the training split less the hold-out, whose accuracy it reports
        seen.append((fit.train_images.shape[0], fit.test_images.shape[0]))
        seen.append(jax.tree.map(np.array, nnx.state(model, nnx.Param)))
        for v in jax.tree.leaves(nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable)):
            v[...] = v[...] + 1.0
        return [{"epoch": 1, "loss": 0.0, "train_acc": 0.0, "test_acc": val_after, "seconds": 0.0}]

    monkeypatch.setattr(compress, "train", fake_train)
    config = compress.CompressionConfig(method="svd", rank=2, num_samples=16, capture_images=16, finetune_epochs=1)
    model = tiny_vit()
    steps = compress.compress(model, ds, order=[0], config=config, progress=False)
    assert seen[0] == (96 - 10, 10)  # a 10 % hold-out, never the 48 test images
    record = steps[0]
    assert record["finetune_kept"] is kept and record["val_ft"] == val_after
    assert 0 <= record["val_cmtf"] <= 1 and record["finetune"][0]["val_acc"] == val_after
    restored = jax.tree.map(np.array, nnx.state(model, nnx.Param))
    same = jax.tree.map(np.array_equal, restored, seen[1])
    assert all(jax.tree.leaves(same)) is not kept


@pytest.mark.parametrize("allocation", ["uniform", "greedy"])
def test_compress_meets_a_reduction_budget(allocation):
    ds = tiny_dataset()
    config = compress.CompressionConfig(method="svd", reduction=0.25, allocation=allocation, num_samples=16,
                                        capture_images=16, finetune_epochs=0)
    model = tiny_vit()
    P = count_params(model)
    steps = compress.compress(model, ds, order="bf", config=config, progress=False)
    assert count_params(model) == steps[-1]["params_model"] <= 0.75 * P
    with pytest.raises(ValueError, match="reduction"):
        compress.compress(tiny_vit(), ds, config=dataclasses.replace(config, reduction=0.9), progress=False)


def test_cli_takes_a_reduction_and_an_allocation(tmp_path):
    from jaxbsd.cli import build_parser
    from jaxbsd.cli.compress import plot_steps

    args = build_parser().parse_args(["compress", "--reduction", "0.3", "--allocation", "greedy"])
    assert (args.reduction, args.allocation, args.val_fraction) == (0.3, "greedy", 0.1)
    for bad in (["--reduction", "1.5"], ["--allocation", "best"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["compress", *bad])
    steps = [{"step": 1, "acc_cmtf": 0.9, "acc_ft": 0.95, "params_model": 80}]
    plot_steps(steps, 0.97, tmp_path / "a.png", "t", params_original=100)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_capture_original_takes_every_blocks_points_from_the_original_network(monkeypatch):
    ds = tiny_dataset()
    # No fine-tuning: replacing block 0 (order fb) already makes the current network's tokens at
    # blocks 1 and 2 differ from the original's, which is all the claim needs.
    base = dict(method="svd", rank=2, num_samples=16, capture_images=16, finetune_epochs=0, batch_size=32)
    original = tiny_vit()
    seen = {}
    real = compress.BlockCalibration.capture

    def flat(tokens):
        return np.asarray(tokens).reshape(-1, tokens.shape[-1])

    def spy(self, model, paths, stage):
        # each step's tokens (stage >= 1; stage 0 plans the ranks), its images, and what the
        # current network (the model as it is at that step) gives on them
        tokens, order = real(self, model, paths, stage)
        if stage:
            for path in paths:
                block, images = int(path.split(".")[1]), self.step_images(stage)
                seen[block] = (np.asarray(tokens[path][0]), np.array(images), flat(mlp_inputs(model, images, block)))
        return tokens, order

    monkeypatch.setattr(compress.BlockCalibration, "capture", spy)
    steps = compress.compress(tiny_vit(), ds, order="fb", config=compress.CompressionConfig(**base, capture="original"),
                              progress=False)
    assert [s["capture"] for s in steps] == ["original"] * 3 and sorted(seen) == [0, 1, 2]
    for block, (tokens, images, _) in seen.items():
        expected = mlp_inputs(original, jnp.asarray(images), block)
        np.testing.assert_allclose(tokens, flat(expected), rtol=1e-6, atol=1e-6)
    # the default protocol captures from the current network, whose tokens at blocks 1 and 2
    # differ from the original network's once block 0 is replaced
    seen.clear()
    compress.compress(tiny_vit(), ds, order="fb", config=compress.CompressionConfig(**base), progress=False)
    assert sorted(seen) == [0, 1, 2]
    for block, (tokens, images, current) in seen.items():
        np.testing.assert_allclose(tokens, current, rtol=1e-6, atol=1e-6)
        if block:
            assert not np.allclose(tokens, flat(mlp_inputs(original, jnp.asarray(images), block)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="capture"):
        compress.CompressionConfig(capture="later")


@pytest.mark.slow  # compress() at two ranks: 5-7 s
def test_samples_grow_with_the_rank_and_old_run_ids_stay_valid():
    ds = tiny_dataset()
    # BSD_RUN's solver shapes (rank 4, S = 40), reached through samples_per_rank instead.
    config = dataclasses.replace(BSD_RUN, num_samples=16, samples_per_rank=10, finetune_epochs=0)
    assert config.samples_for(1) == 16 and config.samples_for(4) == 40
    steps = compress.compress(tiny_vit(), ds, order=[2], config=config, progress=False)
    assert steps[0]["num_samples"] == 40
    # fields added later are left out of the run id at their defaults
    d = compress.CompressionConfig().to_dict()
    assert "capture" not in d and "samples_per_rank" not in d
    assert compress.CompressionConfig(capture="original").to_dict()["capture"] == "original"


@pytest.mark.parametrize("flat", [
    {},
    {"method": "prune", "reduction": 0.3, "refine_steps": 300},
    {"method": "auto", "reduction": 0.5, "auto_judge": "block", "max_iter": 100, "restarts": 2},
    {"method": "bsd", "basis": {"kind": "BSpline", "degree": 2, "dof": 8}, "lam": 4.0, "warm_start": True,
     "selection": "output", "refine_steps": 50, "refine_lr": 0.02, "refine_target": "local", "refine_batch": None},
    {"method": "svd", "rank": 3, "distill_steps": 40, "distill_images": 1024, "distill_schedule": "constant"},
    # the decoupling that contains the pruned MLP: warm start alone (None kept as None), best iterate, patience
    {"method": "bsd", "basis": {"kind": "Augmented", "inner": {"kind": "BSpline", "degree": 0, "dof": 1},
                                "activation": "gelu"}, "restarts": 0, "warm_start": None, "selection": "output",
     "best_iterate": True, "patience": 5},
    {"method": "auto", "restarts": 0, "best_iterate": True, "patience": 3},
    {"method": "bsd", "warm_start": None, "selection": "output", "contain": True},  # compress_model's "bsd"
])
def test_the_flat_form_reads_back_to_the_same_identity_and_the_same_objects(flat):
    """``from_dict`` of a saved flat form gives a configuration whose ``to_dict`` is that form again (as
    ``to_dict`` writes it: the run's identity), and whose objects are those one would build by hand."""
    config = compress.CompressionConfig.from_flat(**flat)
    again = compress.CompressionConfig.from_dict(config.to_dict())  # as a saved run is read back
    assert again.to_dict() == config.to_dict()
    assert (again.method, again.refine, again.distill) == (config.method, config.refine, config.distill)
    name = flat.get("method", "bsd")
    assert config.method.name == name
    if name == "bsd":
        assert config.method.config.lam == flat.get("lam", 0.25) and config.method.warm_start == flat.get("warm_start", False)
    if name in ("bsd", "auto"):
        bsd = config.method if name == "bsd" else config.method.bsd
        assert bsd.best_iterate == flat.get("best_iterate", False) and bsd.config.patience == flat.get("patience")
        assert bsd.contain == flat.get("contain", False)
        # added after runs were saved: in an identity only where set
        assert ("best_iterate" in config.to_dict()) == ("best_iterate" in flat)
    assert (config.refine is None) == (not flat.get("refine_steps"))
    assert (config.distill is None) == (not flat.get("distill_steps"))
    for key in ("refine_steps", "distill_steps", "distill_images", "lam"):
        if flat.get(key) not in (None, 0, 0.25):
            assert config.to_dict()[key] == flat[key]


def test_a_configuration_of_objects_refuses_what_is_not_one():
    with pytest.raises(ValueError, match="method"):
        compress.CompressionConfig(method=3)
    with pytest.raises(ValueError, match="refine"):
        compress.CompressionConfig(refine={"steps": 3})
    with pytest.raises(ValueError, match="unknown"):
        compress.CompressionConfig.from_dict({"lamda": 0.1})
    with pytest.raises(ValueError, match="refine_steps"):
        compress.CompressionConfig.from_flat(refine_steps=-1)
