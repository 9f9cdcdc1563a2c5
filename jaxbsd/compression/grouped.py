"""Grouped compression: the MLPs of one shape solved as one program, when none depends on another.

Back to front without fine-tuning between blocks (the paper's order, and ``order="independent"``),
every MLP is fed by the original model: a block is compressed only after every block downstream
of it, and nothing upstream of it has changed. So the planning capture (one forward pass) holds
every MLP's tokens, and the MLPs of one shape and rank — a *group* — can be solved together: their
problems stacked on a leading block axis and solved by one program, vmapped like the restarts
(:func:`jaxbsd.compression.devices.run_blocks`), its block axis sharded over a mesh when one is
given. A group holds

* the decoupling, its random restarts, its warm start and the selection of a restart (by the
  objective; the held-out selection inside the program where the engine refines, after it
  otherwise);
* ``auto``'s two candidates, and the refinement of each (one program per candidate kind);
* the engine's refinement stage (one program for the group's replacements; for ``method="bsd"``
  with a mesh or on an accelerator, the decoupling's own program, which solves, keeps a restart and
  refines it: one compile for the group, :func:`_bsd_refined_group`; on the CPU without a mesh the
  solve's program then the refinement's, each compiled once, which XLA compiles faster than the
  fused one: :func:`fuses`).

Host computations stay per block: the pruning's float64 least squares (and the warm start built
from it), the low-rank baselines' SVDs (each a jitted program compiled once per shape, not per
block), the report's errors.

What changes nothing: random draws keyed per block by the MLP's index (exactly the keys of one
block at a time), the tokens (the planning capture is what a recapture before each step would
give, the MLP's inputs being the original model's), so a grouped run returns the models of one
block at a time up to rounding (``tests/test_grouped.py`` checks it per method).

What the model judge of ``method="auto"`` sees: the whole model with the candidate in place, the
MLPs of groups finished before in place, and **every other MLP of its own group original** (one
block at a time, the MLPs replaced before it in the order are in place). The block judge is exact.

Why front to back, and any run with ``finetune`` between blocks, stays one MLP at a time: there
each step changes what the next MLP is fed (the replaced blocks upstream, the fine-tuned weights),
so step ``k + 1``'s problem exists only once step ``k`` is done.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.compression import refine as refine_mod
from jaxbsd.compression.devices import Devices, solve_block, run_blocks
from jaxbsd.compression.methods.bsd import BSD
from jaxbsd.compression.refine import refine_group
from jaxbsd.compression.methods import Built
from jaxbsd.compression.sites import Site, param_dtype, same_site, selection_tokens
from jaxbsd.compression.surgery import output_judge
from jaxbsd.solver.driver import restart_batching
from jaxbsd.solver.bases import Augmented
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.compression.methods.warm_start import relative_output_error

__all__ = ["build", "build_together", "fuses", "FUSE", "SEQUENTIAL_REASONS", "INDEPENDENT"]

#: ``order=`` asking for every MLP to be compressed on the original model (grouped, back to front).
INDEPENDENT = "independent"

#: Why a run goes one MLP at a time (the report's ``group``).
SEQUENTIAL_REASONS = {
    "front-to-back": "front to back: each replacement changes the inputs of the MLPs after it",
    "finetune": "finetune between blocks: each step's fine-tuning changes what the next MLP is fed",
    "order": "an explicit order of paths: it may put an MLP after one upstream of it",
    "group=False": "group=False: one MLP at a time was asked for",
}


def _solve_and_refine_block(block, shared, *, restarts: int, batch: str, selection: str, dtype: str,
                            steps: int, refine_batch: int | None, eval_every: int):
    """One block's decoupling and refinement in one program: the solve (restarts, warm start,
    :func:`jaxbsd.compression.devices.solve_block`), every restart's output error on the
    selection tokens and the restart kept (as :func:`jaxbsd.compression.methods.warm_start.choose_restart`: the
    lowest finite error, the lower index on ties, by objective if none is finite), its
    :class:`DecoupledMLP` in ``dtype``, and the refinement loop on it
    (:func:`jaxbsd.compression.refine.refine_loop`)."""
    key_data, prob, init, X_sel, Y_sel, X_train, Y_train, X_held, Y_held, refine_key = block
    config, learning_rate = shared
    res = solve_block((key_data, prob, init), config, restarts=restarts, batch=batch)
    count = res.restarts.objective.shape[0]
    errors = jax.vmap(lambda i: relative_output_error(res.restart_model(i), X_sel, Y_sel))(jnp.arange(count))
    finite = jnp.isfinite(errors)
    errors = jnp.where(finite, errors, jnp.inf)
    chosen = res.best_restart if selection == "objective" else jnp.where(finite.any(), jnp.argmin(errors),
                                                                         res.best_restart)
    module = DecoupledMLP.from_decoupled(res.restart_model(chosen), dtype=jnp.dtype(dtype))
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    best, refine_errors, best_step = refine_mod.refine_loop(
        graphdef, params, rest, X_train, Y_train, X_held, Y_held, learning_rate,
        jax.random.wrap_key_data(refine_key), steps=steps, batch=refine_batch, eval_every=eval_every)
    return res, errors, chosen, rest, best, refine_errors, best_step


def _bsd_refined_group(method: BSD, sites: list[Site], ranks: list, keys: list, refiners: list,
                       devices: Devices) -> list[tuple] | None:
    """The decouplings of ``sites`` and the engine's refinement of each, as **one** program
    (:func:`_solve_and_refine_block` over a leading block axis): what :meth:`BSD.build_group`
    then :func:`refine_group` return, up to rounding, with one compile for the group instead of
    two. None where the blocks cannot share it (a block without a warm start, problems or tokens
    of different shapes): the caller then takes the two-program path."""
    start = time.perf_counter()
    preps, problems, inits = method.group_inputs(sites, ranks)
    if any(init is None for init in inits):  # the refinement's template is the warm start's module
        return None
    dtype = param_dtype(sites[0].module, sites[0].X.dtype)
    # The refinement's operands as refine_module prepares them; the parameters (and the knots, in
    # ``rest``) come from the program's chosen restart, the template only fixes their structure.
    staged = [refine_mod.prepare_refinement(DecoupledMLP.from_decoupled(init, dtype=dtype), r.X, r.Y, r.config, r.key, r.held)
              for init, r in zip(inits, refiners)]
    chosen_tokens = [selection_tokens(site) for site in sites]
    blocks = [(jax.random.key_data(key), prob, init, jnp.asarray(X), jnp.asarray(Y), *prep.operands[2:6],
               jax.random.key_data(prep.operands[7]))
              for key, prob, init, (X, Y, _), prep in zip(keys, problems, inits, chosen_tokens, staged)]

    def signature(i):
        leaves = jax.tree_util.tree_leaves(blocks[i])
        return (jax.tree_util.tree_structure(blocks[i]), tuple((jnp.shape(a), jnp.result_type(a)) for a in leaves),
                preps[i][2], staged[i].graphdef, staged[i].batch, staged[i].every, refiners[i].config)

    if any(signature(i) != signature(0) for i in range(1, len(sites))):
        return None
    first = staged[0]
    out = run_blocks(_solve_and_refine_block, blocks, (preps[0][2], first.operands[6]), devices,
                     restarts=method.restarts, batch=restart_batching(None, method.restarts),
                     selection=method.selection, dtype=jnp.dtype(dtype).name, steps=refiners[0].config.steps,
                     refine_batch=first.batch, eval_every=first.every)
    share = (time.perf_counter() - start) / len(sites)
    builds = []
    for site, prep, init, stage, refiner, (res, errors, _, rest, best, refine_errors, best_step) in zip(
            sites, preps, inits, staged, refiners, out):
        jac, kind, _, _, skipped = prep
        built = method.finish(site, res, True, kind, skipped, time.perf_counter(),
                              output_errors=np.asarray(errors, np.float64))
        stage = dataclasses.replace(stage, operands=(best, rest, *stage.operands[2:]))
        module, refine_info = refine_mod.finish_refinement(stage, refiner.config, best, refine_errors, best_step,
                                                 time.perf_counter())
        refine_info["seconds"] = 0.0
        refine_info["program"] = "the decoupling's (one program for the solve and the refinement)"
        # The group's one program, shared evenly: the solve and the refinement.
        builds.append(built.replace(module=module, refine=refine_info, seconds=built.seconds + share))
    return builds


#: Whether ``method="bsd"`` refined by the engine runs as the one fused program of
#: :func:`_bsd_refined_group`: None (the default) as :func:`fuses` decides from the devices; True or
#: False forces it (the tests, and ``benchmarks/grouped.py``'s ``fused`` mode, set it on the CPU).
FUSE: bool | None = None


def fuses(method, refined: bool, devices: Devices, platform: str | None = None, force: bool | None = None) -> bool:
    """Whether a group of ``method``'s builds, refined by the engine or not (``refined``), runs as one
    program for the solve and the refinement (:func:`_bsd_refined_group`) rather than the group's
    solve program then its refinement program.

    Only ``method="bsd"`` refined has the fused program, and not a best-iterate or containing one. With a mesh, or on an accelerator, it is
    used: one compile and one sharded or batched program for the group. On the CPU without a mesh
    (``platform``: the backend the group runs on; None: ``jax.default_backend()``) there is no
    device parallelism for it to gain, the blocks running one after the other either way
    (:func:`jaxbsd.compression.devices.run_blocks`), and XLA compiles the fused program more slowly
    than the two it joins (``benchmarks/grouped.py``'s ``fused`` mode against ``grouped``): the
    group then runs the solve's program and the refinement's, each compiled once for the group.
    ``force`` (default :data:`FUSE`): True or False decides regardless of the devices."""
    # A best-iterate solve (the decoupling that contains pruning's too: ``contain``) runs one site at a time
    # with its held-out tokens (``BSD.build_group``), and one in an MLP-form basis becomes an MLP there
    # (``BSD.build_mlp``); the fused program does neither.
    if type(method) is not BSD or not refined or method.best_iterate or method.contain:
        return False
    if isinstance(method.config.basis, Augmented) and method.config.basis.is_mlp:
        return False
    force = FUSE if force is None else force
    if force is not None:
        return bool(force)
    if devices.mesh is not None:
        return True
    return (platform or jax.default_backend()) != "cpu"


def _fused(method, pending, sites, rank_of, build_key, refiners, devices) -> list[tuple] | None:
    """The builds of :func:`_bsd_refined_group` for ``method="bsd"`` refined by the engine where
    :func:`fuses` says so, else None."""
    if not fuses(method, all(refiners[s] is not None for s, _ in pending), devices):
        return None
    return _bsd_refined_group(method, [sites[p] for _, p in pending], [rank_of[p] for _, p in pending],
                              [build_key(p, s) for s, p in pending], [refiners[s] for s, _ in pending], devices)


def build(model, plan, members: list[tuple[int, str]], sites: dict[str, Site], rank_of: dict[str, Any], cache: dict,
          judges: dict[int, tuple], refiners: dict[int, Any], build_key: Callable[[str, int], jax.Array]) -> dict[int, Built]:
    """``{step: built}``: each member's replacement as its method builds it, the greedy allocation's
    build reused where it is exactly this one (``cache``: ``{(path, rank): (site, built)}``), one MLP
    in the program of one block at a time, several as one program per kind (:func:`build_together`).

    Args:
      model: the model (original, but for the MLPs already replaced): what the model judges of
        ``method="auto"`` see; plan: the engine's :class:`~jaxbsd.compression.engine.Plan`.
      members: the ``(step, path)`` of one group, in step order; sites: their sites; rank_of: the ranks.
      judges: by step, what the model judge uses; refiners: by step, the engine's refinement or None.
      build_key: ``(path, step) -> key`` of the method's randomness.
    """
    method = plan.method
    builds: dict[int, Built] = {}
    pending = []
    for step, path in members:
        hit = cache.get((path, rank_of[path]))
        if hit is not None and same_site(hit[0], sites[path]) and not (refiners[step] and method.refines_candidates):
            builds[step] = hit[1]  # the greedy allocation already built exactly this
        else:
            pending.append((step, path))
    if len(pending) > 1:
        builds.update(build_together(model, plan, pending, sites, rank_of, build_key, judges, refiners))
    elif pending:  # one MLP: the program of one block at a time
        step, path = pending[0]
        judge = output_judge(model, path, *judges[step]) if step in judges else None
        builds[step] = method.build(sites[path], rank_of[path], build_key(path, step), judge=judge,
                                    refine=refiners[step] if method.refines_candidates else None)
    return builds


def build_together(model, plan, pending: list[tuple[int, str]], sites: dict[str, Site], rank_of: dict[str, Any],
                   build_key: Callable[[str, int], jax.Array], judges: dict[int, tuple],
                   refiners: dict[int, Any]) -> dict[int, Built]:
    """``{step: built}``: the replacements of several MLPs of one group, built as one program
    per kind — for ``method="bsd"`` refined by the engine where :func:`fuses` says so, the solve
    and the refinement in one (:func:`_bsd_refined_group`, whose builds come back refined); else
    the method's :meth:`~jaxbsd.compression.methods.Method.build_group` (the engine's refinement
    stage then refines them, :func:`jaxbsd.compression.refine.refine_stage`).

    Args:
      model: the model (original, but for the groups already finished and put in place): what the
        model judges of ``method="auto"`` see.
      plan: the engine's :class:`~jaxbsd.compression.engine.Plan` (its ``devices`` run the programs).
      pending: the ``(step, path)`` to build, in step order.
      sites: every MLP's planning site; rank_of: the planned ranks.
      build_key: ``(path, step) -> key`` of the method's randomness.
      judges: by step, what the model judge uses; refiners: by step, the engine's refinement or None.
    """
    method, devices = plan.method, plan.devices
    fused = _fused(method, pending, sites, rank_of, build_key, refiners, devices)
    if fused:
        return dict(zip([s for s, _ in pending], fused))
    refs = [refiners[s] for s, _ in pending]
    results = method.build_group(
        [sites[p] for _, p in pending], [rank_of[p] for _, p in pending], [build_key(p, s) for s, p in pending],
        judges=[output_judge(model, p, *judges[s]) if s in judges else None for s, p in pending],
        refiners=refs if method.refines_candidates and all(r is not None for r in refs) else None,
        refine_group=lambda modules, rs: refine_group(modules, rs, devices), devices=devices)
    return dict(zip([s for s, _ in pending], results))
