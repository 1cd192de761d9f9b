"""New collections shaped like a TensorDict: ``empty`` (the structure without tensor leaves) and the ``new_*``
members (``new_zeros``, ``new_ones``, ``new_empty``, ``new_full``, ``new_tensor``): a new batch size, each leaf's
feature shape, dtype and device kept unless the call says otherwise.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from ._apply import map_batch, rewrap, unwrap
from ._base import TensorCollection
from ._convert import parse_batch_size, parse_device
from ._shape import parse_shape
from .nontensor import NonTensorData

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

__all__ = ["NewCollectionsMixin", "empty", "new_filled"]

_Tensor = torch.Tensor
_Size = torch.Size
_MISSING: Any = object()


def empty(td: Any, recurse: bool, batch_size: Any, device: Any, names: Any) -> Any:
    new_batch = td._batch_size if batch_size is None else parse_batch_size(batch_size)
    new_device = td._device if device is _MISSING else parse_device(device)
    storage = _empty_storage(td, len(td._batch_size), new_batch, new_device) if recurse else {}
    result = td._new_unsafe(storage, new_batch, new_device)
    if names is not None:
        result.names = names
    elif batch_size is None:
        result._names = td._names
    return result


def _empty_storage(td: Any, n_batch: int, new_batch: torch.Size, device: Any) -> dict:
    storage = {}
    for key, leaf in td._tensordict.items():
        if isinstance(leaf, TensorCollection):
            inner = unwrap(leaf)
            inner_batch = new_batch + inner._batch_size[n_batch:]
            storage[key] = rewrap(leaf, inner._new_unsafe(_empty_storage(inner, n_batch, new_batch, device),
                                                          inner_batch, device))
        elif isinstance(leaf, NonTensorData):
            storage[key] = leaf._with_batch_size(new_batch + leaf.batch_size[n_batch:])
        elif not isinstance(leaf, _Tensor) and new_batch == td._batch_size:
            storage[key] = leaf  # a NonTensorStack fits only its own batch
    return storage


def new_filled(td: Any, args: tuple, make: Callable[..., torch.Tensor], kwargs: dict) -> Any:
    """``leaf.new_<kind>(size + feature shape)`` for every leaf: a new batch ``size``, same structure."""
    new_batch = _Size(parse_shape(args))
    n_batch = len(td._batch_size)
    device = kwargs.get("device", _MISSING)
    result = map_batch(td, lambda leaf: make(leaf, new_batch + leaf.shape[n_batch:], **kwargs), new_batch)
    if device is not _MISSING:
        result._device = parse_device(device)
    return result


class NewCollectionsMixin(TensorDictHost):
    """``empty`` and the ``new_*`` members of TensorDict."""

    __slots__ = ()

    def empty(self, recurse: bool = False, *, batch_size: Any = None, device: Any = _MISSING,
              names: Any = None) -> Any:
        """A TensorDict with no tensor leaf, the same batch size and device.

        With ``recurse=True`` the sub-TensorDicts (emptied) and non-tensor entries are kept.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3)}}, batch_size=[3])
        >>> list(td.empty().keys()), list(td.empty(recurse=True).keys())
        ([], ['n'])
        """
        return empty(self, recurse, batch_size, device, names)

    def new_zeros(self, *size: Any, dtype: Optional[torch.dtype] = None, device: Any = _MISSING,
                  requires_grad: bool = False, layout: torch.layout = torch.strided,
                  pin_memory: Optional[bool] = None, empty_lazy: bool = False) -> Any:
        """A TensorDict of batch ``size`` with the same structure, every leaf zeros of its feature shape.

        ``dtype`` / ``device`` / ``requires_grad`` / ``layout`` / ``pin_memory`` are the new leaves'
        (``device=None`` gives a result without a device); ``empty_lazy`` concerns lazy stacks, which a
        TensorDict's result never holds.
        """
        return new_filled(self, size, lambda leaf, shape, **kw: leaf.new_zeros(shape, **kw),
                          _new_kwargs(dtype, device, requires_grad, layout, pin_memory))

    def new_ones(self, *size: Any, dtype: Optional[torch.dtype] = None, device: Any = _MISSING,
                 requires_grad: bool = False, layout: torch.layout = torch.strided,
                 pin_memory: Optional[bool] = None, empty_lazy: bool = False) -> Any:
        """As :meth:`new_zeros`, filled with ones."""
        return new_filled(self, size, lambda leaf, shape, **kw: leaf.new_ones(shape, **kw),
                          _new_kwargs(dtype, device, requires_grad, layout, pin_memory))

    def new_empty(self, *size: Any, dtype: Optional[torch.dtype] = None, device: Any = _MISSING,
                  requires_grad: bool = False, layout: torch.layout = torch.strided,
                  pin_memory: Optional[bool] = None, empty_lazy: bool = False) -> Any:
        """As :meth:`new_zeros`, uninitialised."""
        return new_filled(self, size, lambda leaf, shape, **kw: leaf.new_empty(shape, **kw),
                          _new_kwargs(dtype, device, requires_grad, layout, pin_memory))

    def new_tensor(self, data: Any, *, dtype: Optional[torch.dtype] = None, device: Any = _MISSING,
                   requires_grad: bool = False, pin_memory: Optional[bool] = None) -> Any:
        """A TensorDict of the same structure whose leaves are ``leaf.new_tensor(data)`` (copies of ``data``,
        each with its leaf's dtype unless ``dtype``); its batch size is ``data``'s shape. With a TensorDict
        ``data``, each leaf copies the matching leaf. The device is ``device``, else ``data``'s.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> out = TensorDict(a=torch.zeros(3), b=torch.zeros(3, dtype=torch.long), batch_size=[3]).new_tensor([1., 2.])
        >>> out["a"], out["b"]
        (tensor([1., 2.]), tensor([1, 2]))
        """
        return _new_tensor(self, data, dtype, device, requires_grad, pin_memory)

    def new_full(self, size: Sequence[int], fill_value: Any, *, dtype: Optional[torch.dtype] = None,
                 device: Any = _MISSING, requires_grad: bool = False, layout: torch.layout = torch.strided,
                 pin_memory: Optional[bool] = None, empty_lazy: bool = False) -> Any:
        """As :meth:`new_zeros`, filled with ``fill_value``."""
        return new_filled(self, (size,), lambda leaf, shape, **kw: leaf.new_full(shape, fill_value, **kw),
                          _new_kwargs(dtype, device, requires_grad, layout, pin_memory))

def _new_tensor(td: Any, data: Any, dtype: Any, device: Any, requires_grad: bool, pin_memory: Any) -> Any:
    from ._apply import rebuild, tensor_leaves

    if isinstance(data, (torch.Tensor, TensorCollection)):
        shape, data_device = data.shape, data.device
    else:
        converted = torch.as_tensor(data)
        shape, data_device = converted.shape, converted.device
    kwargs: dict = {"requires_grad": requires_grad}
    result_device = data_device if device is _MISSING else device
    if device is not _MISSING:
        kwargs["device"] = device
    elif data_device is not None:
        kwargs["device"] = data_device
    if pin_memory is not None:
        kwargs["pin_memory"] = pin_memory
    if dtype is not None:
        kwargs["dtype"] = dtype
    leaves = tensor_leaves(td)
    if isinstance(data, TensorCollection):
        sources = tensor_leaves(unwrap(data))
        results = [leaf.new_tensor(source, **kwargs) for leaf, source in zip(leaves, sources)]
    else:
        results = [leaf.new_tensor(data, **kwargs) for leaf in leaves]
    batch = _Size(shape)
    result = rebuild(td, iter(results), batch, batch_of=lambda old: batch, device=parse_device(result_device))
    return result



def _new_kwargs(dtype: Any, device: Any, requires_grad: bool, layout: Any, pin_memory: Any) -> dict:
    """The ``new_*`` options that differ from the defaults, as ``Tensor.new_*`` keywords."""
    kwargs: dict = {}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if device is not _MISSING:
        kwargs["device"] = device
    if requires_grad:
        kwargs["requires_grad"] = True
    if layout is not torch.strided:
        kwargs["layout"] = layout
    if pin_memory:
        kwargs["pin_memory"] = True
    return kwargs
