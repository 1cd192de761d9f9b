"""Upstream's compact repr (``set_printoptions(compact=True)``): one line per collection when it fits.

::

    TensorDict(batch_size=[3], fields={a: f32[2], b: {c: i64[], s: str}, n: NonTensorStack})

Each tensor entry is its short dtype and the dims after the batch (``f32[2]``; ``@cuda:0`` appended when the
collection has no device and the tensor is not on the CPU); a non-tensor value is its type name, a stack of
them ``NonTensorStack``; a nested collection is ``{...}``, prefixed by its class name when it is not a
plain TensorDict and by its extra batch dims (``[3]{...}``). It reads metadata only: no data, no stacking
(a lazy stack's entry shows ``-1`` where its members differ). A collection that does not fit in 80
columns is written one entry per line, each by the same rule.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Union

import torch

from ._base import TensorCollection
from ._options import PRINT_OPTIONS
from .nontensor import NonTensorData, NonTensorStack

_WIDTH = 80
_CPU = torch.device("cpu")
Node = Union[str, tuple]  # a token, or (prefix, [(key, node), ...])


@functools.lru_cache(maxsize=None)
def short_dtype(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``f32``, ``torch.uint8`` -> ``u8``, ``torch.bool`` -> ``bool``."""
    name = str(dtype).replace("torch.", "")
    for long_name, short_name in (("float", "f"), ("uint", "u"), ("int", "i"), ("complex", "c")):
        name = name.replace(long_name, short_name)
    return name


def _storage(collection: Any) -> Any:
    """The collection whose entries are printed (a tensorclass prints its TensorDict's; a typed one its source)."""
    inner = getattr(collection, "_tensordict", None)
    if isinstance(inner, TensorCollection):
        return inner
    source = getattr(collection, "_source", None)
    if isinstance(source, TensorCollection):
        return source
    return collection


def _is_lazy(collection: Any) -> bool:
    return hasattr(collection, "tensordicts") and hasattr(collection, "stack_dim")


def _tensor_token(shape: Any, dtype: torch.dtype, devices: set, owner_device: Optional[torch.device]) -> str:
    token = f"[{','.join(map(str, shape))}]"
    if PRINT_OPTIONS["show_dtype"]:
        token = short_dtype(dtype) + token
    if owner_device is None and devices != {_CPU}:
        token += "@" + ",".join(sorted(str(device) for device in devices))
    return token


def _feature_shape(tensor: torch.Tensor, batch_dims: int) -> tuple:
    if getattr(type(tensor), "_pass_through", False):  # an UnbatchedTensor has no batch dims
        return tuple(tensor.shape)
    return tuple(tensor.shape[batch_dims:])


def _lazy_leaf(stack: Any, key: str) -> Any:
    """A lazy stack's tensor entry as (shape with -1 where members differ, promoted dtype, devices); or the
    node of the first member's value when it is not a tensor."""
    shapes, dtypes, devices = set(), set(), set()
    for member in _members(stack):
        value = member.get(key)
        if not isinstance(value, torch.Tensor):
            return _entry(member, key)
        shapes.add(_feature_shape(value, member.batch_dims))
        dtypes.add(value.dtype)
        devices.add(value.device)
    shape_iter = iter(shapes)
    shape = list(next(shape_iter))
    for other in shape_iter:
        if len(other) != len(shape):
            shape = [-1]
            break
        shape = [size if size == other_size else -1 for size, other_size in zip(shape, other)]
    return shape, functools.reduce(torch.promote_types, dtypes), devices


def _members(stack: Any) -> list:
    """The non-lazy members of a (possibly nested) lazy stack."""
    found, pending = [], list(stack.tensordicts)
    while pending:
        member = pending.pop(0)
        if _is_lazy(member) and type(member) is not NonTensorStack:
            pending[:0] = list(member.tensordicts)
        else:
            found.append(member)
    return found


def _entry(collection: Any, key: str) -> Node:
    """The node of one entry of ``collection``."""
    value = kind = None
    if _is_lazy(collection) and type(collection) is not NonTensorStack:
        # The first member's value says what the entry is (as upstream).
        members = _members(collection)
        kind = members[0].get(key) if members else None
        if isinstance(kind, torch.Tensor):
            leaf = _lazy_leaf(collection, key)
            if isinstance(leaf, str) or isinstance(leaf[0], str):
                return leaf
            shape, dtype, devices = leaf
            return _tensor_token(shape, dtype, devices, collection.device)
    value = collection.get(key)
    kind = value if kind is None else kind
    if isinstance(value, torch.Tensor):
        return _tensor_token(_feature_shape(value, collection.batch_dims), value.dtype, {value.device},
                             collection.device)
    if type(value) is NonTensorData or (isinstance(value, NonTensorData)):
        # (a MetaData shows its class, as upstream's: "MetaData", "MetaData[str]")
        return type(value.data).__name__ if type(value) is NonTensorData else type(value).__name__
    if isinstance(value, NonTensorStack):
        return "NonTensorStack"
    if isinstance(value, TensorCollection):
        from .tensordict import TensorDict

        prefix = "" if type(kind) is TensorDict else type(kind).__name__
        extra = value.batch_size[collection.batch_dims:]
        if extra:
            prefix += f"[{','.join(map(str, extra))}]"
        return prefix, _body(value)
    return type(value).__name__


def _sorted(entries: list) -> list:
    order = PRINT_OPTIONS["sort_keys"]
    if order == "alphabetical":
        return sorted(entries, key=lambda entry: f"{entry[0]}: {_flat(entry[1])}")
    if callable(order):
        return sorted(entries, key=lambda entry: order(f"{entry[0]}: {_flat(entry[1])}"))
    return entries


def _body(collection: Any) -> list:
    """The (key, node) entries of a collection; a tensorclass adds its non-tensor and unset fields."""
    storage = _storage(collection)
    entries = _sorted([(key, _entry(storage, key)) for key in storage.keys()])
    field_names = getattr(type(collection), "_tc_field_names", None)
    if field_names is not None:
        present = set(storage.keys())
        entries += [(name, "None") for name in field_names if name not in present]
    return entries


def _flat(node: Node) -> str:
    if isinstance(node, str):
        return node
    prefix, entries = node
    return prefix + "{" + ", ".join(f"{key}: {_flat(value)}" for key, value in entries) + "}"


def _render(node: Node, indent: str, used: int, tail: int) -> str:
    """One line if ``used`` columns before it, the node and ``tail`` columns after fit in 80; else one
    entry per line, four spaces deeper, each rendered by the same rule."""
    flat = _flat(node)
    if isinstance(node, str) or not node[1] or used + len(flat) + tail <= _WIDTH:
        return flat
    prefix, entries = node
    deeper = indent + "    "
    lines = []
    for position, (key, value) in enumerate(entries):
        after = tail + 1 if position == len(entries) - 1 else 1
        lines.append(f"{deeper}{key}: {_render(value, deeper, len(deeper) + len(key) + 2, after)}")
    return prefix + "{\n" + ",\n".join(lines) + "}"


def compact_repr(collection: Any, class_name: Optional[str] = None) -> str:
    """The compact repr of a TensorDict, a lazy stack or a tensorclass instance."""
    header = []
    if PRINT_OPTIONS["show_batch_size"]:
        header.append(f"batch_size=[{','.join(map(str, collection.batch_size))}]")
    if PRINT_OPTIONS["show_device"] and collection.device is not None:
        header.append(f"device={collection.device}")
    exclusive = []
    if _is_lazy(collection):
        header.append(f"stack_dim={collection.stack_dim}")
        shared = set(collection.keys())
        for position, member in enumerate(collection.tensordicts):
            own = [key for key in member.keys() if key not in shared]
            if own:
                exclusive.append((str(position), ("", _sorted([(key, _entry(member, key)) for key in own]))))
    head = f"{class_name or type(collection).__name__}(" + "".join(f"{item}, " for item in header) + "fields="
    tail = 1 + len(", exclusive_fields={") if exclusive else 1
    text = head + _render(("", _body(collection)), "", len(head), tail)
    if exclusive:
        used = len(text.rsplit("\n", 1)[-1]) + len(", exclusive_fields=")
        text += ", exclusive_fields=" + _render(("", exclusive), "", used, 1)
    return text + ")"
