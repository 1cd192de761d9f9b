"""``from_pytree`` / ``to_pytree``: nested Python containers as a TensorDict, and back.

Each list, tuple, namedtuple and dict becomes a nested TensorDict that records its container type in a
``"_pytree_type"`` entry (list / tuple elements under ``"0"``, ``"1"``, ...), so ``to_pytree`` rebuilds the
same structure. A dict key that is not a nested key (an int, an object) is kept in a ``{"key", "value"}``
sub-TensorDict under a generated ``"<NON_NESTED>..."`` key. Tensors and collections are kept as they are;
Python numbers and numpy arrays become tensors; any other leaf raises ``NotImplementedError``.
"""
from __future__ import annotations

import uuid
from typing import Any, Optional

import torch

from ._base import TensorCollection, is_tensor_collection

_TYPE_KEY = "_pytree_type"
_NON_NESTED = "<NON_NESTED>"


def _is_namedtuple_type(kind: type) -> bool:
    return issubclass(kind, tuple) and hasattr(kind, "_fields")


def _is_nested_key(key: Any) -> bool:
    if isinstance(key, str):
        return True
    return type(key) is tuple and bool(key) and all(_is_nested_key(part) for part in key)


def from_pytree(cls: type, pytree: Any, batch_size: Any, auto_batch_size: bool, batch_dims: Optional[int]) -> Any:
    from .nontensor import NonTensorData

    if isinstance(pytree, (TensorCollection, torch.Tensor)):
        return pytree
    result = None
    if isinstance(pytree, tuple) and _is_namedtuple_type(type(pytree)):
        source = {name: _field(cls, value) for name, value in zip(getattr(pytree, "_fields"), pytree)}
        result = cls(source, batch_size=batch_size)
        result.set_non_tensor(_TYPE_KEY, type(pytree))
    elif isinstance(pytree, (list, tuple)):
        source = {str(position): from_pytree(cls, item, None, False, None) for position, item in enumerate(pytree)}
        result = cls(source, batch_size=batch_size)
        result.set_non_tensor(_TYPE_KEY, type(pytree))
    elif isinstance(pytree, dict):
        source = {}
        for key, item in pytree.items():
            if _is_nested_key(key):
                source[key] = from_pytree(cls, item, None, False, None)
            else:
                stored_key = key if isinstance(key, torch.Tensor) else NonTensorData(key)
                source[_NON_NESTED + str(uuid.uuid1())] = cls({"value": from_pytree(cls, item, None, False, None),
                                                               "key": stored_key})
        result = cls(source, batch_size=batch_size)
        result.set_non_tensor(_TYPE_KEY, type(pytree))
    if result is not None:
        if auto_batch_size:
            result.auto_batch_size_(batch_dims)
        return result
    if isinstance(pytree, (int, float)) or type(pytree).__module__ == "numpy":
        return torch.as_tensor(pytree)
    raise NotImplementedError(f"Unknown type {type(pytree)}.")


def _field(cls: type, value: Any) -> Any:
    """A namedtuple field: containers through ``from_pytree`` (so ``to_pytree`` rebuilds them), the rest as is."""
    if isinstance(value, (list, tuple, dict)) and not isinstance(value, str):
        try:
            return from_pytree(cls, value, None, False, None)
        except NotImplementedError:
            return value
    return value


def to_pytree(td: Any) -> Any:
    """The pytree ``from_pytree`` built ``td`` from; ``td`` itself when it holds no ``"_pytree_type"``."""
    kind_entry = td.get(_TYPE_KEY, None) if _TYPE_KEY in td.keys() else None
    if kind_entry is None:
        return td
    kind = kind_entry.data if hasattr(kind_entry, "data") else kind_entry
    items = {}
    for key in td.keys():
        if key == _TYPE_KEY:
            continue
        value = td.get(key)
        if is_tensor_collection(type(value)) and not getattr(type(value), "_is_non_tensor", False):
            value = to_pytree(value)
        elif getattr(type(value), "_is_non_tensor", False):
            value = value.data if hasattr(value, "data") else value.tolist()
        items[key] = value
    if _is_namedtuple_type(kind):
        return kind(**items)
    if issubclass(kind, (list, tuple)):
        return kind([items[str(position)] for position in range(len(items))])
    result = {}
    for key, value in items.items():
        if key.startswith(_NON_NESTED) and isinstance(value, dict) and set(value) == {"key", "value"}:
            result[value["key"]] = value["value"]
        elif key.startswith(_NON_NESTED) and is_tensor_collection(type(value)):
            original = value.get("key")
            result[original.data if hasattr(original, "data") else original] = to_pytree(value.get("value")) \
                if is_tensor_collection(type(value.get("value"))) else value.get("value")
        else:
            result[key] = value
    return kind(result) if kind is not dict else result
