"""Batch-shape ops, indexing and ``torch.stack`` / ``torch.cat`` of the non-tensor leaves.

``NonTensorShapeMixin`` (a base of ``NonTensorData`` and ``NonTensorStack``) runs each shape op
(``view``, ``permute``, ``split``, ``leaf[index]``, ...) on a one-entry TensorDict holding the leaf
and takes the leaf back out: the argument parsing, the errors, the names of the dims and the
leaf's own batch op (``_batch_op`` on the index grid) are the TensorDict's, so the two cannot drift
apart. Where upstream's answer for a lone leaf differs from what a leaf inside a TensorDict
becomes, the method says so: ``NonTensorData.unsqueeze`` and an ``expand`` that adds dims give a
``NonTensorStack`` (upstream stacks copies of the value), and ``NonTensorStack.view`` only
regroups dims (upstream's lazy stack refuses any other view).

``stack`` / ``cat`` here are upstream's for lone leaves: a stack is always a ``NonTensorStack``;
a cat of one value is a ``NonTensorData``, otherwise the stack of the inputs' slices.
"""
from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from .. import nontensor as _core

if TYPE_CHECKING:
    from ._host import NonTensorHost
else:
    NonTensorHost = object

__all__ = ["NonTensorShapeMixin", "stack", "cat", "stack_values"]

_KEY = "leaf"


def _wrap(leaf: Any) -> Any:
    """A TensorDict whose one entry is ``leaf`` (same batch size, device and names)."""
    from ..tensordict import TensorDict

    return TensorDict._new_unsafe({_KEY: leaf}, leaf._batch_size, leaf._device, leaf._names)


def _unwrap(source: Any, result: Any) -> Any:
    """The leaf of each TensorDict in ``result`` (one, or a tuple of them), with its dim names."""
    if isinstance(result, (tuple, list)):
        return tuple(_unwrap(source, item) for item in result)
    leaf = result._tensordict[_KEY]
    if leaf is source:  # an op that changed nothing: a new wrapper, so naming it leaves ``source`` alone
        leaf = source._shallow()
    leaf._names = None if result._names is None else list(result._names)
    return leaf


def _via_tensordict(name: str) -> Callable:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _unwrap(self, getattr(_wrap(self), name)(*args, **kwargs))

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``TensorDict.{name}`` applied to this leaf's batch dims (values follow their elements)."
    return method


def _values_of_their_own(method: Callable) -> Callable:
    """``method``, whose result stack's elements are each a value of its own (no origins)."""
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if type(result) is _core.NonTensorStack:
            result._origins = None
        return result

    wrapped.__name__ = wrapped.__qualname__ = method.__name__
    wrapped.__doc__ = method.__doc__
    setattr(wrapped, "__wrapped__", method)  # its signature
    return wrapped


def _checked_by_torch(method: Callable) -> Callable:
    """``method`` after torch's checks of its arguments on a tensor of the batch shape (torch's errors)."""
    name = method.__name__

    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._batch_size:  # torch moves dims of a 0-dim tensor; upstream refuses (no batch dim)
            raise IndexError("Dimension out of range (expected to be in range of [-0, -1], but got "
                             f"{args[0] if args else 0})")
        getattr(_core._shape_probe(self._batch_size), name)(*args, **kwargs)
        return method(self, *args, **kwargs)

    checked.__name__ = checked.__qualname__ = name
    checked.__doc__ = method.__doc__
    setattr(checked, "__wrapped__", method)  # its signature
    return checked


def _first_mismatch(left: Sequence[int], right: Sequence[int]) -> int:
    # The index of the first differing size, or the last compared index when none differs.
    position = 0
    for position, (a, b) in enumerate(zip(left, right)):
        if a != b:
            break
    return position


def _merges(merged: torch.Size, split: torch.Size) -> bool:
    """Whether ``merged`` is ``split`` with one run of adjacent dims flattened into one."""
    if not merged or not split or merged.numel() != split.numel():
        return False
    head = _first_mismatch(merged, split)
    tail = _first_mismatch(list(reversed(merged)), list(reversed(split)))
    return head == len(merged) - tail - 1


def _stack_error(first: torch.Size, other: torch.Size) -> RuntimeError:
    return RuntimeError(
        f"batch sizes in tensordicts differs, LazyStackedTensorDict cannot be created. Got "
        f"td[0].batch_size={first} and td[i].batch_size={other}. A NonTensorStack can't be ragged: "
        "every value stacked must have the same batch size."
    )


def _common_device(leaves: Sequence[Any]) -> Optional[torch.device]:
    devices = {leaf._device for leaf in leaves}
    return devices.pop() if len(devices) == 1 else None


def _with_out(result: Any, out: Any, verb: str) -> Any:
    """Upstream's ``out=``: written when it can hold the result, else the result is returned."""
    if out is None:
        return result
    if out._batch_size != result._batch_size:
        raise RuntimeError(f"out.batch_size and {verb} batch size must match.")
    if type(out) is _core.NonTensorStack or isinstance(result, _core.NonTensorData):
        out.update_(result)
        return out
    return result


def stack(input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """``torch.stack`` of non-tensor leaves: always a ``NonTensorStack`` (as upstream).

    >>> from torchdict import NonTensorData
    >>> torch.stack([NonTensorData("a"), NonTensorData("a")]).tolist()
    ['a', 'a']
    """
    leaves = list(input)
    if not leaves:
        raise RuntimeError("stack expects a non-empty TensorList")
    first = leaves[0]._batch_size
    for leaf in leaves[1:]:
        if leaf._batch_size != first:
            raise _stack_error(first, leaf._batch_size)
    position = dim + len(first) + 1 if dim < 0 else dim
    if not 0 <= position <= len(first):
        shape = list(first)
        shape.insert(dim, len(leaves))
        raise RuntimeError(f"Stack dim {dim} is too big for batch size {torch.Size(shape)}.")
    from ._metadata import stacked_metadata

    sizes = list(first)
    sizes.insert(position, len(leaves))
    one = stacked_metadata(leaves, torch.Size(sizes))  # MetaData holding one object stays one
    if one is None:
        one = captured_stack(leaves, position)
    if one is not None:
        return _with_out(one, out, "stack")
    result = _core.combine_non_tensor(leaves, lambda grids: torch.stack(grids, position))
    if isinstance(result, _core.NonTensorData):  # one value stacked is still a stack
        result = _core.NonTensorStack._from_flat(result._flat_values(), result._batch_size, result._device)
    result._device = _common_device(leaves)
    return _with_out(result, out, "stack")


def captured_stack(leaves: Sequence[Any], dim: int) -> Any:
    """With ``set_capture_non_tensor_stack(True)``, the stack of ``NonTensorData`` leaves that hold equal
    values, as one ``NonTensorData`` (upstream's capture); otherwise None."""
    from .. import _options
    from .._indexing import same_value

    if not _options.CAPTURE_NON_TENSOR_STACK:
        return None
    first = leaves[0]
    if not all(isinstance(leaf, _core.NonTensorData) and same_value(leaf._data, first._data) for leaf in leaves):
        return None
    sizes = list(first._batch_size)
    sizes.insert(dim, len(leaves))
    return _core.NonTensorData._make(first._data, torch.Size(sizes), first._device)


def cat(input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """``torch.cat`` of non-tensor leaves: one shared value stays a ``NonTensorData``; otherwise the
    stack of every input's slices along ``dim`` (so each slice of a ``NonTensorData`` reads back as it)."""
    from .._indexing import same_value

    leaves = list(input)
    if not leaves:
        raise RuntimeError("torch.cat(): expected a non-empty list of Tensors")
    first = leaves[0]
    batch = first._batch_size
    if not -len(batch) <= dim < len(batch):
        # Upstream words it as the class of the first input does (its lazy stack cat for a stack).
        if isinstance(first, _core.NonTensorData):
            raise RuntimeError(f"dim must index a batch dimension, got dim={dim} and batch_size={batch}")
        if dim >= 0:
            raise RuntimeError(f"dim must be in the range 0 <= dim < len(batch_size), got dim={dim} and "
                               f"batch_size={list(batch)}")
        raise IndexError(f"Dimension out of range (expected to be in range of [{-len(batch)}, "
                         f"{len(batch) - 1}], but got {dim})")
    dim %= len(batch)
    others = batch[:dim] + batch[dim + 1:]
    uniform = isinstance(first, _core.NonTensorData)
    for leaf in leaves:
        shape = leaf._batch_size
        if len(shape) != len(batch) or shape[:dim] + shape[dim + 1:] != others:
            raise RuntimeError(
                f"Non-tensor batch sizes must match outside the concatenation dimension, got {batch} and {shape}."
            )
        uniform = uniform and isinstance(leaf, _core.NonTensorData) and same_value(leaf._data, first._data)
    from ._metadata import concatenated_metadata

    sizes = list(batch)
    sizes[dim] = sum(leaf._batch_size[dim] for leaf in leaves)
    metadata = concatenated_metadata(leaves, torch.Size(sizes))  # MetaData keeps the first one's value
    result: Any
    if metadata is not None:
        result = metadata
    elif uniform:
        result = _core.NonTensorData._make(first._data, torch.Size(sizes), first._device, first._names)
    else:
        slices = [piece for leaf in leaves for piece in leaf.unbind(dim)]
        result = stack(slices, dim) if slices else first.clone()
    return _with_out(result, out, "cat")


def stack_values(values: Sequence[Any], stack_dim: int, device: Optional[torch.device]) -> Any:
    """``NonTensorStack(*values, stack_dim=...)``: values that aren't non-tensor leaves are wrapped."""
    from .._base import TensorCollection

    members = []
    for value in values:
        if _core.is_non_tensor(value):
            members.append(value)
        elif isinstance(value, TensorCollection):
            raise RuntimeError("All tensordicts must be non-tensors.")
        else:
            members.append(_core.NonTensorData._make(value, torch.Size(()), device))
    if not members:
        return _core.NonTensorStack._from_flat([], (0,), device)
    result = stack(members, stack_dim)
    return result if device is None else result._to_device(device)


def _refuse_key(leaf: Any, key: Any, verb: str) -> Exception:
    if isinstance(leaf, _core.NonTensorData):
        return ValueError(
            f"Invalid indexing arguments: {key!r}. A tensorclass is indexed along its batch dimensions; to "
            f"{verb} a field, use the attribute or {'get' if verb == 'read' else 'set'}({key!r}"
            f"{'' if verb == 'read' else ', value'})."
        )
    return KeyError(f'key "{key}" not found in NonTensorStack with keys []')


def _is_key(index: Any) -> bool:
    return isinstance(index, str) or (
        isinstance(index, tuple) and bool(index) and all(isinstance(part, str) for part in index))


_ONE_VALUE_ERROR = (
    "A NonTensorData holds one value for all its elements, so it cannot take another value at an index. "
    "Call maybe_to_stack() to get a NonTensorStack, which holds a value per element."
)


def _check_index(leaf: Any, index: Any) -> None:
    """Refuse an index that doesn't fit the batch, with torch's error: a leaf has no dims past its batch,
    so an index running past them is an IndexError (a TensorDict would apply it to its leaves' dims, with
    a FutureWarning). An empty batch takes no index using a dim (the TensorDict's RuntimeError)."""
    if leaf._batch_size:
        _core._shape_probe(leaf._batch_size)[index]
    else:
        _wrap(leaf)[index]


class NonTensorShapeMixin(NonTensorHost):
    """The batch-shape ops, ``leaf[index]``, ``leaf[index] = value`` and the torch functions of a leaf."""

    __slots__ = ()

    # Ops whose TensorDict form is the leaf's (the leaf's index grid carries its values), with
    # upstream's parameters.
    permute = _via_tensordict("permute")
    squeeze = _via_tensordict("squeeze")
    atleast_1d = _via_tensordict("atleast_1d")
    atleast_2d = _via_tensordict("atleast_2d")
    atleast_3d = _via_tensordict("atleast_3d")

    def _via(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return _unwrap(self, getattr(_wrap(self), name)(*args, **kwargs))

    def transpose(self, dim0: int, dim1: int) -> Any:
        return self._via("transpose", dim0, dim1)

    def swapaxes(self, axis0: int, axis1: int) -> Any:
        return self._via("swapaxes", axis0, axis1)

    def swapdims(self, axis0: int, axis1: int) -> Any:
        return self._via("swapdims", axis0, axis1)

    @_checked_by_torch
    def movedim(self, source: Any, destination: Any) -> Any:
        return self._via("movedim", source, destination)

    @_checked_by_torch
    def moveaxis(self, source: Any, destination: Any) -> Any:
        return self._via("moveaxis", source, destination)

    def split(self, split_size: Any, dim: int = 0) -> Any:
        return self._via("split", split_size, dim)

    def tensor_split(self, indices_or_sections: Any, dim: int = 0) -> Any:
        return self._via("tensor_split", indices_or_sections, dim)

    def unbind(self, dim: int = 0) -> Any:
        return self._via("unbind", dim)

    def chunk(self, chunks: int, dim: int = 0) -> Any:
        return self._via("chunk", chunks, dim)

    def narrow(self, dim: int, start: int, length: int) -> Any:
        return self._via("narrow", dim, start, length)

    def broadcast_to(self, shape: Any) -> Any:
        return self._via("broadcast_to", shape)

    # Ops that move values between elements: a stack's elements become values of their own (as upstream,
    # which copies them one by one), so no selection of the result reads back as a stacked value.
    @_values_of_their_own
    def flip(self, *dims_args: Any, dims: Any = None) -> Any:
        return self._via("flip", *dims_args, dims=dims)

    @_values_of_their_own
    def tile(self, *dims_args: Any, dims: Any = None) -> Any:
        return self._via("tile", *dims_args, dims=dims)

    def roll(self, shifts: Any, dims: Any = None, *, inplace: bool = False) -> Any:
        """``TensorDict.roll`` of the batch; ``inplace`` rolls this leaf's own values."""
        result = self._via("roll", shifts, dims)
        if type(result) is _core.NonTensorStack:
            result._origins = None
        return self._adopt(result) if inplace else result

    # In place, as upstream: a NonTensorData takes the new batch size; a NonTensorStack (a lazy stack
    # upstream) refuses the ops that change its batch size.
    def repeat(self, *repeats: Any, inplace: bool = False) -> Any:
        self._refuse_inplace_on_stack("repeat", inplace)
        result = self._via("repeat", *repeats)
        return self._adopt(result) if inplace else result

    def repeat_interleave(self, repeats: Any, dim: Optional[int] = None, *, output_size: Optional[int] = None,
                          inplace: bool = False) -> Any:
        self._refuse_inplace_on_stack("repeat_interleave", inplace)
        result = self._via("repeat_interleave", repeats, dim, output_size=output_size)
        return self._adopt(result) if inplace else result

    def gather(self, dim: int, index: torch.Tensor, out: Any = None, *, inplace: bool = False) -> Any:
        """``TensorDict.gather`` of the batch; ``out`` (a non-tensor leaf) takes the result's values."""
        self._refuse_inplace_on_stack("gather", inplace)
        result = self._via("gather", dim, index)
        if out is not None:
            return out.update_(result)
        return self._adopt(result) if inplace else result

    def _refuse_inplace_on_stack(self, name: str, inplace: bool) -> None:
        if inplace and type(self) is _core.NonTensorStack:
            raise NotImplementedError(f"{name}(inplace=True) is not supported on a NonTensorStack: call "
                                      f"{name}(inplace=False).")

    def _adopt(self, result: Any) -> Any:
        """This leaf made ``result`` in place (its batch size and names; a stack's values too); returns self."""
        if type(self) is _core.NonTensorStack:
            self._values = result._flat_values()
            self._origins = None
            self._rewrite_saved()
            return self
        self._batch_size = result._batch_size
        self._names = result._names
        return self

    def view(self, *shape: Any, size: Any = None, batch_size: Any = None) -> Any:
        """``TensorDict.view`` of the batch; a ``NonTensorStack`` only regroups dims (flattens a run of
        dims or splits one), as upstream's lazy stack: other shapes raise, use ``reshape``."""
        result = _unwrap(self, _wrap(self).view(*shape, size=size, batch_size=batch_size))
        if type(self) is not _core.NonTensorStack or result._batch_size == self._batch_size:
            return result
        regrouped = self._regroup(result._batch_size)
        if regrouped is None:
            raise RuntimeError("Cannot call `view` on a lazy stacked tensordict. Call `reshape` instead.")
        regrouped._names = result._names
        return regrouped

    def reshape(self, *shape: Any, **kwargs: Any) -> Any:
        """``TensorDict.reshape`` of the batch (a stack regroups its values where it can, as upstream)."""
        return self._reshaped(_unwrap(self, _wrap(self).reshape(*shape, **kwargs)))

    def flatten(self, start_dim: Optional[int] = 0, end_dim: Optional[int] = -1, *, inplace: bool = False) -> Any:
        """``TensorDict.flatten`` of the batch dims ``start_dim..end_dim``, with upstream's checks of them
        (``inplace``: a NonTensorData takes the new batch size; a NonTensorStack refuses)."""
        self._refuse_inplace_on_stack("flatten", inplace)
        if inplace:
            return self._adopt(self.flatten(start_dim, end_dim))
        ndim = len(self._batch_size)
        if not ndim and start_dim in (None, 0) and end_dim in (None, -1, 0):
            return _unwrap(self, _wrap(self).flatten())  # batch [1], as torch flattens a 0-dim tensor
        start = 0 if start_dim is None else start_dim + ndim if start_dim < 0 else start_dim
        end = -1 if end_dim is None else end_dim
        if type(self) is _core.NonTensorStack:  # upstream's lazy stack checks each dim first
            for given in (start_dim, end_dim):
                if given is not None and not -ndim <= given < ndim:
                    raise IndexError(f"Incompatible dim {given} for tensordict with shape {self._batch_size}.")
        if end < 0:
            end += ndim
            if end < 0:
                raise ValueError(f"Incompatible end_dim {end} for tensordict with shape {self._batch_size}.")
        if end < start:
            raise ValueError("The end dimension must be greater or equal to the start dim.")
        if start < 0 or end >= ndim:  # a leaf has no dims past its batch (upstream warns, then applies them)
            raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], "
                             f"but got {end_dim if end >= ndim else start_dim})")
        return self._reshaped(_unwrap(self, _wrap(self).flatten(start, end)))

    def unflatten(self, dim: int, unflattened_size: Sequence[int], *, inplace: bool = False) -> Any:
        self._refuse_inplace_on_stack("unflatten", inplace)
        result = self._reshaped(_unwrap(self, _wrap(self).unflatten(dim, unflattened_size)))
        return self._adopt(result) if inplace else result

    def _reshaped(self, result: Any) -> Any:
        """``result`` (this leaf over a new shape, as the TensorDict op gives it) with a stack's values
        grouped as upstream's lazy stack groups them: its members regrouped when the new shape only
        flattens or splits dims, else one value per element."""
        if type(self) is not _core.NonTensorStack or result._batch_size == self._batch_size:
            return result
        regrouped = self._regroup(result._batch_size)
        if regrouped is None:
            regrouped = _core.NonTensorStack._from_flat(result._flat_values(), result._batch_size, self._device)
        regrouped._names = result._names
        return regrouped

    def _regroup(self, shape: torch.Size) -> Any:
        """This stack over ``shape`` built from its slices when ``shape`` flattens a run of dims (unbind
        them, stack the pieces) or splits one dim (chunk it, stack the chunks), else None."""
        old = self._batch_size
        if not old.numel():
            return _core.NonTensorStack._from_flat([], shape, self._device) if _merges(shape, old) \
                or _merges(old, shape) else None
        if _merges(shape, old):
            first = _first_mismatch(shape, old)
            last = len(old) - _first_mismatch(list(reversed(shape)), list(reversed(old))) - 1
            pieces = [self]
            for _ in range(first, last + 1):
                pieces = [part for piece in pieces for part in piece.unbind(first)]
            return stack(pieces, first)
        if _merges(old, shape):
            first = _first_mismatch(old, shape)
            last = len(shape) - _first_mismatch(list(reversed(old)), list(reversed(shape))) - 1
            result = self
            for dim in range(first, last):
                result = stack(list(result.chunk(shape[dim], dim)), dim)
            removed = len(old) - len(shape)
            if removed > 0 and old[first:first + removed].count(1) == removed:
                for _ in range(removed):
                    (result,) = result.unbind(first)
            return result
        return None

    def unsqueeze(self, dim: int) -> Any:
        """A new dim of size 1; a ``NonTensorData`` becomes a one-value ``NonTensorStack`` (as upstream,
        which stacks it)."""
        result = _unwrap(self, _wrap(self).unsqueeze(dim))
        if type(self) is not _core.NonTensorData:
            return result
        return self._spread(result, 0)

    def expand(self, *shape: Any) -> Any:
        """``TensorDict.expand`` of the batch; new leading dims make a ``NonTensorData`` a
        ``NonTensorStack`` whose slices along them are the value (as upstream, which stacks copies)."""
        result = _unwrap(self, _wrap(self).expand(*shape))
        added = len(result._batch_size) - len(self._batch_size)
        if type(self) is not _core.NonTensorData or added <= 0:
            return result
        return self._spread(result, added)

    def expand_as(self, other: Any) -> Any:
        """``broadcast_to(other.shape)``: a ``NonTensorData`` stays one (as upstream, unlike ``expand``)."""
        return self.broadcast_to(other.shape)

    def _spread(self, result: Any, leading: int) -> Any:
        """``result`` (this value over a larger batch) as a stack: one written value per index of its
        ``leading`` dims, each spanning this value's dims."""
        batch = result._batch_size
        per_value = batch[leading:].numel()
        origins = [_core._new_origin(len(self._batch_size)) for _ in range(batch[:leading].numel())]
        stacked = _core.NonTensorStack._from_flat(
            [self._data] * batch.numel(), batch, self._device,
            [origin for origin in origins for _ in range(per_value)])
        stacked._names = result._names
        return stacked

    def fliplr(self) -> Any:
        _core._shape_probe(self._batch_size).fliplr()  # torch's check and error (needs 2 dims)
        return self.flip(1)

    def flipud(self) -> Any:
        _core._shape_probe(self._batch_size).flipud()
        return self.flip(0)

    # ------------------------------------------------------------------ indexing
    def __getitem__(self, index: Any) -> Any:
        if _is_key(index):
            raise _refuse_key(self, index, "read")
        _check_index(self, index)
        return _unwrap(self, _wrap(self)[index])

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write at ``index``: a ``NonTensorStack`` takes the value(s) there (a list is one value per
        element); a ``NonTensorData`` accepts only its own value (upstream: call ``maybe_to_stack()``)."""
        if _is_key(index):
            raise _refuse_key(self, index, "write")
        from .._indexing import same_value

        if isinstance(self, _core.NonTensorData):
            # Only the same value is accepted: a non-tensor leaf or a number holding it (as upstream,
            # which raises for other raw values; upstream ignores a different number, torchdict refuses it).
            if isinstance(value, _core.NonTensorData):
                value = value._data
            elif type(value) is _core.NonTensorStack:
                try:
                    value = value._unique_value()
                except AttributeError:
                    raise ValueError(_ONE_VALUE_ERROR) from None
            elif not isinstance(value, numbers.Number):
                raise ValueError(_ONE_VALUE_ERROR)
            if not same_value(value, self._data):
                raise ValueError(_ONE_VALUE_ERROR)
            _core._shape_probe(self._batch_size)[index]  # torch's IndexError for an index that doesn't fit
            return
        self._write_values(index, self._index_grid()[index], value)

    def _write_values(self, index: Any, grid: torch.Tensor, value: Any) -> None:
        from .._indexing import same_value
        from ._members import values_over

        if not _core.is_non_tensor(value):
            value = _core.NonTensorStack(*value) if isinstance(value, list) else \
                _core.NonTensorData._make(value, torch.Size(()), self._device)
        target = grid.shape
        try:
            values = value._flat_values() if value._batch_size == target else values_over(value, target)
        except RuntimeError:
            raise RuntimeError(
                f"indexed destination TensorDict batch size is {target} (batch_size = {self._batch_size}, "
                f"index={index}), which differs from the source batch size {value._batch_size}"
            ) from None
        new_values = list(self._values)
        changed = []
        for position, item in zip(grid.reshape(-1).tolist(), values):
            if not same_value(item, new_values[position]):
                changed.append(position)
            new_values[position] = item
        origins = self._origins
        if origins is not None and changed:
            # The elements keep the value they came from (as upstream's members, written in place) unless
            # it was given another value somewhere: then each of its elements is a value of its own (as
            # upstream's member becomes a stack of them, ``maybe_to_stack``).
            split = {origins[position] for position in changed} - {None}
            origins = [None if origin in split else origin for origin in origins]
        self._values = new_values
        self._origins = origins if origins is None or any(o is not None for o in origins) else None
        self._rewrite_saved()

    # ------------------------------------------------------------------ torch functions
    @classmethod
    def __torch_function__(cls, func: Callable, types: tuple, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        combine = _COMBINE.get(func)
        if combine is not None:
            leaves = args[0] if args else kwargs.pop("tensors")
            if not all(_core.is_non_tensor(leaf) for leaf in leaves):
                return NotImplemented
            return combine(leaves, *args[1:], **kwargs)
        name = _TORCH_METHODS.get(func)
        if name is None or not args or not _core.is_non_tensor(args[0]):
            return NotImplemented
        if name == "unsqueeze":  # upstream's torch.unsqueeze keeps a NonTensorData (its method stacks)
            return _unwrap(args[0], _wrap(args[0]).unsqueeze(*args[1:], **kwargs))
        return getattr(args[0], name)(*args[1:], **kwargs)

    stack = staticmethod(stack)
    cat = staticmethod(cat)

    @staticmethod
    def lazy_stack(input: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
        """:meth:`LazyStackedTensorDict.lazy_stack` (its keywords): non-tensor leaves give a NonTensorStack."""
        from ..lazy import LazyStackedTensorDict

        return LazyStackedTensorDict.lazy_stack(input, dim, out=out, **kwargs)

    @staticmethod
    def maybe_dense_stack(input: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
        """:func:`torchdict.maybe_dense_stack` (its keywords): non-tensor leaves give a NonTensorStack."""
        from ..lazy import maybe_dense_stack

        return maybe_dense_stack(input, dim, out=out, **kwargs)


_COMBINE: dict = {torch.stack: stack, torch.cat: cat, torch.concat: cat, torch.concatenate: cat}
# The torch functions upstream answers for a lone non-tensor leaf, as the method of the same name.
_TORCH_METHODS: dict = {
    torch.unbind: "unbind", torch.permute: "permute", torch.reshape: "reshape", torch.flatten: "flatten",
    torch.squeeze: "squeeze", torch.unsqueeze: "unsqueeze", torch.clone: "clone", torch.split: "split",
    torch.chunk: "chunk",
}
