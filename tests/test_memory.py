"""Flat memory over repeated compressions in one process, and one compile per program shape.

Oracles: XLA's own compile log (``jax_log_compiles``: every backend compile names its program) and
the process's resident set size (``/proc/self/statm``), not the code's own counters alone.
"""

from __future__ import annotations

import collections
import gc
import logging
import os

import jax
import numpy as np
import pytest
from bert_reference import WORDS, write_tiny_bert
from residual_stack import ResidualStack
from flax import nnx

import jaxbsd as jb
from jaxbsd import evaluation
from jaxbsd.compression import refine
from jaxbsd.models import bert as B



class _Compiles(logging.Handler):
    """Counts XLA compiles by program name from JAX's compile log."""

    def __init__(self):
        super().__init__()
        self.names = collections.Counter()

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling "):
            self.names[message.split()[1]] += 1


@pytest.fixture
def compiles():
    handler, log = _Compiles(), logging.getLogger("jax")
    log.addHandler(handler)
    before = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)
    try:
        yield handler.names
    finally:
        jax.config.update("jax_log_compiles", before)
        log.removeHandler(handler)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow  # four load-compress-evaluate rounds: ~15 s of CPU
def test_a_second_load_compress_and_evaluate_compiles_nothing_but_the_capture(tmp_path, compiles):
    # Each iteration loads the encoder afresh (a new tokenizer object), prunes it, evaluates it: the
    # programs of the first iteration must serve the later ones (a program keyed by an object that
    # dies with the iteration would compile again, and stay in the cache: memory growth per call).
    path = write_tiny_bert(tmp_path / "m")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=10)) + "." for _ in range(40)]
    pairs = [(t[:12], t) for t in texts[:16]]
    reference = evaluation.embed_eval_set(B.from_pretrained(path), texts[:24], pairs)
    per_iteration, rss = [], []
    for _ in range(4):
        compiles.clear()
        encoder = B.from_pretrained(path)
        ids = B.calibration_windows(encoder, texts, 16, 6, seed=0)
        mask = np.ones_like(ids)
        encoder, _ = jb.compress_model(encoder, lambda m: m(ids, mask), key=jax.random.key(0), mlps=None,
                                       method="prune", reduction=0.1)
        evaluation.fidelity(reference, evaluation.embed_eval_set(encoder, texts[:24], pairs))
        del encoder
        gc.collect()
        per_iteration.append({k: v for k, v in compiles.items() if k != "jit(recording_forward)"})
        rss.append(_rss_mb())
    # The capture traces the caller's own calibration function (a new closure each call): it alone
    # may compile again, and its program dies with the call.
    assert per_iteration[0] and per_iteration[1:] == [{}] * 3, per_iteration
    assert rss[-1] - rss[1] < 20, rss  # MB over two iterations: a program kept per call measured more


def _Twelve(rngs):
    return ResidualStack(12, 8, 16, rngs)


@pytest.mark.slow  # twelve MLPs one at a time, refined: ~30 s on CI's CPU
def test_twelve_same_shape_mlps_compile_each_program_once(compiles):
    x = jax.random.normal(jax.random.key(1), (8, 16, 8))
    traces = refine.trace_count()
    jb.compress_model(_Twelve(nnx.Rngs(0)), x, key=jax.random.key(0), mlps=None, method="prune", reduction=0.3,
                      refine=jb.Refine(steps=20))
    assert refine.trace_count() - traces == 1
    assert compiles["jit(refine_loop)"] == 1
    # Every program of the per-MLP work (token draws, kept-unit fits, errors, refinement) compiles at
    # most once per token count and dtype it sees (sampling points, check tokens, probe): never once
    # per MLP (12). The capture compiles once: the discovery's forward pass is the plan's capture, and
    # back to front every step takes its planning tokens (a capture a step would run a model of its
    # own structure, the later MLPs pruned, and compile 13 times).
    per_mlp = {k: v for k, v in compiles.items() if k != "jit(recording_forward)"}
    assert max(per_mlp.values()) <= 4, sorted(per_mlp.items(), key=lambda kv: -kv[1])[:5]
    assert compiles["jit(recording_forward)"] == 1
