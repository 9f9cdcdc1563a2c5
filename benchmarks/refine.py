"""Refinement against decoupling: the time of the refinement stage per MLP, side by side.

Issue 37's budget: at the default settings (``jb.Refine()``: 300 Adam steps on minibatches of 512
of at most 16,384 calibration tokens, 20 % held out and evaluated once per epoch) the refinement of
one replacement costs at most 25 % of the decoupling's own time for that MLP (``jb.BSD()``: 300
sweeps, the warm start, restart chosen on held-out tokens). The full-batch loop (``batch_size=None``,
every training token at every step, the held-out tokens at every step: the studies' ``-ref300``)
is timed beside them, without a target. Measured on the two MLP shapes the studies compress — ViT/Fashion-MNIST
(``m = 64``, ``H = 256``, 4,352 calibration tokens) and DeiT/USPS (``m = 96``, ``H = 384``,
16,640 tokens) — at the rank a ρ = 0.5 training-free run gives them, in float32, compiled
(one warm-up round), the two timed alternately (:func:`benchmarks.common.interleaved`).

Usage::

    python benchmarks/refine.py                  # writes benchmarks/refine.json
    python benchmarks/refine.py --quick          # CI: one shape, fewer repeats, to a scratch file
"""

from __future__ import annotations

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.common import Row, format_table, interleaved, write_rows  # noqa: E402  (enables x64 first)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import jaxbsd as jb  # noqa: E402
from jaxbsd.compression.refine import refine_module  # noqa: E402
from jaxbsd.compression.sites import make_site  # noqa: E402
from jaxbsd.compression.specs import MLPSpec  # noqa: E402
from jaxbsd.models.layers import MLP  # noqa: E402

#: (name, m, H, calibration tokens, decoupling rank): the rank of a ρ = 0.5 training-free run.
SHAPES = (("ViT/Fashion-MNIST block", 64, 256, 4352, 40), ("DeiT/USPS block", 96, 384, 16640, 48))
TARGET = 0.25


def measure(name: str, m: int, H: int, tokens: int, rank: int, repeats: int) -> list[Row]:
    mlp = MLP(m, H, rngs=nnx.Rngs(0))
    X = jax.random.normal(jax.random.key(1), (tokens, m), jnp.float32)
    Y = mlp(X)
    site = make_site("mlp", mlp, MLPSpec("fc1", "fc2", mlp.activation), X, Y, max(128, 2 * rank), jax.random.key(2))
    method = jb.BSD()
    module = method.build(site, rank, jax.random.key(3)).module
    settings = {"refine": jb.Refine(), "refine_full_batch": jb.Refine(batch_size=None)}
    XY = (jnp.concatenate([site.check_X, site.fit_X]), jnp.concatenate([site.check_Y, site.fit_Y]))

    def decouple():
        out = method.build(site, rank, jax.random.key(3)).module
        jax.block_until_ready(nnx.state(out))

    infos = {}  # the report of each setting's last timed run (every run is the same computation)

    def refiner(key, refine):
        def run():
            out, infos[key] = refine_module(module, *XY, refine, jax.random.key(4))
            jax.block_until_ready(nnx.state(out))
        return run

    t = interleaved({"decouple": decouple, **{k: refiner(k, v) for k, v in settings.items()}}, repeats=repeats)
    rows = []
    for key, refine in settings.items():
        ratio = t[key]["median"] / t["decouple"]["median"]
        info = infos[key]
        default = key == "refine"
        rows.append(Row(
            name=(f"refinement{'' if default else ' (full batch)'} / decoupling, {name} "
                  f"(m={m}, H={H}, r={rank}, {tokens} tokens)"),
            ours=t[key]["median"], reference=t["decouple"]["median"], ratio=ratio,
            target=f"<= {TARGET}" if default else "", passed=ratio <= TARGET if default else None,
            note="ratio = refine / decouple (lower is better)", ratio_min=t[key]["min"] / t["decouple"]["min"],
            details={"refine": t[key], "decouple": t["decouple"], "settings": refine.to_dict(),
                     "sweeps": method.config.max_iter, "tokens_used": info["tokens_train"] + info["tokens_heldout"],
                     "batch_size": info["batch_size"], "evaluations": info["evaluations"],
                     "error_before": info["error_before"], "error_after": info["error_after"]}))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    shapes, repeats = (SHAPES[:1], 2) if args.quick else (SHAPES, 5)
    rows = [row for shape in shapes for row in measure(*shape, repeats=repeats)]
    print(format_table(rows))
    out = args.out or (pathlib.Path("/tmp/refine_quick.json") if args.quick else HERE / "refine.json")
    command = "python benchmarks/refine.py" + (" --quick" if args.quick else "")
    write_rows(out, command, args.quick, rows)
    return 0 if all(r.passed is not False for r in rows) or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
