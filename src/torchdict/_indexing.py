"""Indexing along the batch dimensions: ``td[index]``, ``td[index] = value``, lazy preallocation.

Reading applies the index to every leaf, exactly as torch would to a tensor of
the batch shape, so the result has the batch size torch gives for that tensor
and its leaves are views wherever torch returns views. An index is first
*normalised* (lists, ranges and numpy arrays become tensors, ``...`` becomes
the right number of full slices) so that it only ever touches the leading
batch dims of a leaf, never its feature dims.

The batch size of a result is known without touching any leaf: cheaply for an
int, a slice or a 1-d index tensor, otherwise by indexing a *probe*, a
zero-stride tensor of the batch shape (which also raises torch's own error,
worded for the batch shape, before anything is done).

Writing checks the whole write first and then carries it out, so a failed
write leaves the TensorDict unchanged. A key present in the value but not in
the target is allocated on first write (lazy preallocation): zeros of the
full batch shape with the value's dtype, or the non-tensor value broadcast
over the batch.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from itertools import repeat
from typing import TYPE_CHECKING, Any, Optional

import torch

from ._apply import rewrap, unwrap
from ._base import TensorCollection
from ._bounded_cache import BoundedCache
from ._errors import inplace_error, locked_error, slot_shape_error
from ._write_checks import broadcasts_into, check_grad_writable
from .memmap import PLAIN_ALIAS, plain_alias
from .memmap import MemoryMappedTensor as _MemoryMappedTensor
from .nontensor import NonTensorData, NonTensorStack, NON_TENSOR_TYPES
from ._unbatched import UnbatchedTensor as _Unbatched, with_batch_size

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_Tensor = torch.Tensor
_Size = torch.Size
_MISSING: Any = object()
_ROW_DTYPES = (torch.int64, torch.int32)  # the index dtypes index_select takes

PAST_BATCH_WARNING = (
    "An index runs past the batch dims, and is used on the dims of the leaves instead. Starting with "
    "TensorDict 0.17, the default will change to raising an IndexError, as torch does for a tensor of the "
    "batch size. To index the leaves, write td.apply(lambda x: x[:, idx]), which keeps the batch size."
)


def warn_user(message: str, category: type = FutureWarning) -> None:
    """Warn, pointing at the first caller outside torchdict (however deep the call chain)."""
    import os
    import sys

    package_dir = os.path.dirname(os.path.abspath(__file__))
    frame: Any = sys._getframe(0)  # stacklevel 1 is this function
    level = 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == package_dir:
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


# --------------------------------------------------------------------------- the probe

_PROBES: BoundedCache = BoundedCache(512)


def batch_probe(batch_size: torch.Size) -> torch.Tensor:
    """A zero-stride uint8 tensor of shape ``batch_size`` (no memory, cached).

    Indexing or reshaping it gives the batch size of the same op on a
    TensorDict, and raises torch's error for a bad op, worded for the batch.
    It must never be written to.
    """
    probe = _PROBES.get(batch_size)
    if probe is None:
        probe = _PROBES.put(batch_size, torch.zeros((), dtype=torch.uint8).expand(batch_size))
    return probe


# --------------------------------------------------------------------------- normalising an index


def _zero_dim_error(index: Any) -> RuntimeError:
    return RuntimeError(f"indexing a tensordict with td.batch_dims==0 is not permitted. Got index {index}.")


def _out_of_bounds(index: int, size: int, dim: int = 0) -> IndexError:
    return IndexError(f"index {index} is out of bounds for dimension {dim} with size {size}")


def _convert_item(item: Any) -> Any:
    """Turn index items torch would treat as sequences into tensors (done once, not per leaf)."""
    if isinstance(item, str):
        # A tuple mixing key parts and other items (td["a", 0]) is neither a key nor a batch index.
        raise IndexError(f"a batch index cannot hold the str {item!r}: a key is a str or a tuple of str only "
                         "(to index a leaf, write td[key][index])")
    if isinstance(item, (list, range)):
        try:
            tensor = torch.as_tensor(item if type(item) is list else list(item))
        except (TypeError, ValueError, RuntimeError):
            return item  # e.g. a list holding slices: torch reads it as a tuple
        # torch reads an empty list as an empty *integer* index.
        return tensor.long() if not tensor.numel() and tensor.is_floating_point() else tensor
    if type(item).__module__ == "numpy":
        import numpy

        if isinstance(item, numpy.ndarray):
            return torch.as_tensor(item)
        if isinstance(item, numpy.bool_):
            return bool(item)
        if isinstance(item, numpy.integer):
            return int(item)
    return item


def _dims_used(item: Any) -> int:
    """How many dims of the indexed tensor ``item`` consumes."""
    if item is None or item is Ellipsis or type(item) is bool:
        return 0
    if isinstance(item, _Tensor) and item.dtype in (torch.bool, torch.uint8):
        return item.dim()  # a mask covers as many dims as it has
    return 1


def normalize_index(index: Any, batch_size: torch.Size) -> tuple:
    """``(items, past)``: the index as a tuple acting only on the batch dims.

    ``...`` is replaced by full slices. ``past`` is True when the index uses
    more dims than the batch has (then ``items`` is returned unchanged).
    """
    raw = index if type(index) is tuple else (index,)
    items: list = []
    used = 0
    ellipsis_at = None
    for item in raw:
        item = _convert_item(item)
        if item is Ellipsis:
            if ellipsis_at is not None:
                raise IndexError("an index can only have a single ellipsis ('...')")
            ellipsis_at = len(items)
        used += _dims_used(item)
        items.append(item)
    n_batch = len(batch_size)
    if used and not n_batch:
        raise _zero_dim_error(index)
    if ellipsis_at is not None:
        if used > n_batch:
            raise RuntimeError("Not enough dimensions in TensorDict for index provided.")
        items[ellipsis_at:ellipsis_at + 1] = [slice(None)] * (n_batch - used)
    return tuple(items), used > n_batch


def _batch_part(items: tuple, n_batch: int) -> tuple:
    """The leading items of an index that consume the batch dims."""
    used = 0
    for position, item in enumerate(items):
        if used >= n_batch and _dims_used(item):
            return items[:position]
        used += _dims_used(item)
    return items


def indexed_batch_size(index: Any, batch_size: torch.Size) -> tuple:
    """``(items, new_batch_size)`` for a normalised index that stays within the batch dims.

    Raises torch's IndexError (worded for the batch shape) for a bad index, and
    IndexError when the index runs past the batch dims.
    """
    items, past = normalize_index(index, batch_size)
    if past:
        raise IndexError(f"too many indices for a tensordict with batch size {batch_size}: got {index!r}")
    return items, batch_probe(batch_size)[items].shape


# --------------------------------------------------------------------------- reading

_tensor_getitem = torch.Tensor.__getitem__
NO_BATCH = torch.Size(())
_ROW_BATCH: BoundedCache = BoundedCache(512)  # batch size -> the batch size without its first dim (td[i] is a hot path)


def _row_batch(batch: torch.Size) -> torch.Size:
    rest = _ROW_BATCH.get(batch)
    if rest is None:
        rest = _ROW_BATCH.put(batch, batch[1:])
    return rest


# (slice.start, slice.stop, slice.step, batch size) -> the batch size of td[start:stop:step].
# td[a:b] is a hot path: the raw bounds are the key (cheaper than slice.indices), and
# building a torch.Size is slow.
SLICE_BATCHES: dict = {}


def slice_batch(index: slice, batch: torch.Size) -> torch.Size:
    """The batch size after slicing dim 0 of ``batch`` with ``index`` (cached: td[a:b] is a hot path)."""
    key = (index.start, index.stop, index.step, batch)
    try:
        new_batch = SLICE_BATCHES.get(key)
    except TypeError:  # an unhashable bound: computing it raises the usual error
        new_batch = None
    return _new_slice_batch(key) if new_batch is None else new_batch


def _new_slice_batch(key: tuple) -> torch.Size:
    start, stop, step, batch = key
    rows = range(*slice(start, stop, step).indices(batch[0]))
    if rows.step <= 0:
        raise ValueError("step must be greater than zero")
    new_batch = _Size((len(rows),)) + batch[1:]
    # Only plain bounds are cached: an index-like object (a 0-d tensor) would be kept alive
    # and hashed by identity.
    if all(bound is None or type(bound) is int for bound in (start, stop, step)):
        if len(SLICE_BATCHES) > 512:
            SLICE_BATCHES.clear()
        SLICE_BATCHES[key] = new_batch
    return new_batch


def index_basic(storage: dict, batch: torch.Size, names: Optional[list], index: Any, result: dict) -> tuple:
    """``td[index]`` for an int or a slice ``index``, as parts: fills ``result`` (an empty dict)
    with the indexed storage and returns ``(batch_size, names)`` of the result.

    The parts, not a TensorDict: a tensorclass fills its new instance's own ``__dict__``
    and builds a TensorDict only when one is needed.
    """
    if not batch:
        raise _zero_dim_error(index)
    if type(index) is int:
        size = batch[0]
        if not -size <= index < size:
            raise _out_of_bounds(index, size)
        new_batch: Optional[torch.Size]
        if len(batch) == 1:
            new_batch = NO_BATCH
        else:
            new_batch = _ROW_BATCH.get(batch)
            if new_batch is None:
                new_batch = _row_batch(batch)
        if names is not None:
            names = names[1:] if any(names[1:]) else None
    else:
        new_batch = slice_batch(index, batch)
    # _index_storage's loop, inlined: one call less on the hottest indexing path.
    n_batch = len(batch)
    for key, leaf in storage.items():
        # Exact-type tests first: cheaper than isinstance and true for most leaves.
        leaf_type = type(leaf)
        if leaf_type is _Tensor:
            result[key] = leaf[index]
        elif leaf_type is _MemoryMappedTensor:
            # MemoryMappedTensor.__getitem__ for an int or a slice, without its Python frame
            # and through its plain alias (see memmap.plain_alias): the view, relabelled
            # (reading a memory-mapped dataset item by item).
            plain = leaf.__dict__.get(PLAIN_ALIAS)
            if plain is None:
                plain = plain_alias(leaf)
            view = _tensor_getitem(leaf if plain is False else plain, index)
            view.__class__ = _MemoryMappedTensor
            result[key] = view
        elif isinstance(leaf, _Tensor) and not isinstance(leaf, _Unbatched):
            result[key] = leaf[index]
        else:
            result[key] = _index_entry(leaf, index, n_batch, new_batch)
    return new_batch, names


def _index_storage(storage: dict, index: Any, n_batch: int, new_batch: torch.Size, result: dict) -> dict:
    """``leaf[index]`` for every leaf of a TensorDict with ``n_batch`` batch dims, written into ``result``.

    ``index`` acts on the batch dims only; nested collections keep their
    extra batch dims after ``new_batch``.
    """
    for key, leaf in storage.items():
        result[key] = leaf[index] if type(leaf) is _Tensor else _index_entry(leaf, index, n_batch, new_batch)
    return result


def _index_entry(leaf: Any, index: Any, n_batch: int, new_batch: torch.Size) -> Any:
    """``leaf[index]`` for an entry that is not a plain tensor: a tensor subclass, a nested collection or
    non-tensor data."""
    if isinstance(leaf, _Tensor):
        if isinstance(leaf, _Unbatched):  # no batch dims to index: the same payload, the new batch size
            return with_batch_size(leaf, new_batch + leaf.batch_size[n_batch:])
        return leaf[index]
    if isinstance(leaf, TensorCollection):
        inner = unwrap(leaf)
        if type(getattr(inner, "_tensordict", None)) is not dict:  # a nested lazy stack: its own path
            from ._nested_foreign import map_foreign_batch

            return map_foreign_batch(leaf, lambda grid: grid[index], n_batch, new_batch)
        inner_batch = new_batch + inner._batch_size[n_batch:]
        return rewrap(leaf, inner._new_unsafe(
            _index_storage(inner._tensordict, index, n_batch, new_batch, {}), inner_batch, inner._device))
    if isinstance(leaf, NonTensorData):
        return leaf._with_batch_size(new_batch + leaf.batch_size[n_batch:])
    return leaf._batch_op(lambda grid: grid[index])


def _take_storage(storage: dict, rows: torch.Tensor, n_batch: int, new_batch: torch.Size, seen: list) -> dict:
    """``leaf.index_select(0, rows)`` for every leaf (``rows`` holds non-negative positions)."""
    result: dict = {}
    for key, leaf in storage.items():
        if type(leaf) is _Tensor or (isinstance(leaf, _Tensor) and not isinstance(leaf, _Unbatched)):
            result[key] = leaf.index_select(0, rows)
            seen[0] = True
        elif isinstance(leaf, _Unbatched):  # no batch dims to index
            result[key] = with_batch_size(leaf, new_batch + leaf.batch_size[n_batch:])
        elif isinstance(leaf, TensorCollection):
            inner = unwrap(leaf)
            if type(getattr(inner, "_tensordict", None)) is not dict:  # a nested lazy stack: its own path
                from ._nested_foreign import map_foreign_batch

                result[key] = map_foreign_batch(leaf, lambda grid: grid.index_select(0, rows), n_batch, new_batch)
                continue
            inner_batch = new_batch + inner._batch_size[n_batch:]
            result[key] = rewrap(leaf, inner._new_unsafe(
                _take_storage(inner._tensordict, rows, n_batch, new_batch, seen), inner_batch, inner._device))
        elif isinstance(leaf, NonTensorData):
            result[key] = leaf._with_batch_size(new_batch + leaf.batch_size[n_batch:])
        else:
            result[key] = leaf._batch_op(lambda grid: grid.index_select(0, rows))
    return result


def _take_rows(td: Any, rows: torch.Tensor) -> Optional[Any]:
    """Index dim 0 with a 1-d integer tensor through ``index_select`` (faster than advanced indexing).

    Returns None when ``index_select`` refuses (negative or out-of-range
    positions, another device): the general path then gives torch's answer.
    """
    batch = td._batch_size
    new_batch = rows.shape + batch[1:]
    seen = [False]
    try:
        storage = _take_storage(td._tensordict, rows, len(batch), new_batch, seen)
    except (IndexError, RuntimeError):
        return None
    if not seen[0]:
        # No tensor leaf checked the positions: let the probe do it.
        batch_probe(batch)[rows]
    return td._new_unsafe(storage, new_batch, td._device, td._names)


def index_tensordict(td: Any, index: Any) -> Any:
    """``td[index]`` for any non-key index (see the module docstring)."""
    index_type = type(index)
    if index_type is int or index_type is slice:
        storage: dict = {}
        new_batch, names = index_basic(td._tensordict, td._batch_size, td._names, index, storage)
        return td._new_unsafe(storage, new_batch, td._device, names)
    batch = td._batch_size
    if isinstance(index, _Tensor) and index.dim() == 1 and batch:
        rows = None
        if index.dtype in _ROW_DTYPES:
            rows = index
        elif index.dtype is torch.bool and index.shape[0] == batch[0]:
            rows = index.nonzero().squeeze(1)
        if rows is not None:
            result = _take_rows(td, rows)
            if result is not None:
                return result
    return _index_general(td, index)


def _index_general(td: Any, index: Any) -> Any:
    batch = td._batch_size
    items, past = normalize_index(index, batch)
    n_batch = len(batch)
    if past:
        warn_user(PAST_BATCH_WARNING)
        batch_items = _batch_part(items, n_batch)
        new_batch = batch_probe(batch)[batch_items].shape
        return td._new_unsafe(_index_past_storage(td._tensordict, items, batch_items, n_batch, new_batch),
                              new_batch, td._device)
    probe_result = batch_probe(batch)[items]  # validates the index, gives the batch size
    new_batch = probe_result.shape
    return td._new_unsafe(_index_storage(td._tensordict, items, n_batch, new_batch, {}), new_batch, td._device,
                          _indexed_names(td._names, items))


def _indexed_names(names: Optional[list], items: tuple) -> Optional[list]:
    """Dim names after a basic index (ints drop a dim, None/bool add one); None after advanced indexing."""
    if names is None:
        return None
    result = []
    position = 0
    for item in items:
        if type(item) is slice:
            result.append(names[position])
            position += 1
        elif type(item) is int:
            position += 1
        elif item is None or type(item) is bool:
            result.append(None)
        else:
            return None
    result.extend(names[position:])
    return result if any(name is not None for name in result) else None


def _index_past_storage(storage: dict, items: tuple, batch_items: tuple, n_batch: int,
                        new_batch: torch.Size) -> dict:
    """An index longer than the batch: the leaves get all of it, non-tensors only the batch part."""
    result: dict = {}
    leaf: Any
    for key, leaf in storage.items():
        if isinstance(leaf, _Unbatched):  # no batch dims, and the index past them is not for it either
            result[key] = with_batch_size(leaf, new_batch)
        elif isinstance(leaf, _Tensor):
            result[key] = leaf[items]
        elif isinstance(leaf, TensorCollection):
            collection: Any = leaf
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                result[key] = collection[items]
        elif isinstance(leaf, NonTensorData):
            result[key] = leaf._with_batch_size(new_batch)
        else:
            result[key] = leaf._batch_op(lambda grid: grid[batch_items])
    return result


# --------------------------------------------------------------------------- writing


def _destination_batch_error(dest_batch: torch.Size, batch: torch.Size, index: Any,
                             source_batch: torch.Size) -> RuntimeError:
    return RuntimeError(
        f"indexed destination TensorDict batch size is {dest_batch} (batch_size = {batch}, index={index}), "
        f"which differs from the source batch size {source_batch}"
    )


def same_value(first: Any, second: Any) -> bool:
    """Whether two non-tensor values are the same (``==`` only when it answers with a bool)."""
    if first is second:
        return True
    if type(first) is not type(second):
        return False
    try:
        equal = first == second
    except Exception:
        return False
    return equal if type(equal) is bool else False


class _WritePlan:
    """The writes of one ``td[index] = value``, all checked before the first one is made.

    ``shift`` is how many leading dims the index removes when it is a plain
    int (``td[i] = v``): a value then fits a leaf when
    ``value.shape == leaf.shape[shift:]``, a cheaper test than comparing
    the feature dims of both. It is None for other indices.

    ``cast`` is True when the index holds a tensor: the write then goes through
    ``index_put_``, which refuses a value of another dtype (basic indexing casts),
    so values are cast while planning rather than refused half-way.
    """

    __slots__ = ("index", "top_batch", "dest_batch", "n_dest", "shift", "cast", "copies", "others")

    def __init__(self, index: Any, top_batch: torch.Size, dest_batch: torch.Size, shift: Optional[int]) -> None:
        self.index = index
        self.top_batch = top_batch  # the batch of the TensorDict written into
        self.dest_batch = dest_batch  # the batch of its indexed part
        self.n_dest = len(dest_batch)
        self.shift = shift
        self.cast = shift is None and any(map(isinstance, index if type(index) is tuple else (index,),
                                              repeat(_Tensor)))
        self.copies: list = []  # (existing tensor, value tensor): existing[index] = value
        self.others: list = []  # (callable, args): allocations, new entries, non-tensor writes


def _check_broadcast(value: torch.Tensor, target_shape: torch.Size, key: Any, entry_shape: torch.Size) -> None:
    """Refuse a ``value`` that can't be written into a slot of ``target_shape`` (torch's rule for
    ``slot[...] = value``: leading size-1 dims dropped, then broadcast), naming the key and the shapes
    (torch's ``expand`` error, upstream's, names neither the key nor the entry)."""
    shape = value.shape
    while len(shape) > len(target_shape) and shape[0] == 1:
        shape = shape[1:]
    if not broadcasts_into(shape, target_shape):
        raise slot_shape_error(key, value.shape, target_shape, entry_shape)


def _broadcasts_to(batch: torch.Size, target: torch.Size) -> bool:
    """True when a source batch ``batch`` can be written into a slot of batch ``target`` by
    repeating it along new leading dims (``[3]`` into ``[2, 3]``), as upstream accepts. Size-1
    dims are not stretched (upstream refuses ``[1]`` into ``[4]``), nor is an empty batch."""
    return 0 < len(batch) < len(target) and target[len(target) - len(batch):] == batch


def _allocate(target: Any, key: str, value: torch.Tensor, top_batch: torch.Size, n_dest: int,
              index: Any) -> None:
    device = target._device if target._device is not None else value.device
    leaf = torch.zeros(top_batch + value.shape[n_dest:], dtype=value.dtype, device=device)
    leaf[index] = value
    target._tensordict[key] = leaf


def _put(storage: dict, key: str, value: Any) -> None:
    storage[key] = value


def _write_non_tensor(target: Any, key: str, existing: Any, value: Any, index: Any) -> None:
    if existing._write_shared_at(value, index):  # a shared leaf (share_non_tensor): written to its folder
        return
    if isinstance(existing, NonTensorData):
        existing = NonTensorStack(existing._flat_values(), existing.batch_size, existing.device,
                                  existing._flat_origins())
    existing._set_at(index, value)
    # Back to one value when the write covered every element with one value.
    one = existing._as_one_value()
    target._tensordict[key] = existing if one is None else one


def _plan_collection(plan: _WritePlan, target: Any, source: Any, prefix: tuple) -> None:
    """Plan writing every entry of ``source`` (a TensorDict) into ``target`` at ``plan.index``."""
    storage = target._tensordict
    shift = plan.shift
    cast = plan.cast
    copies = plan.copies
    cls = type(target)
    for key, value in source._tensordict.items():
        existing = storage.get(key, _MISSING)
        if type(value) is _Tensor and type(existing) is _Tensor:  # the common case, kept lean
            if shift is not None:
                if value.shape != existing.shape[shift:]:
                    _check_broadcast(value, value.shape[:plan.n_dest] + existing.shape[len(plan.top_batch):],
                                     prefix + (key,), existing.shape)
            else:
                if value.shape[plan.n_dest:] != existing.shape[len(plan.top_batch):]:
                    _check_broadcast(value, value.shape[:plan.n_dest] + existing.shape[len(plan.top_batch):],
                                     prefix + (key,), existing.shape)
                if cast and value.dtype is not existing.dtype:  # dtypes are singletons
                    value = value.to(existing.dtype)  # see _WritePlan.cast
            if existing.requires_grad:
                check_grad_writable(existing)  # torch's refusal, before the first write rather than half-way
            copies.append((existing, value))
        elif type(value) is cls and type(existing) is cls:  # a sub-TensorDict into a sub-TensorDict
            _plan_collection(plan, existing, value, prefix + (key,))
        else:
            _plan_entry(plan, target, key, existing, value, prefix)


def _plan_entry(plan: _WritePlan, target: Any, key: str, existing: Any, value: Any, prefix: tuple) -> None:
    """Plan one entry that is not a plain tensor written over a plain tensor."""
    n_dest = plan.n_dest
    if isinstance(value, _Tensor):
        if isinstance(existing, _Unbatched):
            _plan_unbatched(plan, existing, value, prefix + (key,) if prefix else key)
            return
        if isinstance(existing, _Tensor):
            feature = existing.shape[len(plan.top_batch):]
            if value.shape[n_dest:] != feature:
                _check_broadcast(value, value.shape[:n_dest] + feature, prefix + (key,), existing.shape)
            if plan.cast and value.dtype is not existing.dtype:
                value = value.to(existing.dtype)  # see _WritePlan.cast
            if existing.requires_grad:
                check_grad_writable(existing)
            plan.copies.append((existing, value))
            return
        if existing is _MISSING:
            if target._is_locked:
                raise locked_error()
            plan.others.append((_allocate, (target, key, value, plan.top_batch, n_dest, plan.index)))
            return
    elif isinstance(value, TensorCollection):
        value_td = unwrap(value)
        if isinstance(existing, TensorCollection):
            _plan_collection(plan, unwrap(existing), value_td, prefix + (key,))
            return
        if existing is _MISSING:
            if target._is_locked:
                raise locked_error()
            new_batch = plan.top_batch + value_td._batch_size[n_dest:]
            created = target._new_unsafe({}, new_batch, target._device)
            plan.others.append((_put, (target._tensordict, key, rewrap(value, created))))
            _plan_collection(plan, created, value_td, prefix + (key,))
            return
    elif type(value) in NON_TENSOR_TYPES:
        if existing is _MISSING:
            if target._is_locked:
                raise locked_error()
            full_batch = plan.top_batch + value.batch_size[n_dest:]
            first = value._flat_values()[0] if value.batch_size.numel() else None
            # (a MetaData written at an index fills the new entry as a MetaData of its class, as upstream's)
            fresh = (type(value)._make(first, full_batch, target._device) if isinstance(value, NonTensorData)
                     else NonTensorData(first, full_batch, target._device))
            plan.others.append((_put, (target._tensordict, key, fresh)))
            if type(value) is NonTensorStack:
                plan.others.append((_write_non_tensor, (target, key, fresh, value, plan.index)))
            return
        if type(existing) in NON_TENSOR_TYPES:
            if isinstance(existing, NonTensorData) and isinstance(value, NonTensorData) and same_value(
                    existing.data, value.data):
                return
            existing._check_shared_at(value)  # a shared NonTensorData takes its own value only (as upstream)
            plan.others.append((_write_non_tensor, (target, key, existing, value, plan.index)))
            return
    raise inplace_error(prefix + (key,) if prefix else key, target)


def _copy_whole(existing: torch.Tensor, value: torch.Tensor) -> None:
    existing.copy_(value)


def _plan_unbatched(plan: _WritePlan, existing: Any, value: torch.Tensor, key: Any) -> None:
    """``td[index] = other`` where ``td`` holds an UnbatchedTensor at ``key``: the whole batch shares it, so
    an UnbatchedTensor of its shape is written whole, whatever the index (as upstream); anything else is
    refused before the first write."""
    if not isinstance(value, _Unbatched) or value.shape != existing.shape:
        raise RuntimeError(
            f"Cannot write a {type(value).__name__} of shape {tuple(value.shape)} at an index into the "
            f"UnbatchedTensor entry {key!r} of shape {tuple(existing.shape)}: it has no batch dims, so only an "
            "UnbatchedTensor of its shape can be written into it (whole)."
        )
    if existing.requires_grad:
        check_grad_writable(existing)
    plan.others.append((_copy_whole, (existing, value)))


def _plan_broadcast(plan: _WritePlan, target: Any, value: Any, prefix: tuple = ()) -> None:
    """Plan ``leaf[index] = value`` for every tensor leaf (non-tensor entries are left alone)."""
    n_top = len(plan.top_batch)
    for key, leaf in target._tensordict.items():
        if isinstance(leaf, _Tensor):
            if type(value) is complex and not leaf.is_complex():
                raise TypeError(f"cannot write the complex number {value} into a {leaf.dtype} leaf")
            item = value
            if leaf.requires_grad:
                check_grad_writable(leaf)
            if isinstance(value, _Tensor):
                target_shape = plan.dest_batch + leaf.shape[n_top:]
                if value.shape != target_shape:
                    _check_broadcast(value, target_shape, prefix + (key,), leaf.shape)
                if value.dtype != leaf.dtype:
                    # Cast up front: a bool or tensor index writes through index_put_, which refuses
                    # a dtype mismatch (basic indexing would cast), and it would refuse after the
                    # leaves before it were written.
                    item = value.to(leaf.dtype)
            plan.copies.append((leaf, item))
        elif isinstance(leaf, TensorCollection):
            _plan_broadcast(plan, unwrap(leaf), value, prefix + (key,))


def set_at_index(td: Any, index: Any, value: Any) -> None:
    """``td[index] = value`` (see the module docstring)."""
    batch = td._batch_size
    if type(index) is int and batch:
        size = batch[0]
        if not -size <= index < size:
            raise _out_of_bounds(index, size)
        items, dest_batch, shift = index, _row_batch(batch), 1
    else:
        if not batch and any(_dims_used(item) for item in (index if type(index) is tuple else (index,))):
            raise IndexError("too many indices for tensor of dimension 0")
        items, dest_batch = indexed_batch_size(index, batch)
        shift = None
    if type(value) is type(td) or isinstance(value, TensorCollection):
        source = value if type(value) is type(td) else unwrap(value)
        if source._batch_size != dest_batch:
            if not _broadcasts_to(source._batch_size, dest_batch):
                raise _destination_batch_error(dest_batch, batch, index, source._batch_size)
            # A source batch that matches the slot's last dims is repeated along the others.
            source = source.expand(dest_batch)
    elif isinstance(value, Mapping):
        from .tensordict import TensorDict

        source = TensorDict(value, batch_size=dest_batch, device=td._device)
    else:
        _broadcast_into(td, items, dest_batch, value)
        return
    plan = _WritePlan(items, batch, dest_batch, shift)
    _plan_collection(plan, td, source, ())
    _run(plan)


def _run(plan: _WritePlan) -> None:
    """Carry out a checked plan: new entries first, then the in-place copies."""
    index = plan.index
    if plan.others:
        for action, args in plan.others:
            action(*args)
    for existing, value in plan.copies:
        existing[index] = value


def _broadcast_into(td: Any, items: Any, dest_batch: torch.Size, value: Any) -> None:
    if not isinstance(value, _Tensor):
        if isinstance(value, (bool, int, float, complex)):
            pass
        elif type(value).__module__ == "numpy":
            value = torch.as_tensor(value)
        else:
            raise TypeError(
                f"td[index] = value needs a TensorDict, a mapping, a tensor or a number; got "
                f"{type(value).__name__}. To write non-tensor data at an index, write "
                "td[index] = {key: value}."
            )
    plan = _WritePlan(items, td._batch_size, dest_batch, None)
    _plan_broadcast(plan, td, value)
    _run(plan)


# --------------------------------------------------------------------------- the mixin


class IndexingMixin(TensorDictHost):
    """``td[index]`` and ``td[index] = value`` for batch indices (the core handles keys).

    >>> import torch
    >>> from torchdict import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, 4, 5)}, batch_size=[3, 4])
    >>> td[..., :2].batch_size, td[0]["a"].shape
    (torch.Size([3, 2]), torch.Size([4, 5]))
    >>> data = TensorDict({}, batch_size=[4])
    >>> data[1] = {"x": torch.ones(2)}  # a new key: zeros of the full batch, then row 1 written
    >>> data["x"]
    tensor([[0., 0.],
            [1., 1.],
            [0., 0.],
            [0., 0.]])
    """

    __slots__ = ()

    # The functions themselves, not wrappers: one call less on the hottest paths.
    _index = index_tensordict
    _set_at_index = set_at_index
