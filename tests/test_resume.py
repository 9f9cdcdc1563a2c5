"""Resume after a kill (issue 35, item 3): ``jb.compress_model(..., state_dir=...)`` and ``jb.compress``
killed by SIGKILL in a subprocess — between two MLPs, and at several points of a save — then rerun
in this process with the same arguments and a freshly built model: the rerun resumes after the last
finished MLP of the state and gives exactly (``array_equal``, the report to the bit) what an
uninterrupted run gives. A different configuration on the same state is refused naming
``state_dir``; ``resume=False`` starts over.

The runs killed are scripts written to ``tmp_path`` (:data:`TOY` for ``compress_model``,
:data:`VIT` for ``jb.compress``): this process imports the same file, so both build the same model
from the same seed. The subprocesses see this process's XLA options (inherited) and its compilation
cache, so they load the programs this process compiled instead of compiling them again.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd.checkpoint import read_checkpoint_header
from jaxbsd.models import count_params

#: A toy ``compress_model`` run: three two-layer MLPs under the user's own names, fine-tuning that
#: changes what the next MLP sees, and kill switches. The subprocess calls ``main([STATE_DIR, WHERE, VARIANT])``.
TOY = r'''
import dataclasses
import os
import signal
import sys

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)  # as the test suite (tests/conftest.py)
jax.config.update("jax_numpy_rank_promotion", "raise")

from flax import nnx  # noqa: E402

import jaxbsd as jb  # noqa: E402

PATHS = ["blocks.0.ffn", "blocks.1.ffn", "blocks.2.ffn"]
CONFIG = jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=20)


class FeedForward(nnx.Module):
    def __init__(self, dim, hidden, *, rngs):
        self.expand = nnx.Linear(dim, hidden, rngs=rngs)
        self.project = nnx.Linear(hidden, dim, rngs=rngs)

    def __call__(self, x):
        return self.project(jax.nn.gelu(self.expand(x), approximate=False))


class Block(nnx.Module):
    def __init__(self, dim, hidden, *, rngs):
        self.mix = nnx.Linear(dim, dim, rngs=rngs)
        self.ffn = FeedForward(dim, hidden, rngs=rngs)

    def __call__(self, x):
        x = x + jnp.tanh(self.mix(x))
        return x + self.ffn(x)


class Toy(nnx.Module):
    def __init__(self, seed=0):
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Linear(5, 12, rngs=rngs)
        self.blocks = nnx.List([Block(12, 24, rngs=rngs) for _ in range(3)])
        self.head = nnx.Linear(12, 3, rngs=rngs)

    def __call__(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def calibration():
    return jax.random.normal(jax.random.key(1), (8, 8, 5), jnp.float32)


def kill():
    os.kill(os.getpid(), signal.SIGKILL)


class Finetune:
    """Moves the input projection a little after each replacement (so the next MLP's tokens depend
    on the state having kept it); kills the process on call ``kill_at`` instead."""

    def __init__(self, kill_at=None):
        self.calls, self.kill_at = 0, kill_at

    def __call__(self, model):
        self.calls += 1
        if self.calls == self.kill_at:
            kill()
        model.embed.bias[...] = model.embed.bias[...] + 0.01


#: How the toy is compressed: ``compress_model``'s keywords beside the budget.
VARIANTS = {
    "bsd": dict(method=jb.BSD(config=CONFIG)),
    # no solver to compile in the killed subprocess: the fast suite's kill-and-resume case
    "prune": dict(method="prune"),
    # the greedy allocation builds candidates on the original model before step 1
    "bsd-greedy": dict(method=jb.BSD(config=CONFIG), allocation="greedy"),
    # the whole model's outputs judge auto's candidates: the original model's, before resuming
    "auto": dict(method=jb.get_method("auto", config=CONFIG)),
}


def run(state_dir=None, *, variant="bsd", reduction=0.3, finetune=None, resume=True, key=0,
        calibration=calibration, model=None, order="back-to-front", num_samples=None, config=None, **options):
    """``options``: more of ``compress_model``'s keywords (they win over the variant's); ``num_samples``
    and ``config`` set on the variant's method."""
    execution = jb.Execution(finetune=Finetune() if finetune is None else finetune, state_dir=state_dir,
                             resume=resume, order=order)
    if num_samples is not None or config is not None:
        base = VARIANTS[variant]["method"]
        changed = {"num_samples": num_samples} if num_samples is not None else {}
        if config is not None:
            changed["bsd" if variant == "auto" else "config"] = (
                jb.BSD(config=config) if variant == "auto" else config)
        options["method"] = dataclasses.replace(jb.get_method(base), **changed)
    return jb.compress_model(Toy() if model is None else model, calibration(), mlps=PATHS, reduction=reduction,
                             key=jax.random.key(key), execution=execution, **{**VARIANTS[variant], **options})


def kill_during_save(where):
    """Kill the process inside the second save of the state (MLP 2), at ``where``; ``"first"``:
    inside the first save (MLP 1), when Orbax finalizes it."""
    import orbax.checkpoint as ocp

    import jaxbsd.compression.state as state

    saves = [0]
    real_save = state.save_checkpoint

    def counting_save(*args, **kwargs):
        saves[0] += 1
        return real_save(*args, **kwargs)

    state.save_checkpoint = counting_save
    target = 1 if where == "first" else 2

    def after(cls, name):  # the real method runs (writes start), then the process dies
        real = getattr(cls, name)

        async def wrapper(*args, **kwargs):
            result = await real(*args, **kwargs)
            if saves[0] == target:
                kill()
            return result
        setattr(cls, name, wrapper)

    def before(cls, name):  # the process dies as the real method is called
        real = getattr(cls, name)

        def wrapper(*args, **kwargs):
            if saves[0] == target:
                kill()
            return real(*args, **kwargs)
        setattr(cls, name, wrapper)

    if where == "arrays":
        after(ocp.StandardCheckpointHandler, "async_save")
    elif where == "header":
        after(ocp.JsonCheckpointHandler, "async_save")
    elif where in ("finalize", "first"):
        before(ocp.path.atomicity.AtomicRenameTemporaryPath, "finalize")
    elif where == "steps-json":  # the checkpoint of MLP 2 is complete, steps.json not yet written
        real_write = state.write_json_atomic

        def write(*args, **kwargs):
            if saves[0] == target:
                kill()
            return real_write(*args, **kwargs)
        state.write_json_atomic = write
    else:
        raise SystemExit(f"unknown kill point {where!r}")


def main(argv):
    state_dir, where, variant = argv
    if where == "finetune":  # between MLPs: after MLP 2's replacement, before its save
        run(state_dir, variant=variant, finetune=Finetune(kill_at=2))
    else:
        kill_during_save(where)
        run(state_dir, variant=variant)
    raise SystemExit("not killed")
'''


def write_module(tmp_path, name, source):
    """``source`` as the module ``name`` in ``tmp_path``, imported here under that name — as the
    subprocess imports it, so that its classes are the same (a checkpoint records the model's
    class by module and name, and refuses a model of another)."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def run_killed(script, *args, timeout=600):
    """Run ``script``'s ``main(args)`` in a subprocess; it must die of SIGKILL (its output is shown
    otherwise)."""
    env = dict(os.environ)
    cache = jax.config.jax_compilation_cache_dir
    if cache:  # load what this process compiled (the subprocess does not run conftest.py)
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    code = (f"import sys; sys.path.insert(0, {str(script.parent)!r}); "
            f"import {script.stem}; {script.stem}.main(sys.argv[1:])")
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=pathlib.Path(__file__).resolve().parents[1])
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])


def without_times(value):
    """Run data without wall times (they differ from run to run)."""
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if not k.startswith("seconds")}
    if isinstance(value, (list, tuple)):
        return [without_times(v) for v in value]
    return value


def leaves(model):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model))]


def assert_same_model(a, b):
    assert nnx.graphdef(a) == nnx.graphdef(b)
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(x, y)


def steps_in_state(state_dir):
    """``(finished steps in the checkpoint, in steps.json)``: -1 where there is none."""
    ckpt = pathlib.Path(state_dir) / "model"
    in_ckpt = len(read_checkpoint_header(ckpt)["metadata"]["steps"]) if ckpt.exists() else -1
    steps_json = pathlib.Path(state_dir) / "steps.json"
    in_json = len(json.loads(steps_json.read_text())["steps"]) if steps_json.exists() else -1
    return in_ckpt, in_json


# ------------------------------------------------------------------------------ compress_model


@pytest.fixture(scope="module")
def toy_module(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("toy")
    return write_module(tmp, "jaxbsd_resume_toy", TOY)


@pytest.fixture(scope="module")
def references(toy_module, tmp_path_factory):
    """``variant -> (model, report, its state directory)``: the uninterrupted runs every resumed one
    must reproduce, each with a state directory of its own (finished, it serves the tests of a
    finished state); built on first use."""
    _, module = toy_module
    cache = {}

    def get(variant):
        if variant not in cache:
            state_dir = tmp_path_factory.mktemp(f"reference-{variant}")
            finetune = module.Finetune()
            model, report = module.run(state_dir, variant=variant, finetune=finetune)
            assert finetune.calls == 3 and steps_in_state(state_dir) == (3, 3)
            cache[variant] = model, report, state_dir
        return cache[variant]
    return get


# where the subprocess dies -> (steps the rerun finds finished, what the state directory holds then)
KILLS = {
    # between MLPs: MLP 2 replaced and fine-tuned, its state not saved
    "finetune": (1, (1, 1)),
    # inside the save of MLP 2: its arrays being written; its header written; before Orbax's
    # finalizing rename; after the checkpoint, before steps.json
    "arrays": (1, (1, 1)),
    "header": (1, (1, 1)),
    "finalize": (1, (1, 1)),
    "steps-json": (2, (2, 1)),
    # inside the first save: nothing is left at the checkpoint's path, the rerun starts over
    "first": (0, (-1, -1)),
}
#: The fast suite runs these; the others are marked slow (each case is a subprocess and two runs). None: the
#: kills are the slow step's (a subprocess each); the default run resumes a finished state in this process
#: (test_a_finished_state_returns_its_result_without_recompressing), and tests/test_checkpoint.py interrupts
#: saves at each of their points.
FAST_CASES = ()
CASES = [("prune", "header"), *((("bsd", where) for where in KILLS)), ("bsd-greedy", "finetune"), ("auto", "finetune")]


@pytest.mark.parametrize("variant, where", [c if c in FAST_CASES else pytest.param(*c, marks=pytest.mark.slow)
                                            for c in CASES])
def test_compress_model_killed_resumes_to_the_uninterrupted_result(toy_module, references, tmp_path, variant, where):
    script, module = toy_module
    reference_model, reference_report, _ = references(variant)
    state_dir = tmp_path / "state"
    run_killed(script, state_dir, where, variant)
    done, in_state = KILLS[where]
    assert steps_in_state(state_dir) == in_state
    if where in ("arrays", "header", "finalize"):  # killed mid-save: an unfinalized step is there
        assert any(".orbax-checkpoint-tmp" in p.name for p in (state_dir / "model").iterdir())
    if where == "first":  # the first save builds its directory beside the path
        assert not (state_dir / "model").exists() and any(".tmp-" in p.name for p in state_dir.iterdir())
    finetune = module.Finetune()
    model, report = module.run(state_dir, variant=variant, finetune=finetune)
    assert finetune.calls == 3 - done  # the finished MLPs were not redone
    assert without_times(report.to_dict()) == without_times(reference_report.to_dict())
    assert_same_model(model, reference_model)
    assert steps_in_state(state_dir) == (3, 3)
    # What an interrupted save left in the checkpoint is gone after the next one: one finalized
    # step, the third save's (Orbax numbers the steps of the checkpoint 1, 2, 3).
    assert [p.name for p in (state_dir / "model").iterdir()] == ["3"]


@pytest.mark.parametrize("variant", ["prune", pytest.param("bsd", marks=pytest.mark.slow)])  # prune: no solver
def test_a_finished_state_returns_its_result_without_recompressing(toy_module, references, variant):
    _, module = toy_module
    reference_model, reference_report, state_dir = references(variant)
    finetune = module.Finetune()
    model, report = module.run(state_dir, variant=variant, finetune=finetune)
    assert finetune.calls == 0
    assert report.to_dict() == reference_report.to_dict()  # times included: read back from the state
    assert_same_model(model, reference_model)


@pytest.mark.parametrize("variant", ["prune", pytest.param("bsd", marks=pytest.mark.slow)])  # prune: no solver
def test_another_configuration_is_refused_naming_state_dir(toy_module, references, tmp_path, variant):
    _, module = toy_module
    reference_model, reference_report, finished = references(variant)
    state_dir = tmp_path / "state"
    shutil.copytree(finished, state_dir)
    header = read_checkpoint_header(state_dir / "model")
    other_calibration = lambda: module.calibration() * 1.5  # noqa: E731
    # 0.29 instead of 0.3: the same decoupling rank (13), so nothing new to compile below.
    # Every part of the identity, each changed alone (the run is refused before anything is built).
    changes = (dict(reduction=0.29), dict(key=1), dict(calibration=other_calibration), dict(variant="auto"),
               dict(refine=None), dict(refine=jb.Refine(steps=299)), dict(refine=jb.Refine(target="local")),
               dict(order="front-to-back"), dict(order=list(module.PATHS)[::-1][1:] + [module.PATHS[-1]]),
               dict(num_samples=40),
               dict(config=jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4), max_iter=21)))
    if variant == "prune":  # options pruning refuses outright (it has no decoupling): not part of its identity
        changes = [change for change in changes if not {"num_samples", "config"} & set(change)]
    for change in changes:
        finetune = module.Finetune()
        with pytest.raises(ValueError, match=r"^state_dir\b.*different run"):
            module.run(state_dir, finetune=finetune, **{"variant": variant, **change})
        assert finetune.calls == 0
    assert read_checkpoint_header(state_dir / "model") == header  # the state is untouched


@pytest.mark.slow  # two more runs of the toy; the refusals above stay in the default run
def test_resume_false_discards_the_state_and_starts_over(toy_module, references, tmp_path):
    _, module = toy_module
    reference_model, reference_report, finished = references("bsd")
    state_dir = tmp_path / "state"
    shutil.copytree(finished, state_dir)
    # resume=False: the state is discarded, another configuration runs from the start ...
    finetune = module.Finetune()
    model, report = module.run(state_dir, reduction=0.29, resume=False, finetune=finetune)
    assert finetune.calls == 3
    assert report.target_reduction == 0.29 and count_params(model) <= 0.71 * report.params_before
    assert steps_in_state(state_dir) == (3, 3)
    # ... and is now the state's run: resumed (nothing left to do), the first configuration refused.
    again = module.Finetune()
    model2, report2 = module.run(state_dir, reduction=0.29, finetune=again)
    assert again.calls == 0 and report2.to_dict() == report.to_dict()
    assert_same_model(model2, model)
    with pytest.raises(ValueError, match=r"^state_dir\b"):
        module.run(state_dir, finetune=module.Finetune())
    # resume=False with the first configuration starts over too, and gives the reference again.
    finetune = module.Finetune()
    model3, report3 = module.run(state_dir, resume=False, finetune=finetune)
    assert finetune.calls == 3
    assert without_times(report3.to_dict()) == without_times(reference_report.to_dict())
    assert_same_model(model3, reference_model)


# ------------------------------------------------------------------------------- jb.compress

#: The paper's pipeline (``jb.compress``) on a tiny ViT and 160 images of the embedded ``digits``
#: data set, one fine-tuning epoch per step; killed by SIGKILL once step 1 is saved.
#: The subprocess calls ``main([STATE_DIR])``.
VIT = r"""
import os
import signal
import sys

import jax

jax.config.update("jax_enable_x64", True)  # as the test suite (tests/conftest.py)
jax.config.update("jax_numpy_rank_promotion", "raise")

import jaxbsd as jb  # noqa: E402
from jaxbsd.data import load_dataset  # noqa: E402
from jaxbsd.models import ViTConfig, build_model  # noqa: E402

CONFIG = jb.CompressionConfig.from_flat(**dict(basis=jb.BSpline(2, 4), rank=4, num_samples=40, capture_images=16,
                                              max_iter=20, finetune_epochs=1, batch_size=32))


def run(state_dir=None, on_step=None):
    model = build_model("vit", ViTConfig(image_size=8, channels=1, patch_size=4, dim=8, depth=3, num_heads=2,
                                         mlp_dim=16), seed=0)
    steps = jb.compress(model, load_dataset("digits", limit=160), order="back-to-front", config=CONFIG,
                        state_dir=state_dir, progress=False, on_step=on_step)
    return model, steps


def kill_after_step_1(record):
    if record["step"] == 1:  # called once the step is saved
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv):
    run(argv[0], on_step=kill_after_step_1)
    raise SystemExit("not killed")
"""


@pytest.mark.slow
def test_compress_killed_after_step_1_resumes_to_the_uninterrupted_result(tmp_path):
    script, module = write_module(tmp_path, "jaxbsd_resume_vit", VIT)
    reference_model, reference = module.run()
    assert [r["block"] for r in reference] == [2, 1, 0]
    state_dir = tmp_path / "state"
    run_killed(script, state_dir)
    assert steps_in_state(state_dir) == (1, 1)
    calls = []
    model, steps = module.run(state_dir, on_step=lambda record: calls.append(record["step"]))
    assert calls == [2, 3]  # step 1 (block 2) was not redone
    assert without_times(steps) == without_times(reference)
    assert_same_model(model, reference_model)


def _scaled(module, path):
    """A freshly built toy with the kernel at ``path`` doubled: another model of the same size."""
    model = module.Toy()
    layer = model
    for part in path.split("."):
        layer = layer[int(part)] if part.isdigit() else getattr(layer, part)
    layer.kernel[...] = layer.kernel[...] * 2
    return model


@pytest.mark.parametrize("changed", ["head", "blocks.2.ffn.project"])
def test_another_model_of_the_same_size_is_refused_naming_state_dir(toy_module, references, tmp_path, changed):
    """Weights after the MLPs' inputs (the head; the first MLP compressed, back to front) do not
    change the captured inputs: the state of the original model must still be refused."""
    _, module = toy_module
    _, _, finished = references("prune")  # the model's identity is the engine's, the same for every method
    state_dir = tmp_path / "state"
    shutil.copytree(finished, state_dir)
    other = _scaled(module, changed)
    expected = np.asarray(_scaled(module, changed).head.kernel[...])
    with pytest.raises(ValueError, match=r"^state_dir\b"):
        module.run(state_dir, model=other, variant="prune", finetune=module.Finetune())
    np.testing.assert_array_equal(np.asarray(other.head.kernel[...]), expected)
