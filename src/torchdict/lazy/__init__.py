"""A lazy stack of TensorDicts: the members are kept, not copied.

``torch.stack(tds)`` copies every leaf into one dense TensorDict, so the
TensorDicts must hold the same keys with the same shapes. :func:`lazy_stack`
keeps the members themselves and stacks on demand, so members may hold leaves
of **different shapes** (ragged dims read as ``-1`` in :meth:`~LazyStackedTensorDict.get_item_shape`)
and **exclusive keys** (keys that not every member has; they are hidden from
``keys()`` and ``get``, and shown apart in the repr).

>>> import torch
>>> from torchdict import TensorDict
>>> a = TensorDict({"obs": torch.zeros(3, 2)}, batch_size=[3])
>>> b = TensorDict({"obs": torch.ones(3, 5)}, batch_size=[3])
>>> td = lazy_stack([a, b])
>>> td.batch_size, td.get_item_shape("obs")
(torch.Size([2, 3]), torch.Size([2, 3, -1]))
>>> td[1] is b
True
>>> [value.shape for value in td.get("obs", as_list=True)]
[torch.Size([3, 2]), torch.Size([3, 5])]
>>> td.get("obs", as_padded_tensor=True).shape
torch.Size([2, 3, 5])

Members are dense ``TensorDict`` instances or lazy stacks themselves (regrouping
by ``view``/``reshape`` nests them); reads stack their values with ``torch.stack``
and writes split a full-batch value along the stack dim into the members. A write
that fails leaves every member as it was.

This module is the stack itself (construction, keys, reads, indexing, writes,
members, the dense form, locking, repr); the rest of upstream's API comes from one
mixin per concern: ``_apply`` (apply and member-wise results), ``_keyops``
(key structure, updates, conversions refusing exclusive keys), ``_queries``
(what the stack says about itself), ``_ops`` (pointwise ops, update, del/pop,
torch.stack/cat), ``_reductions``, ``_shape`` (shape ops that keep the
members), ``_masks`` (masks across the stack dim), ``_names``,
``_extras`` (smaller members, class-level constructors), ``_persistence``
(memmap/load) and ``_pytree`` (torch.vmap / torch.func).
"""
from __future__ import annotations

from functools import reduce
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch

from .._base import TensorCollection
from ..base import TensorDictBase
from .._errors import locked_error, MessageKeyError
from ._ops import _MISSING, LazyOpsMixin, is_ragged
from ._reductions import LazyReductionsMixin
from ._apply import LazyApplyMixin
from ._keyops import LazyKeyOpsMixin
from ._extras import LazyConstructorsMixin, LazyExtrasMixin
from ._masks import LazyMaskMixin, index_with_spanning_mask
from ._names import LazyNamesMixin
from ._persistence import LazyPersistenceMixin
from ._writes import LazyWritesMixin
from ._queries import LazyQueriesMixin
from ._shape import LazyShapeMixin
from .._torch_function import _combine_error, _incongruent_error
from ..nontensor import NON_TENSOR_TYPES, NonTensorData, combine_non_tensor
from .._unbatched import UnbatchedTensor as _Unbatched, stack_unbatched
from ..nontensor._metadata import stacked_metadata
from ..printing import _is_shared as _tensor_is_shared
from ..printing import format_leaf, indent
from ..tensordict import TensorDict

__all__ = ["LazyStackedTensorDict", "lazy_stack", "maybe_dense_stack"]

_Tensor = torch.Tensor


def _missing_key_error(key: Any, keys: Sequence[Any]) -> KeyError:
    shown = sorted(keys, key=str)
    return MessageKeyError(f'key "{key}" not found in LazyStackedTensorDict with keys {shown}')


def _ragged_error(key: Any, shapes: list) -> RuntimeError:
    # Upstream's wording, so code matching on it keeps working.
    return RuntimeError(
        f"Failed to stack tensors within a tensordict under the key {key!r}: their shapes are {shapes}. "
        "To read them, pass as_padded_tensor=True, as_nested_tensor=True or as_list=True to get()."
    )


def _plain_collections(td: TensorDict, retain_none: bool) -> TensorDict:
    """``td`` with each tensorclass in it (at any depth) replaced by its TensorDict; ``retain_none`` writes a
    tensorclass's ``None`` fields in as ``NonTensorData(None)``. ``td`` must be fresh (``contiguous()``'s)."""
    storage = td._tensordict
    for key, value in storage.items():
        if not isinstance(value, TensorCollection):
            continue
        if not isinstance(value, TensorDictBase):  # a tensorclass
            fields = type(value)._tc_field_names  # type: ignore[attr-defined]  # a tensorclass: see the test
            value = storage[key] = value._tensordict
            if value._is_locked:  # a frozen class locks its fields; the copy is the caller's to change
                value.unlock_()
            if retain_none:
                for name in fields:
                    if name not in value._tensordict:
                        value.set_non_tensor(name, None)
        if isinstance(value, TensorDict):
            _plain_collections(value, retain_none)
    return td


def _pad_to(value: torch.Tensor, shape: Sequence[int], padding_value: float, left: bool) -> torch.Tensor:
    """``value`` padded with ``padding_value`` up to ``shape`` (on the right of each dim, or the left)."""
    pads: List[int] = []
    for size, target in zip(reversed(value.shape), reversed(shape)):  # F.pad wants the last dim first
        pads += [target - size, 0] if left else [0, target - size]
    return torch.nn.functional.pad(value, pads, value=padding_value)


class _Index:
    """A batch index split into the part along the stack dim and the part for each member."""

    __slots__ = ("stack_item", "member_index", "trivial", "new_stack_dim")

    def __init__(self, stack_item: Any, member_index: tuple, new_stack_dim: int) -> None:
        self.stack_item = stack_item
        self.member_index = member_index
        # Full slices only: the members are used as they are (td[:, i] is member i).
        self.trivial = all(type(item) is slice and item == slice(None) for item in member_index)
        self.new_stack_dim = new_stack_dim


def _dims_taken(item: Any) -> int:
    if item is None:
        return 0
    if isinstance(item, _Tensor) and item.dtype is torch.bool:
        return item.dim()
    return 1


def _is_advanced(item: Any) -> bool:
    return isinstance(item, list) or (isinstance(item, _Tensor) and item.dim() > 0)


def _common_batch(members: Sequence[TensorDictBase]) -> torch.Size:
    """The members' batch size, with ``-1`` for each dim where they differ (a ragged lazy stack, as upstream)."""
    first = members[0].batch_size
    for member in members:
        if member.batch_size != first:
            break
    else:
        return first
    return torch.Size([sizes[0] if len(set(sizes)) == 1 else -1
                       for sizes in zip(*(member.batch_size for member in members))])


def _rank_mismatch_error(first: torch.Size, other: torch.Size) -> RuntimeError:
    return RuntimeError(
        "batch sizes in tensordicts differs, LazyStackedTensorDict cannot be created. Got "
        f"td[0].batch_size={first} and td[i].batch_size={other}. If the length match and you wish to stack these "
        "tensordicts, set strict_shape to False.")


def _unsupported_index(index: Any, why: str) -> IndexError:
    return IndexError(f"Unsupported index {index!r} on a LazyStackedTensorDict: {why}.")


class LazyStackedTensorDict(LazyWritesMixin, LazyApplyMixin, LazyKeyOpsMixin, LazyQueriesMixin, LazyOpsMixin, LazyReductionsMixin,
                            LazyShapeMixin, LazyMaskMixin, LazyNamesMixin, LazyExtrasMixin, LazyConstructorsMixin,
                            LazyPersistenceMixin, TensorDictBase):
    """A stack of TensorDicts along a new batch dim ``stack_dim`` that keeps its members.

    Build it with :func:`lazy_stack` (or ``LazyStackedTensorDict(*tds, stack_dim=0)``).

    >>> import torch
    >>> from torchdict import TensorDict
    >>> a, b = TensorDict(x=torch.zeros(3), batch_size=[3]), TensorDict(x=torch.ones(3), batch_size=[3])
    >>> td = LazyStackedTensorDict(a, b, stack_dim=1)
    >>> td["x"]
    tensor([[0., 1.],
            [0., 1.],
            [0., 1.]])
    >>> td[:, 0] is a
    True
    """

    __slots__ = ("_tds", "_stack_dim", "_member_batch", "_is_locked", "_stack_name", "__weakref__")

    def __init__(self, *tensordicts: TensorDictBase, stack_dim: int = 0) -> None:
        if not tensordicts:
            raise RuntimeError("items cannot be empty")
        for td in tensordicts:
            # Members are TensorDictBase collections: dense TensorDicts or lazy stacks themselves
            # (reshaping or flattening a lazy stack regroups its members into nested lazy stacks).
            if not isinstance(td, TensorDictBase):
                raise TypeError(
                    "Expected all inputs to be TensorDict instances but got "
                    f"{type(td)} instead."
                )
        first = tensordicts[0]
        batch = first.batch_size
        ragged = False
        for position, td in enumerate(tensordicts):
            if td.batch_size != batch:
                if len(td.batch_size) != len(batch):
                    raise _rank_mismatch_error(batch, td.batch_size)
                ragged = True
            if td.device != first.device:
                raise RuntimeError(f"devices differ, got {first.device} and {td.device}")
        if ragged:
            batch = _common_batch(tensordicts)
        n_batch = len(batch)
        if not -n_batch - 1 <= stack_dim <= n_batch:
            full = torch.Size((*batch, len(tensordicts)))
            raise RuntimeError(f"Stack dim {stack_dim} is too big for batch size {full}.")
        self._tds: List[TensorDictBase] = list(tensordicts)
        self._stack_dim = stack_dim % (n_batch + 1)
        self._member_batch = batch
        self._is_locked = False
        self._stack_name: Optional[str] = None  # the stack dim's name (the members' names are theirs)

    @classmethod
    def _from_members(cls, members: List[TensorDictBase], stack_dim: int) -> "LazyStackedTensorDict":
        """A stack of members already known to be consistent (their batch sizes and devices agree)."""
        td = object.__new__(cls)
        td._tds = members
        td._stack_dim = stack_dim
        td._member_batch = _common_batch(members)
        td._is_locked = False
        td._stack_name = None
        return td

    @classmethod
    def lazy_stack(cls, items: Sequence[Any], dim: int = 0, *, device: Any = None, out: Any = None,
                   stack_dim_name: Optional[str] = None, strict_shape: bool = False, as_list: bool = False,
                   as_padded_tensor: bool = False, as_nested_tensor: bool = False, padding_side: str = "right",
                   layout: Optional[torch.layout] = None, padding_value: float = 0.0) -> Any:
        """Stack ``items`` along a new batch dim ``dim`` without copying them (see :func:`lazy_stack`).

        ``stack_dim_name`` names the new dim. ``device`` is not used (the stack has its members'
        device), as upstream's. Members whose batch sizes differ (with the same number of dims) give a
        ragged stack, whose batch size holds ``-1`` where they differ; ``strict_shape=True`` refuses them. A list of tensors is stacked with ``torch.stack``, or returned as a list
        (``as_list``), padded to its largest size in every dim then stacked (``as_padded_tensor``,
        with ``padding_value`` on ``padding_side``), or as a nested tensor of ``layout``
        (``as_nested_tensor``, jagged by default); non-tensor leaves give a ``NonTensorStack``.

        >>> LazyStackedTensorDict.lazy_stack([TensorDict(), TensorDict()]).batch_size
        torch.Size([2])
        >>> LazyStackedTensorDict.lazy_stack([torch.zeros(1), torch.ones(2)], as_padded_tensor=True)
        tensor([[0., 0.],
                [1., 1.]])
        """
        from ._tensor_lists import stack_tensor_list

        if not items:
            raise RuntimeError("items cannot be empty")
        if all(isinstance(item, _Tensor) for item in items):
            return stack_tensor_list(list(items), dim, out, as_list=as_list, as_padded_tensor=as_padded_tensor,
                                     as_nested_tensor=as_nested_tensor, padding_side=padding_side, layout=layout,
                                     padding_value=padding_value)
        if all(type(item) in NON_TENSOR_TYPES for item in items):
            return NonTensorData.stack(list(items), dim, out=out)
        if strict_shape:
            for position, item in enumerate(items):
                if isinstance(item, TensorDictBase) and item.batch_size != items[0].batch_size:
                    raise _incongruent_error(items, position)
        result = cls(*items, stack_dim=dim)
        if out is not None:
            return _stacked_into(out, result)
        result._stack_name = stack_dim_name
        return result

    @classmethod
    def maybe_dense_stack(cls, items: Sequence[Any], dim: int = 0, out: Any = None,
                          strict: bool = False) -> Any:
        """``torch.stack(items, dim)`` when the members hold the same keys with the same shapes, else lazy.

        >>> import torch
        >>> type(LazyStackedTensorDict.maybe_dense_stack([TensorDict(a=0), TensorDict(a=1)])).__name__
        'TensorDict'
        >>> type(LazyStackedTensorDict.maybe_dense_stack([TensorDict(a=0), TensorDict(b=1)])).__name__
        'LazyStackedTensorDict'
        """
        return maybe_dense_stack(items, dim, out=out, strict=strict)

    # ------------------------------------------------------------------ shape and members
    @property
    def tensordicts(self) -> List[TensorDictBase]:
        """The members (the same objects), in stack order; a new list each time."""
        return list(self._tds)

    @property
    def stack_dim(self) -> int:
        return self._stack_dim

    @property
    def batch_size(self) -> torch.Size:
        batch, dim = self._member_batch, self._stack_dim
        return torch.Size((*batch[:dim], len(self._tds), *batch[dim:]))

    shape = batch_size

    @property
    def batch_dims(self) -> int:
        return len(self._member_batch) + 1

    ndim = batch_dims

    def dim(self) -> int:
        return self.batch_dims

    @property
    def device(self) -> Optional[torch.device]:
        return self._tds[0].device

    def __len__(self) -> int:
        return self.batch_size[0]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.unbind(0))

    def unbind(self, dim: int = 0) -> tuple:
        """The members along the stack dim; along another dim, lazy stacks of the members' slices.

        >>> a, b = TensorDict(), TensorDict()
        >>> [td is m for td, m in zip(lazy_stack([a, b]).unbind(0), (a, b))]
        [True, True]
        """
        n_batch = self.batch_dims
        if not -n_batch <= dim < n_batch:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n_batch}, {n_batch - 1}], "
                             f"but got {dim})")
        dim %= n_batch
        if dim == self._stack_dim:
            return tuple(self._tds)
        prefix = (slice(None),) * dim
        return tuple(self[prefix + (i,)] for i in range(self.batch_size[dim]))

    # ------------------------------------------------------------------ keys
    def keys(self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Optional[Callable] = None,
             *, sort: bool = False) -> list:
        """The keys every member has (members' order of the first one); exclusive keys are left out.

        ``sort`` sorts them as upstream does (a nested key as the tuple of its parts).

        >>> a = TensorDict(x=0, only_a=1)
        >>> lazy_stack([a, TensorDict(x=1, only_b=2)]).keys()
        ['x']
        """
        first, *others = [list(td.keys(include_nested, leaves_only, is_leaf)) for td in self._tds]
        shared = set(first).intersection(*others)
        keys = [key for key in first if key in shared]
        if sort:
            keys.sort(key=lambda key: (key,) if isinstance(key, str) else tuple(key))
        return keys

    def _exclusive_keys(self) -> List[list]:
        """Per member, its top-level keys that some other member lacks."""
        shared = set(self.keys())
        return [[key for key in td.keys() if key not in shared] for td in self._tds]

    def __contains__(self, key: Any) -> bool:
        return all(key in td for td in self._tds)

    # ------------------------------------------------------------------ reading
    def _member_values(self, key: Any) -> Any:
        """Each member's value at ``key`` (non-tensors as their wrappers), or _MISSING if one lacks it."""
        values = []
        for td in self._tds:
            value = td.get(key, _MISSING)
            if value is _MISSING:
                return _MISSING
            values.append(value)
        return values

    def get(self, key: Any, default: Any = None, *, as_list: bool = False, as_padded_tensor: bool = False,
            as_nested_tensor: bool = False, padding_value: float = 0.0, padding_side: str = "right",
            layout: torch.layout = torch.jagged) -> Any:
        """The members' values at ``key`` stacked along the stack dim; ``default`` if a member lacks it.

        Tensors are stacked densely (they must have one shape, unless one of the
        options is given); sub-TensorDicts give a lazy stack of the members' ones;
        non-tensor entries give their stacked ``NonTensorData``/``NonTensorStack``.

        - ``as_list``: the members' values as a list;
        - ``as_padded_tensor``: tensors padded with ``padding_value`` to their largest
          size in every dim (on the ``padding_side``, "right" or "left"), then stacked;
        - ``as_nested_tensor``: a ``torch.nested`` tensor of ``layout`` (jagged: one
          ragged dim at most) whose first dim runs over the members, whatever the stack dim.

        >>> import torch
        >>> td = lazy_stack([TensorDict(x=torch.zeros(1)), TensorDict(x=torch.ones(2))])
        >>> td.get("x", as_padded_tensor=True, padding_value=-1)
        tensor([[ 0., -1.],
                [ 1.,  1.]])
        >>> td.get("x", as_nested_tensor=True).unbind()[1]
        tensor([1., 1.])
        """
        if as_list + as_padded_tensor + as_nested_tensor > 1:
            raise ValueError("Pass at most one of as_list, as_padded_tensor and as_nested_tensor.")
        values = self._member_values(key)
        if values is _MISSING:
            return default
        if as_list:
            return values
        kinds = {isinstance(value, _Tensor) for value in values}
        if kinds == {True}:
            if as_padded_tensor:
                return self._padded(values, padding_value, padding_side)
            if as_nested_tensor:
                return torch.nested.as_nested_tensor(values, layout=layout)
            if isinstance(values[0], _Unbatched):  # no batch dims to stack: the first one, the stack's batch size
                batch = list(values[0].batch_size)
                batch.insert(self._stack_dim, len(values))
                return stack_unbatched(values, torch.Size(batch))
            if is_ragged(values):
                raise _ragged_error(key, [value.shape for value in values])
            return torch.stack(values, self._stack_dim)
        if as_padded_tensor or as_nested_tensor:
            raise TypeError(f"as_padded_tensor and as_nested_tensor need tensor entries; key {key!r} holds "
                            f"{type(values[0]).__name__} values.")
        if all(isinstance(value, TensorDictBase) for value in values):
            return LazyStackedTensorDict(*values, stack_dim=self._stack_dim)
        if all(type(value) in NON_TENSOR_TYPES for value in values):
            batch = list(values[0].batch_size)
            batch.insert(self._stack_dim, len(values))
            metadata = stacked_metadata(values, torch.Size(batch))  # MetaData holding one object stays one
            if metadata is not None:
                return metadata
            return combine_non_tensor(values, lambda grids: torch.stack(grids, self._stack_dim))
        if all(isinstance(value, TensorCollection) for value in values):
            return self._stacked_tensorclasses(key, values)
        raise _combine_error(key, values, "stack", TypeError())

    def _stacked_tensorclasses(self, key: Any, values: list) -> Any:
        """The members' tensorclass instances at ``key`` (some may be TensorDicts) stacked along the stack dim.

        Instances of one class give an instance of it, as upstream, but dense (a copy): a tensorclass keeps
        its fields in a TensorDict, never in a lazy stack. A mix of classes gives a lazy stack of their fields,
        as upstream gives a lazy stack.
        """
        kind = type(values[0])
        if any(type(value) is not kind for value in values):
            return LazyStackedTensorDict(*[value if isinstance(value, TensorDictBase) else value._tensordict
                                           for value in values], stack_dim=self._stack_dim)
        try:
            return torch.stack(values, self._stack_dim)
        except RuntimeError as err:
            raise RuntimeError(
                f"Cannot stack the {kind.__name__} instances at key {key!r}: {err} torchdict stacks a tensorclass "
                "densely; read the members' instances with get(key, as_list=True), or one field padded with "
                "get((key, field), as_padded_tensor=True).") from err

    def _padded(self, values: list, padding_value: float, padding_side: str) -> torch.Tensor:
        if padding_side not in ("left", "right"):
            raise RuntimeError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
        if len({value.dim() for value in values}) > 1:
            raise RuntimeError(f"Cannot pad tensors of different numbers of dims: {[v.shape for v in values]}.")
        shape = [max(sizes) for sizes in zip(*(value.shape for value in values))]
        padded = [_pad_to(value, shape, padding_value, padding_side == "left") for value in values]
        # The members along dim 0 whatever the stack dim, as upstream (and as a nested tensor's components).
        return torch.stack(padded, 0)

    def get_item_shape(self, key: Any) -> torch.Size:
        """The shape of the stacked entry at ``key``, with ``-1`` where the members' sizes differ.

        >>> import torch
        >>> lazy_stack([TensorDict(x=torch.zeros(2, 4)), TensorDict(x=torch.ones(3, 4))]).get_item_shape("x")
        torch.Size([2, -1, 4])
        """
        values = self._member_values(key)
        if values is _MISSING:
            raise _missing_key_error(key, self.keys())
        shapes = [value.shape if isinstance(value, _Tensor) else value.batch_size for value in values]
        if len({len(shape) for shape in shapes}) > 1:
            raise RuntimeError(f"The entries at key {key!r} have different numbers of dims: {shapes}.")
        sizes = [sizes[0] if len(set(sizes)) == 1 else -1 for sizes in zip(*shapes)]
        sizes.insert(self._stack_dim, len(self._tds))
        return torch.Size(sizes)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str) or (isinstance(index, tuple) and index and
                                      all(isinstance(item, (str, tuple)) for item in index)):
            value = self.get(index, _MISSING)
            if value is _MISSING:
                raise _missing_key_error(index, self.keys())
            return value.data if type(value) in NON_TENSOR_TYPES else value
        across = index_with_spanning_mask(self, index)
        if across is not None:
            return across
        split = self._split_index(index)
        item = split.stack_item
        if isinstance(item, int):
            member = self._tds[item]
            return member if split.trivial else member[split.member_index]
        members = [self._tds[position] for position in item]
        if not split.trivial:
            members = [member[split.member_index] for member in members]
        return LazyStackedTensorDict._from_members(members, split.new_stack_dim)

    def _split_index(self, index: Any) -> _Index:
        """Find the item of ``index`` that runs along the stack dim (ints, slices, None, ``...`` and one
        list / 1-d tensor are supported) and turn it into a member position or a list of positions."""
        items = list(index) if isinstance(index, tuple) else [index]
        for position, item in enumerate(items):
            if isinstance(item, range):
                items[position] = list(item)
            elif isinstance(item, bool) or (isinstance(item, _Tensor) and item.dim() == 0
                                            and item.dtype is torch.bool) or not (item is None or item is Ellipsis or isinstance(
                    item, (int, slice, list, _Tensor))):
                raise _unsupported_index(index, f"{type(item).__name__} items are not supported")
        if sum(map(_is_advanced, items)) > 1:
            raise _unsupported_index(index, "at most one list or tensor item is supported")
        n_batch = self.batch_dims
        taken = sum(_dims_taken(item) for item in items if item is not Ellipsis)
        if taken > n_batch:
            raise IndexError(f"too many indices for a tensordict of batch size {self.batch_size}")
        if items.count(Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items[at:at + 1] = [slice(None)] * (n_batch - taken)
        else:
            items += [slice(None)] * (n_batch - taken)
        dim = out_dims = 0
        for position, item in enumerate(items):
            width = _dims_taken(item)
            if dim <= self._stack_dim < dim + width:
                if width > 1:
                    raise _unsupported_index(index, "a boolean mask may not span the stack dim and another")
                member_index = tuple(items[:position] + items[position + 1:])
                return _Index(self._positions(item), member_index, out_dims)
            dim += width
            out_dims += 0 if isinstance(item, int) or (isinstance(item, _Tensor) and item.dim() == 0) else 1
        raise AssertionError("unreachable: the items cover every batch dim")

    def _positions(self, item: Any) -> Any:
        """The member position (int) or positions (list) that ``item`` selects along the stack dim."""
        count = len(self._tds)
        if isinstance(item, slice):
            positions = list(range(count))[item]
        elif isinstance(item, _Tensor) and item.dtype is torch.bool or (
                isinstance(item, list) and item and all(isinstance(v, bool) for v in item)):
            mask = torch.as_tensor(item)
            if mask.shape != (count,):
                raise IndexError(f"The shape of the mask {list(mask.shape)} does not match the stack dim of "
                                 f"size {count}")
            positions = mask.nonzero().squeeze(-1).tolist()
        else:
            picked = item.tolist() if isinstance(item, _Tensor) else item
            if isinstance(picked, int):
                return self._position(picked)
            if any(isinstance(value, list) for value in picked):
                raise _unsupported_index(item, "a multi-dim index along the stack dim")
            positions = [self._position(value) for value in picked]
        if not positions:
            raise IndexError("The index selects no member along the stack dim; a LazyStackedTensorDict needs one.")
        return positions

    def _position(self, value: int) -> int:
        count = len(self._tds)
        if not -count <= value < count:
            raise IndexError(f"index {value} is out of bounds for the stack dim of size {count}")
        return value % count

    # ------------------------------------------------------------------ TensorDictBase primitives
    # The generic members of TensorDictBase that this class does not define run on the dense stack
    # (``contiguous()``) and, for in-place ones, write the result back through these.
    def _keys_str(self) -> Iterator[str]:
        return iter(self.keys())

    def _get_str(self, key: str, default: Any) -> Any:
        value = self.get(key, _MISSING)
        return default if value is _MISSING else value

    def _set_str(self, key: str, value: Any, inplace: bool) -> None:
        if inplace:
            self.set_(key, value)
        else:
            self.set(key, value)

    def _del_str(self, key: str) -> None:
        del self[key]

    def _dense(self) -> TensorDict:
        return self.contiguous()

    def _dense_is_copy(self) -> bool:
        return True

    # ------------------------------------------------------------------ members
    def _check_member(self, td: Any) -> None:
        if self._is_locked:
            raise locked_error()
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"Expected new value to be a TensorDict instance but got {type(td)} instead.")
        if td.batch_size != self._member_batch:
            raise ValueError(f"Batch sizes in tensordicts differs: stack has batch_size={self._member_batch}, "
                             f"new_value has batch_size={td.batch_size}.")
        if td.device != self.device:
            raise RuntimeError(f"devices differ, got {self.device} and {td.device}")

    def append(self, tensordict: TensorDict) -> None:
        """Add ``tensordict`` as the last member (same batch size and device as the members)."""
        self.insert(len(self._tds), tensordict)

    def insert(self, index: int, tensordict: TensorDict) -> None:
        """Add ``tensordict`` as a member before position ``index`` (as ``list.insert``).

        >>> td = lazy_stack([TensorDict()])
        >>> td.insert(0, TensorDict())
        >>> td.batch_size
        torch.Size([2])
        """
        self._check_member(tensordict)
        self._tds.insert(index, tensordict)

    def extend(self, tensordict: Sequence[TensorDict]) -> None:
        """Append every TensorDict of the sequence ``tensordict`` (none is added if one does not fit)."""
        tds = list(tensordict)
        for td in tds:
            self._check_member(td)
        self._tds.extend(tds)

    # ------------------------------------------------------------------ conversions
    def contiguous(self, *, canonical: bool = False, inplace: bool = False) -> TensorDict:
        """A dense TensorDict (``torch.stack`` of the members, whose leaves have row-major strides: ``canonical``
        changes nothing); ragged entries raise. A lazy stack can't become dense in place (``inplace=True``
        raises ``NotImplementedError``, as upstream).

        >>> lazy_stack([TensorDict(a=0), TensorDict(a=1)]).contiguous()["a"]
        tensor([0, 1])
        """
        if inplace:
            raise NotImplementedError("contiguous(inplace=True) is not supported on LazyStackedTensorDict. Call "
                                      ".to_tensordict() first or use inplace=False.")
        for key in self.keys(True, True):
            values = self._member_values(key)
            if is_ragged(values):
                raise _ragged_error(key, [value.shape for value in values])
        # torch.stack of TensorDicts: torch's stubs take tensors only; TensorDict.__torch_function__ answers.
        return torch.stack(self._shared_members(), self._stack_dim)  # type: ignore[arg-type, return-value]

    def _shared_members(self) -> List[TensorDictBase]:
        """The members as dense TensorDicts holding only the keys every member has (as upstream, the dense
        form of a lazy stack leaves exclusive keys out; a shared sub-TensorDict stays, maybe empty)."""
        members = [td.contiguous() if isinstance(td, LazyStackedTensorDict) else td for td in self._tds]
        key_sets = [set(td.keys(True)) for td in members]
        shared = set.intersection(*key_sets)
        if all(keys == shared for keys in key_sets):
            return members
        return [td.exclude(*(key for key in td.keys(True) if key not in shared)) for td in members]

    def to_tensordict(self, *, retain_none: Optional[bool] = None) -> TensorDict:
        """``contiguous()``: a dense TensorDict of the keys every member has, with the tensorclasses in it as
        TensorDicts (their ``None`` fields as ``NonTensorData(None)`` with ``retain_none=True``), as upstream."""
        return _plain_collections(self.contiguous(), bool(retain_none))

    def _map_members(self, fn: Callable[[TensorDictBase], TensorDictBase]) -> "LazyStackedTensorDict":
        return LazyStackedTensorDict(*[fn(td) for td in self._tds], stack_dim=self._stack_dim)

    @staticmethod
    def _restack(members: Sequence[Any], stack_dim: int) -> "LazyStackedTensorDict":
        """A lazy stack of ``members`` (dense TensorDicts or lazy stacks) along ``stack_dim``."""
        return LazyStackedTensorDict(*members, stack_dim=stack_dim)

    def to(self, *args: Any, **kwargs: Any) -> "LazyStackedTensorDict":
        """A lazy stack of ``member.to(...)``: every form of ``TensorDict.to`` but ``batch_size=``
        (``inplace=True`` converts the members in place and returns self). See ``lazy/_moves.py``."""
        from ._moves import lazy_to

        return lazy_to(self, args, kwargs)

    # ------------------------------------------------------------------ locking
    @property
    def is_locked(self) -> bool:
        return self._is_locked

    def lock_(self) -> "LazyStackedTensorDict":
        """Lock the stack (no new members or keys) and every member; returns self."""
        for td in self._tds:
            td.lock_()
        self._is_locked = True
        return self

    def unlock_(self) -> "LazyStackedTensorDict":
        """Unlock the stack and every member; returns self."""
        for td in self._tds:
            td.unlock_()
        self._is_locked = False
        return self

    # ------------------------------------------------------------------ printing
    def __repr__(self) -> str:
        from ..printing import PRINT_OPTIONS

        if PRINT_OPTIONS["compact"]:
            from .._compact_repr import compact_repr

            return compact_repr(self)
        fields = {}
        mixed = set()
        for key in self.keys():
            values = self._member_values(key)
            if all(isinstance(value, _Tensor) for value in values):
                # The dense repr's layout, with the stacked shape (-1 where ragged) and promoted dtype.
                dtype = reduce(torch.promote_types, (value.dtype for value in values))
                fields[key] = (f"Tensor(shape={self.get_item_shape(key)}, device={values[0].device}, "
                               f"dtype={dtype}, is_shared={_tensor_is_shared(values[0])})")
            elif all(isinstance(value, TensorDictBase) for value in values) or all(
                    type(value) in NON_TENSOR_TYPES for value in values):
                fields[key] = format_leaf(self.get(key))
            else:
                mixed.add(key)  # a tensor in one member, a TensorDict in another: shown per member
        exclusive = {}
        for position, td in enumerate(self._tds):
            own = [key for key in td.keys() if key not in fields]
            if own:
                exclusive[position] = _block([f"{key}: {format_leaf(td.get(key))}" for key in sorted(own)])
        lines = [f"fields={_block([f'{key}: {fields[key]}' for key in sorted(fields)])},"]
        if exclusive:
            lines.append(f"exclusive_fields={_block([f'{pos}: {text}' for pos, text in exclusive.items()])},")
        lines += [f"batch_size={self.batch_size},", f"device={self.device},",
                  f"is_shared={_is_shared(self)},", f"stack_dim={self._stack_dim})"]
        return f"{type(self).__name__}(\n" + indent("\n".join(lines))


def _block(entries: list) -> str:
    """``{`` entries one a line ``}`` in the dense repr's layout."""
    if not entries:
        return "{\n}"
    return "{\n" + indent(",\n".join(entries)) + "}"


def _is_shared(td: LazyStackedTensorDict) -> bool:
    from ..printing import td_is_shared

    return any(td_is_shared(member) for member in td._tds)


def lazy_stack(input: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> LazyStackedTensorDict:
    """Stack TensorDicts along a new batch dim ``dim`` without copying them.

    The members must have the same batch size and device; their leaves may
    have different shapes and they may hold keys the others lack.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> tds = [TensorDict(a=torch.zeros(3), batch_size=[3]) for _ in range(2)]
    >>> td = lazy_stack(tds, dim=-1)
    >>> td.batch_size, td.stack_dim
    (torch.Size([3, 2]), 1)

    ``out`` (a collection of the stacked batch size) receives the stack's values in place and is returned.
    The other keywords are :meth:`LazyStackedTensorDict.lazy_stack`'s (``stack_dim_name``, the options
    for lists of tensors, ...).
    """
    return LazyStackedTensorDict.lazy_stack(input, dim, out=out, **kwargs)


def _stacked_into(out: Any, result: Any) -> Any:
    """``out=`` of the stacking functions: ``result``'s values copied into ``out`` (same batch size); ``out``."""
    if out.batch_size != result.batch_size:
        raise RuntimeError(f"out.batch_size and stacked batch size must match, got out.batch_size={out.batch_size} "
                           f"and batch_size={result.batch_size}")
    out.update_(result)
    return out


def maybe_dense_stack(input: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
    """``torch.stack(items, dim)`` (dense) when every member holds the same leaves with the same shapes,
    else ``lazy_stack(items, dim)``.

    >>> import torch
    >>> type(maybe_dense_stack([TensorDict(a=torch.zeros(1)), TensorDict(a=torch.zeros(2))])).__name__
    'LazyStackedTensorDict'
    """
    strict = kwargs.pop("strict", False)
    if kwargs:
        raise TypeError(f"maybe_dense_stack() got unexpected keyword arguments {sorted(kwargs)}.")
    if out is not None:
        result = maybe_dense_stack(input, dim)
        if strict:
            _check_same_keys(out, result)
        return _stacked_into(out, result)
    items = list(input)
    if not items:
        raise RuntimeError("items cannot be empty")
    if all(isinstance(td, LazyStackedTensorDict) for td in items):
        return torch.stack(items, dim)  # lazy stacks of lazy stacks: see _ops._stack_lazy_stacks

    def layout(td: Any) -> dict:
        return {key: (value.shape if isinstance(value, _Tensor) else (type(value), value.batch_size))
                for key, value in td.items(True, True)} if isinstance(td, TensorDict) else {}

    first = layout(items[0])
    if all(isinstance(td, TensorDict) for td in items) and all(layout(td) == first for td in items[1:]):
        return torch.stack(items, dim)
    return lazy_stack(items, dim)


def _check_same_keys(out: Any, result: Any) -> None:
    """``maybe_dense_stack(..., out=out, strict=True)``: ``out`` must hold exactly the stacked keys."""
    out_keys, in_keys = set(out.keys()), set(result.keys())
    if out_keys != in_keys:
        raise RuntimeError(f"With strict=True, out must hold the keys of the stacked tensordicts: out has "
                           f"{sorted(map(str, out_keys - in_keys))} more and {sorted(map(str, in_keys - out_keys))} "
                           "fewer.")


def _register_pytree() -> None:
    from ._pytree import register

    register()


_register_pytree()
