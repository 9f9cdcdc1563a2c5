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

from jaxbsd import driver
from jaxbsd.cmtf import CMTFConfig, DecouplingResult, Problem
from jaxbsd.decoupled import Decoupled

__all__ = ["Devices", "run_blocks", "decouple_group", "trace_count", "stack", "unstack", "check_mesh",
           "group_bytes", "shard_batch"]


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
    (:func:`decouple_group`, once per group signature) or ``"refine"``."""
    return _TRACES.get({"solver": "_solve_block", "refine": "_refine_block"}.get(what, what), 0)


@jax.jit  # one program per group signature, not one eager op (and compile) per leaf
def stack(trees: list) -> Any:
    """Pytrees of one structure and shapes, stacked on a new leading axis."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


@functools.partial(jax.jit, static_argnums=1)  # one program, as stack
def unstack(tree: Any, count: int) -> list:
    """The ``count`` members of a pytree stacked on its leading axis."""
    return [jax.tree_util.tree_map(lambda a, i=i: a[i], tree) for i in range(count)]


def _to_global(x, sharding: NamedSharding):
    """``x`` (the same host value on every process) as a global array with ``sharding``."""
    if not isinstance(x, (jax.Array, np.ndarray)):
        return x  # a Python number (a config's λ, say) stays a weakly typed constant of the program
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _over_blocks(one: Callable, blocks, shared):
    """``one(block, shared)`` for every block: vmapped on accelerators (one batched program step
    for all blocks, as the restarts), one block after the other inside the program on the CPU
    (``lax.map``: the same arithmetic as one block at a time, one compile and one dispatch for
    the group; the CPU has no idle lanes for a batch to fill, and its batched LAPACK kernels are
    what :func:`jaxbsd.cmtf._batch_polymorphic` avoids)."""
    def mapped(blocks, shared):
        return jax.lax.map(lambda block: one(block, shared), blocks)

    def vmapped(blocks, shared):
        return jax.vmap(one, in_axes=(0, None))(blocks, shared)

    return jax.lax.platform_dependent(blocks, shared, cpu=mapped, default=vmapped)


@functools.lru_cache(maxsize=None)
def _program(fn: Callable, statics: tuple, mesh: Mesh | None, axis: str | None) -> Callable:
    """The jitted program ``(blocks, shared) -> outputs`` of ``fn(block, shared, **statics)``
    over the leading axis of ``blocks`` (:func:`_over_blocks`; shard-mapped over ``axis`` of
    ``mesh``); cached, so a group signature is traced and compiled once."""
    one = functools.partial(fn, **dict(statics))

    def program(blocks, shared):
        _TRACES[fn.__name__] = _TRACES.get(fn.__name__, 0) + 1  # Python runs once per trace
        return _over_blocks(one, blocks, shared)

    if mesh is None:
        return jax.jit(program)
    mapped = jax.shard_map(program, mesh=mesh, in_specs=(P(axis), P()), out_specs=P(axis), check_vma=False)
    # Gathered: every process (jax.distributed) ends with every block's result.
    return jax.jit(mapped, out_shardings=NamedSharding(mesh, P()))


def run_blocks(fn: Callable, blocks: Any, shared: Any, devices: Devices = Devices(), **statics) -> Any:
    """``fn(block, shared, **statics)`` for every block of ``blocks`` (leaves stacked on a leading
    block axis ``G``), as one program; the outputs stacked on the block axis.

    With a mesh, the block axis is padded to a multiple of the devices on ``devices.axis`` (by
    repeating the last block; the copies are dropped) and split over them; ``shared`` is
    replicated. Inputs must be the same on every process (they are: every process of an SPMD run
    captured the same tokens), and the outputs are gathered onto every device.
    """
    G = jax.tree_util.tree_leaves(blocks)[0].shape[0]
    program = _program(fn, tuple(sorted(statics.items())), devices.mesh, devices.axis_name)
    if devices.mesh is None:
        return program(blocks, shared)
    pad = (-G) % devices.size
    if pad:
        blocks = jax.tree_util.tree_map(lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], pad, axis=0)]), blocks)
    split = NamedSharding(devices.mesh, P(devices.axis_name))
    whole = NamedSharding(devices.mesh, P())
    blocks = jax.tree_util.tree_map(lambda a: _to_global(a, split), blocks)
    shared = jax.tree_util.tree_map(lambda a: _to_global(a, whole), shared)
    out = program(blocks, shared)
    # Gathered on every device; brought back as this process's own arrays (under jax.distributed the
    # program's outputs are global arrays, which the host code after it cannot mix with its own).
    return jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a)[:G]), out)


def _solve_block(block, shared, *, restarts: int, batch: str) -> DecouplingResult:
    """One block's whole solve (restarts, warm start, selection by objective): what
    :func:`jaxbsd.decouple` compiles for one problem, without the progress hook."""
    key_data, problem, init = block
    config = shared
    keys = jax.random.split(jax.random.wrap_key_data(key_data), restarts)
    return driver._decouple_compiled(keys, problem, config, jnp.int32(0), jnp.int32(0), init, batch=batch,
                                     report=False)


def decouple_group(problems: list[Problem], config: CMTFConfig, keys: list[jax.Array], inits: list[Decoupled] | None,
                   *, restarts: int, devices: Devices = Devices()) -> list[DecouplingResult]:
    """:func:`jaxbsd.decouple` of several problems of one shape, as one program.

    Args:
      problems: validated :class:`~jaxbsd.cmtf.Problem` of one structure and shape (:func:`jaxbsd.problem`).
      config: the solver configuration (one rank for all).
      keys: one key per problem, exactly the key :func:`jaxbsd.decouple` would get for it.
      inits: one warm start per problem (validated, in the problems' dtype), or None.
      restarts: random restarts per problem.
      devices: where the program runs.

    Returns:
      one :class:`~jaxbsd.DecouplingResult` per problem, what ``decouple(..., key=keys[i],
      restarts=restarts, init=inits[i], shard=None)`` returns up to rounding.
    """
    batch = driver._restart_batching(None, restarts)
    key_data = jnp.stack([jax.random.key_data(k) for k in keys])
    block_inits = None if inits is None else stack(inits)
    blocks = (key_data, stack(problems), block_inits)
    out = run_blocks(_solve_block, blocks, config, devices, restarts=restarts, batch=batch)
    return unstack(out, len(problems))


def group_bytes(G: int, S: int, n: int, m: int, rank: int, restarts: int, dof: int, *, hidden: int | None = None,
                max_iter: int = 0, itemsize: int = 4) -> int:
    """An upper estimate of the peak bytes of a group's solve on one device (the memory model).

    Per block: the problem (``X (S, m)``, ``F (S, n)``, and the Jacobian: dense ``S·n·m``, or
    structured ``S·H + H·(n + m)``), and per restart (warm start included) a handful of copies of
    the solver state (``W0 (r, m)``, ``W1 (n, r)``, ``G``, ``R (S, r)``, coefficients, knots: the
    current iterate, the best one, the stepped one, and the sweep's temporaries ``M1 (n, r)``,
    ``M2 (m, r)``, design matrices ``(r, S, ν)`` twice) and the history ``2·max_iter``.
    ``G`` blocks on one device hold ``G`` times that (the vmapped program of an accelerator; the
    CPU program solves its blocks one after the other and holds one block's temporaries, so it
    needs less). Checked against ``compiled.memory_analysis()`` (arguments + outputs +
    temporaries) in ``tests/test_grouped.py``: between 0.8 and 2 times the measurement.
    """
    jac = S * n * m if hidden is None else S * hidden + hidden * (n + m)
    problem = S * m + S * n + jac
    state = rank * m + n * rank + 2 * S * rank + rank * dof + rank * (dof + 4)
    sweep = n * rank + m * rank + 2 * rank * S * dof + S * rank * 2
    per_restart = 4 * state + sweep + 2 * max_iter
    return int(itemsize * G * (problem + (restarts + 1) * per_restart))


def shard_batch(calibration, devices: Devices):
    """The calibration batch split over the mesh axis along its leading (batch) dimension, for a
    data-parallel capture: every array leaf whose leading size divides evenly; None where that is
    not possible (no mesh, several processes, a callable calibration): the capture then runs
    unsharded."""
    if devices.mesh is None or callable(calibration) or jax.process_count() > 1:
        return None
    sharding = NamedSharding(devices.mesh, P(devices.axis_name))
    leaves = jax.tree_util.tree_leaves(calibration)
    if not leaves or any(getattr(a, "ndim", 0) < 1 or a.shape[0] % devices.size for a in leaves):
        return None
    return jax.tree_util.tree_map(lambda a: jax.device_put(a, sharding), calibration)
