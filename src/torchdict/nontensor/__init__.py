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
non-tensor data) comes from the mixins of ``_shape`` (batch-shape ops,
indexing, ``torch.stack`` / ``torch.cat``), ``_members`` (metadata, moves,
locking, keys, updates), ``_ops`` (comparisons, ``where``, the refused
arithmetic) and ``_io`` (memmap / load).
See ``docs/non_tensor.md``.
"""
from __future__ import annotations

from itertools import count
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

import torch

from ._io import NonTensorPersistenceMixin
from .._names import check_names
from ._members import NonTensorMembersMixin
from ._ops import NonTensorOpsMixin
from ._shape import NonTensorShapeMixin

__all__ = ["NonTensorData", "NonTensorStack", "is_non_tensor", "NON_TENSOR_TYPES"]

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

    # ``__weakref__``: ``tolist(as_linked_list=True)`` binds its list to the leaf weakly (as upstream).
    __slots__ = ("_data", "_batch_size", "_device", "_names", "_locked", "_lock_undo", "_saved_path", "__weakref__")
    _is_non_tensor = True  # upstream's class marker, read by ``is_tensor_collection``

    def __init__(self, data: Any, batch_size: Any = None, device: Any = None,
                 names: Optional[Sequence[Optional[str]]] = None) -> None:
        if isinstance(data, NonTensorData):  # (a MetaData too)
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
        if not self._write_shared(value):  # a shared leaf (share_non_tensor) writes its folder instead
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

        ``convert_tensors`` and ``tolist_first`` are accepted for upstream's signature and change nothing
        (the items are the stored value). ``as_linked_list``: nested ``LinkedList``s bound to this leaf,
        whose item assignments write here (a different value raises ``ValueError``, as a write does).
        """
        values = _nest([self._data] * self._batch_size.numel(), self._batch_size)
        if as_linked_list and self._batch_size:
            from .._linked_list import nested_linked_list

            return nested_linked_list(values, self, len(self._batch_size))
        return values

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

    def _palette_form(self) -> tuple:
        """``(codes, palette, palette_origins)``: one value, referenced by a zero-stride grid of zeros."""
        return _zero_codes(self._batch_size), [self._data], [_new_origin(len(self._batch_size))]

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
    >>> td["s"]  # a list that writes back into the stack, as upstream's
    LinkedList(['a', 'b'])
    >>> NonTensorStack("a", "b")[1].data
    'b'
    """

    # The values are a *palette* of distinct entries and, per element, a code into it: ``_codes`` is an
    # int64 tensor of the batch shape, or None when element i is ``_palette[i]`` (the flat form). Batch
    # ops run on the codes (one torch op), so stacking, indexing or reshaping a stack of a few values
    # over a large batch builds no Python object per element; the per-element list (``_values``) is
    # made only when someone reads it.
    __slots__ = ("_palette", "_palette_origins", "_codes", "_batch_size", "_device", "_names", "_locked",
                 "_lock_undo", "_saved_path", "__weakref__")
    _is_non_tensor = True
    if TYPE_CHECKING:
        _palette: list
        _palette_origins: Optional[list]
        _codes: Optional[torch.Tensor]

    def __init__(self, *values: Any, stack_dim: int = 0, device: Any = None,
                 names: Optional[Sequence[Optional[str]]] = None) -> None:
        if len(values) in (2, 3, 4) and type(values[1]) is torch.Size and type(values[0]) is list:
            # The former internal form ``NonTensorStack(flat_values, batch_size[, device[, origins]])``,
            # kept for the callers not yet moved to ``_from_flat``: a torch.Size as the second value
            # is not something a caller stacks as a value.
            self._set_flat(values[0], values[1], values[2] if len(values) > 2 else device,
                           values[3] if len(values) > 3 else None)
            return
        from ._shape import stack_values

        result = stack_values(values, stack_dim, _as_device(device))
        if type(result) is NonTensorStack:
            self._set_codes(result._palette, result._palette_origins, result._codes, result._batch_size,
                            result._device)
        else:
            self._set_flat(result._flat_values(), result._batch_size, result._device, result._flat_origins())
        self._names = check_names(names, self._batch_size)

    def _set_flat(self, values: Sequence[Any], batch_size: Any, device: Any,
                  origins: Optional[Sequence[Any]]) -> None:
        batch_size = torch.Size(batch_size)
        if len(values) != batch_size.numel():
            raise ValueError(
                f"NonTensorStack got {len(values)} values for a batch of {batch_size.numel()} elements."
            )
        self._palette = list(values)
        self._codes = None
        # One origin token per value (None: a value of its own), or None when no value has one.
        self._palette_origins = _some_origins(origins)
        self._batch_size = batch_size
        self._device = _as_device(device)
        self._names = None
        self._locked = False
        self._lock_undo = None
        self._saved_path = None

    def _set_codes(self, palette: list, palette_origins: Optional[list], codes: Optional[torch.Tensor],
                   batch_size: torch.Size, device: Optional[torch.device]) -> None:
        """The palette form: ``palette`` is shared, never mutated (writes replace it)."""
        self._palette = palette
        self._palette_origins = palette_origins
        self._codes = codes
        self._batch_size = batch_size
        self._device = device
        self._names = None
        self._locked = False
        self._lock_undo = None
        self._saved_path = None

    @classmethod
    def _from_codes(cls, palette: list, palette_origins: Optional[list], codes: torch.Tensor,
                    device: Optional[torch.device]) -> "NonTensorStack":
        """A stack whose element at each position is ``palette[codes[position]]``."""
        self = _object_new(cls)
        self._set_codes(palette, palette_origins, codes, codes.shape, device)
        return self

    # Per-element views of the palette form, made on demand; assigning one stores the flat form.
    def _get_values(self) -> list:
        if self._codes is None:
            return self._palette
        palette = self._palette
        return [palette[code] for code in self._codes.reshape(-1).tolist()]

    def _assign_values(self, values: list) -> None:
        if self._write_shared(values):  # a shared stack (share_non_tensor) writes its folder instead
            return
        origins = self._origins
        self._palette, self._palette_origins, self._codes = values, origins, None

    _values = property(_get_values, _assign_values)

    def _get_origins(self) -> Optional[list]:
        origins = self._palette_origins
        if origins is None or self._codes is None:
            return origins
        return [origins[code] for code in self._codes.reshape(-1).tolist()]

    def _assign_origins(self, origins: Optional[list]) -> None:
        if self._is_shared():  # a shared stack's elements are each a value of its own: no origins to keep
            return
        if self._codes is not None:
            self._palette, self._codes = self._get_values(), None
        self._palette_origins = origins

    _origins = property(_get_origins, _assign_origins)

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
        """The values as nested ``LinkedList``s of the batch shape, bound to this stack (what ``td[key]``
        returns, as upstream's: ``td[key][i] = v`` writes into the stack).

        Upstream's ``NonTensorStack.data`` is the one value every element holds (AttributeError when
        they differ); torchdict keeps the nested list here, which the TensorDict reads rely on.
        """
        values = _nest(self._values, self._batch_size)
        if not self._batch_size:  # no batch dim: the one value itself
            return values
        from .._linked_list import nested_linked_list

        return nested_linked_list(values, self, len(self._batch_size))

    def tolist(self, *, convert_tensors: Any = False, tolist_first: bool = False,
               as_linked_list: bool = False, convert_nodes: bool = True) -> Any:
        """The values as nested plain lists of the batch shape (``as_linked_list``: as ``data``, nested
        ``LinkedList``s bound to this stack; the other keywords as ``NonTensorData.tolist``)."""
        if as_linked_list:
            return self.data
        return _nest(self._values, self._batch_size)

    def to_dict(self, *, retain_none: bool = True, convert_tensors: Any = False,
                tolist_first: bool = False, as_linked_list: bool = False) -> Any:
        """The values as nested lists (as upstream, like ``tolist()``)."""
        return _nest(self._values, self._batch_size)

    def maybe_to_stack(self) -> "NonTensorStack":
        return self._shallow()

    def copy_(self, tensordict: Any, non_blocking: bool = False) -> "NonTensorStack":
        """``update_(tensordict)`` (a stack names its source ``tensordict``, as upstream's lazy stack)."""
        return self.update_(tensordict)

    # A stack is a lazy stack upstream: its class-level stacking takes the lazy stack's parameters (not
    # NonTensorData's, which the shared mixin has: the overrides differ, as upstream's).
    @staticmethod
    def lazy_stack(items: Sequence[Any], dim: int = 0, *, device: Any = None,  # type: ignore[override]
                   out: Any = None,
                   stack_dim_name: Optional[str] = None, strict_shape: bool = False, as_list: bool = False,
                   as_padded_tensor: bool = False, as_nested_tensor: bool = False, padding_side: str = "right",
                   layout: Any = None, padding_value: Any = 0.0) -> Any:
        """:meth:`LazyStackedTensorDict.lazy_stack`."""
        from ..lazy import LazyStackedTensorDict

        return LazyStackedTensorDict.lazy_stack(
            items, dim, device=device, out=out, stack_dim_name=stack_dim_name, strict_shape=strict_shape,
            as_list=as_list, as_padded_tensor=as_padded_tensor, as_nested_tensor=as_nested_tensor,
            padding_side=padding_side, layout=layout, padding_value=padding_value)

    @staticmethod
    def maybe_dense_stack(items: Sequence[Any], dim: int = 0, out: Any = None,  # type: ignore[override]
                          strict: bool = False) -> Any:
        """:meth:`LazyStackedTensorDict.maybe_dense_stack`."""
        from ..lazy import maybe_dense_stack

        return maybe_dense_stack(items, dim, out=out, strict=strict)

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
        from .._indexing import same_value

        values = self._values
        if values and all(same_value(value, values[0]) for value in values[1:]):
            return values[0]
        raise AttributeError("Cannot get the non-unique data of a NonTensorStack. Use .tolist() instead.")

    # ------------------------------------------------------------------ internal protocol
    def _read(self) -> Any:
        """What ``td[key]`` returns for this stack: :attr:`data`, its values as linked lists."""
        return self.data

    def _flat_values(self) -> List[Any]:
        return list(self._palette) if self._codes is None else self._get_values()

    def _flat_origins(self) -> List[Any]:
        origins = self._get_origins()
        if origins is None:
            return [None] * self._batch_size.numel()
        return list(origins) if self._codes is None else origins

    def _index_grid(self) -> torch.Tensor:
        """The element positions over the batch (indices into ``_values``)."""
        return torch.arange(self._batch_size.numel()).view(self._batch_size)

    def _palette_form(self) -> tuple:
        """``(codes, palette, palette_origins)``: what batch ops run on (codes index the palette)."""
        codes = self._codes
        if codes is None:
            codes = torch.arange(len(self._palette)).view(self._batch_size)
        return codes, self._palette, self._palette_origins

    def _code_grid(self) -> torch.Tensor:
        return self._palette_form()[0]

    def _batch_op(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "NonTensorData | NonTensorStack":
        codes, palette, origins = self._palette_form()
        return _from_grid(fn(codes), palette, origins, self._device)

    def _with_batch_size(self, batch_size: torch.Size) -> "NonTensorStack":
        if self._codes is None:
            return NonTensorStack._from_flat(self._palette, batch_size, self._device, self._palette_origins)
        return NonTensorStack._from_codes(self._palette, self._palette_origins, self._codes.reshape(batch_size),
                                          self._device)

    def _to_device(self, device: Any) -> "NonTensorStack":
        result = self._with_batch_size(self._batch_size)
        result._device = _as_device(device)
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
        values, origins = self._flat_values(), self._flat_origins()
        for position, item, origin in zip(positions, new_values, new_origins):
            values[position] = item
            origins[position] = origin
        # A new flat list: the old palette may be shared with stacks made from this one.
        self._palette, self._palette_origins, self._codes = values, _some_origins(origins), None

    def _as_one_value(self) -> "Optional[NonTensorData]":
        """This stack as a NonTensorData when every element comes from one written value, else None."""
        codes, palette, origins = self._palette_form()
        return _one_value_of_codes(codes, palette, origins, self._device)

    def __repr__(self) -> str:
        values = str(self.tolist())
        if len(values) > 50:  # upstream's cut
            values = f"{values[:50]}..."
        return f"NonTensorStack(\n    {values},\n    batch_size={self._batch_size},\n    device={self._device})"


def _some_origins(origins: Optional[Sequence[Any]]) -> Optional[list]:
    """``origins`` as a list, or None when no value has one."""
    return None if origins is None or not any(o is not None for o in origins) else list(origins)


def _zero_codes(batch_size: torch.Size) -> torch.Tensor:
    # Every element is palette entry 0: a zero-stride grid, no memory whatever the batch.
    return torch.zeros((), dtype=torch.long).expand(batch_size)


def _one_value(values: list, origins: Optional[list], batch_size: torch.Size,
               device: Any) -> Optional[NonTensorData]:
    if not values or origins is None:
        return None
    first = origins[0]
    if first is None or first[1] < len(batch_size) or origins.count(first) != len(origins):
        return None
    return NonTensorData._make(values[0], batch_size, device)


def used_codes(codes: torch.Tensor) -> List[int]:
    """The distinct palette entries a grid of codes refers to, in increasing order (one pass in torch)."""
    if not codes.numel():
        return []
    low, high = torch.aminmax(codes)
    low_code, high_code = int(low), int(high)
    if low_code == high_code:
        return [low_code]
    counts = torch.bincount(codes.reshape(-1) - low_code, minlength=high_code - low_code + 1)
    return (counts.nonzero().reshape(-1) + low_code).tolist()


def _one_value_of_codes(codes: torch.Tensor, palette: list, origins: Optional[list],
                        device: Any) -> Optional[NonTensorData]:
    """The palette form of :func:`_one_value`: every element's origin is one value spanning the batch."""
    if origins is None or not codes.numel():
        return None
    used = used_codes(codes)
    first = origins[used[0]]
    if first is None or first[1] < codes.dim() or any(origins[code] != first for code in used[1:]):
        return None
    return NonTensorData._make(palette[used[0]], codes.shape, device)


# Up to this many elements a batch op's result is stored flat (a Python list is then cheaper than the
# torch ops of the palette form); above it, as codes into the source's palette.
_FLAT_RESULT_LIMIT = 256


def _from_grid(grid: torch.Tensor, values: Sequence[Any], origins: Optional[Sequence[Any]],
               device: Any, mixed: bool = False) -> "NonTensorData | NonTensorStack":
    """The elements of ``values`` that ``grid`` (a batch op's result on a grid of codes) picks.

    ``mixed``: the caller knows the picked elements come from more than one value.
    """
    if grid.numel() > _FLAT_RESULT_LIMIT and grid.dim():
        one = None if mixed else _one_value_of_codes(grid, values, origins, device)  # type: ignore[arg-type]
        return one if one is not None else NonTensorStack._from_codes(values, origins, grid, device)  # type: ignore[arg-type]
    flat = grid.reshape(-1).tolist()
    picked = [values[i] for i in flat]
    if grid.dim() == 0:
        return NonTensorData._make(picked[0], torch.Size(()), device)
    picked_origins = None if origins is None else [origins[i] for i in flat]
    one = _one_value(picked, picked_origins, grid.shape, device)
    return one if one is not None else NonTensorStack._from_flat(picked, grid.shape, device, picked_origins)


#: The classes of the non-tensor leaves, for exact-type tests (``type(x) in NON_TENSOR_TYPES``, a set
#: lookup): NonTensorData, NonTensorStack and each MetaData class (``_metadata`` adds them as they are made).
NON_TENSOR_TYPES: set = {NonTensorData, NonTensorStack}


def is_non_tensor(leaf: object) -> bool:
    return type(leaf) in NON_TENSOR_TYPES


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
    palette: list = []
    origins: list = []
    grids = []
    used: set = set()  # the origins the elements refer to
    for leaf in leaves:
        codes, leaf_palette, leaf_origins = leaf._palette_form()
        leaf_origins = [None] * len(leaf_palette) if leaf_origins is None else leaf_origins
        if len(used) < 2:
            if isinstance(leaf, NonTensorData):  # one value: no need to scan its (zero-stride) codes
                used.add(leaf_origins[0])
            else:
                used.update(leaf_origins[code] for code in used_codes(codes))
        if isinstance(leaf, NonTensorData):  # its one entry's offset, still a zero-stride grid
            codes = torch.full((), len(palette), dtype=torch.long).expand(leaf._batch_size)
        elif palette:
            codes = codes + len(palette)
        grids.append(codes)
        palette.extend(leaf_palette)
        origins.extend(leaf_origins)
    grid = combine(grids)
    device = leaves[0].device if leaves else None
    if leaves and grid.dim() == len(leaves[0].batch_size) and len(used) > 1:
        # A cat of different values: one flat list whose slices stay lists (as upstream, which
        # keeps its elements' values only along a stack dim).
        return _from_grid(grid, palette, None, device)
    return _from_grid(grid, palette, _some_origins(origins), device, mixed=len(used) > 1)
