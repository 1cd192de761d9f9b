"""The stored format of a store: server key names, entry metadata, tensor bytes (documented in docs/store.md).

Nothing here talks to the server. Every value written is either raw little-endian tensor bytes or JSON
text: the format never holds pickled data, so reading a store never runs code chosen by its writer.
"""
from __future__ import annotations

import functools
import json
import math
import sys
from typing import Any, Dict, List, Optional, Tuple

import torch

FORMAT = "torchdict.store/1"

# Entry kinds (the "kind" field of an entry's metadata).
NODE = "td"  # a nested level (or a store's root)
TENSOR = "tensor"
JSON_VALUE = "json"  # NonTensorData: one value for the whole batch
JSON_STACK = "json_stack"  # NonTensorStack: one value per batch element
LAZY_STACK = "lazy_stack"  # the root of a LazyStackedTensorDictStore

ROOT_FIELD = "[]"

# The dtypes kept as raw bytes, by the name written in the metadata. Quantized and sub-byte dtypes have
# no plain byte layout that another process could read back, so they are refused.
_DTYPE_NAMES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
)
DTYPES: Dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in _DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)
}
_NAME_OF: Dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}

Tree = Dict[str, Tuple[bytes, dict]]
"""A snapshot of one store's tree hash: field -> (raw metadata as stored, parsed metadata)."""


def check_byte_order() -> None:
    if sys.byteorder != "little":
        raise RuntimeError("TensorDictStore keeps tensors as little-endian bytes and needs a little-endian host.")


# ---------------------------------------------------------------------- server key names
def namespace(prefix: str, td_id: str) -> str:
    """The first part of every server key of one store. The braces make it a Redis Cluster hash tag, so
    that a transaction or script over one store's keys stays on one node."""
    for name, value in (("prefix", prefix), ("td_id", td_id)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"TensorDictStore: {name} must be a non-empty str, got {value!r}.")
        if "{" in value or "}" in value:
            raise ValueError(f"TensorDictStore: {name} can't contain braces (they delimit the store's hash tag), "
                             f"got {value!r}.")
    return f"{prefix}:{{{td_id}}}"


def tree_key(ns: str) -> str:
    return ns + ":tree"


def data_key(ns: str, field: str) -> str:
    return ns + ":t:" + field


def element_namespace(ns: str, position: int) -> str:
    """The namespace of member ``position`` of a stored lazy stack."""
    return f"{ns}:{position}"


def field_of(path: Tuple[str, ...]) -> str:
    """The tree-hash field of a key path: its JSON array (ASCII), so no separator can clash with a key."""
    return json.dumps(list(path), ensure_ascii=True, separators=(",", ":"))


@functools.lru_cache(maxsize=4096)  # the same few fields are parsed on every read of a store
def path_of(field: str) -> Tuple[str, ...]:
    return tuple(json.loads(field))


def child_prefix(field: str) -> str:
    """What the fields of ``field``'s descendants start with (``'["a","b"'`` + ``','``; the root: ``'["'``)."""
    return '["' if field == ROOT_FIELD else field[:-1] + ","


# ---------------------------------------------------------------------- metadata
def encode_meta(meta: dict) -> bytes:
    return json.dumps(meta, ensure_ascii=True, separators=(",", ":"), sort_keys=True).encode("ascii")


def decode_meta(raw: bytes) -> dict:
    return json.loads(raw)


def parse_tree(raw_tree: Dict[bytes, bytes], previous: Optional[Tree] = None) -> Tree:
    """The snapshot of a tree hash as read; entries whose stored metadata is unchanged since ``previous``
    keep their parsed metadata (shared, never mutated) instead of being decoded again."""
    tree: Tree = {}
    for field, raw in raw_tree.items():
        name = field.decode("ascii")
        known = None if previous is None else previous.get(name)
        tree[name] = known if known is not None and known[0] == raw else (raw, decode_meta(raw))
    return tree


def root_meta(batch_size: torch.Size, device: Optional[torch.device], backend: str) -> dict:
    return {"format": FORMAT, "kind": NODE, "batch_size": list(batch_size),
            "device": None if device is None else str(device), "backend": backend}


def check_root(meta: Optional[dict], where: str) -> dict:
    if meta is None:
        raise KeyError(f"no store {where} on the server")
    if meta.get("format") != FORMAT:
        raise ValueError(f"the data {where} is not a torchdict store (format {meta.get('format')!r}, "
                         f"expected {FORMAT!r}).")
    return meta


def dtype_name(dtype: torch.dtype) -> str:
    name = _NAME_OF.get(dtype)
    if name is None:
        raise TypeError(f"TensorDictStore can't store tensors of dtype {dtype}: it keeps tensors as plain bytes, "
                        f"which it supports for {', '.join(DTYPES)}.")
    return name


def tensor_meta(shape: torch.Size, dtype: torch.dtype, order: int) -> dict:
    return {"kind": TENSOR, "dtype": dtype_name(dtype), "shape": list(shape), "n": order}


def node_meta(batch_size: torch.Size, order: int) -> dict:
    return {"kind": NODE, "batch_size": list(batch_size), "n": order}


def nbytes(meta: dict) -> int:
    return math.prod(meta["shape"]) * DTYPES[meta["dtype"]].itemsize


def check_tensor(tensor: torch.Tensor, key: Any) -> None:
    """Refuse what has no plain byte layout, before anything is written."""
    dtype_name(tensor.dtype)
    if tensor.layout is not torch.strided or tensor.is_nested:
        raise TypeError(f"TensorDictStore can only store dense (strided) tensors; the value at {key!r} has "
                        f"layout {tensor.layout}.")


# ---------------------------------------------------------------------- tensor bytes
def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's values as C-ordered little-endian bytes (a view when it is contiguous on the CPU)."""
    flat = tensor.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data  # the array's buffer, viewed


def tensor_from_bytes(data: Any, dtype: torch.dtype, shape: List[int]) -> torch.Tensor:
    """A new tensor of ``shape`` from raw bytes (copied: the server's reply is immutable)."""
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    buffer = data if isinstance(data, bytearray) else bytearray(data)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)


# ---------------------------------------------------------------------- non-tensor values
def json_text(value: Any, key: Any) -> Any:
    """``value`` checked to survive JSON unchanged in kind; the store never falls back to pickle."""
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"TensorDictStore keeps non-tensor values as JSON and never pickles them; the value at {key!r} "
            f"({type(value).__name__}) can't be written as JSON: {error}") from None
    return value


def non_tensor_meta(leaf: Any, key: Any, order: int) -> dict:
    from ..nontensor import NonTensorData

    if type(leaf) is NonTensorData:
        return {"kind": JSON_VALUE, "batch_size": list(leaf.batch_size), "value": json_text(leaf._read(), key),
                "n": order}
    return {"kind": JSON_STACK, "batch_size": list(leaf.batch_size),
            "values": [json_text(value, key) for value in leaf._flat_values()], "n": order}


def non_tensor_from_meta(meta: dict, device: Optional[torch.device]) -> Any:
    from ..nontensor import NonTensorData, NonTensorStack

    if meta["kind"] == JSON_VALUE:
        return NonTensorData(meta["value"], batch_size=meta["batch_size"], device=device)
    return NonTensorStack._from_flat(meta["values"], meta["batch_size"], device)
