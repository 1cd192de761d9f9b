"""Upstream's top-level constructors and leaf predicates, as functions: ``from_dict``, ``fromkeys``,
``from_module`` / ``from_modules``, ``from_any``, ``from_namedtuple``, ``from_tuple``, ``from_pytree``,
``from_dataclass`` (a dataclass instance or type as a tensorclass), ``default_is_leaf``, ``is_leaf_nontensor``.

Each TensorDict-building one forwards to the ``TensorDict`` classmethod of the same name (``_constructors``).
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Optional, Sequence

import torch

from ._base import is_tensor_collection

__all__ = ["default_is_leaf", "from_any", "from_dataclass", "from_dict", "from_module", "from_modules",
           "from_namedtuple", "from_pytree", "from_tuple", "fromkeys", "is_leaf_nontensor"]


def _td() -> Any:
    from .tensordict import TensorDict

    return TensorDict


def default_is_leaf(cls: type) -> bool:
    """The default ``is_leaf`` of ``keys`` / ``items`` / ``apply``: anything but a tensor collection.

    Non-tensor data is not a leaf here (``leaves_only=True`` skips it); an ``UnbatchedTensor`` is.

    >>> from torchdict import NonTensorData, TensorDict
    >>> default_is_leaf(torch.Tensor), default_is_leaf(NonTensorData), default_is_leaf(TensorDict)
    (True, False, False)
    """
    if cls is torch.Tensor:
        return True
    return not is_tensor_collection(cls) or bool(getattr(cls, "_pass_through", False))


def is_leaf_nontensor(cls: type) -> bool:
    """An ``is_leaf`` for tensors and non-tensor data (``NonTensorData`` / ``NonTensorStack``); other types
    (tensor collections, Python types) are not leaves.

    >>> from torchdict import NonTensorData, TensorDict
    >>> is_leaf_nontensor(NonTensorData), is_leaf_nontensor(TensorDict)
    (True, False)
    """
    if cls is torch.Tensor:
        return True
    if is_tensor_collection(cls):
        return bool(getattr(cls, "_is_non_tensor", False) or getattr(cls, "_pass_through", False))
    return isinstance(cls, type) and issubclass(cls, torch.Tensor)


def from_dict(d: Any, *, auto_batch_size: Optional[bool] = None, batch_dims: Optional[int] = None,
              device: Any = None, batch_size: Any = None, names: Optional[Sequence[str]] = None) -> Any:
    """``TensorDict.from_dict``: a (nested) mapping as a TensorDict.

    >>> from_dict({"a": torch.zeros(3, 2)}, batch_dims=1).batch_size
    torch.Size([3])
    """
    return _td().from_dict(d, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                           batch_size=batch_size, names=names)


def fromkeys(keys: Sequence[Any], value: Any = 0) -> Any:
    """``TensorDict.fromkeys``: every key set to ``value``.

    >>> fromkeys(["a", ("b", "c")], 1)["b", "c"]
    tensor(1)
    """
    return _td().fromkeys(keys, value)


def from_module(module: Any, as_module: bool = False, lock: bool = True, use_state_dict: bool = False,
                filter_empty: bool = True) -> Any:
    """``TensorDict.from_module`` (locked by default, as upstream's top-level function)."""
    return _td().from_module(module, as_module=as_module, lock=lock, use_state_dict=use_state_dict,
                             filter_empty=filter_empty)


def from_modules(*modules: Any, as_module: bool = False, lock: bool = True, use_state_dict: bool = False,
                 lazy_stack: bool = False, expand_identical: bool = False) -> Any:
    """``TensorDict.from_modules``: the parameters of several modules of one structure, stacked."""
    return _td().from_modules(*modules, as_module=as_module, lock=lock, use_state_dict=use_state_dict,
                              lazy_stack=lazy_stack, expand_identical=expand_identical)


def from_any(obj: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None, device: Any = None,
             batch_size: Any = None) -> Any:
    """``TensorDict.from_any``: a mapping, namedtuple, dataclass, tuple or structured array as a TensorDict."""
    return _td().from_any(obj, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                          batch_size=batch_size)


def from_namedtuple(named_tuple: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                    device: Any = None, batch_size: Any = None) -> Any:
    """``TensorDict.from_namedtuple``."""
    return _td().from_namedtuple(named_tuple, auto_batch_size=auto_batch_size, batch_dims=batch_dims,
                                 device=device, batch_size=batch_size)


def from_tuple(obj: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None, device: Any = None,
               batch_size: Any = None) -> Any:
    """``TensorDict.from_tuple``: a tuple as a TensorDict with keys ``"0"``, ``"1"``, ...

    >>> sorted(from_tuple((torch.zeros(3), torch.ones(3))).keys())
    ['0', '1']
    """
    return _td().from_tuple(obj, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                            batch_size=batch_size)


def from_pytree(pytree: Any, *, batch_size: Any = None, auto_batch_size: bool = False,
                batch_dims: Optional[int] = None) -> Any:
    """``TensorDict.from_pytree``: nested lists / tuples / dicts as a TensorDict that ``to_pytree`` rebuilds."""
    return _td().from_pytree(pytree, batch_size=batch_size, auto_batch_size=auto_batch_size, batch_dims=batch_dims)


def from_dataclass(obj: Any, *, dest_cls: Optional[type] = None, auto_batch_size: bool = False,
                   batch_dims: Optional[int] = None, batch_size: Any = None, frozen: bool = False,
                   autocast: bool = False, nocast: bool = False, inplace: bool = False, shadow: bool = False,
                   tensor_only: bool = False, device: Any = None) -> Any:
    """A dataclass *type* as a tensorclass type (``<Name>_tc``, or the type itself with ``inplace=True``), or a
    dataclass *instance* as a tensorclass instance (of ``dest_cls``, or of a new ``<Name>_tc`` class).

    ``frozen`` / ``autocast`` / ``nocast`` / ``shadow`` / ``tensor_only`` are the new class's options.

    >>> @dataclasses.dataclass
    ... class Point:
    ...     x: torch.Tensor
    >>> type(from_dataclass(Point(torch.zeros(3)), auto_batch_size=True)).__name__
    'Point_tc'
    """
    from .tensorclass import is_tensorclass, tensorclass

    options = {"frozen": frozen, "autocast": autocast, "nocast": nocast, "shadow": shadow,
               "tensor_only": tensor_only}
    if isinstance(obj, type):
        if is_tensorclass(obj):
            return obj
        if not dataclasses.is_dataclass(obj):
            raise TypeError(f"Expected a dataclass input, got a {obj} input instead.")
        return tensorclass(obj if inplace else _tensorclass_copy(obj), **_chosen(options))
    if not dataclasses.is_dataclass(obj):
        raise TypeError(f"Expected a obj input, got a {type(obj)} input instead.")
    if tensor_only and (autocast or nocast):
        raise TypeError("tensor_only cannot be combined with autocast or nocast.")
    if auto_batch_size and batch_size is not None:
        raise TypeError("auto_batch_size=True and batch_size are exclusive.")
    if dest_cls is None:
        dest_cls = tensorclass(_tensorclass_copy(type(obj)), **_chosen(options))
    values = {field.name: getattr(obj, field.name) for field in dataclasses.fields(obj)}
    td = _td().from_dataclass(obj, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                              batch_size=batch_size)
    instance = dest_cls(**values, batch_size=td.batch_size, device=td.device)
    return instance


def _chosen(options: dict) -> dict:
    return {name: value for name, value in options.items() if value}


def _tensorclass_copy(dataclass_type: type) -> type:
    """A new plain class ``<Name>_tc`` with the dataclass's annotated fields and defaults."""
    hints = typing.get_type_hints(dataclass_type)
    namespace: dict = {"__annotations__": {}, "__module__": dataclass_type.__module__}
    for field in dataclasses.fields(dataclass_type):
        namespace["__annotations__"][field.name] = hints.get(field.name, field.type)
        if field.default is not dataclasses.MISSING:
            namespace[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            namespace[field.name] = dataclasses.field(default_factory=field.default_factory)
    return type(dataclass_type.__name__ + "_tc", (), namespace)
