"""Model checkpoints on Orbax: whole models, and compressed models in factored form.

A checkpoint is a directory::

    <path>/
      LATEST                  JSON: format, version, the current version directory and the
                              SHA-256 of its header.json
      v<time>-<id>/header.json    JSON: model kind and config, caller metadata, the variable
                                  table (type, shape, dtype), the replaced submodules and a
                                  SHA-256 over all arrays
      v<time>-<id>/state/         Orbax ``StandardCheckpointer`` tree of ``nnx.state(model)``,
                                  one array per dotted variable path (PRNG keys as key data)

**Atomicity.** A save writes a new version directory under a temporary name, renames it into
place, and only then replaces ``LATEST`` (a small file, written to a temporary file, fsynced
and moved over the old one with ``os.replace``). A crash at any point leaves ``LATEST``
naming a complete version: the previous checkpoint, or the new one. Older versions and
leftovers of interrupted saves are removed by the next save. A first save builds the whole
directory under a temporary name next to ``path`` and renames it into place.

**Resume.** :func:`read_checkpoint_header` reads ``LATEST`` and ``header.json`` only (no
weights): the kind and config rebuild the model, ``metadata`` carries the caller's data
(the training history, a compression step log).

**Integrity.** Orbax restores into whatever abstract target it is given, even one of another
shape, so every load first checks the stored variable table against the model (names, shapes,
dtypes), restores into the model's abstract state, and verifies the SHA-256 of the arrays.
Missing files, truncation, bit flips and mismatched models raise ``ValueError`` naming the
path and what did not match.

**Compressed models.** :func:`save_compressed` stores, for every :class:`DecoupledMLP`,
:class:`~jaxbsd.baselines.LowRankMLP`, :class:`~jaxbsd.baselines.PrunedMLP` or stand-alone
:class:`~jaxbsd.baselines.LowRankLinear`
found anywhere in the module tree (``nnx.List`` items included), its path, kind, rank, basis
(as data) and factor shapes; the factors themselves and every other variable of the model are
in the state. :func:`load_compressed` takes a freshly built *original* model, puts modules of
the stored shapes at those paths and restores all weights. It works for any NNX model.

**Old ``.npz`` checkpoints** (format version 1, one file written by earlier versions of
:func:`jaxbsd.train.save_checkpoint`) are still read, so loading one and saving again (or
:func:`migrate_checkpoint`) converts it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pathlib
import shutil
import time
import uuid
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd import bases as _bases
from jaxbsd import baselines as _baselines
from jaxbsd.io import fsync_dir, write_bytes_atomic
from jaxbsd.models import MODELS, build_model, config_to_dict
from jaxbsd.models.decoupled_mlp import DecoupledMLP

__all__ = [
    "CHECKPOINT_FORMAT",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint_header",
    "save_compressed",
    "load_compressed",
    "migrate_checkpoint",
    "replaced_modules",
]

CHECKPOINT_FORMAT = "jaxbsd-checkpoint"
_VERSION = 2
_LEGACY_VERSION = 1
_LATEST = "LATEST"
_HEADER = "header.json"
_STATE = "state"
_TMP = ".tmp-"
_LEGACY_HEADER_KEY = "__header__"

PathLike = str | os.PathLike


# ----------------------------------------------------------------------------- helpers


def _flat_variables(model) -> dict[str, nnx.Variable]:
    return {".".join(map(str, path)): var for path, var in nnx.to_flat_state(nnx.state(model))}


def _is_key(value) -> bool:
    return jnp.issubdtype(getattr(value, "dtype", np.float32), jax.dtypes.prng_key)


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _version_name() -> str:
    return f"v{time.time_ns()}-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------------------- module tree


def _shape_dtype(v: nnx.Variable) -> dict:
    a = v[...]
    return {"shape": list(a.shape), "dtype": np.dtype(a.dtype).str}


def _lowrank_linear_record(layer: _baselines.LowRankLinear) -> dict:
    return {name: _shape_dtype(getattr(layer, name)) for name in ("A", "B", "bias")}


def _describe(module) -> dict | None:
    """The record :func:`save_compressed` keeps for a replaced module, or None for others."""
    if isinstance(module, DecoupledMLP):
        return {
            "kind": "DecoupledMLP",
            "rank": int(module.W0[...].shape[0]),
            "basis": module.basis.to_dict(),
            "factors": {name: _shape_dtype(getattr(module, name)) for name in ("W0", "W1", "coef", "knots")},
        }
    if isinstance(module, _baselines.LowRankMLP):
        return {
            "kind": "LowRankMLP",
            "rank": [int(k) for k in module.ranks],
            "activation": module.activation,
            "factors": {"fc1": _lowrank_linear_record(module.fc1), "fc2": _lowrank_linear_record(module.fc2)},
        }
    if isinstance(module, _baselines.PrunedMLP):
        return {
            "kind": "PrunedMLP",
            "rank": int(module.rank),
            "activation": module.activation,
            "factors": {layer: {name: _shape_dtype(getattr(getattr(module, layer), name)) for name in ("kernel", "bias")}
                        for layer in ("fc1", "fc2")},
        }
    if isinstance(module, _baselines.LowRankLinear):
        return {
            "kind": "LowRankLinear",
            "rank": int(module.A[...].shape[1]),
            "factors": _lowrank_linear_record(module),
        }
    return None


def replaced_modules(model) -> list[dict]:
    """The replaced submodules of ``model``: ``DecoupledMLP``, ``LowRankMLP`` and stand-alone
    ``LowRankLinear`` at any path (``nnx.List`` items included), outermost first.

    Returns:
        one record per module: ``path`` (a list of attribute names and list indices),
        ``kind``, ``rank``, factor shapes and dtypes, and the basis (``DecoupledMLP``) or the
        activation (``LowRankMLP``), all JSON data.
    """
    found: list[dict] = []
    for path, node in nnx.iter_graph(model):
        if not isinstance(node, nnx.Module):
            continue
        record = _describe(node)
        if record is None:
            continue
        found.append({"path": list(path), **record})
    # A LowRankLinear inside a recorded LowRankMLP is part of that record.
    paths = [r["path"] for r in found]
    outer = [r for r in found if not any(len(p) < len(r["path"]) and r["path"][: len(p)] == p for p in paths)]
    return sorted(outer, key=lambda r: [(isinstance(k, str), k) for k in r["path"]])


def _placeholder(record: dict, where: str):
    """A module of the recorded kind and shapes (zeros; the load fills in the weights)."""

    def zeros(spec: dict):
        return jnp.zeros(tuple(spec["shape"]), np.dtype(spec["dtype"]))

    def lowrank_linear(f: dict):
        return _baselines.LowRankLinear(zeros(f["A"]), zeros(f["B"]), zeros(f["bias"]))

    try:
        kind, f = record["kind"], record["factors"]
        if kind == "DecoupledMLP":
            basis = _bases.Basis.from_dict(record["basis"])
            return DecoupledMLP(zeros(f["W0"]), zeros(f["W1"]), zeros(f["coef"]), zeros(f["knots"]), basis)
        if kind == "LowRankMLP":
            return _baselines.LowRankMLP(lowrank_linear(f["fc1"]), lowrank_linear(f["fc2"]), record["activation"])
        if kind == "LowRankLinear":
            return lowrank_linear(f)
        if kind == "PrunedMLP":
            return _baselines.PrunedMLP(zeros(f["fc1"]["kernel"]), zeros(f["fc1"]["bias"]), zeros(f["fc2"]["kernel"]),
                                        zeros(f["fc2"]["bias"]), record["activation"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: invalid replaced-module record {record!r}: {e}") from None
    raise ValueError(f"{where}: unknown replaced-module kind {kind!r}")


def _child(node, key, where: str, path: list):
    try:
        if isinstance(key, int):
            return node[key]
        return getattr(node, key)
    except (AttributeError, IndexError, KeyError, TypeError):
        raise ValueError(
            f"{where}: the model {type(node).__name__} has no submodule at {_path_str(path)} "
            f"(no {key!r}); it does not match the checkpoint"
        ) from None


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


def collect_arrays(model) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """Every variable of ``model`` as ``({name: array}, {name: {"type", ...}})`` (the table
    records what is needed to rebuild it; PRNG keys are stored as their key data)."""
    arrays: dict[str, np.ndarray] = {}
    table: dict[str, dict] = {}
    for name, var in _flat_variables(model).items():
        value = var[...]
        entry = {"type": type(var).__name__}
        if _is_key(value):
            entry["key_impl"] = str(jax.random.key_impl(value))
            value = jax.random.key_data(value)
        arr = np.asarray(value)
        entry.update(shape=list(arr.shape), dtype=arr.dtype.str)
        arrays[name] = arr
        table[name] = entry
    return arrays, table


def _header_for(model, metadata: dict | None) -> tuple[dict, dict[str, np.ndarray]]:
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a dict or None, got {type(metadata).__name__}")
    if not isinstance(model, nnx.Module):
        raise ValueError(f"model must be a flax.nnx.Module, got {type(model).__name__}")
    arrays, table = collect_arrays(model)
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
        "checksum": _checksum(arrays),
    }
    return header, arrays


def _encode_header(header: dict) -> bytes:
    try:
        return json.dumps(header, allow_nan=True).encode()
    except (TypeError, ValueError) as e:
        raise ValueError(f"metadata must be JSON-serialisable: {e}") from None


def _write_version(directory: pathlib.Path, blob: bytes, arrays: dict[str, np.ndarray]) -> None:
    """Write ``header.json`` and the Orbax state into the new directory ``directory``."""
    import orbax.checkpoint as ocp  # imported here: Orbax is slow to import

    directory.mkdir(parents=True)
    # Orbax refuses zero-size arrays (a polynomial basis has no knots), so every polynomial
    # compression with a state_dir failed; their shape and dtype in the header determine them,
    # so only the others are stored.
    stored = {name: np.asarray(a) for name, a in arrays.items() if np.size(a)}
    if stored:
        # Orbax refuses relative paths; users pass ``checkpoints/model.npz``.
        with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as checkpointer:
            checkpointer.save(directory.absolute() / _STATE, stored)
    else:
        (directory / _STATE).mkdir()
    with open(directory / _HEADER, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)


def _latest_blob(version: str, header_blob: bytes) -> bytes:
    return json.dumps({
        "format": CHECKPOINT_FORMAT,
        "version": _VERSION,
        "current": version,
        "header_sha256": hashlib.sha256(header_blob).hexdigest(),
    }).encode()


def _write(path: pathlib.Path, header: dict, arrays: dict[str, np.ndarray]) -> pathlib.Path:
    blob = _encode_header(header)
    path.parent.mkdir(parents=True, exist_ok=True)
    version = _version_name()
    if path.is_dir() and (path / _LATEST).is_file():
        # Existing checkpoint: new version beside the old one, then flip LATEST.
        tmp = path / f"{_TMP}{version}"
        try:
            _write_version(tmp, blob, arrays)
            os.rename(tmp, path / version)
            fsync_dir(path)
            write_bytes_atomic(path / _LATEST, _latest_blob(version, blob))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for entry in path.iterdir():  # older versions and leftovers of interrupted saves
            if entry.name not in (_LATEST, version) and (entry.name.startswith(("v", _TMP, f".{_LATEST}."))):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        entry.unlink()
        return path
    if path.exists() and not (path.is_file() or (path.is_dir() and not any(path.iterdir()))):
        raise ValueError(f"path {path} exists and is not a jaxbsd checkpoint; refusing to overwrite it")
    # First save (or over an old-format file / an empty directory): build the whole
    # checkpoint under a temporary name next to ``path``, then move it into place.
    tmp = path.parent / f".{path.name}{_TMP}{version}"
    old = None
    try:
        _write_version(tmp / version, blob, arrays)
        (tmp / _LATEST).write_bytes(_latest_blob(version, blob))
        fsync_dir(tmp)
        if path.is_file() or path.is_dir():
            # An old-format file or an empty directory: set it aside first (a crash between
            # the two renames leaves it under the .old name).
            old = path.parent / f".{path.name}.old-{version}"
            os.rename(path, old)
        os.rename(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists():
            os.rename(old, path)
        raise
    if old is not None:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
    return path


def save_checkpoint(path: PathLike, model, metadata: dict | None = None) -> pathlib.Path:
    """Write ``model``'s full state and ``metadata`` to the checkpoint directory ``path``, atomically.

    Args:
        path: the checkpoint directory (created; any name, ``.npz`` included, is used as is).
            An existing checkpoint there is replaced atomically; an old-format ``.npz`` file
            there is replaced by the new format.
        model: any NNX module; ViT/Swin/DeiT also store their kind and config, and replaced
            MLPs (``DecoupledMLP``, low-rank) are recorded so that ``load_checkpoint(path)``
            can rebuild the model.
        metadata: JSON-serialisable dict (e.g. dataset, accuracy, history).

    Returns:
        the path written.

    Raises:
        ValueError: ``metadata`` is not a JSON-serialisable dict, ``model`` is not an NNX
            module, or ``path`` is something other than a checkpoint.
    """
    header, arrays = _header_for(model, metadata)
    return _write(pathlib.Path(path), header, arrays)


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


def migrate_checkpoint(src: PathLike, dst: PathLike | None = None) -> pathlib.Path:
    """Convert an old-format ``.npz`` checkpoint (or copy a current one) to the current format.

    Args:
        src: the old checkpoint file.
        dst: where to write (default: ``src`` itself, replaced in place).

    Returns:
        the path written.
    """
    src = pathlib.Path(src)
    header, arrays = _read_all(src)
    header = {**header, "version": _VERSION}
    header.setdefault("replaced", [])
    return _write(pathlib.Path(dst) if dst is not None else src, header, arrays)


# ----------------------------------------------------------------------------- reading


def _expected(path: pathlib.Path) -> str:
    return (
        f"expected a {CHECKPOINT_FORMAT} directory written by jaxbsd.save_checkpoint "
        f"(with {_LATEST}, <version>/{_HEADER} and <version>/{_STATE})"
    )


def _read_header_v2(path: pathlib.Path) -> tuple[dict, pathlib.Path]:
    latest = path / _LATEST
    if not latest.is_file():
        raise ValueError(
            f"checkpoint {path} has no {_LATEST} file: not a checkpoint, or its first save never "
            f"finished; {_expected(path)}"
        )
    try:
        pointer = json.loads(latest.read_bytes().decode())
        version = pointer["current"]
        want_sha = pointer["header_sha256"]
        if pointer.get("format") != CHECKPOINT_FORMAT or not isinstance(version, str) or "/" in version:
            raise ValueError("wrong format")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"checkpoint {path}: {latest} is corrupt ({e}); {_expected(path)}") from None
    if pointer.get("version") != _VERSION:
        raise ValueError(f"checkpoint {path} has version {pointer.get('version')!r}, expected {_VERSION}")
    directory = path / version
    header_file = directory / _HEADER
    try:
        blob = header_file.read_bytes()
    except OSError as e:
        raise ValueError(f"checkpoint {path}: cannot read {header_file} ({e}); files are missing") from None
    if hashlib.sha256(blob).hexdigest() != want_sha:
        raise ValueError(f"checkpoint {path} is corrupt: {header_file} does not match its SHA-256 in {_LATEST}")
    try:
        header = json.loads(blob.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"checkpoint {path} has a corrupt header {header_file}: {e}") from None
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT or header.get("version") != _VERSION:
        raise ValueError(f"checkpoint {path}: {header_file} is not a version-{_VERSION} {CHECKPOINT_FORMAT} header")
    if not isinstance(header.get("variables"), dict):
        raise ValueError(f"checkpoint {path}: {header_file} has no variable table")
    return header, directory


def _read_legacy(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Header and arrays of an old-format (version 1) ``.npz`` checkpoint."""
    expected = f"a {CHECKPOINT_FORMAT} directory, or an old-format .npz checkpoint file"
    try:
        with np.load(path, allow_pickle=False) as npz:
            files = {name: npz[name] for name in npz.files}  # reading checks every zip CRC
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        raise ValueError(f"checkpoint {path} is truncated or corrupt (expected {expected}): {e}") from None
    if _LEGACY_HEADER_KEY not in files:
        raise ValueError(f"checkpoint {path} has no {_LEGACY_HEADER_KEY} entry (expected {expected})")
    try:
        header = json.loads(files.pop(_LEGACY_HEADER_KEY).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"checkpoint {path} has a corrupt header (expected JSON): {e}") from None
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path} is not {expected}")
    if header.get("version") != _LEGACY_VERSION:
        raise ValueError(
            f"checkpoint {path} has version {header.get('version')!r}; this file format is read "
            f"for version {_LEGACY_VERSION} only: retrain, or migrate it with a jaxbsd that wrote it"
        )
    table = header.get("variables", {})
    if set(table) != set(files):
        raise ValueError(f"checkpoint {path} is corrupt: its arrays do not match its variable table")
    if _checksum(files) != header.get("checksum"):
        raise ValueError(f"checkpoint {path} is corrupt: checksum mismatch")
    header.setdefault("replaced", [])
    return header, files


def _read_header(path: pathlib.Path) -> tuple[dict, pathlib.Path | None, dict | None]:
    """``(header, version_dir, legacy_arrays)``: one of the last two is None."""
    if path.is_dir():
        header, directory = _read_header_v2(path)
        return header, directory, None
    if path.is_file():
        header, arrays = _read_legacy(path)
        return header, None, arrays
    raise FileNotFoundError(f"checkpoint {path} does not exist")


def _restore_arrays(path: pathlib.Path, directory: pathlib.Path, table: dict[str, dict]) -> dict[str, np.ndarray]:
    import orbax.checkpoint as ocp

    state = directory / _STATE
    if not state.is_dir():
        raise ValueError(f"checkpoint {path}: {state} is missing")
    target = {
        name: jax.ShapeDtypeStruct(tuple(e["shape"]), np.dtype(e["dtype"])) for name, e in table.items()
        if math.prod(e["shape"])  # zero-size arrays are not stored (see _write_version)
    }
    restored = {}
    if target:
        try:
            with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as checkpointer:
                restored = checkpointer.restore(state.absolute(), target)  # Orbax wants absolute paths
        except Exception as e:  # Orbax/TensorStore raise many types on truncated or missing files
            raise ValueError(f"checkpoint {path} is truncated or corrupt: cannot restore {state}: "
                             f"{type(e).__name__}: {str(e)[:500]}") from None
    if not isinstance(restored, dict) or set(restored) != set(target):
        raise ValueError(f"checkpoint {path} is corrupt: {state} does not hold the variables of {_HEADER}")
    restored |= {name: np.zeros(tuple(e["shape"]), np.dtype(e["dtype"]))
                 for name, e in table.items() if name not in target}
    arrays = {}
    for name, value in restored.items():
        arr = np.asarray(value)
        want = (tuple(table[name]["shape"]), np.dtype(table[name]["dtype"]))
        if (arr.shape, arr.dtype) != want:
            raise ValueError(f"checkpoint {path} is corrupt: {name} restored as {arr.shape} {arr.dtype}, "
                             f"header says {want[0]} {want[1]}")
        arrays[name] = arr
    return arrays


def _read_all(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    header, directory, arrays = _read_header(path)
    if arrays is None:
        arrays = _restore_arrays(path, directory, header["variables"])
        if _checksum(arrays) != header.get("checksum"):
            raise ValueError(f"checkpoint {path} is corrupt: the arrays in {directory / _STATE} do not match "
                             f"the SHA-256 in {directory / _HEADER}")
    return header, arrays


def read_checkpoint_header(path: PathLike) -> dict:
    """The verified JSON header of a checkpoint, without loading any weights.

    Returns:
        a dict with ``kind``, ``config``, ``metadata``, ``variables`` (name -> type, shape,
        dtype), ``replaced`` (see :func:`replaced_modules`) and ``version``.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: not a checkpoint, or a corrupt one, naming ``path``.
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
            want = tuple(np.shape(jax.random.key_data(current)))
            if tuple(entry["shape"]) != want:
                raise ValueError(f"checkpoint {path}: {name} has key data of shape {tuple(entry['shape'])}, "
                                 f"expected {want}")
            continue
        want = (tuple(np.shape(current)), np.dtype(current.dtype))
        got = (tuple(entry["shape"]), np.dtype(entry["dtype"]))
        if got != want:
            raise ValueError(
                f"checkpoint {path}: {name} has shape {got[0]} {got[1]}, expected {want[0]} {want[1]}"
            )
    return variables


def _assign(path: pathlib.Path, header: dict, variables: dict[str, nnx.Variable], arrays: dict[str, np.ndarray]):
    table = header["variables"]
    values = {}
    for name, var in variables.items():
        arr = arrays[name]
        if _is_key(var[...]):
            values[name] = jax.random.wrap_key_data(arr, impl=table[name]["key_impl"])
        else:
            values[name] = jnp.asarray(arr)
    for name, var in variables.items():  # only after everything checked
        var[...] = values[name]


def _apply_replacements(path: pathlib.Path, header: dict, model) -> None:
    for record in header.get("replaced", []):
        where = f"checkpoint {path}"
        rpath = record.get("path") if isinstance(record, dict) else None
        if not isinstance(rpath, list):
            raise ValueError(f"{where}: corrupt replaced-module record {record!r}")
        _set_submodule(model, rpath, _placeholder(record, f"{where}, {_path_str(rpath)}"), where)


def load_checkpoint(path: PathLike, model=None):
    """Restore a checkpoint written by :func:`save_checkpoint` (or an old ``.npz`` one).

    Args:
        path: the checkpoint directory (or old-format file).
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
    header, directory, legacy = _read_header(path)
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
    arrays = legacy if legacy is not None else _read_all(path)[1]
    _assign(path, header, variables, arrays)
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
    header, _, legacy = _read_header(path)
    stored_class = header.get("model_class")
    this_class = f"{type(model).__module__}.{type(model).__qualname__}"
    if stored_class is not None and stored_class != this_class:
        raise ValueError(f"checkpoint {path} holds a {stored_class}, but model is a {this_class}")
    # Replace on a copy first, so a failed load leaves the caller's model as it was.
    trial = nnx.clone(model)
    _apply_replacements(path, header, trial)
    _check_against(path, header, trial)
    arrays = legacy if legacy is not None else _read_all(path)[1]
    _apply_replacements(path, header, model)
    variables = _check_against(path, header, model)
    _assign(path, header, variables, arrays)
    if hasattr(model, "eval"):
        model.eval()
    return model
