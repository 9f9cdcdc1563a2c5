"""Shared helpers of the paper-reproduction experiments (``experiments/*.py``).

* :func:`load_or_train` — a trained model from ``checkpoints/<kind>-<dataset>``, or trains
  it with the exact command recorded in ``experiments/results/training.json`` and caches it;
* :func:`solve_lambdas` — R-CMTF-BSD restarts for several λ in one compiled program (vmapped
  over λ and over the restarts);
* :func:`subset`, :func:`write_json`, :func:`command_line`, :func:`mean_std`.

The scripts import this file as ``common`` (``experiments/`` is put on ``sys.path``).
"""

from __future__ import annotations

import os

import sys as _sys  # noqa: E402

# The scripts use the jaxbsd of the checkout they belong to (the one their provenance hashes),
# not whichever copy is installed (an editable install may point at another worktree).
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _CHECKOUT not in _sys.path:
    _sys.path.insert(1, _CHECKOUT)

import dataclasses  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Sequence  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxbsd as jb  # noqa: E402
from jaxbsd.io import provenance, read_json, write_json_atomic  # noqa: E402
from jaxbsd.data import Dataset  # noqa: E402

__all__ = [
    "ROOT",
    "RESULTS",
    "CHECKPOINTS",
    "enable_compilation_cache",
    "command_line",
    "write_json",
    "read_json",
    "jsonable",
    "subset",
    "training_command",
    "load_or_train",
    "checkpoint_key",
    "solve_lambdas",
    "finished_steps",
    "resumed_seconds",
    "mean_std",
    "paired_verdict",
    "unit_done",
    "resume_unit",
    "save_unit",
    "save_infeasible",
    "Timer",
]

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
CHECKPOINTS = ROOT / "checkpoints"
TRAINING_JSON = RESULTS / "training.json"

def enable_compilation_cache(path: str | os.PathLike | None = None) -> pathlib.Path:
    """Persist compiled XLA programs on disk, so reruns and other data sets skip compilation.

    The ablation compiles one solver program per (rank, basis, variant): ~200 programs of
    ~5–10 s each on two cores. Default location: ``$JAXBSD_CACHE/xla`` (``~/.cache/jaxbsd/xla``).
    """
    if path is None:
        base = os.environ.get("JAXBSD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxbsd")
        path = os.path.join(base, "xla")
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


#: Provenance of the running experiment, taken when it starts (:func:`command_line`), so the
#: commit and source hashes a result records are those of the code that computed it.
_RUN_PROVENANCE: dict | None = None


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces this run (``python experiments/<script> ...``); also records
    the run's provenance (commit, source hashes) for :func:`write_json`."""
    global _RUN_PROVENANCE
    args = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python", f"experiments/{script}", *map(shlex.quote, map(str, args))])
    _RUN_PROVENANCE = provenance(command)
    return command


def jsonable(x: Any) -> Any:
    """``x`` with numpy/JAX scalars and arrays turned into Python numbers and lists, and
    non-finite floats into ``None`` (strict JSON has no NaN)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.ndarray, jax.Array)):
        return jsonable(np.asarray(x).tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, pathlib.Path):
        return str(x)
    return x


def write_json(path: str | os.PathLike, payload: dict) -> pathlib.Path:
    """Write ``payload`` as strict JSON (NaN → null), atomically (:mod:`jaxbsd.io`), with a
    ``provenance`` entry (command, commit, source hashes: see :func:`jaxbsd.io.provenance`)
    taken when the run started, so no result can be written without one."""
    payload = dict(payload)
    payload.setdefault("provenance", _RUN_PROVENANCE or provenance(str(payload.get("command", "unknown"))))
    return write_json_atomic(path, jsonable(payload))


def subset(dataset: Dataset, train: int | None = None, test: int | None = None, seed: int = 0) -> Dataset:
    """A seeded random subset of the splits, keeping the full set's normalization.

    (``load_dataset(limit=...)`` would renormalize with the subset's statistics, which a model
    trained on the full split never saw.)
    """
    rng = np.random.default_rng(seed)

    def pick(images, labels, n):
        if n is None or n >= images.shape[0]:
            return images, labels
        idx = np.sort(rng.choice(images.shape[0], n, replace=False))
        return images[idx], labels[idx]

    tr_x, tr_y = pick(dataset.train_images, dataset.train_labels, train)
    te_x, te_y = pick(dataset.test_images, dataset.test_labels, test)
    return dataclasses.replace(dataset, train_images=tr_x, train_labels=tr_y, test_images=te_x, test_labels=te_y)


def training_command(kind: str, dataset: str) -> tuple[list[str], str]:
    """``jaxbsd train`` arguments (without ``--out``/``--json``) for ``kind`` on ``dataset``,
    and where they come from: the run recorded in ``training.json``, else ``jaxbsd.training.RECIPES``."""
    if TRAINING_JSON.exists():
        for run in read_json(TRAINING_JSON).get("runs", []):
            if run.get("model") == kind and run.get("dataset") == dataset and run.get("command"):
                args = shlex.split(run["command"])[1:]  # drop the program name
                keep, skip = [], False
                for a in args:
                    if skip:
                        skip = False
                        continue
                    if a in ("--out", "--json"):
                        skip = True
                        continue
                    if a.startswith(("--out=", "--json=")):
                        continue
                    keep.append(a)
                if "--teacher" in keep:
                    i = keep.index("--teacher") + 1
                    keep[i] = _renamed(keep[i])
                return keep, f"{TRAINING_JSON.relative_to(ROOT)}: {run['command']}"
    from jaxbsd.training import RECIPES

    if (kind, dataset) not in RECIPES:
        raise ValueError(f"no training recipe for {kind} on {dataset}; pass --checkpoint")
    extra = RECIPES[(kind, dataset)].cli_args()  # spelled out, so the recorded command says it all
    return ["train", "--model", kind, "--dataset", dataset, *extra, "--no-progress"], "jaxbsd.training.RECIPES"


#: Model config overrides where the library has no preset: Swin's patch is image_size // 8,
#: which 28×28 images do not allow; patch 7 gives a 4×4 token grid (one 4×4 window, then 2×2).
MODEL_OVERRIDES = {("swin", "fashion-mnist"): {"patch_size": 7}, ("swin", "mnist"): {"patch_size": 7}}


def load_or_train(kind: str, dataset: str, *, checkpoint: str | os.PathLike | None = None,
                  quick_dir: str | os.PathLike | None = None, quick_epochs: int = 2,
                  quick_limit: int = 2000, log=print):
    """A trained ``kind`` model for ``dataset`` and a dict describing where it came from.

    Order: ``checkpoint`` if given; else ``checkpoints/<kind>-<dataset>`` if it exists; else
    * with ``quick_dir`` (CI): train ``quick_epochs`` on ``quick_limit`` training images (no
      teacher) and cache the weak model as ``<quick_dir>/<kind>-<dataset>-quick``;
    * otherwise train with the recorded ``jaxbsd train`` command (``training.json``, else the
      recipe table jaxbsd.training.RECIPES), writing ``checkpoints/<kind>-<dataset>`` once it has finished.
    """
    from jaxbsd.checkpoint import load_checkpoint

    if checkpoint is not None:
        path = pathlib.Path(checkpoint)
        model, meta = load_checkpoint(path)
        return model, {"checkpoint": str(path), "trained_now": False, "command": meta.get("command")}
    path = CHECKPOINTS / f"{kind}-{dataset}"
    if path.exists():
        model, meta = load_checkpoint(path)
        return model, {"checkpoint": rel_path(path), "trained_now": False, "command": meta.get("command")}
    args, source = training_command(kind, dataset)
    overrides = MODEL_OVERRIDES.get((kind, dataset), {})
    if quick_dir is not None:
        quick = pathlib.Path(quick_dir) / f"{kind}-{dataset}-quick"
        if not quick.exists():
            args = _set_option(args, "--epochs", str(quick_epochs))
            args = _set_option(args, "--warmup-epochs", "0")
            if "--teacher" in args:  # the teacher may be missing in CI: train without one
                i = args.index("--teacher")
                del args[i:i + 2]
            log(f"[quick] training {kind} on {quick_limit} {dataset} images: jaxbsd {' '.join(args)}")
            train_from_args(args, quick, overrides=overrides, train_limit=quick_limit, log=log)
        model, meta = load_checkpoint(quick)
        return model, {"checkpoint": str(quick), "trained_now": True, "quick": True,
                       "command": meta.get("command"), "recipe": source, "config_overrides": overrides}
    if "--teacher" in args:
        teacher = pathlib.Path(args[args.index("--teacher") + 1])
        if not (ROOT / teacher).exists() and not teacher.exists():
            t_kind, t_data = teacher.stem.split("-", 1)
            load_or_train(t_kind, t_data, log=log)
    log(f"training {kind} on {dataset} ({source}): jaxbsd {' '.join(args)}"
        + (f" with config overrides {overrides}" if overrides else ""))
    train_from_args(args, path, overrides=overrides, log=log)
    model, meta = load_checkpoint(path)
    return model, {"checkpoint": rel_path(path), "trained_now": True, "command": meta.get("command"),
                   "recipe": source, "config_overrides": overrides}


#: The trained models were ``checkpoints/<kind>-<dataset>.npz`` until issue 22 renamed them
#: (same weights, bit for bit); recorded commands (``training.json``) and the keys of committed
#: study state (``experiments/results/state``) still spell them so.
_OLD_NAME = re.compile(r"checkpoints/([\w-]+)\.npz")


def checkpoint_key(path: str | os.PathLike) -> str:
    """How ``path`` (as :func:`load_or_train` records it) enters protocol keys and resume tags:
    ``checkpoints/<kind>-<dataset>`` keeps its old spelling ``checkpoints/<kind>-<dataset>.npz``,
    so the studies find the units they finished before the rename; other paths are unchanged."""
    path = str(path)
    return f"{path}.npz" if re.fullmatch(r"checkpoints/[\w-]+", path) else path


def _renamed(path: str) -> str:
    """A checkpoint path from a recorded command, as the checkpoint is named now."""
    match = _OLD_NAME.fullmatch(path)
    return f"checkpoints/{match.group(1)}" if match else path


def rel_path(path: pathlib.Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _set_option(args: list[str], name: str, value: str) -> list[str]:
    args = list(args)
    if name in args:
        args[args.index(name) + 1] = value
    else:
        args += [name, value]
    return args


def train_from_args(args: list[str], path: pathlib.Path, *, overrides: dict | None = None,
                    train_limit: int | None = None, log=print) -> pathlib.Path:
    """What ``jaxbsd train <args> --out <path>`` does, plus model-config ``overrides`` and a
    random ``train_limit`` subset that keeps the full split's normalization; the checkpoint
    appears only once training has finished (training writes ``<path>.partial`` each epoch)."""
    from jaxbsd import cli, data
    from jaxbsd.models import build_model, config_for_dataset, count_params
    from jaxbsd.checkpoint import load_checkpoint
    from jaxbsd.training import train

    ns = cli.build_parser().parse_args(args)
    cfg = cli.train_config_from_args(ns)
    dataset = data.load_dataset(ns.dataset, ns.data_root, seed=cfg.seed, limit=ns.limit)
    if train_limit is not None:
        dataset = subset(dataset, train=train_limit, seed=cfg.seed)
    over = dict(overrides or {})
    if cfg.drop_path is not None:
        over["drop_path"] = cfg.drop_path
    model = build_model(ns.model, config_for_dataset(ns.model, dataset, **over), seed=cfg.seed)
    teacher = None
    if ns.teacher:
        teacher_path = pathlib.Path(ns.teacher)
        teacher, _ = load_checkpoint(teacher_path if teacher_path.is_absolute() else ROOT / teacher_path)
    command = "jaxbsd " + " ".join(args)
    metadata = {"dataset": ns.dataset, "data_root": ns.data_root, "command": command, "teacher": ns.teacher,
                "params": count_params(model), "train_config": cfg.to_dict(), "config_overrides": overrides or {},
                "train_limit": train_limit, "written_by": "experiments/common.py train_from_args"}
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")

    def report(h):
        log(f"  epoch {h['epoch']:3d}  loss {h['loss']:.4f}  test_acc {h['test_acc']:.4f}  {h['seconds']:.1f} s")

    train(model, dataset, cfg, teacher=teacher, progress=False, checkpoint=partial, metadata=metadata,
          on_epoch=report)
    os.replace(partial, path)
    return path


# --------------------------------------------------------------------------- solver


@functools.partial(jax.jit, static_argnames="restarts")
def _solve_lambdas(key, problem, lams, config, restarts):
    keys = jax.random.split(key, restarts)  # the keys decouple(key=key, restarts=...) uses

    def per_lam(lam):
        cfg = config.replace(lam=lam)
        return jax.vmap(lambda k: jb.solver.solve(k, problem, cfg))(keys)

    return jax.vmap(per_lam)(lams)


def solve_lambdas(jac, F, X, config: jb.CMTFConfig, lams: Sequence[float], *, key: jax.Array,
                  restarts: int) -> list[jb.DecouplingResult]:
    """``[decouple(jac, F, X, config.replace(lam=λ), key=key, restarts=restarts) for λ in lams]``,
    as one compiled program: λ is a traced leaf of the config, so the ablation compiles one
    program per (rank, basis, variant), vmapped over λ and over the restarts.

    Each restart uses the same key and the same :func:`jaxbsd.solve` as ``decouple``; the best
    restart is picked by :func:`jaxbsd.select_best`, as ``decouple`` does, so
    ``res.restart_model(k)``, ``res.restarts.error_J``, ``res.model`` mean what they mean there.
    """
    problem = jb.solver.problem(jac, F, X)
    lam_arr = jnp.asarray(np.asarray(lams, dtype=np.float64), dtype=problem.F.dtype)
    runs = _solve_lambdas(key, problem, lam_arr, config, restarts)
    return [jb.solver.select_best(jax.tree_util.tree_map(lambda x: x[i], runs), config.replace(lam=float(lam)))
            for i, lam in enumerate(lams)]


# --------------------------------------------------------------------------- small things


def finished_steps(state_dir: str | os.PathLike) -> int:
    """How many steps a ``jaxbsd.compress(state_dir=...)`` run has already finished (0 if none)."""
    path = pathlib.Path(state_dir) / "steps.json"
    try:
        return len(read_json(path).get("steps", []))
    except (OSError, ValueError):
        return 0


def resumed_seconds(state_dir: str | os.PathLike) -> float:
    """The wall seconds that the steps a ``jaxbsd.compress(state_dir=...)`` run already finished took
    when they ran (each step's own and its after-step seconds, from ``steps.json``; 0 if none): what a
    resumed unit adds to the seconds of the process that finishes it, so that its time is the whole
    compression's, not the last stretch's."""
    path = pathlib.Path(state_dir) / "steps.json"
    try:
        steps = read_json(path).get("steps", [])
    except (OSError, ValueError):
        return 0.0
    return float(sum(s.get("seconds", 0.0) + (s.get("seconds_finetune") or 0.0) for s in steps))


#: How a distillation knob that differs from a study's headline plan tags its units and result file
#: (``learning_rate=3e-4`` -> ``lr3``); the studies name which of these knobs they have, in order.
KNOB_TAGS: dict[str, Callable[[Any], str]] = {
    "images": lambda v: f"n{v}", "distill_windows": lambda v: f"n{v}", "steps": lambda v: f"s{v}",
    "learning_rate": lambda v: f"lr{round(v / 1e-4)}", "trainable": lambda v: v.replace("replaced+norms", "norms"),
    "schedule": str, "warmup": lambda v: f"w{v}", "variants": lambda v: "-".join(v), "lengths": str}


def knob_suffix(plan: dict, base: dict, knobs: Sequence[str], sep: str, skip: Sequence[str] = ()) -> str:
    """``sep``-joined tags (:data:`KNOB_TAGS`) of the ``knobs`` of ``plan`` that differ from ``base``,
    in the order of ``knobs``, but those in ``skip``; ``""`` if none. A study's ablation names its own
    result file with it, so it never overwrites the headline."""
    return "".join(sep + KNOB_TAGS[k](plan[k]) for k in knobs if k not in skip and plan[k] != base[k])


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and (population, ddof=0) standard deviation; ``(nan, nan)`` when empty."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std())


def paired_verdict(a: Sequence[float], b: Sequence[float], *, better: str, worse: str,
                   noise: str = "within noise", alpha: float = 0.05) -> dict:
    """Is ``a`` better than ``b``, paired by seed? The verdict is computed, never typed by hand.

    ``a[i]`` and ``b[i]`` come from the same seed (same sampling points, solver key, fine-tuning
    order). Tests: the paired t-test (``scipy.stats.ttest_rel``) and the two-sided sign test
    (``scipy.stats.binomtest`` on the non-zero differences). Verdict: ``better`` when the mean
    difference ``a − b`` is positive and the t-test's p < ``alpha``, ``worse`` when it is
    negative and p < ``alpha``, ``noise`` otherwise (fewer than 2 pairs, identical values, or
    p >= ``alpha``). The sign test is reported beside it (with n pairs its smallest two-sided p
    is 2^(1−n): 0.25 for 3 seeds, so it cannot decide alone at 3 seeds).

    Returns:
      ``{"n", "mean_a", "mean_b", "mean_diff", "diffs", "t", "p_ttest", "wins", "losses",
      "p_sign", "alpha", "verdict"}`` (p values None where a test is undefined).
    """
    from scipy import stats

    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be paired 1-D sequences, got shapes {a.shape} and {b.shape}")
    d = a - b
    n = int(d.size)
    wins, losses = int(np.sum(d > 0)), int(np.sum(d < 0))
    t = p_t = None
    if n >= 2:
        if np.all(d == d[0]):  # no spread: the t statistic is undefined (0/0) or infinite
            t, p_t = (None, 1.0) if d[0] == 0 else (float(np.sign(d[0]) * np.inf), 0.0)
        else:
            res = stats.ttest_rel(a, b)
            t, p_t = float(res.statistic), float(res.pvalue)
    p_sign = float(stats.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else None
    mean_diff = float(d.mean()) if n else float("nan")
    verdict = noise
    if p_t is not None and p_t < alpha and mean_diff > 0:
        verdict = better
    elif p_t is not None and p_t < alpha and mean_diff < 0:
        verdict = worse
    return {"n": n, "mean_a": float(a.mean()) if n else None, "mean_b": float(b.mean()) if n else None,
            "mean_diff": mean_diff, "diffs": d.tolist(), "t": t, "p_ttest": p_t, "wins": wins, "losses": losses,
            "p_sign": p_sign, "alpha": alpha, "verdict": verdict}


def unit_done(path: str | os.PathLike, tag: str) -> dict | None:
    """The record of a finished unit of work saved at ``path`` by :func:`save_unit` under the
    same ``tag`` (the protocol it was computed with), else None."""
    try:
        saved = read_json(path)
    except (OSError, ValueError):
        return None
    return saved.get("record") if isinstance(saved, dict) and saved.get("tag") == tag else None


def resume_unit(state_dir: pathlib.Path, tag: str, label: str, log: Callable[[str], None]) -> dict | None:
    """Where a resumable unit stands: its record if it finished before under the same ``tag``
    (``state_dir/unit.json``, logged as kept), else None, after logging the step an unfinished one
    resumes after (``compress(state_dir=...)``'s ``steps.json``), if any. A unit that finished
    under another tag (its configuration changed since) starts over: its run state is removed."""
    if (kept := unit_done(state_dir / "unit.json", tag)) is not None:
        log(f"  {label}: finished before, kept from {rel_path(state_dir / 'unit.json')}")
        return kept
    if (state_dir / "unit.json").exists():
        log(f"  {label}: finished before under another configuration; starting over")
        shutil.rmtree(state_dir)
        state_dir.mkdir()
    if done := finished_steps(state_dir):
        log(f"  {label}: resuming after step {done} from {rel_path(state_dir)}")
    return None


def save_unit(path: str | os.PathLike, tag: str, record: dict) -> None:
    """Save a finished unit's ``record`` atomically (a killed run never leaves half a file)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, jsonable({"tag": tag, "record": record}))


def save_infeasible(err: ValueError, record: dict, path: str | os.PathLike, tag: str, label: str, seconds: float,
                    log: Callable[[str], None]) -> dict:
    """The finished record of a unit whose budget cannot be met (``jb.compress_model`` /
    ``jaxbsd.compress`` refused it): ``record`` with ``status="infeasible"``, the reason and the
    seconds, saved as :func:`save_unit` does and logged. Any other ``ValueError`` is re-raised."""
    if "cannot be met" not in str(err):
        raise err
    record.update(status="infeasible", reason=str(err), seconds=seconds)
    log(f"  {label}: infeasible ({err})")
    save_unit(path, tag, record)
    return record


def machine() -> str:
    """The accelerator a unit ran on and the JAX version, e.g. ``"NVIDIA H200 (gpu), jax 0.11.2"``:
    a study that resumes across machines records, per unit, which figures came from where."""
    return f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"


class Timer:
    """Wall-clock seconds since construction (``Timer()()``)."""

    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start
