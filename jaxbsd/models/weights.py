"""The weights of a Hugging Face directory: one ``model.safetensors`` or shards with an index.

``save_pretrained`` in ``transformers`` writes one ``model.safetensors``, or, past
``max_shard_size``, shards ``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``
(``{"weight_map": {tensor name: shard file}}``). Checkpoints of large decoders store bfloat16 or
float16. :func:`load_weights` reads either layout; :func:`read_safetensors` reads one file in any of
its floating and integer dtypes (bfloat16 through ``ml_dtypes``, which numpy lacks), as numpy arrays
backed by a read-only memory map: nothing is copied until a family converts a tensor to the dtype
its model asks for.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np

__all__ = ["WEIGHTS", "WEIGHTS_INDEX", "weights_file", "read_safetensors", "safetensors_names", "load_weights",
           "weight_names"]

#: The single weights file of a Hugging Face directory.
WEIGHTS = "model.safetensors"
#: The index of a sharded one.
WEIGHTS_INDEX = "model.safetensors.index.json"

# safetensors dtype codes -> numpy dtypes (BF16 from ml_dtypes, which JAX depends on).
_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32", "I16": "int16",
           "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool"}
_HEADER_LIMIT = 100_000_000  # safetensors' own bound on the JSON header


def _dtype(code: str) -> np.dtype:
    if code == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if code not in _DTYPES:
        raise ValueError(f"dtype {code!r} is not supported")
    return np.dtype(_DTYPES[code])


def weights_file(root: pathlib.Path) -> pathlib.Path | None:
    """``root``'s ``model.safetensors``, else its ``model.safetensors.index.json``, else None."""
    for name in (WEIGHTS, WEIGHTS_INDEX):
        if (root / name).is_file():
            return root / name
    return None


def _header(file: pathlib.Path) -> tuple[dict, int]:
    """``(header without __metadata__, offset of the data)`` of a ``.safetensors`` file."""
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        size = int.from_bytes(raw, "little")
        if size > _HEADER_LIMIT:
            raise ValueError(f"header of {size} bytes")
        header = json.loads(f.read(size).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header.pop("__metadata__", None)
    return header, 8 + size


def safetensors_names(file: pathlib.Path) -> list[str]:
    """The tensor names of a ``.safetensors`` file (its header only); ``ValueError`` naming the file."""
    try:
        return list(_header(file)[0])
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{file}: cannot read ({type(err).__name__}: {err})") from err


def read_safetensors(file: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file, in its stored dtype, as read-only numpy arrays.

    Raises ``ValueError`` naming the file for anything that is not a well-formed safetensors file
    (a truncated one, offsets outside the data, a byte count that is not the shape's, an unknown dtype).
    """
    file = pathlib.Path(file)
    try:
        header, start = _header(file)
        length = file.stat().st_size - start
        data = np.memmap(file, dtype=np.uint8, mode="r", offset=start, shape=(length,)) if length else np.zeros(0, np.uint8)
        tensors = {}
        for name, info in header.items():
            dtype, shape = _dtype(info["dtype"]), tuple(int(n) for n in info["shape"])
            begin, end = (int(n) for n in info["data_offsets"])
            if not 0 <= begin <= end <= length or end - begin != math.prod(shape) * dtype.itemsize:
                raise ValueError(f"tensor {name!r}: data_offsets {[begin, end]} do not hold {info['dtype']} {list(shape)}"
                                 f" within {length} bytes")
            tensors[name] = data[begin:end].view(dtype).reshape(shape)
        return tensors
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise ValueError(f"{file}: cannot read ({type(err).__name__}: {err})") from err


def _index(index_file: pathlib.Path) -> dict[str, str]:
    """``{tensor name: shard file name}`` of a ``model.safetensors.index.json``; ``ValueError`` naming it."""
    try:
        weight_map = json.loads(index_file.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{index_file}: cannot read the shard index ({err})") from err
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_file}: expected a weight_map of tensor name -> shard file")
    root = index_file.parent.resolve()
    for shard in sorted(set(weight_map.values())):
        if pathlib.PurePath(shard).name != shard or not (root / shard).is_file():
            raise ValueError(f"{index_file}: shard {shard!r} is missing from {root}")
    return weight_map


def load_weights(root: pathlib.Path) -> tuple[dict[str, np.ndarray], str]:
    """``(every tensor, the file to name in messages)`` of the Hugging Face directory ``root``:
    ``model.safetensors``, or the shards that ``model.safetensors.index.json`` lists (each tensor
    from the shard the index names). Tensors are in their stored dtype (:func:`read_safetensors`).
    Raises ``ValueError`` naming the file: none there, an unreadable file or index, a missing shard,
    a tensor the index names that its shard lacks."""
    file = weights_file(root)
    if file is None:
        raise ValueError(f"{root}: no {WEIGHTS}")
    if file.name == WEIGHTS:
        return read_safetensors(file), str(file)
    weight_map = _index(file)
    shards = {shard: read_safetensors(root / shard) for shard in sorted(set(weight_map.values()))}
    missing = [name for name, shard in weight_map.items() if name not in shards[shard]]
    if missing:
        raise ValueError(f"{file}: tensor(s) {missing[:4]} are not in the shards the index names")
    return {name: shards[shard][name] for name, shard in weight_map.items()}, str(file)


def weight_names(root: pathlib.Path) -> set[str]:
    """The tensor names of ``root``'s weights (headers or index only); ``ValueError`` as :func:`load_weights`."""
    file = weights_file(root)
    if file is None:
        raise ValueError(f"{root}: no {WEIGHTS}")
    if file.name == WEIGHTS:
        return set(safetensors_names(file))
    return set(_index(file))
