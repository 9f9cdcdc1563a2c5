"""Compressing a transformer block by block (paper §5.3): decouple, replace, fine-tune, repeat.

One step for block ``i``:

1. draw ``S`` of the MLP's input tokens on a random subset of training images;
2. build the MLP's Jacobian there — structured ``[[V1, V0ᵀ, h'(X V0ᵀ + b0)]]`` for a standard
   :class:`~jaxbsd.models.layers.MLP` (never materialized), dense through ``jax.jacfwd``
   otherwise — and decouple it (any basis, robust or not, vmapped restarts); or, for the
   baselines, factor the dense layers by truncated SVD or DRONE;
3. ``model.blocks[i].mlp = new_module`` and evaluate;
4. fine-tune the whole model for ``finetune_epochs`` with Optax and evaluate again.

Orders: ``"front-to-back"`` (FB), ``"back-to-front"`` (BF) or an explicit list of block
indices. Each finished step is recorded (accuracies, parameter counts, savings, accuracy drop,
Error(𝒥), Error(F), wall times) and, with ``state_dir``, saved atomically together with a
checkpoint of the model, so a rerun of an interrupted run resumes after its last finished step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd import baselines, metrics
from jaxbsd.bases import Basis, BSpline, Polynomial, ReLU
from jaxbsd.cmtf import CMTFConfig, decouple
from jaxbsd.io import write_json_atomic
from jaxbsd.models import count_params
from jaxbsd.models.capture import capture, mlp_inputs
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.models.layers import ACTIVATION_DERIVATIVES, MLP
from jaxbsd.tensor import mlp_jacobian
from jaxbsd.train import evaluate, load_checkpoint, read_checkpoint_header, save_checkpoint, train

__all__ = [
    "METHODS",
    "ORDERS",
    "CompressionConfig",
    "block_order",
    "sample_tokens",
    "compress_block",
    "compress",
    "mlp_params",
]

METHODS = ("bsd", "svd", "drone")
ORDERS = {"front-to-back": "fb", "back-to-front": "bf"}


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
    """How each block is compressed and fine-tuned.

    Attributes:
      method: ``"bsd"`` (decoupling), ``"svd"`` or ``"drone"`` (low-rank baselines).
      basis: basis of the internal functions (``"bsd"`` only).
      rank: decoupling rank, or the low-rank baselines' rank; ``None`` = the block's width
        (the paper's choice, ``r = m``) for ``"bsd"``; required for the baselines.
      robust, lam, max_iter, restarts, tol: solver settings (``"bsd"`` only).
      num_samples: ``S``, sampling points (token vectors) per block.
      capture_images: training images whose tokens the samples are drawn from.
      structured: use the structured Jacobian for standard MLP blocks.
      finetune_epochs: epochs of fine-tuning after every replacement (0 = none).
      lr, batch_size, schedule: fine-tuning optimizer settings.
      seed: seeds the image subset, the token draw, the solver and the fine-tuning.
    """

    method: str = "bsd"
    basis: Basis = BSpline(3, 4)
    rank: int | None = None
    robust: bool = True
    lam: float = 0.25
    max_iter: int = 300
    restarts: int = 1
    tol: float = 1e-8
    num_samples: int = 128
    capture_images: int = 256
    structured: bool = True
    finetune_epochs: int = 5
    lr: float = 1e-4
    batch_size: int = 128
    schedule: str = "constant"
    seed: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.method != "bsd" and self.rank is None:
            raise ValueError(f"rank must be given for method {self.method!r}")
        for name in ("num_samples", "capture_images", "restarts", "max_iter", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.finetune_epochs, int) or self.finetune_epochs < 0:
            raise ValueError(f"finetune_epochs must be an int >= 0, got {self.finetune_epochs!r}")

    def solver_config(self, width: int) -> CMTFConfig:
        return CMTFConfig(
            rank=self.rank or width, basis=self.basis, lam=self.lam, robust=self.robust,
            max_iter=self.max_iter, tol=self.tol,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["basis"] = {"kind": type(self.basis).__name__, **dataclasses.asdict(self.basis)}
        return d


def _basis_from_dict(d: dict) -> Basis:
    kinds = {"BSpline": BSpline, "Polynomial": Polynomial, "ReLU": ReLU}
    d = dict(d)
    return kinds[d.pop("kind")](**d)


def block_order(order: str | Sequence[int], num_blocks: int) -> tuple[int, ...]:
    """Block indices for ``"front-to-back"``/``"fb"``, ``"back-to-front"``/``"bf"`` or a list."""
    if isinstance(order, str):
        key = ORDERS.get(order, order)
        if key == "fb":
            return tuple(range(num_blocks))
        if key == "bf":
            return tuple(reversed(range(num_blocks)))
        raise ValueError(f"order must be 'front-to-back', 'back-to-front' or a list of ints, got {order!r}")
    indices = tuple(int(i) for i in order)
    if not indices or len(set(indices)) != len(indices) or not all(0 <= i < num_blocks for i in indices):
        raise ValueError(f"order must list distinct block indices in [0, {num_blocks}), got {list(order)}")
    return indices


def mlp_params(module: nnx.Module) -> int:
    """Trainable parameters of one block's MLP module."""
    return count_params(module)


def sample_tokens(model, images, block_index: int, num_samples: int, key: jax.Array) -> jax.Array:
    """``(S, m)`` MLP input tokens of block ``block_index``, drawn without replacement."""
    tokens = mlp_inputs(model, images, block_index)
    flat = tokens.reshape(-1, tokens.shape[-1])
    if num_samples > flat.shape[0]:
        raise ValueError(f"num_samples ({num_samples}) exceeds the {flat.shape[0]} available tokens")
    return flat[jax.random.choice(key, flat.shape[0], (num_samples,), replace=False)]


def compress_block(model, block_index: int, images, config: CompressionConfig, key: jax.Array):
    """Build the replacement of ``model.blocks[block_index].mlp`` (the model is not changed).

    Returns:
      ``(module, info)``: the new MLP module and a dict with ``error_J``, ``error_F``,
      ``status``, ``iterations`` (decoupling only) and ``seconds``.
    """
    start = time.perf_counter()
    mlp = model.blocks[block_index].mlp
    info: dict[str, Any] = {}
    if config.method == "bsd":
        if config.structured and isinstance(mlp, MLP):
            X = sample_tokens(model, images, block_index, config.num_samples, key)
            V0, b0 = mlp.fc1.kernel[...].T, mlp.fc1.bias[...]
            jac = mlp_jacobian(X, V0, b0, mlp.fc2.kernel[...].T, ACTIVATION_DERIVATIVES[mlp.activation])
            F = mlp(X)
        else:
            X, jac, F = capture(model, images, block_index, config.num_samples, key=key)
        width = X.shape[-1]
        res = decouple(jac, F, X, config.solver_config(width), key=jax.random.fold_in(key, 1),
                       restarts=config.restarts)
        module = DecoupledMLP.from_decoupled(res.model, dtype=X.dtype)
        info.update(error_J=float(res.error_J), error_F=float(res.error_F), status=int(res.status),
                    iterations=int(res.iterations))
    else:
        if not isinstance(mlp, MLP):
            raise ValueError(f"block {block_index}'s MLP is already compressed ({type(mlp).__name__})")
        if config.method == "svd":
            module = baselines.svd_mlp(mlp, config.rank)
        else:
            # DRONE sees many real tokens: all of the capture images' tokens (up to 8192).
            tokens = mlp_inputs(model, images, block_index)
            flat = tokens.reshape(-1, tokens.shape[-1])
            take = min(flat.shape[0], 8192)
            X = flat[jax.random.choice(key, flat.shape[0], (take,), replace=False)]
            module = baselines.drone_mlp(mlp, X, config.rank)
        X_check = sample_tokens(model, images, block_index, min(config.num_samples, 512), key)
        F = mlp(X_check)
        info.update(error_F=float(metrics.error_F(F, module(X_check))))
    info["seconds"] = time.perf_counter() - start
    return module, info


def _placeholder(record: dict, old: nnx.Module) -> nnx.Module:
    """A module with the structure of a finished step's replacement (weights loaded later)."""
    if record["method"] == "bsd":
        basis = _basis_from_dict(record["basis"])
        r, m, n = record["rank"], record["in_features"], record["out_features"]
        z = lambda *s: jnp.zeros(s, jnp.float32)  # noqa: E731
        return DecoupledMLP(z(r, m), z(n, r), z(r, basis.num_coef), z(r, basis.num_knots), basis)
    (K1, b1), (K2, b2) = baselines._kernels(old)
    k = record["rank"]
    z = lambda a, b: jnp.zeros((a, b), K1.dtype)  # noqa: E731
    return baselines.LowRankMLP(
        baselines.LowRankLinear(z(K1.shape[0], k), z(k, K1.shape[1]), b1),
        baselines.LowRankLinear(z(K2.shape[0], k), z(k, K2.shape[1]), b2),
        old.activation,
    )


def _run_id(config: CompressionConfig, order: tuple[int, ...], params_before: int) -> str:
    text = json.dumps({"config": config.to_dict(), "order": order, "params": params_before}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _load_state(state_dir: pathlib.Path, run_id: str, model) -> list[dict]:
    """Finished steps and the model after the last one, from ``state_dir/model.npz``.

    The step log travels inside the checkpoint's metadata, so model and log are written by
    one atomic rename and can never disagree (``steps.json`` is a readable copy).
    """
    path = state_dir / "model.npz"
    if not path.exists():
        return []
    meta = read_checkpoint_header(path).get("metadata", {})
    if not isinstance(meta, dict) or "steps" not in meta or "run_id" not in meta:
        raise ValueError(f"{path}: expected a checkpoint written by jaxbsd.compress (with its step log)")
    if meta["run_id"] != run_id:
        raise ValueError(
            f"{path} belongs to a different run (config, order or model differ); "
            "use another state_dir or delete it to start over"
        )
    steps = meta["steps"]
    for record in steps:
        block = model.blocks[record["block"]]
        block.mlp = _placeholder(record, block.mlp)
    load_checkpoint(path, model)
    return steps


def compress(
    model,
    dataset,
    *,
    order: str | Sequence[int] = "back-to-front",
    config: CompressionConfig = CompressionConfig(),
    state_dir: str | os.PathLike | None = None,
    teacher=None,
    progress: bool = True,
    on_step: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Compress ``model`` in place, block by block, fine-tuning after every replacement.

    Args:
      model: a ViT, Swin or DeiT (``model.blocks[i].mlp``); changed in place.
      dataset: a :class:`jaxbsd.data.Dataset`: capture images come from its training split,
        accuracies from its test split.
      order: ``"front-to-back"``, ``"back-to-front"`` or explicit block indices.
      config: a :class:`CompressionConfig`.
      state_dir: if given, the step log (``steps.json``) and the model after the last finished
        step (``model.npz``) are kept there, written atomically; calling again with the same
        arguments resumes after the last finished step.
      teacher: passed to fine-tuning (hard distillation for DeiT).
      progress: print a line per step (and show training progress bars).
      on_step: called with each step's record once it is saved.

    Returns:
      One record per step (``step`` 1-based, ``block``, ``acc_cmtf``, ``acc_ft``, parameter
      counts, ``savings_model``/``savings_mlp`` in percent, ``accuracy_drop`` in points,
      errors, wall times), including resumed ones.
    """
    indices = block_order(order, len(model.blocks))
    model.eval()
    original_params = count_params(model)
    acc_original = evaluate(model, dataset.test_images, dataset.test_labels)
    run_id = _run_id(config, indices, original_params)
    steps: list[dict] = []
    if state_dir is not None:
        state_dir = pathlib.Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        steps = _load_state(state_dir, run_id, model)
        if steps and progress:
            print(f"resuming after step {len(steps)} of {len(indices)} from {state_dir}", file=sys.stderr)
    key = jax.random.key(config.seed)
    n_capture = min(config.capture_images, dataset.train_images.shape[0])
    for step, block in enumerate(indices, start=1):
        if step <= len(steps):
            continue
        # Per-step streams, so a resumed run draws exactly what an uninterrupted one would.
        rng = np.random.default_rng([config.seed, step])
        images = jnp.asarray(dataset.train_images[rng.choice(dataset.train_images.shape[0], n_capture, replace=False)])
        old = model.blocks[block].mlp
        old_params = mlp_params(old)
        module, info = compress_block(model, block, images, config, jax.random.fold_in(key, step))
        model.blocks[block].mlp = module
        acc_cmtf = evaluate(model, dataset.test_images, dataset.test_labels)
        start = time.perf_counter()
        ft_history = []
        if config.finetune_epochs:
            ft_history = train(model, dataset, epochs=config.finetune_epochs, lr=config.lr,
                               batch_size=config.batch_size, seed=config.seed + step, teacher=teacher,
                               schedule=config.schedule, progress=progress, on_epoch=lambda r: None)
        acc_ft = ft_history[-1]["test_acc"] if ft_history else acc_cmtf
        params = count_params(model)
        record = {
            "step": step,
            "block": block,
            "method": config.method,
            "basis": {"kind": type(config.basis).__name__, **dataclasses.asdict(config.basis)},
            "rank": int(module.W0[...].shape[0]) if isinstance(module, DecoupledMLP) else config.rank,
            "in_features": int(old.fc1.kernel[...].shape[0]) if isinstance(old, MLP) else None,
            "out_features": int(old.fc2.kernel[...].shape[1]) if isinstance(old, MLP) else None,
            "acc_original": acc_original,
            "acc_cmtf": acc_cmtf,
            "acc_ft": acc_ft,
            "accuracy_drop": 100 * metrics.accuracy_drop(acc_original, acc_ft),
            "params_model": params,
            "params_original": original_params,
            "params_mlp_old": old_params,
            "params_mlp_new": mlp_params(module),
            "savings_model": metrics.savings_percentage(params, original_params),
            "savings_mlp": metrics.savings_percentage(mlp_params(module), old_params),
            "seconds_compress": info.pop("seconds"),
            "seconds_finetune": time.perf_counter() - start,
            "finetune": ft_history,
            **info,
        }
        steps.append(record)
        if state_dir is not None:
            save_checkpoint(state_dir / "model.npz", model, {"run_id": run_id, "steps": steps})
            write_json_atomic(state_dir / "steps.json", {"run_id": run_id, "steps": steps})
        if progress:
            err = f"  Error(J) {record['error_J']:.2e}" if "error_J" in record else ""
            print(
                f"step {step}: block {block}  acc after {config.method} {acc_cmtf:.4f}  after FT {acc_ft:.4f}"
                f"  params {params}  savings {record['savings_model']:.2f} %{err}",
                file=sys.stderr, flush=True,
            )
        if on_step is not None:
            on_step(record)
    return steps
