"""Non-tensor leaves: Python values carried along the batch dimensions.

``NonTensorData`` holds one value shared by every element of its batch.
``NonTensorStack`` holds one value per element (the result of stacking or
concatenating non-tensor leaves, or of writing different values at
different indices). Batch operations are applied to an *index grid*
(``arange(numel).view(batch_size)``), so any op that works on a tensor of
the batch shape (indexing, permute, reshape, stack, ...) works here too,
with no per-op code.

A stack also remembers, per element, which written value it came from (its
*origin*: one token per ``NonTensorData`` stacked, concatenated or written at an
index). A batch op whose elements all come from one such value gives that value
back as a ``NonTensorData``: ``torch.stack(tds)[i]["s"]`` is ``tds[i]["s"]``, not
a list repeating it.

Both classes are plain leaves, not :class:`~torchdict.TensorCollection` subclasses:
every TensorDict recursion takes a collection for a nested TensorDict, and these
hold no entries. Their TensorDict-like public API (upstream's, where it applies to
non-tensor data) comes from the mixins of ``_nontensor_shape`` (batch-shape ops,
indexing, ``torch.stack`` / ``torch.cat``), ``_nontensor_members`` (metadata, moves,
locking, keys, updates), ``_nontensor_ops`` (comparisons, ``where``, the refused
arithmetic) and ``_nontensor_io`` (memmap / load).
See ``docs/non_tensor.md``.
"""
from __future__ import annotations

from itertools import count
from operator import attrgetter
from typing import Any, Callable, List, Optional, Sequence

import torch

from ._nontensor_io import NonTensorPersistenceMixin
from ._names import check_names
from ._nontensor_members import NonTensorMembersMixin
from ._nontensor_ops import NonTensorOpsMixin
from ._nontensor_shape import NonTensorShapeMixin

__all__ = ["NonTensorData", "NonTensorStack", "is_non_tensor"]

# Origin tokens: a fresh one for each value written as a whole (next() on a count is atomic),
# with the number of batch dims that value spans: a selection of elements that all come from one
# value reads back as that value only when it has no more dims than the value had (as upstream,
# where a slice of a stack stays a stack, ``stack[0:1]`` a one-row list).
_next_token = count().__next__


def _new_origin(ndim: int) -> tuple:
    return (_next_token(), ndim)


def _shape_probe(batch_size: torch.Size) -> torch.Tensor:
    # A zero-stride tensor of the batch shape: costs no memory whatever the batch.
    return torch.zeros((), dtype=torch.uint8).expand(batch_size)


def _nest(values: Sequence[Any], shape: Sequence[int]) -> Any:
    if len(shape) == 0:
        return values[0]
    if len(shape) == 1:
        return list(values)
    step = len(values) // shape[0] if shape[0] else 0
    return [_nest(values[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _as_size(batch_size: Any) -> torch.Size:
    """A public ``batch_size`` argument as a ``torch.Size`` (None: no batch dims; an int: one dim)."""
    if batch_size is None:
        return torch.Size(())
    if isinstance(batch_size, int):
        return torch.Size((batch_size,))
    return torch.Size(batch_size)


def _as_device(device: Any) -> Optional[torch.device]:
    return None if device is None else torch.device(device)


_object_new = object.__new__


class NonTensorData(NonTensorShapeMixin, NonTensorMembersMixin, NonTensorOpsMixin, NonTensorPersistenceMixin):
    """A Python value stored in a TensorDict, shared across its batch.

    ``NonTensorData(data, batch_size=None, device=None, names=None)``; a ``NonTensorData``
    given as ``data`` is unwrapped (its value is used).

    >>> from torchdict import TensorDict
    >>> td = TensorDict(batch_size=[2])
    >>> td["name"] = "hello"
    >>> td["name"], td[0]["name"]
    ('hello', 'hello')
    >>> NonTensorData("x", batch_size=[2, 1]).tolist()
    [['x'], ['x']]
    """

    __slots__ = ("_data", "_batch_size", "_device", "_names", "_locked", "_lock_undo", "_saved_path")
    _is_non_tensor = True  # upstream's class marker, read by ``is_tensor_collection``

    def __init__(self, data: Any, batch_size: Any = None, device: Any = None,
                 names: Optional[Sequence[Optional[str]]] = None) -> None:
        if type(data) is NonTensorData:
            data = data._data
        elif type(data) is NonTensorStack:
            data = data._unique_value()  # upstream's ``stack.data``: AttributeError when the values differ
        batch_size = _as_size(batch_size)
        self._data = data
        self._batch_size = batch_size
        self._device = _as_device(device)
        self._names = check_names(names, batch_size)
        self._locked = False
        self._lock_undo = None
        self._saved_path = None

    @classmethod
    def _make(cls, data: Any, batch_size: torch.Size, device: Optional[torch.device],
              names: Optional[list] = None) -> "NonTensorData":
        """The unchecked constructor of internal results (``batch_size`` a Size, ``device`` parsed)."""
        self = _object_new(cls)
        self._data = data
        self._batch_size = batch_size
        self._device = device
        self._names = names
        self._locked = False
        self._lock_undo = None
        self._saved_path = None
        return self

    # ------------------------------------------------------------------ the value
    def _set_data(self, value: Any) -> None:
        self._refuse_if_locked()
        self._data = value

    # The getter is a C attrgetter: ``td[key]`` reads it for every non-tensor entry (a Python getter
    # costs a function call there).
    data = property(attrgetter("_data"), _set_data, doc="The value (assignment refused while locked).")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the value (as upstream: a TensorDict of functions can be ``apply``-ed)."""
        return self._data(*args, **kwargs)

    def tolist(self, *, convert_tensors: Any = False, tolist_first: bool = False,
               as_linked_list: bool = False, convert_nodes: bool = True) -> Any:
        """The value in a nested list of the batch shape (the value itself for an empty batch).

        The keyword arguments are accepted for upstream's signature; they change nothing (the items
        are the stored value; ``as_linked_list`` gives a plain list).
        """
        return _nest([self._data] * self._batch_size.numel(), self._batch_size)

    def to_dict(self, *, retain_none: bool = True, convert_tensors: Any = False,
                tolist_first: bool = False, as_linked_list: bool = False) -> Any:
        """The value (as upstream: a non-tensor leaf has no keys, its dict form is its data)."""
        return self._data

    def maybe_to_stack(self) -> "NonTensorData | NonTensorStack":
        """A ``NonTensorStack`` holding the value at every element; ``self`` when the batch is empty."""
        if not self._batch_size:
            return self
        origins = [None] * self._batch_size.numel()  # each element a value of its own, as upstream's copies
        return NonTensorStack._from_flat(self._flat_values(), self._batch_size, self._device, origins)

    # ------------------------------------------------------------------ internal protocol
    def _read(self) -> Any:
        """What ``td[key]`` returns for this leaf."""
        return self._data

    def _batch_op(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "NonTensorData":
        return NonTensorData._make(self._data, fn(_shape_probe(self._batch_size)).shape, self._device)

    def _with_batch_size(self, batch_size: torch.Size) -> "NonTensorData":
        return NonTensorData._make(self._data, batch_size, self._device)

    def _to_device(self, device: Any) -> "NonTensorData":
        return NonTensorData._make(self._data, self._batch_size, _as_device(device), self._names)

    def _flat_values(self) -> List[Any]:
        return [self._data] * self._batch_size.numel()

    def _flat_origins(self) -> List[Any]:
        return [_new_origin(len(self._batch_size))] * self._batch_size.numel()

    def _shallow(self) -> "NonTensorData":
        """A new wrapper of the same value (same batch, device and names), unlocked."""
        return NonTensorData._make(self._data, self._batch_size, self._device, self._names)

    def __repr__(self) -> str:
        data = str(self._data)
        if len(data) > 200:  # upstream's cut of a long value
            data = data[:20] + "  ...  " + data[-20:]
        return f"NonTensorData(data={data}, batch_size={self._batch_size}, device={self._device})"


class NonTensorStack(NonTensorShapeMixin, NonTensorMembersMixin, NonTensorOpsMixin, NonTensorPersistenceMixin):
    """One Python value per batch element.

    ``NonTensorStack(*values, stack_dim=0)`` stacks ``values`` as ``torch.stack`` would (a value that
    is not a ``NonTensorData`` / ``NonTensorStack`` is wrapped in a ``NonTensorData`` first);
    ``NonTensorStack.from_list(nested_list)`` stacks nested lists level by level. ``tolist()`` gives
    the values as nested lists of the batch shape (so does ``data``, which ``td[key]`` returns).

    >>> import torch
    >>> from torchdict import TensorDict
    >>> td = torch.stack([TensorDict(s="a"), TensorDict(s="b")])
    >>> td["s"]
    ['a', 'b']
    >>> NonTensorStack("a", "b")[1].data
    'b'
    """

    __slots__ = ("_values", "_origins", "_batch_size", "_device", "_names", "_locked", "_lock_undo",
                 "_saved_path")
    _is_non_tensor = True

    def __init__(self, *values: Any, stack_dim: int = 0, device: Any = None,
                 names: Optional[Sequence[Optional[str]]] = None) -> None:
        if len(values) in (2, 3, 4) and type(values[1]) is torch.Size and type(values[0]) is list:
            # The former internal form ``NonTensorStack(flat_values, batch_size[, device[, origins]])``,
            # kept for the callers not yet moved to ``_from_flat``: a torch.Size as the second value
            # is not something a caller stacks as a value.
            self._set_flat(values[0], values[1], values[2] if len(values) > 2 else device,
                           values[3] if len(values) > 3 else None)
            return
        from ._nontensor_shape import stack_values

        result = stack_values(values, stack_dim, _as_device(device))
        self._set_flat(result._flat_values(), result._batch_size, result._device, result._origins)
        self._names = check_names(names, self._batch_size)

    def _set_flat(self, values: Sequence[Any], batch_size: Any, device: Any,
                  origins: Optional[Sequence[Any]]) -> None:
        batch_size = torch.Size(batch_size)
        if len(values) != batch_size.numel():
            raise ValueError(
                f"NonTensorStack got {len(values)} values for a batch of {batch_size.numel()} elements."
            )
        self._values = list(values)
        # One origin token per value (None: a value of its own), or None when no value has one.
        self._origins = None if origins is None or not any(o is not None for o in origins) else list(origins)
        self._batch_size = batch_size
        self._device = _as_device(device)
        self._names = None
        self._locked = False
        self._lock_undo = None
        self._saved_path = None

    @classmethod
    def _from_flat(cls, values: Sequence[Any], batch_size: Sequence[int], device: Any = None,
                   origins: Optional[Sequence[Any]] = None) -> "NonTensorStack":
        """The internal constructor: ``values`` flat in row-major order over ``batch_size``."""
        self = _object_new(cls)
        self._set_flat(values, batch_size, device, origins)
        return self

    @classmethod
    def from_list(cls, non_tensors: List[Any]) -> "NonTensorStack":
        """Stack a (nested) list of values: each inner list becomes a stack, others a ``NonTensorData``.

        >>> NonTensorStack.from_list([["a", "b"], ["c", "d"]]).batch_size
        torch.Size([2, 2])
        """
        return cls(*[cls.from_list(item) if isinstance(item, list) else item for item in non_tensors])

    @classmethod
    def from_nested_list(cls, values: list, batch_size: Sequence[int] | None = None) -> "NonTensorStack":
        """The stack of a rectangular nested list (its nesting depth, or ``len(batch_size)``, gives the dims)."""
        shape: list = []
        probe: Any = values
        while isinstance(probe, list) and (batch_size is None or len(shape) < len(batch_size)):
            shape.append(len(probe))
            if not probe:
                break
            probe = probe[0]
        flat: list = []

        def walk(item: Any, depth: int) -> None:
            if depth == len(shape):
                flat.append(item)
                return
            if not isinstance(item, list) or len(item) != shape[depth]:
                raise ValueError("A list of non-tensor values must be rectangular to be stacked.")
            for sub in item:
                walk(sub, depth + 1)

        walk(values, 0)
        return cls._from_flat(flat, shape)

    # ------------------------------------------------------------------ the values
    @property
    def data(self) -> Any:
        """The values as nested lists of the batch shape (what ``td[key]`` returns).

        Upstream's ``NonTensorStack.data`` is the one value every element holds (AttributeError when
        they differ); torchdict keeps the nested list here, which the TensorDict reads rely on.
        """
        return _nest(self._values, self._batch_size)

    def tolist(self, *, convert_tensors: Any = False, tolist_first: bool = False,
               as_linked_list: bool = False, convert_nodes: bool = True) -> Any:
        """The values as nested lists of the batch shape (keyword arguments as ``NonTensorData.tolist``)."""
        return _nest(self._values, self._batch_size)

    def to_dict(self, *, retain_none: bool = True, convert_tensors: Any = False,
                tolist_first: bool = False, as_linked_list: bool = False) -> Any:
        """The values as nested lists (as upstream, like ``tolist()``)."""
        return _nest(self._values, self._batch_size)

    def maybe_to_stack(self) -> "NonTensorStack":
        return self._shallow()

    def __contains__(self, key: Any) -> bool:
        """No key is in a stack (upstream's answer); a ``NonTensorData`` has no ``__contains__`` (as upstream,
        ``in`` then iterates over its first dim)."""
        if isinstance(key, str) or (isinstance(key, tuple) and all(isinstance(part, str) for part in key)):
            return False
        raise RuntimeError("key must be a NestedKey (a str or a possibly tuple of str).")

    @property
    def stack_dim(self) -> int:
        """0: the values are laid out over the whole batch (upstream's lazy stacks may stack on another dim)."""
        return 0

    @property
    def tensordicts(self) -> list:
        """The slices along dim 0 (upstream's members of a stack along dim 0)."""
        return list(self.unbind(0)) if self._batch_size else []

    def _unique_value(self) -> Any:
        """Upstream's ``stack.data``: the value every element holds, else AttributeError."""
        from ._indexing import same_value

        values = self._values
        if values and all(same_value(value, values[0]) for value in values[1:]):
            return values[0]
        raise AttributeError("Cannot get the non-unique data of a NonTensorStack. Use .tolist() instead.")

    # ------------------------------------------------------------------ internal protocol
    def _read(self) -> Any:
        return _nest(self._values, self._batch_size)

    def _flat_values(self) -> List[Any]:
        return list(self._values)

    def _flat_origins(self) -> List[Any]:
        return [None] * len(self._values) if self._origins is None else list(self._origins)

    def _index_grid(self) -> torch.Tensor:
        return torch.arange(len(self._values)).view(self._batch_size)

    def _batch_op(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "NonTensorData | NonTensorStack":
        grid = fn(self._index_grid())
        return _from_grid(grid, self._values, self._origins, self._device)

    def _with_batch_size(self, batch_size: torch.Size) -> "NonTensorStack":
        return NonTensorStack._from_flat(self._values, batch_size, self._device, self._origins)

    def _to_device(self, device: Any) -> "NonTensorStack":
        result = NonTensorStack._from_flat(self._values, self._batch_size, device, self._origins)
        result._names = self._names
        return result

    def _shallow(self) -> "NonTensorStack":
        return self._to_device(self._device)

    def _set_at(self, index: Any, value: Any) -> None:
        """Write ``value`` at ``index`` in place; a value written as a whole gets a fresh origin."""
        positions = self._index_grid()[index].reshape(-1).tolist()
        if isinstance(value, (NonTensorData, NonTensorStack)):
            new_values, new_origins = value._flat_values(), value._flat_origins()
            if len(new_values) == 1:  # one value written over the whole selection
                new_values = new_values * len(positions)
                new_origins = [_new_origin(len(self._batch_size))] * len(positions)
        else:
            new_values, new_origins = [value] * len(positions), [_new_origin(len(self._batch_size))] * len(positions)
        if len(new_values) != len(positions):
            raise RuntimeError(
                f"Cannot write {len(new_values)} non-tensor values into {len(positions)} positions."
            )
        origins = self._flat_origins()
        for position, item, origin in zip(positions, new_values, new_origins):
            self._values[position] = item
            origins[position] = origin
        self._origins = origins

    def _as_one_value(self) -> "Optional[NonTensorData]":
        """This stack as a NonTensorData when every element comes from one written value, else None."""
        return _one_value(self._values, self._origins, self._batch_size, self._device)

    def __repr__(self) -> str:
        values = str(self.tolist())
        if len(values) > 50:  # upstream's cut
            values = f"{values[:50]}..."
        return f"NonTensorStack(\n    {values},\n    batch_size={self._batch_size},\n    device={self._device})"


def _one_value(values: list, origins: Optional[list], batch_size: torch.Size,
               device: Any) -> Optional[NonTensorData]:
    if not values or origins is None:
        return None
    first = origins[0]
    if first is None or first[1] < len(batch_size) or origins.count(first) != len(origins):
        return None
    return NonTensorData._make(values[0], batch_size, device)


def _from_grid(grid: torch.Tensor, values: Sequence[Any], origins: Optional[Sequence[Any]],
               device: Any) -> "NonTensorData | NonTensorStack":
    """The elements of ``values`` that ``grid`` (a batch op's result on the index grid) picks."""
    flat = grid.reshape(-1).tolist()
    picked = [values[i] for i in flat]
    if grid.dim() == 0:
        return NonTensorData._make(picked[0], torch.Size(()), device)
    picked_origins = None if origins is None else [origins[i] for i in flat]
    one = _one_value(picked, picked_origins, grid.shape, device)
    return one if one is not None else NonTensorStack._from_flat(picked, grid.shape, device, picked_origins)


def is_non_tensor(leaf: object) -> bool:
    return type(leaf) in (NonTensorData, NonTensorStack)


def combine_non_tensor(
    leaves: Sequence["NonTensorData | NonTensorStack"],
    combine: Callable[[List[torch.Tensor]], torch.Tensor],
) -> "NonTensorData | NonTensorStack":
    """Stack or concatenate non-tensor leaves with the same ``combine`` torch uses for tensors.

    ``combine`` receives one index grid per leaf (offset so the grids are disjoint)
    and returns the combined grid, e.g. ``lambda grids: torch.stack(grids, dim)``.
    Each ``NonTensorData`` is a value of its own (an origin), so indexing the result
    back to one of them gives that value.
    """
    values: list = []
    origins: list = []
    grids = []
    for leaf in leaves:
        flat = leaf._flat_values()
        grids.append(torch.arange(len(values), len(values) + len(flat)).view(leaf.batch_size))
        values.extend(flat)
        origins.extend(leaf._flat_origins())
    grid = combine(grids)
    device = leaves[0].device if leaves else None
    if leaves and grid.dim() == len(leaves[0].batch_size) and len(set(origins)) > 1:
        # A cat of different values: one flat list whose slices stay lists (as upstream, which
        # keeps its elements' values only along a stack dim).
        origins = None
    return _from_grid(grid, values, origins, device)
