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

import warnings
from operator import is_not, methodcaller
from typing import Any, Callable, Optional

import torch

from ._apply import flat_tensors, keep_non_tensor, rebuild, tensor_leaves, unwrap
from ._base import TensorCollection
from ._bounded_cache import BoundedCache
from ._context import undo_to, write_back
from ._convert import parse_batch_size, parse_device

_Tensor = torch.Tensor
_DEVICES: BoundedCache = BoundedCache(64)  # device string -> torch.device, for the to(same device) fast path
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
        device = _DEVICES.put(name, parse_device(name))
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
# How leaves are copied, as upstream (docs/devices.md):
# * non_blocking=None (the default): every copy is issued with non_blocking=True, and a move to a
#   device other than CUDA (e.g. to the host) waits once, after the last copy, if a leaf came from
#   an accelerator: the caller can read the result at once. Under torch.compile these copies block.
# * non_blocking=True: no wait; synchronise before reading a result on the host.
# * non_blocking=False: blocking copies.
# A leaf already on the target device is kept (no .to call): a device check per leaf.

_is_cpu = _Tensor.is_cpu.__get__  # type: ignore[attr-defined]  # (a getset descriptor)
_device_of = _Tensor.device.__get__  # type: ignore[attr-defined]


def _parse_to(args: tuple, kwargs: dict) -> tuple:
    """``(device, dtype, non_blocking, batch_size)`` from the ways ``Tensor.to`` can be called."""
    device, dtype, non_blocking, batch_size, _, _ = parse_to_call(args, kwargs)
    return device, dtype, bool(non_blocking), batch_size


def parse_to_call(args: tuple, kwargs: dict) -> tuple:
    """``(device, dtype, non_blocking, batch_size, non_blocking_pin, num_threads)`` of a ``to()`` call.

    ``non_blocking`` is None unless given: by keyword, or as a positional bool after the device,
    dtype or tensor (a positional True is read as None, with upstream's FutureWarning).
    """
    keyword = "non_blocking" in kwargs
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = kwargs.pop("non_blocking", None)
    batch_size = kwargs.pop("batch_size", None)
    pin = bool(kwargs.pop("non_blocking_pin", False))
    num_threads = kwargs.pop("num_threads", None)
    kwargs.pop("copy", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}.")
    positional = list(args)
    if positional and isinstance(positional[-1], bool):
        flag = positional.pop()
        if not keyword:
            non_blocking = _positional_non_blocking(flag)
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
    return device, dtype, non_blocking, batch_size, pin, num_threads


def _positional_non_blocking(flag: bool) -> Optional[bool]:
    if not flag:
        return False
    if not torch.compiler.is_compiling():
        warnings.warn("to() ignores a positional non_blocking=True: it copies as for the default non_blocking=None, "
                      "which synchronizes after a copy to a device other than CUDA. Pass non_blocking=True by "
                      "keyword to skip that synchronization, or drop it to keep the current behaviour.",
                      FutureWarning, stacklevel=4)
    return None


def check_device_exists(device: torch.device) -> None:
    """Raise torch's own error now, before any leaf moves, for an accelerator index that does not exist."""
    if device.type in ("cpu", "meta") or device.index is None or torch.compiler.is_compiling():
        return
    module = getattr(torch, device.type, None)
    count = getattr(module, "device_count", None)
    if count is not None and device.index >= count():
        torch.empty(0, device=device)  # raises torch's error for this device
        raise RuntimeError(f"{device} does not exist: there are {count()} {device.type} devices.")


def _all_on(leaves: list, device: torch.device) -> bool:
    """Every leaf on ``device`` already: one C-level pass (``is_cpu`` for the CPU, cheaper than a device)."""
    if device.type == "cpu":
        return all(map(_is_cpu, leaves))
    return set(map(_device_of, leaves)) <= {device}


@write_back(undo_to)  # here rather than on the method: its already-there fast path stays free
def to(td: Any, *args: Any, **kwargs: Any) -> Any:
    """``td`` moved/cast like ``Tensor.to``; ``td`` itself when nothing changes."""
    device, dtype, non_blocking, batch_size, pin, num_threads = parse_to_call(args, kwargs)
    if batch_size is not None:
        td.batch_size = parse_batch_size(batch_size)
    moving = device is not None and device != td._device
    if not moving and dtype is None:
        return td
    if moving and dtype is None and getattr(td, "_consolidated", None) is not None:
        from . import _consolidate

        if _consolidate.is_consolidated(td):
            check_device_exists(device)
            return _consolidate.to_consolidated(td, device, non_blocking, pin)
    storage = td._tensordict
    flat_leaves = flat_tensors(storage)
    flat = flat_leaves is not None
    leaves = flat_leaves if flat_leaves is not None else tensor_leaves(td)
    if moving and dtype is None and not pin and _all_on(leaves, device):
        results = leaves  # nothing to copy: a new TensorDict on that device over the same leaves
        wait = False
    else:
        if moving:
            check_device_exists(device)
        results, wait = _convert(leaves, device if moving else None, dtype, non_blocking, pin, num_threads)
    if not moving and not any(map(is_not, results, leaves)):
        return td  # every leaf already had that dtype (Tensor.to returned it)
    if flat and not moving:
        result = td._new_like(dict(zip(storage, results)))
    elif flat:
        result = td._new_unsafe(dict(zip(storage, results)), td._batch_size, device, td._names)
    elif moving:
        result = rebuild(td, iter(results), td._batch_size, non_tensor=_non_tensor_to(device), device=device)
    else:
        result = rebuild(td, iter(results), td._batch_size)
    if td._is_locked:
        result._lock_tree()
    if wait:
        from ._consolidate import sync_transfers

        sync_transfers()
    return result


def copy_mode(device: Optional[torch.device], non_blocking: Optional[bool], compiling: bool,
              all_on_host: Callable[[], bool]) -> tuple:
    """``(copy asynchronously, wait once after the copies)`` for ``to(device, non_blocking=...)``.

    The default (None) copies asynchronously and, for a target other than CUDA (its stream
    orders the work that reads the result), waits at the end if a leaf came from an
    accelerator (``all_on_host()`` is False): the host may read the result at once. Under
    torch.compile such copies block instead (the wait can't be traced). True never waits;
    False blocks.
    """
    if non_blocking is not None:
        return bool(non_blocking), False
    if device is None:
        return False, False
    if device.type != "cuda" and compiling:
        return False, False
    return True, device.type != "cuda" and not all_on_host()


def _convert(leaves: list, device: Optional[torch.device], dtype: Optional[torch.dtype],
             non_blocking: Optional[bool], pin: bool, num_threads: Optional[int]) -> tuple:
    """``(converted leaves, whether to wait for the copies)`` for ``to(device, dtype)``."""
    asynchronous, wait = copy_mode(device, non_blocking, torch.compiler.is_compiling(),
                                   lambda: all(map(_is_cpu, leaves)))
    if device is None and not asynchronous and dtype in _CAST_METHODS:
        convert = _CAST_METHODS[dtype]  # ``leaf.double()`` is faster than ``leaf.to(torch.float64)``
    else:
        target = tuple(item for item in (device, dtype) if item is not None)
        convert = methodcaller("to", *target, non_blocking=True) if asynchronous else methodcaller("to", *target)
    if pin:
        from ._consolidate import _pin_all

        leaves = _pin_all(leaves, num_threads)
    return list(map(convert, leaves)), wait


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


def _canonical(leaf: torch.Tensor) -> torch.Tensor:
    """``leaf`` with the row-major strides of its shape (copied unless it has them already)."""
    expected, step = [], 1
    for size in reversed(leaf.shape):
        expected.append(step)
        step *= max(size, 1)
    if leaf.is_contiguous() and tuple(reversed(expected)) == leaf.stride():
        return leaf
    return leaf.clone(memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------- the mixin

#: Casting shortcuts: method name -> dtype (``td.float()`` is ``td.to(torch.float32)``).
CASTS = {
    "float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16,
    "int": torch.int32, "long": torch.int64, "short": torch.int16, "bool": torch.bool,
    "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "complex64": torch.complex64, "complex128": torch.complex128,
    "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64, "complex32": torch.complex32,
}
# Upstream's quantized shorthands: torch can't cast a tensor to these with ``to`` (it raises, as upstream's do).
QUANTIZED_CASTS = {"qint8": torch.qint8, "qint32": torch.qint32, "quint8": torch.quint8, "quint4x2": torch.quint4x2}


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

    def contiguous(self, *, canonical: bool = False, inplace: bool = False) -> Any:
        """Every leaf contiguous in memory (leaves that already are are shared); unlocked, as upstream.

        ``canonical=True`` also copies a leaf whose strides are not the row-major ones of its shape (which
        ``is_contiguous`` may accept with dims of size 1); ``inplace=True`` replaces the leaves of this
        TensorDict (its identity, keys and nested TensorDicts kept) and returns it.
        """
        result = _map_leaves(self, _canonical if canonical else _contiguous)
        if not inplace:
            return result
        from ._inplace_results import take_over

        return take_over(self, result, allow_locked=True)

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
        """``to("cpu", **kwargs)``: self when its device is already the CPU."""
        return self.to("cpu", **kwargs)

    def cuda(self, device: Any = None, **kwargs: Any) -> Any:
        """``to(cuda device)``: ``None`` is the current CUDA device, an int (or a str of digits) an index.

        A device that is not a CUDA one raises ``RuntimeError``.
        """
        if device is None:
            device = torch.device("cuda")
        elif isinstance(device, torch.device) or (isinstance(device, str) and not device.isdigit()):
            device = torch.device(device)
            if device.type != "cuda":
                raise RuntimeError(f"Invalid device {device}, must be a cuda device.")
        else:
            device = f"cuda:{device}"
        return self.to(device, **kwargs)

    def type(self, dst_type: Any, *, cast_filter: Optional[Callable[..., bool]] = None) -> Any:
        """Every tensor leaf through ``Tensor.type(dst_type)`` (a dtype, or a name such as
        ``"torch.IntTensor"``); ``cast_filter(key, leaf)`` selects the leaves to cast. As upstream, the result
        of a locked TensorDict is unlocked (with a ``FutureWarning``)."""
        if self._is_locked:
            warnings.warn("type() returns an unlocked tensordict for a locked one. Starting with TensorDict 0.17, "
                          "the default will change to a locked result, as the other casts return.", FutureWarning,
                          stacklevel=2)
        cast = methodcaller("type", dst_type)
        if cast_filter is None:
            return _map_leaves(self, cast)
        from ._cast_filter import cast_filtered

        return cast_filtered(self, cast, cast_filter, keep_lock=False)

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
        """Every tensor leaf in page-locked (pinned) memory, for fast and asynchronous copies to an accelerator.

        ``num_threads`` pins on that many threads (``None`` / ``0``: the calling one). ``inplace=True``
        replaces the leaves of self and returns self (a locked TensorDict keeps its leaves). Needs an
        accelerator: without one torch raises. See docs/devices.md.
        """
        from ._consolidate import pin_memory

        return pin_memory(self, num_threads, inplace)

    def pin_memory_(self, num_threads: int = 0) -> Any:
        """``pin_memory(num_threads, inplace=True)``: self, its leaves pinned (deprecated, as upstream)."""
        from ._consolidate import pin_memory

        warnings.warn(f"{type(self).__name__}.pin_memory_() is deprecated: use pin_memory(inplace=True) instead.",
                      DeprecationWarning, stacklevel=2)

        return pin_memory(self, num_threads, True)

    def record_stream(self, stream: Any) -> Any:
        """Mark every tensor leaf as used by the CUDA ``stream`` (``Tensor.record_stream``); returns self.

        Its memory is then not reused before the work queued on ``stream`` is done. A
        TensorDict is tied to one stream: another one raises ``RuntimeError``.
        """
        from ._consolidate import record_stream

        return record_stream(self, stream)

    def consolidate(self, filename: Any = None, *, num_threads: Any = 0, device: Any = None,
                    non_blocking: bool = False, inplace: bool = False, return_early: bool = False,
                    use_buffer: bool = False, share_memory: bool = False, pin_memory: bool = False,
                    metadata: bool = False) -> Any:
        """Every tensor leaf as a view into one flat byte storage (upstream's layout); the result is locked.

        ``to(device)`` then moves the whole storage in one copy. ``filename`` maps a file as the
        storage and writes the structure after it (:func:`from_consolidated` reads it back);
        ``device`` places the storage (default: this TensorDict's device, or the CPU);
        ``pin_memory`` / ``share_memory`` place it in pinned / shared memory; ``inplace=True``
        swaps the leaves of self; ``num_threads > 1`` copies by chunks on threads
        (``return_early=True``: returns a future whose ``result()`` waits). An already
        consolidated TensorDict is returned as it is. See docs/devices.md.

        >>> td = TensorDict(a=torch.zeros(3), b={"c": torch.ones(3, dtype=torch.int16)}, batch_size=[3])
        >>> packed = td.consolidate()
        >>> packed.is_consolidated(), packed.is_locked, packed["b", "c"].untyped_storage().nbytes()
        (True, True, 24)
        """
        from ._consolidate import consolidate

        return consolidate(self, filename, num_threads=num_threads, device=device, non_blocking=non_blocking,
                           inplace=inplace, return_early=return_early, use_buffer=use_buffer,
                           share_memory=share_memory, pin_memory=pin_memory, metadata=metadata)

    def is_consolidated(self) -> bool:
        """True while the tensor leaves are views into the storage :meth:`consolidate` made."""
        if getattr(self, "_consolidated", None) is None:
            return False
        from ._consolidate import is_consolidated

        return is_consolidated(self)

    @classmethod
    def from_consolidated(cls, filename: Any) -> Any:
        """What ``consolidate(filename=...)`` wrote, upstream's files too (:func:`torchdict.from_consolidated`)."""
        from ._consolidate import from_consolidated

        return from_consolidated(filename)


def _make_cast(dtype: torch.dtype, name: str) -> Any:
    def cast(self: Any, *, cast_filter: Optional[Callable[..., bool]] = None) -> Any:
        if cast_filter is None:
            return to(self, dtype)
        from ._cast_filter import cast_filtered

        return cast_filtered(self, methodcaller("to", dtype), cast_filter)

    cast.__name__ = cast.__qualname__ = name
    cast.__doc__ = (f"``to({dtype})``: every tensor leaf cast to {dtype}; with ``cast_filter(key, leaf) -> bool``, "
                    "only the leaves it selects.")
    return cast


for _name, _dtype in {**CASTS, **QUANTIZED_CASTS}.items():
    setattr(MovesMixin, _name, _make_cast(_dtype, _name))
del _name, _dtype


# The unsigned casts beside ``float()``, ``int()``, ... (torch has these dtypes since 2.3).
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        setattr(MovesMixin, _name, _make_cast(getattr(torch, _name), _name))
del _name
