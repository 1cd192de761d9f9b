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
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from ._apply import flat_tensors, keep_non_tensor, rebuild, tensor_leaves, unwrap
from ._base import TensorCollection
from ._bounded_cache import BoundedCache
from ._context import undo_to, write_back
from ._convert import parse_batch_size, parse_device
from ._unbatched import UnbatchedTensor, detach_unbatched_

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_Tensor = torch.Tensor
_DEVICES: BoundedCache = BoundedCache(64)  # device string -> torch.device, for the to(same device) fast path
#: dtype -> the Tensor method casting to it (each returns the tensor itself when it already has the dtype).
_CAST_METHODS = {
    torch.float64: _Tensor.double, torch.float32: _Tensor.float, torch.float16: _Tensor.half,
    torch.bfloat16: _Tensor.bfloat16, torch.int64: _Tensor.long, torch.int32: _Tensor.int,
    torch.int16: _Tensor.short, torch.int8: _Tensor.char, torch.uint8: _Tensor.byte, torch.bool: _Tensor.bool,
    # cfloat and cdouble are missing from torch's stubs
    torch.complex64: getattr(_Tensor, "cfloat"), torch.complex128: getattr(_Tensor, "cdouble"),
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

_is_cpu = getattr(_Tensor, "is_cpu").__get__  # (a getset descriptor)
_device_of = _Tensor.device.__get__


def _parse_to(args: tuple, kwargs: dict) -> tuple:
    """``(device, dtype, non_blocking, batch_size)`` from the ways ``Tensor.to`` can be called."""
    from ._to_call import parse_to_call

    call = parse_to_call(args, kwargs)
    return call.device, call.dtype, bool(call.non_blocking), call.batch_size


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
    """``td`` moved/cast like ``Tensor.to``; ``td`` itself when nothing changes (see ``MovesMixin.to``)."""
    from ._to_call import is_attrs_argument, parse_to_call, to_per_leaf  # on first use: import torchdict stays light

    if args and is_attrs_argument(args[0]):
        return to_per_leaf(td, args, kwargs)
    call = parse_to_call(args, kwargs)
    device, batch_size = call.device, call.batch_size
    target = device if device is not None and device != td._device else None  # where the leaves move, if anywhere
    moving = target is not None
    if not moving and not call.converts():
        if batch_size is not None:
            td.batch_size = parse_batch_size(batch_size)
        return td
    if batch_size is not None:
        batch_size = parse_batch_size(batch_size)
        check_leaves_fit(td, batch_size)  # before any copy: a failed call changes nothing
    consolidated_move = moving and not call.converts() and td.is_consolidated()
    if call.inplace and not consolidated_move:
        td._check_unlocked()  # (a consolidated TensorDict, locked, moves in place as one storage)
    if consolidated_move and target is not None:
        from . import _consolidate

        check_device_exists(target)
        result = _consolidate.to_consolidated(td, target, call.non_blocking, call.pin, call.inplace)
        if batch_size is not None:
            result.batch_size = batch_size
        return result
    storage = td._tensordict
    flat_leaves = flat_tensors(storage)
    flat = flat_leaves is not None
    leaves = flat_leaves if flat_leaves is not None else tensor_leaves(td)
    if target is not None and not call.converts() and not call.pin and _all_on(leaves, target):
        results = leaves  # nothing to copy: a new TensorDict on that device over the same leaves
        wait = False
    else:
        if target is not None:
            check_device_exists(target)
        results, wait = _convert(td, leaves, target, call)
    if not moving and batch_size is None and not any(map(is_not, results, leaves)):
        return td  # every leaf already had that dtype and memory format (Tensor.to returned it)
    if call.inplace:
        result = _rebuilt(td, results, flat, target, None)
        if wait:
            from ._consolidate import sync_transfers

            sync_transfers()
        adopt(td, result)
        if batch_size is not None:
            td.batch_size = batch_size  # the setter's rule (checked above)
        return td
    result = _rebuilt(td, results, flat, target, batch_size)
    if td._is_locked:
        result._lock_tree()
    if wait:
        from ._consolidate import sync_transfers

        sync_transfers()
    return result


def _rebuilt(td: Any, results: list, flat: bool, target: Optional[torch.device],
             batch_size: Optional[torch.Size]) -> Any:
    """``td``'s structure over ``results`` (on ``target``, the device moved to, when there is one). With
    ``batch_size`` (upstream's rule for a move or cast with a batch size), the result and every nested
    TensorDict get exactly that batch size and no names, with upstream's FutureWarning where a later version
    will keep them."""
    if batch_size is not None:
        if not torch.compiler.is_compiling() and _batch_size_will_change(td, batch_size, root=True):
            warnings.warn("to() with a batch_size and a new device or dtype gives every nested tensordict exactly "
                          "that batch size and erases the names. Starting with TensorDict 0.17, the default will "
                          "change to setting the batch size as to(batch_size=...) does without a device, which "
                          "keeps the nested batch sizes and names. Call to(...) and then set the batch_size to "
                          "get the new behaviour now.", FutureWarning, stacklevel=4)
        kwargs = {"device": target} if target is not None else {}
        non_tensor = _non_tensor_to(target) if target is not None else keep_non_tensor
        result = rebuild(td, iter(results), batch_size, batch_of=lambda old: batch_size, non_tensor=non_tensor,
                         **kwargs)
        _erase_names(result)
        return result
    storage = td._tensordict
    if flat and target is None:
        return td._new_like(dict(zip(storage, results)))
    if flat:
        return td._new_unsafe(dict(zip(storage, results)), td._batch_size, target, td._names)
    if target is not None:
        return rebuild(td, iter(results), td._batch_size, non_tensor=_non_tensor_to(target), device=target)
    return rebuild(td, iter(results), td._batch_size)


def check_leaves_fit(td: Any, batch_size: torch.Size) -> None:
    """Every tensor leaf's shape starts with ``batch_size`` (torch's message otherwise, as the setter's)."""
    from ._cast_filter import keyed_tensor_leaves
    from ._errors import incompatible_batch_error

    count = len(batch_size)
    for key, leaf in keyed_tensor_leaves(td):
        if tuple(leaf.shape[:count]) != tuple(batch_size):
            raise incompatible_batch_error(key if len(key) > 1 else key[0], leaf.shape, batch_size)


def _batch_size_will_change(td: Any, batch_size: torch.Size, root: bool) -> bool:
    """Whether ``to(device, batch_size=...)`` gives another result than ``to(device)`` then the setter."""
    inner = unwrap(td)
    if not root:
        own = getattr(inner, "_batch_size", None)
        if own is None or getattr(inner, "_tensordict", None) is None:
            return True  # a nested lazy stack
        if len(own) >= len(batch_size) and own != batch_size:
            return True
    names = getattr(inner, "_names", None)
    if names is not None and any(name is not None for name in names[:len(batch_size)]):
        return True
    storage = getattr(inner, "_tensordict", None)
    if type(storage) is not dict:
        return False
    return any(_batch_size_will_change(value, batch_size, root=False) for value in storage.values()
               if isinstance(value, TensorCollection) and not getattr(type(value), "_is_non_tensor", False))


def _erase_names(td: Any) -> None:
    inner = unwrap(td)
    if hasattr(inner, "_names"):
        inner._names = None
    storage = getattr(inner, "_tensordict", None)
    if type(storage) is dict:
        for value in storage.values():
            if isinstance(value, TensorCollection) and not getattr(type(value), "_is_non_tensor", False):
                _erase_names(value)


def adopt(td: Any, result: Any) -> Any:
    """``to(..., inplace=True)``: ``td`` takes the leaves and devices of ``result`` (its own structure
    converted), keeping its identity and that of its nested collections; returns ``td``."""
    from ._inplace_results import take_over

    _adopt_devices(unwrap(td), unwrap(result))
    return take_over(td, result, allow_locked=True)


def _adopt_devices(td: Any, result: Any) -> None:
    td._device = result._device
    storage, new = td._tensordict, result._tensordict
    for key, value in storage.items():
        other = new.get(key)
        if isinstance(value, TensorCollection) and isinstance(other, TensorCollection):
            inner, other_inner = unwrap(value), unwrap(other)
            if type(getattr(inner, "_tensordict", None)) is dict and type(getattr(other_inner, "_tensordict", None)) \
                    is dict:
                _adopt_devices(inner, other_inner)


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


def _convert(td: Any, leaves: list, device: Optional[torch.device], call: Any) -> tuple:
    """``(converted leaves, whether to wait for the copies)`` for ``to(device, dtype, memory_format=...)``."""
    dtype, memory_format = call.dtype, call.memory_format
    asynchronous, wait = copy_mode(device, call.non_blocking, torch.compiler.is_compiling(),
                                   lambda: all(map(_is_cpu, leaves)))
    dtypes: Any = None
    if call.cast_filter is not None:
        from ._cast_filter import keyed_tensor_leaves

        # The predicate runs on every leaf before any copy: one that raises leaves nothing half done.
        dtypes = [dtype if call.cast_filter(key, leaf) else None for key, leaf in keyed_tensor_leaves(td)]
    if call.pin:
        from ._consolidate import _pin_all

        leaves = _pin_all(leaves, call.num_threads)
    if dtypes is None and memory_format is None:
        if device is None and not asynchronous and dtype in _CAST_METHODS:
            convert = _CAST_METHODS[dtype]  # ``leaf.double()`` is faster than ``leaf.to(torch.float64)``
        else:
            target = tuple(item for item in (device, dtype) if item is not None)
            convert = methodcaller("to", *target, non_blocking=True) if asynchronous else methodcaller("to", *target)
        return list(map(convert, leaves)), wait
    if dtypes is None:
        dtypes = [dtype] * len(leaves)
    return [_convert_leaf(leaf, device, leaf_dtype, memory_format, asynchronous)
            for leaf, leaf_dtype in zip(leaves, dtypes)], wait


def _convert_leaf(leaf: torch.Tensor, device: Optional[torch.device], dtype: Optional[torch.dtype],
                  memory_format: Optional[torch.memory_format], asynchronous: bool) -> torch.Tensor:
    """One leaf to ``device`` / ``dtype``; ``memory_format`` applies to 4-D and 5-D leaves (as
    ``nn.Module.to`` does)."""
    target: tuple = tuple(item for item in (device, dtype) if item is not None)  # Tensor.to's positional form
    if memory_format is not None and leaf.dim() in (4, 5):
        # (mypy can't tell that ``target``, a device and/or a dtype, leaves non_blocking to the keyword)
        if asynchronous:
            return leaf.to(*target, non_blocking=True, memory_format=memory_format)  # type: ignore[call-overload]
        return leaf.to(*target, memory_format=memory_format)
    if not target:
        return leaf
    return leaf.to(*target, non_blocking=True) if asynchronous else leaf.to(*target)  # type: ignore[call-overload]


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


class MovesMixin(TensorDictHost):
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
        unbatched = False
        for leaf in tensor_leaves(self):
            if type(leaf) is not _Tensor and isinstance(leaf, UnbatchedTensor):
                unbatched = True  # an alias (a view): replaced by its detach() below, as upstream
            else:
                leaf.detach_()
        if unbatched:
            detach_unbatched_(self)
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

        Accepts what ``Tensor.to`` does (a device, a dtype, both, a tensor, ``non_blocking=``,
        ``memory_format=``: applied to the 4-D and 5-D leaves) and upstream's keywords:
        ``other=`` (a TensorDict: its device, and its dtype when all its leaves share one),
        ``inplace=True`` (the leaves written into self, returned), ``cast_filter=`` (which leaves
        a dtype casts), ``batch_size=`` (alone: set in place; with a move or cast: the result's),
        ``non_blocking_pin=`` and ``num_threads=``. A collection first (``to(other.attrs())``)
        sends each leaf to the device and dtype recorded at its key. A failed call changes
        nothing. See docs/devices.md.

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
