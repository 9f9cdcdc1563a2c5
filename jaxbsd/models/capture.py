"""Sampling an MLP block's Jacobians at token vectors captured from real images.

Paper §5.3, step 2: choose a subset of the training data, run the network, and take the
chosen block's MLP inputs (one m-vector per token per image) as sampling points
x⁽ˢ⁾.  The tensor 𝒥 and the matrix F then come from the MLP alone:

    J[s] = ∂ mlp/∂x (x⁽ˢ⁾)   (S, m, m),     F[s] = mlp(x⁽ˢ⁾)   (S, m),

computed with ``jax.vmap(jax.jacfwd(f))`` where ``f`` is ``block.mlp`` turned into a pure
function with ``nnx.split`` / ``nnx.merge``.  Any module with the ``(..., m) -> (..., m)``
contract works (the original :class:`~jaxbsd.models.layers.MLP`, a ``DecoupledMLP``, …).

The model must provide ``model.blocks`` and ``model.block_input(images, i)``, and each
block ``block.mlp_input(x)`` (all of ViT, Swin, DeiT do, and the language model
:class:`~jaxbsd.models.LM`, whose "images" are ``(B, T)`` integer token ids).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["mlp_inputs", "capture", "mlp_function"]


def _check_block_index(model, block_index) -> None:
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "block_input"):
        raise ValueError(
            f"model must have .blocks and .block_input (ViT, Swin, DeiT), got {type(model).__name__}"
        )
    if not isinstance(block_index, (int, np.integer)) or isinstance(block_index, bool):
        raise ValueError(f"block_index must be an int, got {block_index!r}")
    if not 0 <= block_index < len(blocks):
        raise ValueError(f"block_index must lie in [0, {len(blocks)}), got {block_index}")


def _check_images(images) -> None:
    # (B, T) integer ids are the input of the language model (jaxbsd.models.lm), whose hooks
    # (blocks, block_input, mlp_input) are the same.
    ndim = getattr(images, "ndim", None)
    tokens = ndim == 2 and jnp.issubdtype(images.dtype, jnp.integer)
    if ndim != 4 and not tokens:
        raise ValueError(
            f"images must be an NHWC array (B, H, W, C) (or (B, T) integer tokens for a language "
            f"model), got shape {getattr(images, 'shape', None)}"
        )
    if images.shape[0] == 0:
        raise ValueError("images must hold at least one image")


@nnx.jit(static_argnums=2)
def _mlp_inputs_batch(model, images, index):
    x = model.blocks[index].mlp_input(model.block_input(images, index))
    return x.reshape(x.shape[0], -1, x.shape[-1])


def padded_batches(images, batch_size):
    """Yield ``(start, valid, chunk)``: fixed-size batches of ``images``, the last one
    zero-padded (``valid`` real rows), so a jitted step compiles once for all of them."""
    n = images.shape[0]
    size = min(batch_size, n)
    for start in range(0, n, size):
        chunk = np.asarray(images[start : start + size])
        valid = chunk.shape[0]
        if valid < size:
            chunk = np.concatenate([chunk, np.zeros((size - valid,) + chunk.shape[1:], chunk.dtype)])
        yield start, valid, chunk


def _batched_mlp_inputs(model, images, block_index, batch_size):
    """Yield ``(start, tokens)`` per batch; the last batch is padded to keep one compile."""
    for start, valid, chunk in padded_batches(images, batch_size):
        yield start, _mlp_inputs_batch(model, jax.device_put(chunk), int(block_index))[:valid]  # no compiled copy


def mlp_inputs(model, images, block_index: int, *, batch_size: int = 256) -> jax.Array:
    """Input tokens of ``model.blocks[block_index].mlp`` for each image.

    Args:
        model: a ViT, Swin or DeiT (put in eval mode: stochastic depth off).
        images: ``(B, H, W, C)``.
        block_index: which block.
        batch_size: images per forward pass.

    Returns:
        ``(B, T, m)``: T tokens per image (Swin's grid is flattened row-major).
    """
    _check_block_index(model, block_index)
    _check_images(images)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    return jnp.concatenate([t for _, t in _batched_mlp_inputs(model, images, block_index, batch_size)])


def mlp_function(module: nnx.Module) -> Callable[[jax.Array], jax.Array]:
    """A pure function ``x -> module(x)`` over a snapshot of the module's state.

    The module is split once; the returned function merges a fresh copy on each call,
    so JAX transformations (``jacfwd``, ``vmap``, ``jit``) see no Python side effects.
    """
    graphdef, state = nnx.split(module)

    def f(x):
        return nnx.merge(graphdef, state)(x)

    return f


@jax.jit(static_argnums=(0, 3))
def module_jacobians(graphdef, state, X, batch_size):
    """``(J, F)`` of the token-wise module ``nnx.merge(graphdef, state)`` at the rows of ``X``:
    ``J (S, n, m)`` by ``jax.jacfwd``, ``F (S, n)``, ``batch_size`` rows at a time."""

    def f(x):
        return nnx.merge(graphdef, state)(x)

    def one(x):
        return jax.jacfwd(f)(x), f(x)

    # lax.map with batch_size vmaps over chunks: bounded memory, no Python loop.
    return jax.lax.map(one, X, batch_size=batch_size)


def capture(model, images, block_index: int, num_samples: int, *, key: jax.Array, batch_size: int = 256):
    """Sampling points, Jacobians and outputs of block ``block_index``'s MLP.

    Runs the model on ``images`` (eval mode), draws ``num_samples`` of the B·T MLP input
    token vectors uniformly without replacement with ``key``, and evaluates the MLP
    and its Jacobian there.

    Args:
        model: a ViT, Swin or DeiT; ``model.blocks[block_index].mlp`` may be any module
            with the ``(..., m) -> (..., m)`` contract.
        images: ``(B, H, W, C)`` images (e.g. a random subset of the training set).
        block_index: which block.
        num_samples: S, at most B·T.
        key: a ``jax.random`` key for the draw.
        batch_size: images per forward pass and samples per Jacobian chunk.

    Returns:
        ``(X, J, F)`` with shapes ``(S, m)``, ``(S, m, m)``, ``(S, m)``:
        ``J[s] = ∂mlp/∂x (X[s])`` and ``F[s] = mlp(X[s])``, samples in the drawn order.
    """
    _check_block_index(model, block_index)
    _check_images(images)
    if not isinstance(num_samples, (int, np.integer)) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    model.eval()

    n_images = images.shape[0]
    batches = _batched_mlp_inputs(model, images, block_index, batch_size)
    start, first = next(batches)
    tokens = first.shape[1]
    total = n_images * tokens
    if num_samples > total:
        raise ValueError(
            f"num_samples ({num_samples}) exceeds the {total} token vectors available "
            f"({n_images} images × {tokens} tokens)"
        )
    drawn = np.asarray(jax.random.choice(key, total, (num_samples,), replace=False))
    order = np.argsort(drawn, kind="stable")
    wanted = drawn[order]  # sorted flat (image, token) indices

    # Keep only the drawn tokens of each batch, so memory is O(S·m), not O(B·T·m).
    pieces = []

    def keep(start, batch):
        lo, hi = np.searchsorted(wanted, [start * tokens, (start + batch.shape[0]) * tokens])
        if hi > lo:
            local = wanted[lo:hi] - start * tokens
            pieces.append(batch.reshape(-1, batch.shape[-1])[local])

    keep(start, first)
    for start, batch in batches:  # lazily: one batch of tokens alive at a time
        keep(start, batch)
    X_sorted = jnp.concatenate(pieces)
    X = X_sorted[np.argsort(order, kind="stable")]  # back to the drawn order

    graphdef, state = nnx.split(model.blocks[block_index].mlp)
    J, F = module_jacobians(graphdef, state, X, min(batch_size, num_samples))
    return X, J, F
