"""Copies and moves: clone, detach, data, contiguous, to(device / dtype), share_memory_, pin_memory.

Each is one pass over the tensor leaves (:func:`tensor_leaves`) and one
:func:`rebuild`. ``to`` returns the TensorDict itself when nothing would
change (same device, and every leaf already of the requested dtype), with a
fast path for the common ``td.to(device_it_is_already_on)``.

Locks: ``clone`` gives an unlocked TensorDict; ``to``, ``detach``, ``data``
and ``contiguous`` keep the lock (as upstream does), since they give the same
structure in another form.
"""
from __future__ import annotations

from operator import is_not, methodcaller
from typing import Any, Optional

import torch

from ._apply import flat_tensors, keep_non_tensor, rebuild, tensor_leaves, unwrap
from ._base import TensorCollection
from ._context import undo_to, write_back
from ._convert import parse_batch_size, parse_device

_Tensor = torch.Tensor
_DEVICES: dict = {}  # device string -> torch.device, for the to(same device) fast path
#: dtype -> the Tensor method casting to it (each returns the tensor itself when it already has the dtype).
_CAST_METHODS = {
    torch.float64: _Tensor.double, torch.float32: _Tensor.float, torch.float16: _Tensor.half,
    torch.bfloat16: _Tensor.bfloat16, torch.int64: _Tensor.long, torch.int32: _Tensor.int,
    torch.int16: _Tensor.short, torch.int8: _Tensor.char, torch.uint8: _Tensor.byte, torch.bool: _Tensor.bool,
    torch.complex64: _Tensor.cfloat, torch.complex128: _Tensor.cdouble,
}


def _cached_device(name: str) -> Optional[torch.device]:
    """``torch.device(name)`` from a cache (``"cuda"`` alone is not cached: it means the current device)."""
    device = _DEVICES.get(name)
    if device is None and name != "cuda":
        device = parse_device(name)
        if len(_DEVICES) < 64:
            _DEVICES[name] = device
    return device


def _map_leaves(td: Any, fn: Any, *, device: Any = None, keep_lock: bool = False,
                non_tensor: Any = keep_non_tensor) -> Any:
    """A TensorDict like ``td`` with ``fn(leaf)`` for every tensor leaf (and ``device`` when given)."""
    storage = td._tensordict
    leaves = flat_tensors(storage)
    if leaves is not None:
        result = td._new_like(dict(zip(storage, map(fn, leaves))))
        if device is not None:
            result._device = device
    else:
        results = list(map(fn, tensor_leaves(td)))
        kwargs = {} if device is None else {"device": device}
        result = rebuild(td, iter(results), td._batch_size, non_tensor=non_tensor, **kwargs)
    if keep_lock and td._is_locked:
        result._lock_tree()
    return result


def _clone_non_tensor(leaf: Any, batch_size: torch.Size) -> Any:
    return leaf.clone()


def clone(td: Any, recurse: bool = True) -> Any:
    """A deep copy (``recurse=False``: a shallow one, like ``copy()``); unlocked, same device and names."""
    if not recurse:
        return td.copy()
    return _map_leaves(td, _Tensor.clone, non_tensor=_clone_non_tensor)


# --------------------------------------------------------------------------- to()


def _parse_to(args: tuple, kwargs: dict) -> tuple:
    """``(device, dtype, non_blocking, batch_size)`` from the ways ``Tensor.to`` can be called."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = kwargs.pop("non_blocking", False)
    batch_size = kwargs.pop("batch_size", None)
    kwargs.pop("copy", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}.")
    positional = list(args)
    if positional and isinstance(positional[-1], bool):
        non_blocking = positional.pop()
    for arg in positional:
        if isinstance(arg, torch.dtype):
            dtype = arg
        elif isinstance(arg, _Tensor):
            device, dtype = arg.device, arg.dtype
        elif isinstance(arg, TensorCollection):
            device = unwrap(arg)._device
        elif isinstance(arg, (str, torch.device, int)):
            device = arg
        else:
            raise TypeError(f"to() cannot take an argument of type {type(arg).__name__}.")
    device = parse_device(device) if device is not None else None
    return device, dtype, bool(non_blocking), batch_size


@write_back(undo_to)  # here rather than on the method: its already-there fast path stays free
def to(td: Any, *args: Any, **kwargs: Any) -> Any:
    """``td`` moved/cast like ``Tensor.to``; ``td`` itself when nothing changes."""
    device, dtype, non_blocking, batch_size = _parse_to(args, kwargs)
    if batch_size is not None:
        td.batch_size = parse_batch_size(batch_size)
    moving = device is not None and device != td._device
    if not moving and dtype is None:
        return td
    if device is None and not non_blocking and dtype in _CAST_METHODS:
        convert = _CAST_METHODS[dtype]  # ``leaf.double()`` is faster than ``leaf.to(torch.float64)``
    else:
        target = tuple(item for item in (device, dtype) if item is not None)
        convert = methodcaller("to", *target, non_blocking=True) if non_blocking else methodcaller("to", *target)
    storage = td._tensordict
    flat_leaves = flat_tensors(storage)
    flat = flat_leaves is not None
    leaves = flat_leaves if flat_leaves is not None else tensor_leaves(td)
    results = list(map(convert, leaves))
    if not moving and not any(map(is_not, results, leaves)):
        return td  # every leaf already had that dtype (Tensor.to returned it)
    if flat and not moving:
        result = td._new_like(dict(zip(storage, results)))
    elif moving:
        result = rebuild(td, iter(results), td._batch_size, non_tensor=_non_tensor_to(device), device=device)
    else:
        result = rebuild(td, iter(results), td._batch_size)
    if td._is_locked:
        result._lock_tree()
    return result


def _non_tensor_to(device: torch.device) -> Any:
    def move(leaf: Any, batch_size: torch.Size) -> Any:
        leaf = keep_non_tensor(leaf, batch_size)
        return leaf if leaf.device == device else leaf._to_device(device)

    return move


# --------------------------------------------------------------------------- shared and pinned memory


def share_memory_(td: Any) -> Any:
    """Move every leaf to shared memory and lock ``td``; returns ``td``."""
    for leaf in tensor_leaves(td):
        leaf.share_memory_()
    td._lock_tree()
    return td


def _leaf_is_shared(leaf: torch.Tensor) -> bool:
    if leaf.device.type != "cpu":
        return leaf.device.type == "cuda"  # CUDA memory is shared between processes through IPC
    try:
        return leaf.is_shared()
    except RuntimeError:  # tensors without storage (functorch wrappers, ...)
        return False


def is_shared(td: Any) -> bool:
    """True when ``td`` has tensor leaves and every one of them lives in shared memory."""
    leaves = tensor_leaves(td)
    return bool(leaves) and all(_leaf_is_shared(leaf) for leaf in leaves)


def pin_memory(td: Any, inplace: bool = False) -> Any:
    """Every leaf in page-locked memory (needs an accelerator; torch raises without one)."""
    if not inplace:
        return _map_leaves(td, _Tensor.pin_memory)
    _replace_leaves(td, _Tensor.pin_memory)
    return td


def _replace_leaves(td: Any, fn: Any) -> None:
    storage = td._tensordict
    for key, leaf in list(storage.items()):
        if isinstance(leaf, _Tensor):
            storage[key] = fn(leaf)
        elif isinstance(leaf, TensorCollection):
            _replace_leaves(unwrap(leaf), fn)


# --------------------------------------------------------------------------- autograd


def _can_require_grad(leaf: torch.Tensor) -> bool:
    return leaf.is_floating_point() or leaf.is_complex()


def requires_grad_(td: Any, requires_grad: bool = True) -> Any:
    """Set ``requires_grad`` on every floating-point or complex leaf (others can't carry gradients)."""
    for leaf in tensor_leaves(td):
        if _can_require_grad(leaf):
            leaf.requires_grad_(requires_grad)
    return td


def _detach(leaf: torch.Tensor) -> torch.Tensor:
    return leaf.detach()


def _data(leaf: torch.Tensor) -> torch.Tensor:
    return leaf.data


def _contiguous(leaf: torch.Tensor) -> torch.Tensor:
    return leaf.contiguous()


# --------------------------------------------------------------------------- the mixin

#: Casting shortcuts: method name -> dtype (``td.float()`` is ``td.to(torch.float32)``).
CASTS = {
    "float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16,
    "int": torch.int32, "long": torch.int64, "short": torch.int16, "bool": torch.bool,
    "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "complex64": torch.complex64, "complex128": torch.complex128,
}


class MovesMixin:
    __slots__ = ()

    def clone(self, recurse: bool = True, **kwargs: Any) -> Any:
        """A deep copy: new leaves (``recurse=False``: the same leaves, like ``copy()``).

        The copy is unlocked and keeps the device and names.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.zeros(2))
        >>> td.clone()["a"] is td["a"], td.clone(recurse=False)["a"] is td["a"]
        (False, True)
        """
        return clone(self, recurse)

    def detach(self) -> Any:
        """Every leaf detached from the autograd graph (sharing storage).

        >>> TensorDict(a=torch.ones(2, requires_grad=True)).detach().requires_grad
        False
        """
        return _map_leaves(self, _detach, keep_lock=True)

    def detach_(self) -> Any:
        """Detach every leaf in place; returns self."""
        for leaf in tensor_leaves(self):
            leaf.detach_()
        return self

    @property
    def data(self) -> Any:
        """Every leaf's ``.data`` (plain tensors sharing storage, e.g. of ``nn.Parameter`` leaves).

        >>> params = TensorDict(w=torch.nn.Parameter(torch.ones(2)))
        >>> _ = params.data.zero_()
        >>> params["w"].detach()
        tensor([0., 0.])
        """
        return _map_leaves(self, _data, keep_lock=True)

    @property
    def requires_grad(self) -> bool:
        """True when some leaf requires gradients."""
        return any(leaf.requires_grad for leaf in tensor_leaves(self))

    def requires_grad_(self, requires_grad: bool = True) -> Any:
        """Set ``requires_grad`` on every floating-point/complex leaf in place; returns self.

        >>> TensorDict(a=torch.zeros(2), i=torch.zeros(2, dtype=torch.long)).requires_grad_()["a"].requires_grad
        True
        """
        return requires_grad_(self, requires_grad)

    def contiguous(self) -> Any:
        """Every leaf contiguous in memory (leaves that already are are shared); unlocked, as upstream."""
        return _map_leaves(self, _contiguous)

    def is_contiguous(self) -> bool:
        """True when every leaf is contiguous."""
        return all(leaf.is_contiguous() for leaf in tensor_leaves(self))

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """Move and/or cast every leaf, like ``Tensor.to``; returns self when nothing changes.

        In a ``with`` block, edits to the result are written back to self on exit
        (cast back to each leaf's dtype and device).

        Accepts a device, a dtype, both, a tensor (its device and dtype) or a TensorDict
        (its device), plus ``non_blocking=`` and ``batch_size=`` (which sets the batch size
        in place). ``to(dtype)`` casts every tensor leaf.

        >>> td = TensorDict(a=torch.zeros(2), device="cpu")
        >>> td.to("cpu") is td
        True
        >>> td.to(torch.float64)["a"].dtype
        torch.float64
        >>> td.to("meta")["a"].device
        device(type='meta')
        """
        if not kwargs and len(args) == 1:
            # Fast path: already on that device.
            target = args[0]
            if type(target) is str:
                if _cached_device(target) == self._device and self._device is not None:
                    return self
            elif type(target) is torch.device and target == self._device:
                return self
        return to(self, *args, **kwargs)

    def cpu(self, **kwargs: Any) -> Any:
        """``to("cpu")``."""
        return to(self, "cpu", **kwargs)

    def cuda(self, device: Any = None, **kwargs: Any) -> Any:
        """``to("cuda")`` (or ``to("cuda:<device>")`` for an int ``device``)."""
        if device is None:
            device = "cuda"
        elif isinstance(device, int):
            device = f"cuda:{device}"
        return to(self, device, **kwargs)

    def type(self, dtype: torch.dtype) -> Any:
        """``to(dtype)``."""
        return to(self, dtype)

    def share_memory_(self) -> Any:
        """Move every leaf to shared memory and lock the TensorDict; returns self.

        >>> td = TensorDict(a=torch.zeros(2)).share_memory_()
        >>> td.is_shared(), td.is_locked
        (True, True)
        """
        return share_memory_(self)

    def is_shared(self) -> bool:
        """True when the TensorDict has tensor leaves and all of them are in shared memory."""
        return is_shared(self)

    def pin_memory(self, num_threads: Optional[int] = None, inplace: bool = False) -> Any:
        """Every leaf in page-locked memory (``inplace=True`` replaces the leaves of self)."""
        return pin_memory(self, inplace)


def _make_cast(dtype: torch.dtype, name: str) -> Any:
    def cast(self: Any) -> Any:
        return to(self, dtype)

    cast.__name__ = cast.__qualname__ = name
    cast.__doc__ = f"``to({dtype})``: every tensor leaf cast to {dtype}."
    return cast


for _name, _dtype in CASTS.items():
    setattr(MovesMixin, _name, _make_cast(_dtype, _name))
del _name, _dtype
