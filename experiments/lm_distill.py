"""Label-free distillation of the compressed character LM, paired with refinement alone.

The compression is a unit of ``experiments/lm_compression.py`` (its gated LM, every MLP back to
front at a whole-model reduction ρ by ``jb.compress_model``, refined: ``prune-ref300`` by default;
the same calibration windows, samples and key, so its training-free bits per character are that
study's). The compressed LM is then trained towards the original LM's next-character logits (KL,
T = 2) on ``distill_windows`` further windows of the training text (another draw; the text's next
characters are never read as targets, only the original model's predictions are), through
:func:`jaxbsd.compression.distill.distill_model`. Test bits per character on the study's test
subset, refined and distilled: the pairing.

Usage::

    python experiments/lm_distill.py            # rho = 0.1 / 0.2 / 0.35, refined pruning, 3 seeds
    python experiments/lm_distill.py --quick    # CI: the study's tiny LM, 10 steps

Writes ``<out>/lm_distill.json`` (``lm_distill_quick.json``), resuming unit by unit
(``<out>/state/lm_distill/<unit>/unit.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxbsd as jb
from jaxbsd.compression.distill import DISTILL_STREAM, distill_model, teacher_outputs
from jaxbsd.data import load_text_dataset
from jaxbsd.models import count_params
from jaxbsd.evaluation import evaluate_lm
from jaxbsd.checkpoint import load_checkpoint

import lm_compression as lmc
from checkout import RESULTS, enable_compilation_cache
from output import Timer, command_line, machine, write_json
from refinement import Refinement, Setting
from units import resume_unit, save_unit

FULL = dict(study=lmc.FULL, budgets=(0.1, 0.2, 0.35), methods=(Setting("prune", Refinement(300)),), seeds=3, distill_windows=4096, steps=3000,
            batch=16, learning_rate=1e-3, schedule="cosine", temperature=2.0)
QUICK = dict(FULL, study=lmc.QUICK, seeds=1, distill_windows=64, steps=10, batch=8)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--budgets", type=float, nargs="+")
    parser.add_argument("--methods", nargs="+", type=Setting.parse)
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--steps", type=int)
    args = parser.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    for name in ("budgets", "methods", "seeds", "steps"):
        if (value := getattr(args, name)) is not None:
            plan[name] = tuple(value) if isinstance(value, list) else value
    study = plan["study"]
    stem = "lm_distill_quick" if args.quick else "lm_distill"
    command = command_line("lm_distill.py", argv)
    enable_compilation_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    wall = Timer()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    data = load_text_dataset("pystdlib", limit=study["limit"])
    paths, model_info = lmc.models_for(study, data, args.out, log)
    original = load_checkpoint(paths["gated"])[0]
    context = original.config.context
    test_ids, _ = lmc.test_subset(data.test, study["test_chars"], study["test_segments"])
    bpc_original = evaluate_lm(original, test_ids)
    P = count_params(original)
    order = list(range(original.config.depth))[::-1][: study["blocks"] or None]
    mlps = [f"blocks.{i}.mlp" for i in order]
    mlp_params = [count_params(original.blocks[i].mlp) for i in order]
    log(f"lm: {P} parameters, test {bpc_original:.4f} bpc on {len(test_ids)} characters")

    records = []
    for rho in plan["budgets"]:
        num_samples = lmc.samples_for(P, mlp_params, original.config, rho, study)
        for setting in plan["methods"]:
            method = setting.name
            base, refine = lmc.refine_of(setting)
            for seed in range(plan["seeds"]):
                name = f"{method}-dist-rho{int(round(1000 * rho)):04d}-seed{seed}"
                config = jb.Distill(loss="kl", temperature=plan["temperature"], steps=plan["steps"],
                                    batch_size=plan["batch"], learning_rate=plan["learning_rate"],
                                    schedule=plan["schedule"])
                tag = json.dumps({"method": method, "rho": rho, "seed": seed, "num_samples": num_samples,
                                  "study": {k: study[k] for k in ("calib_windows", "max_iter", "limit", "test_chars",
                                                                  "test_segments")},
                                  "distill": config.to_dict(), "distill_windows": plan["distill_windows"]},
                                 sort_keys=True)
                state = args.out / "state" / stem / name
                if (kept := resume_unit(state, tag, name, log)) is not None:
                    records.append(kept)
                    continue
                timer = Timer()
                calib = jnp.asarray(lmc.calibration_windows(data.train, study["calib_windows"], context, seed))
                model, report = jb.compress_model(load_checkpoint(paths["gated"])[0], calib, mlps=mlps, reduction=rho, method=jb.get_method(base, config=lmc.solver_config(study) if base in ("bsd", "auto") else None, **lmc.paper_basis(base), num_samples=num_samples), key=jax.random.key(seed), refine=refine)
                bpc_refined = evaluate_lm(model, test_ids)
                seconds_compress = timer()
                windows = jnp.asarray(lmc.calibration_windows(data.train, plan["distill_windows"], context,
                                                              10_000 + seed))
                targets = teacher_outputs(original, windows)
                info = distill_model(model, windows, targets, [r.path for r in report.mlps], config,
                                     jax.random.fold_in(jax.random.key(seed), DISTILL_STREAM))
                bpc = evaluate_lm(model, test_ids)
                record = dict(method=method, reduction=rho, seed=seed, params=report.params_after,
                              bpc_original=bpc_original, bpc_refined=bpc_refined, bpc=bpc,
                              gap_refined=bpc_refined - bpc_original, gap=bpc - bpc_original, distill=info,
                              distill_windows=int(windows.shape[0]), seconds_compress=seconds_compress,
                              seconds_distill=info["seconds"], seconds=timer(), machine=machine())
                save_unit(state / "unit.json", tag, record)
                records.append(record)
                log(f"  {name}: {bpc_refined:.4f} bpc refined -> {bpc:.4f} distilled (original {bpc_original:.4f}; "
                    f"held-out loss {info['loss_before']:.4g} -> {info['loss_after']:.4g}, step {info['steps_kept']}), "
                    f"{timer():.0f} s")
    rows = []
    for rho in plan["budgets"]:
        for method in (m.name for m in plan["methods"]):
            rs = [r for r in records if r["method"] == method and r["reduction"] == rho]
            if rs:
                rows.append(dict(method=method, reduction=rho, seeds=[r["seed"] for r in rs],
                                 gap_refined_mean=float(np.mean([r["gap_refined"] for r in rs])),
                                 gap_mean=float(np.mean([r["gap"] for r in rs])),
                                 bpc_mean=float(np.mean([r["bpc"] for r in rs])),
                                 bpc_refined_mean=float(np.mean([r["bpc_refined"] for r in rs]))))
    write_json(args.out / f"{stem}.json", {
        "command": command, "plan": dict(plan, study=dataclasses.asdict(study) if dataclasses.is_dataclass(study)
                                         else study),
        "model": model_info, "bpc_original": bpc_original, "test_characters": len(test_ids), "rows": rows,
        "runs": records, "wall_seconds": wall(), "machines": sorted({r["machine"] for r in records})})
    log(f"wrote {args.out / (stem + '.json')} ({len(records)} units, {wall():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
