"""The one leaf-wise recursion, and apply / apply_ / named_apply on top of it.

:func:`map_batch` is used by every op that acts on the batch dimensions
(indexing, shape ops, stacking, ...): it applies a tensor function to each
tensor leaf, the same function to the index grid of each non-tensor stack,
and rebuilds nested TensorDicts (and tensorclasses) whose batch sizes follow
from the parent's new batch size. :func:`apply` is the user-facing variant.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ._base import TensorCollection
from ._errors import batch_mismatch_error, missing_key_error
from .nontensor import NonTensorData, NonTensorStack

_Tensor = torch.Tensor
_MISSING: Any = object()


def unwrap(value: Any) -> Any:
    """The TensorDict behind a collection (a tensorclass keeps one in ``_tensordict``)."""
    inner = getattr(value, "_tensordict", None)
    return value if type(inner) is dict else inner


def rewrap(original: Any, td: Any) -> Any:
    """Put ``td`` back in the same kind of collection as ``original``."""
    return td if unwrap(original) is original else original._rewrap(td)


def map_batch(td: Any, fn: Callable[[torch.Tensor], torch.Tensor], batch_size: torch.Size,
              device: Any = _MISSING) -> Any:
    """A new TensorDict of batch ``batch_size`` whose leaves are ``fn(leaf)``.

    ``fn`` must act on the leading (batch) dims only and keep any trailing
    dims, so that a nested TensorDict with a longer batch gets
    ``batch_size + its extra dims``.
    """
    storage = _map_batch_storage(td._tensordict, fn, len(td._batch_size), batch_size)
    return td._new_unsafe(storage, batch_size, td._device if device is _MISSING else device)


def _map_batch_storage(storage: dict, fn: Callable, old_dims: int, batch_size: torch.Size) -> dict:
    result = {}
    for key, leaf in storage.items():
        if isinstance(leaf, _Tensor):
            result[key] = fn(leaf)
        elif isinstance(leaf, TensorCollection):
            inner = unwrap(leaf)
            inner_batch = batch_size + inner._batch_size[old_dims:]
            mapped = inner._new_unsafe(
                _map_batch_storage(inner._tensordict, fn, old_dims, inner_batch), inner_batch, inner._device
            )
            result[key] = rewrap(leaf, mapped)
        elif type(leaf) is NonTensorData:
            result[key] = leaf._with_batch_size(batch_size + leaf.batch_size[old_dims:])
        else:
            result[key] = leaf._batch_op(fn)
    return result


def _is_dropped_everything(result: Any) -> bool:
    return result is None


def apply(td: Any, fn: Callable, others: tuple, *, batch_size: Any = None, device: Any = _MISSING,
          names: Any = _MISSING, inplace: bool = False, default: Any = _MISSING, filter_empty: Optional[bool] = None,
          propagate_lock: bool = False, call_on_nested: bool = False, is_leaf: Optional[Callable] = None,
          out: Any = None, named: bool = False, nested_keys: bool = False, prefix: tuple = ()) -> Any:
    from ._convert import parse_batch_size, parse_device

    new_batch = td._batch_size if batch_size is None else parse_batch_size(batch_size)
    new_device = td._device if device is _MISSING else parse_device(device)
    state = {"dropped": False}
    storage = _apply_storage(td, fn, others, new_batch, new_device, inplace, default, filter_empty,
                             call_on_nested, is_leaf, named, nested_keys, prefix, state)
    if inplace:
        return td
    if out is not None:
        out.update(td._new_unsafe(storage, new_batch, new_device), inplace=True)
        return out
    if not storage and state["dropped"] and filter_empty is not False:
        return None
    result = td._new_unsafe(storage, new_batch, new_device)
    if batch_size is None and names is _MISSING:
        result._names = td._names
    elif names is not _MISSING and names is not None:
        result.names = names
    if propagate_lock and td._is_locked:
        result.lock_()
    return result


def _apply_storage(td: Any, fn: Callable, others: tuple, batch_size: torch.Size, device: Any, inplace: bool,
                   default: Any, filter_empty: Optional[bool], call_on_nested: bool, is_leaf: Optional[Callable],
                   named: bool, nested_keys: bool, prefix: tuple, state: dict) -> dict:
    storage = td._tensordict
    other_storages = [unwrap(other)._tensordict for other in others]
    if others and default is _MISSING:
        for other_storage in other_storages:
            if other_storage.keys() != storage.keys():
                missing = set(storage) - set(other_storage)
                if missing:
                    raise missing_key_error(sorted(missing)[0], other_storage)
    n_batch = len(batch_size)
    result: dict = {}
    for key, leaf in storage.items():
        other_leaves = [other_storage.get(key, default) for other_storage in other_storages]
        if any(item is _MISSING for item in other_leaves):
            raise missing_key_error(key, other_storages[0])
        name = (prefix + (key,) if nested_keys else key)
        leaf_type = type(leaf)
        if isinstance(leaf, TensorCollection) and not call_on_nested and not (is_leaf and is_leaf(leaf_type)):
            inner = unwrap(leaf)
            inner_batch = batch_size + inner._batch_size[len(td._batch_size):]
            inner_others = tuple(
                unwrap(item) if isinstance(item, TensorCollection) else item for item in other_leaves
            )
            inner_storage = _apply_storage(inner, fn, inner_others, inner_batch, device, inplace, default,
                                           filter_empty, call_on_nested, is_leaf, named, nested_keys,
                                           prefix + (key,), state)
            if inplace:
                continue
            if not inner_storage and filter_empty is not False and inner._tensordict:
                continue
            result[key] = rewrap(leaf, inner._new_unsafe(inner_storage, inner_batch, device))
            continue
        if leaf_type in (NonTensorData, NonTensorStack):
            if not inplace:
                result[key] = leaf if leaf.batch_size[:n_batch] == batch_size else leaf._with_batch_size(
                    batch_size + leaf.batch_size[len(td._batch_size):])
            continue
        value = fn(name, leaf, *other_leaves) if named else fn(leaf, *other_leaves)
        if value is None:
            state["dropped"] = True
            continue
        if inplace:
            if value is not leaf:
                leaf.copy_(value)
            continue
        if isinstance(value, _Tensor):
            if value.shape[:n_batch] != batch_size:
                raise batch_mismatch_error(batch_size, value.shape, name)
            if device is not None and value.device != device:
                value = value.to(device)
        elif not isinstance(value, TensorCollection):
            from ._convert import to_leaf

            value = to_leaf(value, name, batch_size, device)
        result[key] = value
    return result


class ApplyMixin:
    __slots__ = ()

    def apply(self, fn: Callable, *others: Any, batch_size: Any = None, device: Any = _MISSING,
              names: Any = _MISSING, inplace: bool = False, default: Any = _MISSING,
              filter_empty: Optional[bool] = None, propagate_lock: bool = False, call_on_nested: bool = False,
              is_leaf: Optional[Callable] = None, out: Any = None, **constructor_kwargs: Any) -> Any:
        """``fn(leaf, *other_leaves)`` on every tensor leaf; a ``None`` return drops the key.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.ones(2)).apply(lambda x: x * 2)["a"]
        tensor([2., 2.])
        """
        return apply(self, fn, others, batch_size=batch_size, device=device, names=names, inplace=inplace,
                     default=default, filter_empty=filter_empty, propagate_lock=propagate_lock,
                     call_on_nested=call_on_nested, is_leaf=is_leaf, out=out)

    def apply_(self, fn: Callable, *others: Any, **kwargs: Any) -> Any:
        """``apply`` writing the results back into the existing leaves; returns self."""
        return apply(self, fn, others, inplace=True, **kwargs)

    def named_apply(self, fn: Callable, *others: Any, nested_keys: bool = False, batch_size: Any = None,
                    device: Any = _MISSING, names: Any = _MISSING, inplace: bool = False, default: Any = _MISSING,
                    filter_empty: Optional[bool] = None, propagate_lock: bool = False,
                    call_on_nested: bool = False, is_leaf: Optional[Callable] = None, out: Any = None,
                    **constructor_kwargs: Any) -> Any:
        """``fn(key, leaf, *other_leaves)``; with ``nested_keys=True`` keys are full tuples."""
        return apply(self, fn, others, batch_size=batch_size, device=device, names=names, inplace=inplace,
                     default=default, filter_empty=filter_empty, propagate_lock=propagate_lock,
                     call_on_nested=call_on_nested, is_leaf=is_leaf, out=out, named=True,
                     nested_keys=nested_keys)
