"""The arguments of ``to()``, and its per-leaf form ``to(td.attrs())``.

``to()`` takes the forms of ``torch.Tensor.to`` (a device, a dtype, both, a tensor, ``memory_format=``,
``non_blocking``) and upstream's keywords: ``other=`` (a TensorDict whose device, and dtype when all its
leaves share one, are the target), ``inplace=``, ``cast_filter=``, ``batch_size=``, ``non_blocking_pin=``
and ``num_threads=``. :func:`parse_to_call` reads them all into one :class:`ToCall`; eagerly torch's
own parser reads the torch forms (same quirks, same errors), under torch.compile a traceable one does.

A collection as first argument is a per-leaf spec (what ``attrs()`` returns): each leaf goes to the
device and dtype recorded at its key (:func:`to_per_leaf`).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch

from ._apply import rebuild, unwrap
from ._base import TensorCollection
from ._convert import parse_device

__all__ = ["ToCall", "parse_to_call", "to_per_leaf", "is_attrs_argument"]

_Tensor = torch.Tensor


class ToCall:
    """What a ``to()`` call asks for (``non_blocking`` is None unless given: see docs/devices.md)."""

    __slots__ = ("device", "dtype", "non_blocking", "memory_format", "batch_size", "pin", "num_threads", "inplace",
                 "cast_filter")

    def __init__(self, device: Optional[torch.device], dtype: Optional[torch.dtype], non_blocking: Optional[bool],
                 memory_format: Optional[torch.memory_format], batch_size: Any, pin: bool,
                 num_threads: Optional[int], inplace: bool, cast_filter: Optional[Callable]) -> None:
        self.device = device
        self.dtype = dtype
        self.non_blocking = non_blocking
        self.memory_format = memory_format
        self.batch_size = batch_size
        self.pin = pin
        self.num_threads = num_threads
        self.inplace = inplace
        self.cast_filter = cast_filter if dtype is not None else None  # it selects the leaves a dtype casts

    def converts(self) -> bool:
        """A dtype or a memory format to apply (beyond a move)."""
        return self.dtype is not None or self.memory_format is not None


def is_attrs_argument(value: Any) -> bool:
    """A collection passed first to ``to()``: the per-leaf form."""
    return isinstance(value, TensorCollection) and not isinstance(value, _Tensor)


def parse_to_call(args: tuple, kwargs: dict) -> ToCall:
    """Read a ``to()`` call (``kwargs`` is consumed)."""
    keyword_non_blocking = "non_blocking" in kwargs
    non_blocking = kwargs.pop("non_blocking", None)
    batch_size = kwargs.pop("batch_size", None)
    pin = bool(kwargs.pop("non_blocking_pin", False))
    num_threads = kwargs.pop("num_threads", None)
    other = kwargs.pop("other", None)
    inplace = bool(kwargs.pop("inplace", False))
    cast_filter = kwargs.pop("cast_filter", None)
    if torch.compiler.is_compiling():
        device, dtype, memory_format = _traceable_parse(args, kwargs)
    else:
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if not keyword_non_blocking and len(args) > 1:
        non_blocking = _positional_non_blocking(args)
    device = parse_device(device) if device is not None else None
    if other is not None:
        device, dtype = _from_other(other, device)
    return ToCall(device, dtype, non_blocking, memory_format, batch_size, pin, num_threads, inplace, cast_filter)


def _traceable_parse(args: tuple, kwargs: dict) -> tuple:
    """``(device, dtype, memory_format)`` as torch's parser gives them, in Python Dynamo can trace."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    memory_format = kwargs.pop("memory_format", None)
    kwargs.pop("copy", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}.")
    for arg in args:
        if isinstance(arg, bool):
            continue  # non_blocking (read by the caller) or copy
        if isinstance(arg, torch.dtype):
            dtype = arg
        elif isinstance(arg, _Tensor):
            device, dtype = arg.device, arg.dtype
        elif isinstance(arg, (str, torch.device, int)):
            device = arg
        else:
            raise TypeError(f"to() cannot take an argument of type {type(arg).__name__}.")
    return device, dtype, memory_format


def _positional_non_blocking(args: tuple) -> Optional[bool]:
    """A positional ``non_blocking`` (after the device, dtype or tensor): False, or None for True (as
    upstream, which warns that it will honour it later)."""
    for arg in args[1:]:
        if type(arg) is bool:
            if not arg:
                return False
            if not torch.compiler.is_compiling():
                warnings.warn("to() ignores a positional non_blocking=True: it copies as for the default "
                              "non_blocking=None, which synchronizes after a copy to a device other than CUDA. "
                              "Pass non_blocking=True by keyword to skip that synchronization, or drop it to keep "
                              "the current behaviour.", FutureWarning, stacklevel=5)
            return None
    return None


def _from_other(other: Any, device: Optional[torch.device]) -> tuple:
    """``to(other=td)``: td's device, and its dtype when every tensor leaf has the same one."""
    if not isinstance(other, TensorCollection):
        raise TypeError(f"to(other=...) takes a TensorDict, got {type(other).__name__}.")
    other_device = other.device
    if device is not None and device != other_device:
        raise ValueError("other and device cannot be both passed")
    dtypes = {leaf.dtype for leaf in other.values(True, True) if isinstance(leaf, _Tensor)}
    return other_device, (next(iter(dtypes)) if len(dtypes) == 1 else None)


# ---------------------------------------------------------------------------- to(td.attrs())


def _attrs_spec(attrs_td: Any, prefix: tuple = (), out: Optional[dict] = None) -> dict:
    """``{key tuple: TensorAttrs}`` of an attrs collection (its other entries are ignored)."""
    from ._tensor_attrs import TensorAttrs

    out = {} if out is None else out
    storage = getattr(unwrap(attrs_td), "_tensordict", None)
    if type(storage) is not dict:
        return out
    for key, value in storage.items():
        if isinstance(value, TensorAttrs):
            out[prefix + (key,)] = value
        elif isinstance(value, TensorCollection):
            _attrs_spec(value, prefix + (key,), out)
    return out


def to_per_leaf(td: Any, args: tuple, kwargs: dict) -> Any:
    """``to(attrs_td)``: each leaf of ``td`` to the ``tgt_device`` / ``tgt_dtype`` recorded at its key in
    ``attrs_td`` (a leaf it doesn't name, or names with neither, is kept). As upstream, the result has no
    device of its own; ``inplace=True`` writes the leaves into ``td``."""
    if len(args) > 1:
        raise TypeError("to(attrs_td) does not accept additional positional arguments.")
    kwargs.pop("cast_filter", None)  # the attrs give each leaf its dtype
    non_blocking = kwargs.pop("non_blocking", None)
    pin = kwargs.pop("non_blocking_pin", False)
    kwargs.pop("num_threads", None)
    inplace = bool(kwargs.pop("inplace", False))
    if kwargs:
        raise TypeError(f"to(attrs_td) got unexpected keyword arguments {sorted(kwargs)}.")
    if pin:
        raise NotImplementedError("non_blocking_pin is not yet supported when an attrs tensordict is passed to "
                                  "`to()`.")
    from ._cast_filter import keyed_tensor_leaves
    from ._moves import adopt, check_device_exists

    spec = _attrs_spec(args[0])
    if inplace:
        td._check_unlocked()
    asynchronous = True if non_blocking is None else bool(non_blocking)
    pairs = list(keyed_tensor_leaves(td))
    targets = []
    for key, leaf in pairs:
        attrs = spec.get(key)
        device = None if attrs is None else attrs.tgt_device
        dtype = None if attrs is None else attrs.tgt_dtype
        if device is not None:
            device = parse_device(device)
            assert device is not None  # a device given parses to one
            check_device_exists(device)
        targets.append((device, dtype))
    from_accelerator = False
    results = []
    for (_, leaf), (device, dtype) in zip(pairs, targets):
        if device is None and dtype is None:
            results.append(leaf)
            continue
        if device is not None and device.type == "cpu" and leaf.device.type not in ("cpu", "meta"):
            from_accelerator = True
        results.append(leaf.to(device=device, dtype=dtype, non_blocking=asynchronous))
    result = rebuild(td, iter(results), td._batch_size, device=None)
    if td._is_locked:
        result._lock_tree()
    if from_accelerator and non_blocking is None:
        from ._consolidate import sync_transfers

        sync_transfers()  # the host reads what came from an accelerator
    if inplace:
        return adopt(td, result)
    return result
