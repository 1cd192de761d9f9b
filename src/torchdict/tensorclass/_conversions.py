"""Tensorclass conversions from and to dicts and TensorDicts: the helpers of ``from_dict``,
``from_tensordict``, ``to_tensordict`` and ``to_dict`` (the methods are in ``_delegation``).

Nested dicts and TensorDicts become the tensorclass a field's annotation names (``T`` or
``Optional[T]``), and ``None`` fields, which a tensorclass does not store, are written back
into exports.
"""
from __future__ import annotations

import dataclasses
import numbers
import typing
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .._apply import unwrap
from .._base import TensorCollection
from .._indexing import warn_user
from ._fields import _resolve_annotations, is_tensorclass_type
from ..nontensor import NonTensorData
from ..tensordict import TensorDict

if TYPE_CHECKING:
    from ._delegation import TensorDictMethods

_Size = torch.Size

# Per class: field name -> the tensorclass its annotation names. Computed on first use, when
# forward references (a class naming itself or one defined later) can be resolved.
_NESTED_CLASSES: "weakref.WeakKeyDictionary[type, dict]" = weakref.WeakKeyDictionary()


def _annotated_tensorclass(annotation: Any) -> Optional[type]:
    """The tensorclass named by ``T``, ``T[...]`` or ``Optional[T]``, else None."""
    if typing.get_origin(annotation) is typing.Union or type(annotation).__name__ == "UnionType":
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) != 1:
            return None
        annotation = args[0]
    annotation = typing.get_origin(annotation) or annotation
    return annotation if isinstance(annotation, type) and is_tensorclass_type(annotation) else None


def _nested_classes(cls: type[TensorDictMethods]) -> dict:
    classes = _NESTED_CLASSES.get(cls)
    if classes is None:
        hints = _resolve_annotations(cls)
        classes = {}
        for name in cls._tc_field_names:
            target = _annotated_tensorclass(hints.get(name))
            if target is not None:
                classes[name] = target
        _NESTED_CLASSES[cls] = classes
    return classes


def _fitting_keys(cls: type, td: TensorDict) -> list:
    """The tensorclass-annotated fields of ``cls`` holding a TensorDict whose keys are all fields of that class."""
    storage = td._tensordict
    return [name for name, target in _nested_classes(cls).items()
            if isinstance(storage.get(name), TensorDict) and storage[name]._tensordict.keys() <= target._tc_field_set]


def _wrap_entries(cls: type, td: TensorDict, keys: list) -> None:
    # ``td`` owns its nested TensorDicts (fresh or a copy): they are changed in place.
    for name in keys:
        target = _nested_classes(cls)[name]
        entry = td._tensordict[name]
        inner_keys = _fitting_keys(target, entry)
        if inner_keys:
            _wrap_entries(target, entry, inner_keys)
        td._tensordict[name] = target._from_tensordict_unchecked(entry)


def nest_tensorclasses(cls: type, td: TensorDict, owned: bool) -> TensorDict:
    """``td`` with the TensorDicts of tensorclass-annotated fields turned into those classes.

    A TensorDict holding a key its annotated class lacks stays a TensorDict (as upstream).
    Unless ``owned``, the changes go to a shallow copy (locked if ``td`` is), never to ``td``.
    """
    keys = _fitting_keys(cls, td)
    if not keys:
        return td
    locked = td._is_locked
    if not owned:
        td = td.copy()  # copies the nested TensorDicts too (unlocked), not the leaves
    _wrap_entries(cls, td, keys)
    if locked:
        td._lock_tree()
    return td


def _declares_default(spec: Any) -> bool:
    """A default factory, or a default other than None (a None default changes nothing)."""
    default = spec.default
    return spec.factory is not dataclasses.MISSING or (default is not dataclasses.MISSING and default is not None)


def warn_defaults_not_filled(cls: type[TensorDictMethods], given: set) -> None:
    # Upstream 0.15 sets a missing field to None even when it declares a default, and warns
    # that 0.17 will fill the default instead; torchdict does the same, with the same warning.
    skipped = [name for name, spec in cls._tc_fields.items()
               if name not in given and _declares_default(spec)]
    if skipped:
        warn_user(f"{cls.__name__}.from_dict() sets the fields {skipped} that the input misses to None, not to "
                  "their declared defaults. Starting with TensorDict 0.17, the default will change to filling "
                  "these fields with their defaults, as the constructor does. Pass the fields to from_dict() to "
                  "choose their values.")


def _is_scalar(value: Any) -> bool:
    # numpy's bool scalar is no numbers.Real (its class is "bool" in numpy 2, "bool_" before).
    return isinstance(value, numbers.Real) or (type(value).__module__ == "numpy"
                                               and type(value).__name__ in ("bool", "bool_"))


def scalars_as_non_tensor(values: Mapping, batch_size: _Size, device: Any) -> dict:
    """A copy of ``values`` (nested dicts too) with each Python or NumPy scalar as ``NonTensorData``."""
    result: dict = {}
    for key, value in values.items():
        if _is_scalar(value):
            value = NonTensorData(value, batch_size, device)
        elif isinstance(value, Mapping):
            value = scalars_as_non_tensor(value, batch_size, device)
        result[key] = value
    return result


def set_none_item(target: dict, name: str) -> None:
    target[name] = None


def set_none_entry(target: TensorDict, name: str) -> None:
    target.set_non_tensor(name, None)


def fill_none_fields(collection: Any, target: Any, write_none: Callable[[Any, str], None]) -> None:
    """Write each ``None`` field of the tensorclasses in ``collection`` (at any depth) into the
    matching level of ``target``, its export (a dict or a TensorDict) with the same nesting."""
    storage = unwrap(collection)._tensordict
    if is_tensorclass_type(type(collection)):
        for name in type(collection)._tc_field_names:
            if name not in storage:
                write_none(target, name)
    for key, value in storage.items():
        if isinstance(value, TensorCollection):
            fill_none_fields(value, target[key], write_none)
