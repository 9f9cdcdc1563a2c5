"""Model checkpoints on Orbax: whole models, and compressed models in factored form.

A checkpoint is a directory managed by an Orbax ``CheckpointManager`` that keeps one step::

    <path>/<step>/header/   JSON item (``JsonSave``): format, version, model class, kind and
                            config, caller metadata, the variable table (type, shape, dtype),
                            the replaced submodules and a SHA-256
    <path>/<step>/state/    array item (``StandardSave``): ``nnx.state(model)``, one array per
                            dotted variable path (PRNG keys as key data)

**Atomicity** is Orbax's: a step is written under a temporary name and renamed into place once
complete (finalized); ``latest_step`` sees finalized steps only, and the previous step is deleted
(``max_to_keep=1``) only after the new one is finalized. A crash at any point therefore leaves
the previous checkpoint loadable; the next save removes what an interrupted one left
(``cleanup_tmp_directories``). A first save builds the directory beside ``path`` and renames it
into place, so ``path`` exists only once it holds a loadable checkpoint (resumable runs test for it).

**Resume.** :func:`read_checkpoint_header` restores the JSON item only (no weights): the kind
and config rebuild the model, ``metadata`` carries the caller's data (training history, a
compression step log).

**Integrity.** Finalization makes a step complete, not unchanged: a bit flipped in an Orbax data
file afterwards restores silently as other weights, and Orbax restores into an abstract target of
any shape. So every load first checks the stored variable table against the model (names,
shapes, dtypes), then verifies a SHA-256 over the header and all arrays. Missing files,
truncation, bit flips, edited headers and mismatched models raise ``ValueError`` naming the path.

**Compressed models.** :func:`save_compressed` stores, for every :class:`DecoupledMLP`,
:class:`~jaxbsd.models.compressed.LowRankMLP`, :class:`~jaxbsd.models.compressed.PrunedMLP`, their gated
forms (:class:`~jaxbsd.models.compressed.LowRankGatedMLP`, :class:`~jaxbsd.models.compressed.PrunedGatedMLP`) or stand-alone
:class:`~jaxbsd.models.compressed.LowRankLinear`
found anywhere in the module tree (``nnx.List`` items included), its path, kind, rank, basis
(as data) and factor shapes; the factors themselves and every other variable of the model are
in the state. :func:`load_compressed` takes a freshly built *original* model, puts modules of
the stored shapes at those paths and restores all weights. It works for any NNX model.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import shutil
import uuid

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.solver import bases as _bases
from jaxbsd.models import compressed as _compressed
from jaxbsd.io import fsync_dir
from jaxbsd.models import MODELS, build_model, config_to_dict
from jaxbsd.models.decoupled_mlp import DecoupledMLP

__all__ = [
    "CHECKPOINT_FORMAT",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint_header",
    "save_compressed",
    "load_compressed",
    "replaced_modules",
]

CHECKPOINT_FORMAT = "jaxbsd-checkpoint"
_VERSION = 3  # 1: one .npz file; 2: LATEST + v<time>/ directories; 3: an Orbax CheckpointManager
_HEADER, _STATE = "header", "state"
_ORBAX_TMP = ".orbax-checkpoint-tmp"  # Orbax's suffix for a step that was never finalized
_EXPECTED = (f"expected a {CHECKPOINT_FORMAT} directory written by jaxbsd.save_checkpoint "
             f"(Orbax steps <step>/{_HEADER} and <step>/{_STATE})")

PathLike = str | os.PathLike


def _flat_variables(model) -> dict[str, nnx.Variable]:
    return {".".join(map(str, path)): var for path, var in nnx.to_flat_state(nnx.state(model))}


def _is_key(value) -> bool:
    return jnp.issubdtype(getattr(value, "dtype", np.float32), jax.dtypes.prng_key)


def _checksum(header: dict, arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over the header (without its ``checksum``, canonical JSON) and every array."""
    h = hashlib.sha256(json.dumps({k: v for k, v in header.items() if k != "checksum"}, sort_keys=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _manager(path: pathlib.Path, *, write: bool):
    import orbax.checkpoint as ocp  # imported here: Orbax is slow to import

    # Under jax.distributed each process reads, and only process 0 writes (a compression run's state),
    # on its own: no barrier with processes that do not take part.
    alone = ({"multiprocessing_options": ocp.options.MultiprocessingOptions(
        primary_host=jax.process_index(), active_processes={jax.process_index()})} if jax.process_count() > 1 else {})
    if alone and write:  # Orbax creates the root itself only when every process takes part
        path.absolute().mkdir(parents=True, exist_ok=True)
    options = ocp.CheckpointManagerOptions(max_to_keep=1, create=write and not alone, cleanup_tmp_directories=write,
                                           enable_async_checkpointing=False, **alone)
    handlers = {_HEADER: ocp.JsonCheckpointHandler(), _STATE: ocp.StandardCheckpointHandler()}
    return ocp.CheckpointManager(path.absolute(), options=options, item_handlers=handlers)  # Orbax wants absolute paths


# ----------------------------------------------------------------------------- module tree


def _shape_dtype(v: nnx.Variable) -> dict:
    a = v[...]
    return {"shape": list(a.shape), "dtype": np.dtype(a.dtype).str}


def _lowrank_linear_record(layer: _compressed.LowRankLinear) -> dict:
    # A layer without a bias (the gated baselines keep the original's) records None.
    return {name: None if getattr(layer, name) is None else _shape_dtype(getattr(layer, name))
            for name in ("A", "B", "bias")}


def _linear_record(layer: nnx.Linear) -> dict:
    return {name: None if getattr(layer, name) is None else _shape_dtype(getattr(layer, name))
            for name in ("kernel", "bias")}


def _describe(module) -> dict | None:
    """The record :func:`save_compressed` keeps for a replaced module, or None for others."""
    if isinstance(module, DecoupledMLP):
        return {"kind": "DecoupledMLP", "rank": int(module.W0[...].shape[0]), "basis": module.basis.to_dict(),
                "factors": {name: _shape_dtype(getattr(module, name)) for name in ("W0", "W1", "coef", "knots")}}
    if isinstance(module, _compressed.LowRankMLP):
        return {
            "kind": "LowRankMLP",
            "rank": [int(k) for k in module.ranks],
            "activation": module.activation,
            "factors": {"fc1": _lowrank_linear_record(module.fc1), "fc2": _lowrank_linear_record(module.fc2)},
        }
    if isinstance(module, _compressed.PrunedMLP):
        return {
            "kind": "PrunedMLP",
            "rank": int(module.rank),
            "activation": module.activation,
            "factors": {layer: {name: _shape_dtype(getattr(getattr(module, layer), name)) for name in ("kernel", "bias")}
                        for layer in ("fc1", "fc2")},
        }
    if isinstance(module, _compressed.LowRankGatedMLP):
        return {
            "kind": "LowRankGatedMLP",
            "rank": [int(k) for k in module.ranks],
            "activation": module.activation,
            "factors": {layer: _lowrank_linear_record(getattr(module, layer)) for layer in ("gate", "up", "down")},
        }
    if isinstance(module, _compressed.PrunedGatedMLP):
        return {
            "kind": "PrunedGatedMLP",
            "rank": int(module.rank),
            "activation": module.activation,
            "factors": {layer: _linear_record(getattr(module, layer)) for layer in ("gate", "up", "down")},
        }
    if isinstance(module, _compressed.LowRankLinear):
        return {"kind": "LowRankLinear", "rank": int(module.A[...].shape[1]), "factors": _lowrank_linear_record(module)}
    return None


def replaced_modules(model) -> list[dict]:
    """The replaced submodules of ``model``: ``DecoupledMLP``, ``LowRankMLP``, ``PrunedMLP``, their
    gated forms ``LowRankGatedMLP``/``PrunedGatedMLP`` and stand-alone ``LowRankLinear`` at any
    path (``nnx.List`` items included), outermost first.

    Returns:
        one record per module: ``path`` (a list of attribute names and list indices),
        ``kind``, ``rank``, factor shapes and dtypes, and the basis (``DecoupledMLP``) or the
        activation (``LowRankMLP``), all JSON data.
    """
    found = [{"path": list(path), **record} for path, node in nnx.iter_graph(model)
             if isinstance(node, nnx.Module) and (record := _describe(node)) is not None]
    # A LowRankLinear inside a recorded LowRankMLP is part of that record.
    paths = [r["path"] for r in found]
    outer = [r for r in found if not any(len(p) < len(r["path"]) and r["path"][: len(p)] == p for p in paths)]
    return sorted(outer, key=lambda r: [(isinstance(k, str), k) for k in r["path"]])


def _placeholder(record: dict, where: str):
    """A module of the recorded kind and shapes (zeros; the load fills in the weights)."""

    def zeros(spec: dict | None):
        return None if spec is None else jnp.zeros(tuple(spec["shape"]), np.dtype(spec["dtype"]))

    def lowrank_linear(f: dict):
        return _compressed.LowRankLinear(zeros(f["A"]), zeros(f["B"]), zeros(f["bias"]))

    try:
        kind, f = record["kind"], record["factors"]
        if kind == "DecoupledMLP":
            basis = _bases.Basis.from_dict(record["basis"])
            return DecoupledMLP(zeros(f["W0"]), zeros(f["W1"]), zeros(f["coef"]), zeros(f["knots"]), basis)
        if kind == "LowRankMLP":
            return _compressed.LowRankMLP(lowrank_linear(f["fc1"]), lowrank_linear(f["fc2"]), record["activation"])
        if kind == "LowRankLinear":
            return lowrank_linear(f)
        if kind == "LowRankGatedMLP":
            return _compressed.LowRankGatedMLP(*(lowrank_linear(f[layer]) for layer in ("gate", "up", "down")),
                                              record["activation"])
        if kind == "PrunedGatedMLP":
            arrays = [zeros(f[layer][name]) for layer in ("gate", "up", "down") for name in ("kernel", "bias")]
            return _compressed.PrunedGatedMLP(*arrays, record["activation"])
        if kind == "PrunedMLP":
            return _compressed.PrunedMLP(zeros(f["fc1"]["kernel"]), zeros(f["fc1"]["bias"]), zeros(f["fc2"]["kernel"]),
                                        zeros(f["fc2"]["bias"]), record["activation"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: invalid replaced-module record {record!r}: {e}") from None
    raise ValueError(f"{where}: unknown replaced-module kind {kind!r}")


def _child(node, key, where: str, path: list):
    try:
        return node[key] if isinstance(key, int) else getattr(node, key)
    except (AttributeError, IndexError, KeyError, TypeError):
        raise ValueError(f"{where}: the model {type(node).__name__} has no submodule at {_path_str(path)} "
                         f"(no {key!r}); it does not match the checkpoint") from None


def _set_submodule(model, path: list, module, where: str) -> None:
    if not path:
        raise ValueError(f"{where}: a replaced module at the root cannot be restored into a model")
    parent = model
    for i, key in enumerate(path[:-1]):
        parent = _child(parent, key, where, path[: i + 1])
    _child(parent, path[-1], where, path)  # the original module must be there
    if isinstance(path[-1], int):
        parent[path[-1]] = module
    else:
        setattr(parent, path[-1], module)


def _path_str(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "<root>"


# ----------------------------------------------------------------------------- writing


def _collect(model) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """Every variable of ``model`` as ``({name: array}, {name: {"type", "shape", "dtype"}})``
    (PRNG keys are stored as their key data, with their ``key_impl``)."""
    arrays: dict[str, np.ndarray] = {}
    table: dict[str, dict] = {}
    for name, var in _flat_variables(model).items():
        value = var[...]
        entry = {"type": type(var).__name__}
        if _is_key(value):
            entry["key_impl"] = str(jax.random.key_impl(value))
            value = jax.random.key_data(value)
        arrays[name] = np.asarray(value)
        table[name] = entry | {"shape": list(arrays[name].shape), "dtype": arrays[name].dtype.str}
    return arrays, table


def _header_for(model, metadata: dict | None) -> tuple[dict, dict[str, np.ndarray]]:
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a dict or None, got {type(metadata).__name__}")
    if not isinstance(model, nnx.Module):
        raise ValueError(f"model must be a flax.nnx.Module, got {type(model).__name__}")
    arrays, table = _collect(model)
    kind = getattr(type(model), "kind", None)
    config = getattr(model, "config", None)
    known = kind in MODELS and isinstance(model, MODELS[kind])
    header = {
        "format": CHECKPOINT_FORMAT,
        "version": _VERSION,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "kind": kind if known else None,
        "config": config_to_dict(config) if known and config is not None else None,
        "metadata": metadata or {},
        "replaced": replaced_modules(model),
        "variables": table,
    }
    try:  # as it will read back (tuples as lists, keys as strings), so the checksum matches
        header = json.loads(json.dumps(header))
    except (TypeError, ValueError) as e:
        raise ValueError(f"metadata must be JSON-serialisable: {e}") from None
    return header | {"checksum": _checksum(header, arrays)}, arrays


def _holds_only_steps(path: pathlib.Path) -> bool:
    return path.is_dir() and all(e.name.isdigit() or _ORBAX_TMP in e.name for e in path.iterdir())


def save_checkpoint(path: PathLike, model, metadata: dict | None = None) -> pathlib.Path:
    """Write ``model``'s full state and ``metadata`` to the checkpoint directory ``path``, atomically.

    Args:
        path: the checkpoint directory (created). A checkpoint already there is replaced
            atomically: until the new step is finalized, the previous one is what loads.
        model: any NNX module; ViT/Swin/DeiT also store their kind and config, and replaced
            MLPs (``DecoupledMLP``, low-rank) are recorded so that ``load_checkpoint(path)``
            can rebuild the model.
        metadata: JSON-serialisable dict (e.g. dataset, accuracy, history).

    Returns:
        the path written.

    Raises:
        ValueError: ``metadata`` is not a JSON-serialisable dict, ``model`` is not an NNX
            module, or ``path`` is something other than a checkpoint (or an empty directory).
    """
    import orbax.checkpoint as ocp

    header, arrays = _header_for(model, metadata)
    path = pathlib.Path(path)
    if path.exists() and not _holds_only_steps(path):
        raise ValueError(f"path {path} exists and is not a jaxbsd checkpoint; refusing to overwrite it")
    # Orbax refuses zero-size arrays (a polynomial basis has no knots); the header's table
    # determines them, so only the others are stored.
    stored = {name: a for name, a in arrays.items() if a.size}
    items = {_HEADER: ocp.args.JsonSave(header)} | ({_STATE: ocp.args.StandardSave(stored)} if stored else {})
    first = not path.exists()
    root = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}" if first else path
    try:
        with _manager(root, write=True) as manager:
            manager.save((manager.latest_step() or 0) + 1, args=ocp.args.Composite(**items))
            manager.wait_until_finished()
        if first:
            os.rename(root, path)
            fsync_dir(path.parent)
    except BaseException:
        if first:
            shutil.rmtree(root, ignore_errors=True)
        raise
    return path


def save_compressed(path: PathLike, model, metadata: dict | None = None) -> pathlib.Path:
    """Save a compressed model in factored form (see the module docstring), atomically.

    For every replaced submodule (``DecoupledMLP``: ``W0``, ``W1``, ``coef``, ``knots``, basis
    and rank; ``LowRankMLP``/``LowRankLinear``: the factors ``A``, ``B`` and biases, ranks and
    activation) the path and shapes are recorded; the factors and all remaining parameters
    and state of the model are stored. Works for any NNX model.

    Args:
        path: the checkpoint directory.
        model: an NNX module with replaced submodules (none is allowed: then it is a plain
            checkpoint).
        metadata: JSON-serialisable dict.

    Returns:
        the path written.

    Example::

        jb.save_compressed("runs/vit-compressed", model)
        model = jb.load_compressed("runs/vit-compressed", build_original_model())
    """
    return save_checkpoint(path, model, metadata)


# ----------------------------------------------------------------------------- reading


def _read_header(path: pathlib.Path) -> tuple[dict, int]:
    """The header of the latest finalized step, and that step."""
    import orbax.checkpoint as ocp

    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if not path.is_dir():
        raise ValueError(f"checkpoint {path} is not a directory; {_EXPECTED}")
    try:
        with _manager(path, write=False) as manager:
            step = manager.latest_step()
            header = None if step is None else manager.restore(
                step, args=ocp.args.Composite(**{_HEADER: ocp.args.JsonRestore()}))[_HEADER]
    except Exception as e:  # Orbax raises many types on missing or corrupt files
        raise ValueError(f"checkpoint {path} has a missing or corrupt header: {type(e).__name__}: "
                         f"{str(e)[:300]}; {_EXPECTED}") from None
    if step is None:
        raise ValueError(f"checkpoint {path} holds no finished save (a first save that never finished, "
                         f"or an older format); {_EXPECTED}")
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path}: step {step} has no {CHECKPOINT_FORMAT} header; {_EXPECTED}")
    if header.get("version") != _VERSION:
        raise ValueError(f"checkpoint {path} has version {header.get('version')!r}, expected {_VERSION}")
    if not isinstance(header.get("variables"), dict) or not isinstance(header.get("checksum"), str):
        raise ValueError(f"checkpoint {path}: the header of step {step} has no variable table or checksum")
    return header, step


def _restore_arrays(path: pathlib.Path, header: dict, step: int) -> dict[str, np.ndarray]:
    """Every array of the step, verified against the header's SHA-256."""
    import orbax.checkpoint as ocp

    table = header["variables"]
    try:
        shapes = {name: (tuple(e["shape"]), np.dtype(e["dtype"])) for name, e in table.items()}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {path} has a corrupt variable table: {e}") from None
    target = {name: jax.ShapeDtypeStruct(*s) for name, s in shapes.items() if math.prod(s[0])}
    restored = {}
    if target:
        try:
            with _manager(path, write=False) as manager:
                restored = manager.restore(step, args=ocp.args.Composite(
                    **{_STATE: ocp.args.StandardRestore(target)}))[_STATE]
        except Exception as e:  # Orbax/TensorStore raise many types on truncated or missing files
            raise ValueError(f"checkpoint {path} is truncated, corrupt or missing files: cannot restore "
                             f"{step}/{_STATE}: {type(e).__name__}: {str(e)[:500]}") from None
    if not isinstance(restored, dict) or set(restored) != set(target):
        raise ValueError(f"checkpoint {path} is corrupt: {step}/{_STATE} does not hold the variables of its header")
    arrays = {name: np.asarray(restored[name]) if name in target else np.zeros(*s) for name, s in shapes.items()}
    if _checksum(header, arrays) != header["checksum"]:
        raise ValueError(f"checkpoint {path} is corrupt: its header or arrays do not match the SHA-256 "
                         f"recorded at save time (step {step})")
    return arrays


def read_checkpoint_header(path: PathLike) -> dict:
    """The JSON header of a checkpoint, without loading any weights.

    Returns:
        a dict with ``kind``, ``config``, ``metadata``, ``variables`` (name -> type, shape,
        dtype), ``replaced`` (see :func:`replaced_modules`) and ``version``.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: not a checkpoint, or one without a readable header, naming ``path``.
    """
    return _read_header(pathlib.Path(path))[0]


def _check_against(path: pathlib.Path, header: dict, model) -> dict[str, nnx.Variable]:
    """The model's variables, after checking that the stored table matches them exactly."""
    variables = _flat_variables(model)
    table = header["variables"]
    missing, unexpected = sorted(set(variables) - set(table)), sorted(set(table) - set(variables))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model {type(model).__name__}: "
            f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'…' if len(unexpected) > 5 else ''}"
        )
    for name, var in variables.items():
        current, entry = var[...], table[name]
        if _is_key(current):
            if "key_impl" not in entry:
                raise ValueError(f"checkpoint {path}: {name} was saved as data, expected a PRNG key")
            current = jax.random.key_data(current)
        want = (tuple(np.shape(current)), np.dtype(current.dtype))
        got = (tuple(entry["shape"]), np.dtype(entry["dtype"]))
        if got != want:
            raise ValueError(f"checkpoint {path}: {name} has shape {got[0]} {got[1]}, expected {want[0]} {want[1]}")
    return variables


def _assign(header: dict, variables: dict[str, nnx.Variable], arrays: dict[str, np.ndarray]) -> None:
    table = header["variables"]
    values = {name: jax.random.wrap_key_data(arrays[name], impl=table[name]["key_impl"]) if _is_key(var[...])
              else jax.device_put(np.asarray(arrays[name])) for name, var in variables.items()}  # no compiled copy
    for name, var in variables.items():  # only after everything converted
        var[...] = values[name]


def _apply_replacements(path: pathlib.Path, header: dict, model) -> None:
    for record in header.get("replaced", []):
        where = f"checkpoint {path}"
        rpath = record.get("path") if isinstance(record, dict) else None
        if not isinstance(rpath, list):
            raise ValueError(f"{where}: corrupt replaced-module record {record!r}")
        _set_submodule(model, rpath, _placeholder(record, f"{where}, {_path_str(rpath)}"), where)


def load_checkpoint(path: PathLike, model=None):
    """Restore a checkpoint written by :func:`save_checkpoint`.

    Args:
        path: the checkpoint directory.
        model: a module with the same state structure to load into (in place), e.g. a
            model whose ``block.mlp`` were replaced the same way as the saved one.  If
            None, the model is rebuilt from the stored kind and config, and the recorded
            replaced submodules are put back in place.

    Returns:
        ``(model, metadata)``; the model is in eval mode when it has ``eval()``.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: truncated, corrupt or incomplete checkpoint, or a state that does not
            match ``model`` (missing/unexpected variables, shapes or dtypes), naming ``path``.
    """
    path = pathlib.Path(path)
    header, step = _read_header(path)
    if model is None:
        kind = header.get("kind")
        if kind not in MODELS or header.get("config") is None:
            raise ValueError(f"checkpoint {path} stores no known model kind; pass model=")
        try:
            model = build_model(kind, header["config"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"checkpoint {path} has an invalid {kind} config: {e}") from None
        _apply_replacements(path, header, model)
    variables = _check_against(path, header, model)
    _assign(header, variables, _restore_arrays(path, header, step))
    if hasattr(model, "eval"):
        model.eval()
    return model, header.get("metadata", {})


def load_compressed(path: PathLike, model):
    """Restore a :func:`save_compressed` checkpoint into a freshly built *original* model.

    The modules recorded at their paths are replaced by modules of the stored kind and
    shapes (attribute assignment, or item assignment in an ``nnx.List``), then every weight
    is restored, so the model computes exactly what the saved one did.

    Args:
        path: the checkpoint directory.
        model: the uncompressed model, built the same way as the one that was compressed
            (any NNX module); changed in place.

    Returns:
        ``model``, compressed and restored (in eval mode when it has ``eval()``).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: corrupt, truncated or incomplete checkpoint; a model of another class,
            without a submodule at a recorded path, or whose other variables differ in
            names, shapes or dtypes; each naming ``path`` and what did not match.
    """
    path = pathlib.Path(path)
    if not isinstance(model, nnx.Module):
        raise ValueError(f"model must be a flax.nnx.Module, got {type(model).__name__}")
    header, step = _read_header(path)
    stored_class = header.get("model_class")
    this_class = f"{type(model).__module__}.{type(model).__qualname__}"
    if stored_class is not None and stored_class != this_class:
        raise ValueError(f"checkpoint {path} holds a {stored_class}, but model is a {this_class}")
    # Replace on a copy first, so a failed load leaves the caller's model as it was.
    trial = nnx.clone(model)
    _apply_replacements(path, header, trial)
    _check_against(path, header, trial)
    arrays = _restore_arrays(path, header, step)
    _apply_replacements(path, header, model)
    variables = _check_against(path, header, model)
    _assign(header, variables, arrays)
    if hasattr(model, "eval"):
        model.eval()
    return model
