"""Many devices: one program for a group of blocks, its block axis sharded over a mesh.

A *group* is a set of MLPs of one shape whose problems do not depend on one another (back to
front without fine-tuning, every MLP's inputs come from the original model). Their problems are
stacked on a leading block axis and solved by one program, ``jax.vmap`` over the blocks exactly as
the solver vmaps its restarts (:func:`run_blocks`). With a :class:`jax.sharding.Mesh` the block
axis is split over one of its axes with :func:`jax.shard_map` (each device vmaps its own blocks;
the results are gathered so that every process holds all of them); without one, the program runs
on the default device. Nothing here schedules work: JAX's runtime runs the SPMD program, on one
process or several (``jax.distributed``).

Random draws stay keyed per block (the MLP's index, as one block at a time), never per device, so
the answer does not depend on how the blocks are split.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxbsd.solver import driver
from jaxbsd.solver.cmtf import CMTFConfig, DecouplingResult, Problem
from jaxbsd.solver.decoupled import Decoupled

__all__ = ["Devices", "run_blocks", "decouple_group", "trace_count", "vectorized", "check_mesh",
           "group_bytes"]


@dataclasses.dataclass(frozen=True)
class Devices:
    """Where a group's program runs.

    Attributes:
      mesh: a :class:`jax.sharding.Mesh`, or None (the default device).
      axis: the mesh axis the block axis is split over (None: the mesh's first axis).
      max_blocks: the most blocks one device holds in one program (None: a whole group). A larger
        group is solved in chunks of ``max_blocks × size`` blocks, one program each (the chunks
        of one size share it): how a group that does not fit in a device's memory
        (:func:`group_bytes`) is run.
    """

    mesh: Mesh | None = None
    axis: str | None = None
    max_blocks: int | None = None

    @property
    def axis_name(self) -> str | None:
        if self.mesh is None:
            return None
        return self.axis if self.axis is not None else self.mesh.axis_names[0]

    @property
    def size(self) -> int:
        """Devices the block axis is split over (1 without a mesh)."""
        return 1 if self.mesh is None else int(self.mesh.shape[self.axis_name])

    @property
    def chunk(self) -> int | None:
        """The most blocks of one program (None: no limit)."""
        return None if self.max_blocks is None else self.max_blocks * self.size


def check_mesh(mesh, axis) -> Devices:
    """``compress_model``'s ``mesh=``/``mesh_axis=`` validated (``ValueError`` naming them)."""
    if mesh is None:
        if axis is not None:
            raise ValueError(f"mesh_axis={axis!r} needs a mesh (mesh=jax.sharding.Mesh(...))")
        return Devices()
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
    if axis is not None and axis not in mesh.axis_names:
        raise ValueError(f"mesh_axis must be one of the mesh's axes {mesh.axis_names}, got {axis!r}")
    # The same devices with automatic axes (``jax.make_mesh`` makes explicit ones): the captured
    # tokens, sharded by the data-parallel capture, are then indexed like any array.
    auto = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))
    return Devices(auto, axis)


#: How many times each group program has been traced in this process, by block function (a test reads it).
_TRACES: dict[str, int] = {}


def trace_count(what: str = "solver") -> int:
    """How many times a group program has been traced in this process: ``"solver"``
    (:func:`decouple_group`, once per group signature, or the decoupling and refinement of
    ``method="bsd"`` in one program) or ``"refine"`` (a refinement program of its own)."""
    names = {"solver": ("solve_block", "_solve_and_refine_block"), "refine": ("_refine_block",)}.get(what, (what,))
    return sum(_TRACES.get(name, 0) for name in names)


def _stack_on_host(members: list) -> Any:
    """Pytrees of one structure and shapes, stacked on a new leading axis as host arrays (what a
    mesh's global arrays are assembled from: no device program, so no compile per structure)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *members)


def _to_global(x, sharding: NamedSharding):
    """``x`` (the same host value on every process) as a global array with ``sharding``."""
    if not isinstance(x, (jax.Array, np.ndarray)):
        return x  # a Python number (a config's λ, say) stays a weakly typed constant of the program
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def vectorized(devices: "Devices") -> bool:
    """Whether a group's blocks are vmapped (accelerators: one batched program step for all
    blocks, as the restarts) or run one after the other (the CPU: the same arithmetic as one
    block at a time, one compile for the group; the CPU has no idle lanes for a batch to fill,
    and its batched LAPACK kernels are what :func:`jaxbsd.solver.linalg.batch_polymorphic` avoids).
    On the CPU without a mesh, :func:`run_blocks` runs the one-block program on each block in
    turn; with a mesh, each device's share is a ``lax.map`` inside the sharded program. Decided
    in Python from the devices the program runs on, so only the chosen form is traced and
    compiled."""
    platform = jax.default_backend() if devices.mesh is None else devices.mesh.devices.flat[0].platform
    return platform != "cpu"


@functools.lru_cache(maxsize=None)
def _program(fn: Callable, statics: tuple, mesh: Mesh | None, axis: str | None, vectorize: bool) -> Callable:
    """The jitted program ``(blocks, shared) -> outputs`` of ``fn(block, shared, **statics)``
    over the leading axis of ``blocks``, vmapped or ``lax.map``-ped (:func:`vectorized`), and
    shard-mapped over ``axis`` of ``mesh`` when there is one; cached, so a group signature is
    traced and compiled once."""
    one = _counted(fn, statics)

    def program(blocks, shared):
        if vectorize:
            return jax.vmap(one, in_axes=(0, None))(blocks, shared)
        return jax.lax.map(lambda block: one(block, shared), blocks)

    if mesh is None:
        return jax.jit(program)
    mapped = jax.shard_map(program, mesh=mesh, in_specs=(P(axis), P()), out_specs=P(axis), check_vma=False)
    # Gathered: every process (jax.distributed) ends with every block's result.
    return jax.jit(mapped, out_shardings=NamedSharding(mesh, P()))


@functools.lru_cache(maxsize=None)
def _one_block_program(fn: Callable, statics: tuple) -> Callable:
    """The jitted program ``(block, shared) -> output`` of ``fn(block, shared, **statics)`` for one
    block; cached, so a group signature is traced and compiled once."""
    return jax.jit(_counted(fn, statics))


def _counted(fn: Callable, statics: tuple) -> Callable:
    """``fn(block, shared, **statics)`` that counts its traces (:func:`trace_count`)."""
    one = functools.partial(fn, **dict(statics))

    def traced(block, shared):
        _TRACES[fn.__name__] = _TRACES.get(fn.__name__, 0) + 1  # Python runs once per trace
        return one(block, shared)

    traced.__name__ = traced.__qualname__ = fn.__name__  # the program's name in profiles: jit(<fn>)
    return traced


def run_blocks(fn: Callable, members: list, shared: Any, devices: Devices = Devices(), **statics) -> list:
    """``fn(block, shared, **statics)`` for every block of ``members`` (pytrees of one structure
    and shapes), as one program; one output per block.

    On the CPU without a mesh (:func:`vectorized`), the one-block program is compiled once and
    run on each block in turn. Otherwise the blocks are stacked on a leading block axis on the
    host and the outputs split there
    (numpy: no device program, so nothing to compile per group structure; stacking inside the
    group's program measured 2–3 s more compile on this CPU). With a mesh, the block axis is
    padded to a multiple of the devices on ``devices.axis`` (by repeating the last block; the
    copies are dropped) and split over them; ``shared`` is replicated. Inputs must be the same on
    every process (they are: every process of an SPMD run captured the same tokens), and the
    outputs are gathered onto every device.
    """
    if devices.mesh is None and not vectorized(devices):
        # The CPU without a mesh: the one-block program, compiled once for the group and run on
        # each block in turn (a lax.map over the blocks in one program did the same arithmetic but
        # took XLA ~1.7x longer to compile than the one-block programs: benchmarks/grouped.py).
        one = _one_block_program(fn, tuple(sorted(statics.items())))
        return [one(jax.device_put(member), shared) for member in members]
    program = _program(fn, tuple(sorted(statics.items())), devices.mesh, devices.axis_name, vectorized(devices))
    G = len(members)
    blocks = _stack_on_host(members)
    if devices.mesh is None:
        out = program(jax.device_put(blocks), shared)
    else:
        pad = (-G) % devices.size
        if pad:
            blocks = jax.tree_util.tree_map(lambda a: np.concatenate([a, np.repeat(a[-1:], pad, axis=0)]), blocks)
        split = NamedSharding(devices.mesh, P(devices.axis_name))
        whole = NamedSharding(devices.mesh, P())
        blocks = jax.tree_util.tree_map(lambda a: _to_global(a, split), blocks)
        shared = jax.tree_util.tree_map(lambda a: _to_global(a, whole), shared)
        out = program(blocks, shared)
    # Brought back as this process's own arrays (under jax.distributed the program's outputs are
    # global arrays, gathered on every device, which the host code after it cannot mix with its
    # own). device_put, not jnp.asarray: the latter compiles a copy program per shape.
    host = jax.tree_util.tree_map(np.asarray, out)
    return [jax.tree_util.tree_map(lambda a, i=i: jax.device_put(a[i]), host) for i in range(G)]


def solve_block(block, shared, *, restarts: int, batch: str) -> DecouplingResult:
    """One block's whole solve (restarts, warm start, selection by objective): what
    :func:`jaxbsd.decouple` compiles for one problem, without the progress hook."""
    key_data, problem, init = block
    config = shared
    keys = driver.restart_keys(jax.random.wrap_key_data(key_data), restarts)
    return driver.decouple_compiled(keys, problem, config, jnp.int32(0), jnp.int32(0), init, batch=batch,
                                     report=False, warm_only=restarts == 0)


def decouple_group(problems: list[Problem], config: CMTFConfig, keys: list[jax.Array], inits: list[Decoupled] | None,
                   *, restarts: int, devices: Devices = Devices()) -> list[DecouplingResult]:
    """:func:`jaxbsd.decouple` of several problems of one shape, as one program.

    Args:
      problems: validated :class:`~jaxbsd.solver.cmtf.Problem` of one structure and shape (:func:`jaxbsd.problem`).
      config: the solver configuration (one rank for all).
      keys: one key per problem, exactly the key :func:`jaxbsd.decouple` would get for it.
      inits: one warm start per problem (validated, in the problems' dtype), or None.
      restarts: random restarts per problem (0: the warm starts alone; ``inits`` must then be given).
      devices: where the program runs.

    Returns:
      one :class:`~jaxbsd.DecouplingResult` per problem, what ``decouple(..., key=keys[i],
      restarts=restarts, init=inits[i], shard=None)`` returns up to rounding.
    """
    batch = driver.restart_batching(None, restarts)
    members = [(jax.random.key_data(k), prob, None if inits is None else inits[i])
               for i, (k, prob) in enumerate(zip(keys, problems))]
    return run_blocks(solve_block, members, config, devices, restarts=restarts, batch=batch)


def group_bytes(G: int, S: int, n: int, m: int, rank: int, restarts: int, dof: int, *, hidden: int | None = None,
                max_iter: int = 0, itemsize: int = 4, vectorize: bool = True) -> int:
    """An estimate of the peak bytes of a group's solve on one device (the memory model).

    ``P = S·m + S·n + jac`` elements per block (``X``, ``F`` and the Jacobian: dense ``S·n·m``,
    structured ``S·H + H·(n + m)``); the device holds the blocks' problems and their stacked copy,
    the program's argument (``2·G·P``), and per block solved at once the solve's temporaries
    ``T = 1.5·P + (R + 1)·(16·S·r·ν + 24·r·(n + m))`` (``R`` restarts and the warm start:
    the iterate, the best one, the sweep's design matrices ``(r, S, ν)`` and the factor updates).
    ``vectorize`` (an accelerator's vmapped program) holds ``G`` blocks' temporaries at once, the
    CPU's ``lax.map`` one. ``max_iter`` (the history, ``2·max_iter`` per restart) is negligible and
    only kept in the signature for callers that pass it.

    The coefficients are fitted to ``compiled.memory_analysis()`` (arguments, outputs and
    temporaries, plus the blocks' own problems beside the stacked argument) of 20 problem shapes
    (S 128–1024, m 16–128, H 64–512, r 4–32, R 1–4) with ``G`` = 1 and 2, and scaled to bound
    them: the vmapped program's measurement was 0.22–0.97 times the estimate (an upper estimate,
    up to 4.5× generous on the smallest shapes), the CPU program's 0.22–1.14 times.
    ``tests/test_grouped.py`` checks two shapes in both forms. XLA's buffer assignment is not a
    formula of the sizes; keep a margin when choosing a chunk size from it.
    """
    jac = S * n * m if hidden is None else S * hidden + hidden * (n + m)
    problem = S * m + S * n + jac
    temporaries = 1.5 * problem + (restarts + 1) * (16 * S * rank * dof + 24 * rank * (n + m))
    held = 2 * G * problem
    return int(itemsize * (held + (G if vectorize else 1) * temporaries))

