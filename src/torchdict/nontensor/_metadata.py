"""``MetaData``: one Python value for a whole batch, which stays one value through indexing and stacking.

A ``MetaData`` is a ``NonTensorData`` (torchdict's one-value leaf) with upstream's rules for the ops
that would turn a one-value leaf into one value per element:

- ``torch.stack`` of ``MetaData`` leaves holding the very same object (``is``, not ``==``) is one
  ``MetaData`` over the stacked batch; other values give a ``NonTensorStack``. ``clone()`` copies the
  value, so a clone and its source stack into a ``NonTensorStack``.
- ``torch.cat`` keeps the first one's value (as upstream's).
- indexing, ``unsqueeze``, ``expand``, reshapes and splits give a ``MetaData`` (of the same class).

``MetaData[cls]`` is a subclass (one per ``cls``, cached) whose constructor refuses a value that is not
an instance of ``cls`` (``TypeError``).

The one-value leaf code of torchdict tests ``isinstance(leaf, NonTensorData)`` where a ``MetaData``
behaves as a ``NonTensorData``, and builds results with ``type(leaf)._make`` (the overrides below) so
that the class survives each batch op; the stack rules are :func:`stacked_metadata` /
:func:`concatenated_metadata`, asked by every stack / cat of non-tensor leaves.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, cast

import torch

from .. import nontensor as _core

__all__ = ["MetaData", "stacked_metadata", "concatenated_metadata", "metadata_class_name", "one_value_class"]


def _typed_metadata(expected: type, data: Any, batch_size: torch.Size, device: Any, names: Any) -> "MetaData":
    """Unpickle a ``MetaData[expected]`` (the class is made again: it has no importable name)."""
    return cast(MetaData, MetaData[expected]._make(data, batch_size, device, names))


class _MetaDataClass(type):
    """The metaclass of ``MetaData``: ``MetaData[cls]`` is the subclass that only takes values of type ``cls``
    (made once per ``cls``)."""

    _typed_classes: Dict[Any, type] = {}

    def __getitem__(cls, item: Any) -> "type[MetaData]":
        if cls is not MetaData:
            raise TypeError(f"Cannot specify type for {cls.__name__}")
        typed = _MetaDataClass._typed_classes.get(item)
        if typed is None:
            name = f"MetaData[{getattr(item, '__name__', str(item))}]"
            typed = _MetaDataClass(name, (cls,), {"__slots__": (), "_expected_type": item, "__qualname__": name,
                                                  "__module__": cls.__module__})
            _MetaDataClass._typed_classes[item] = typed
        return cast("type[MetaData]", typed)


class MetaData(_core.NonTensorData, metaclass=_MetaDataClass):
    """A Python value for the whole batch, kept as one value by indexing, stacking and the shape ops.

    ``MetaData(data, batch_size=None, device=None, names=None)``; a ``NonTensorData`` (or ``MetaData``)
    given as ``data`` is unwrapped.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> config = {"lr": 0.1}
    >>> td = TensorDict(obs=torch.zeros(3), config=MetaData(config, batch_size=[3]), batch_size=[3])
    >>> stacked = torch.stack([td, td])
    >>> type(stacked.get("config")).__name__, stacked["config"] is config
    ('MetaData', True)
    >>> MetaData[str](1)
    Traceback (most recent call last):
        ...
    TypeError: Expected data of type str, got int
    """

    __slots__ = ()
    _expected_type: Optional[type] = None  # set on the classes made by MetaData[cls]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _core.NON_TENSOR_TYPES.add(cls)  # read as a non-tensor leaf by the exact-type tests

    def __init__(self, data: Any, batch_size: Any = None, device: Any = None,
                 names: Optional[Sequence[Optional[str]]] = None) -> None:
        if isinstance(data, _core.NonTensorData):
            data = data._data
        super().__init__(data, batch_size, device, names)
        expected = self._expected_type
        if expected is not None and not isinstance(self._data, expected):
            raise TypeError(f"Expected data of type {getattr(expected, '__name__', str(expected))}, got "
                            f"{type(self._data).__name__}")

    # ------------------------------------------------------------------ the class survives the batch ops
    # (``_make`` is the unchecked constructor of ``cls``: its result is a ``MetaData`` of this class.)
    def _batch_op(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "MetaData":
        shape = fn(_core._shape_probe(self._batch_size)).shape
        return cast(MetaData, type(self)._make(self._data, shape, self._device))

    def _with_batch_size(self, batch_size: torch.Size) -> "MetaData":
        return cast(MetaData, type(self)._make(self._data, batch_size, self._device))

    def _to_device(self, device: Any) -> "MetaData":
        return cast(MetaData, type(self)._make(self._data, self._batch_size, _core._as_device(device), self._names))

    def _shallow(self) -> "MetaData":
        return cast(MetaData, type(self)._make(self._data, self._batch_size, self._device, self._names))

    def where(self, condition: torch.Tensor, other: Any, *, out: Any = None, pad: Any = None,
              update_batch_size: bool = False) -> Any:
        """This value over the whole batch (as upstream's: a ``MetaData`` is one value, whatever ``other``)."""
        result = self._shallow()
        return result if out is None else out.update_(result)

    def __reduce__(self) -> Any:
        if self._expected_type is None:
            return super().__reduce__()
        return (_typed_metadata, (self._expected_type, self._data, self._batch_size, self._device, self._names))

    def __repr__(self) -> str:
        text = super().__repr__()
        return type(self).__name__ + text[len("NonTensorData"):]


_core.NON_TENSOR_TYPES.add(MetaData)


def stacked_metadata(leaves: Sequence[Any], batch_size: torch.Size) -> Optional[MetaData]:
    """The ``torch.stack`` of non-tensor ``leaves`` (over ``batch_size``) when the first is a ``MetaData``
    and every one is a ``MetaData`` of its class holding the very same object; otherwise None (the
    caller stacks them as values per element)."""
    first = leaves[0]
    if not isinstance(first, MetaData):
        return None
    cls, data = type(first), first._data
    for leaf in leaves:
        if not isinstance(leaf, cls) or leaf._data is not data:
            return None
    return cast(MetaData, cls._make(data, batch_size, first._device))


def concatenated_metadata(leaves: Sequence[Any], batch_size: torch.Size) -> Optional[MetaData]:
    """The ``torch.cat`` of non-tensor ``leaves`` when they are all ``MetaData`` of the first one's class:
    the first one's value over ``batch_size`` (upstream's); otherwise None."""
    first = leaves[0]
    if not isinstance(first, MetaData):
        return None
    cls = type(first)
    if not all(isinstance(leaf, cls) for leaf in leaves):
        return None
    return cast(MetaData, cls._make(first._data, batch_size, first._device, first._names))


# The value types a saved ``MetaData[cls]`` is made again with: builtins only, read by name (a load imports
# nothing). Any other ``cls`` loads as a plain ``MetaData``.
_SAVED_TYPES = {cls.__name__: cls for cls in (str, int, float, bool, complex, bytes, list, tuple, dict, set)}


def metadata_class_name(leaf: Any) -> Optional[str]:
    """What a save records of a one-value leaf's class: None for a ``NonTensorData``, else the name of its
    ``MetaData`` class (``"MetaData"``, ``"MetaData[str]"``: upstream's names)."""
    return type(leaf).__name__ if isinstance(leaf, MetaData) else None


def one_value_class(name: Any) -> type:
    """The one-value leaf class a saved ``name`` (as :func:`metadata_class_name` or upstream's meta.json gives it)
    stands for: ``NonTensorData`` for None or anything else unknown."""
    if type(name) is not str or not name.startswith("MetaData"):
        return _core.NonTensorData
    if name.startswith("MetaData[") and name.endswith("]"):
        expected = _SAVED_TYPES.get(name[len("MetaData["):-1])
        return MetaData if expected is None else MetaData[expected]
    return MetaData
