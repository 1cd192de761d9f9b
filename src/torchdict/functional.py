"""``torchdict.functional``: functions over collections of TensorDicts, as upstream's ``tensordict.functional``.

- ``pad`` / ``pad_sequence`` (padding the batch dims; from ``_padding``) and ``unpad_sequence`` (its inverse);
- ``collate``: a DataLoader ``collate_fn`` for samples that are (or hold) TensorDicts / tensorclasses;
- ``dense_stack_tds``: stack densely where the members allow it;
- ``group_by``: split the rows by the value of one entry;
- ``merge_tensordicts``: every key of several TensorDicts in one;
- ``make_tensordict``: a TensorDict from a dict or keyword arguments.

Imported on first use.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional, Sequence, Union

import torch

from ._base import is_tensor_collection
from ._keys import NestedKey, key_to_tuple, unravel_key
from ._padding import pad, pad_sequence
from .nontensor import NonTensorData, NonTensorStack
from .tensorclass import is_tensorclass

__all__ = ["collate", "dense_stack_tds", "group_by", "make_tensordict", "merge_tensordicts", "pad",
           "pad_sequence", "unpad_sequence"]


def _is_non_tensor(value: Any) -> bool:
    return isinstance(value, (NonTensorData, NonTensorStack))


def _inner(collection: Any) -> Any:
    return collection._tensordict if is_tensorclass(collection) else collection


# ---------------------------------------------------------------------------------------------- make / merge
def make_tensordict(input_dict: Optional[dict] = None, batch_size: Any = None, device: Any = None,
                    auto_batch_size: Optional[bool] = None, **kwargs: Any) -> Any:
    """A TensorDict from ``input_dict`` and/or keyword entries (``input_dict`` wins on a shared key), as
    ``TensorDict.from_dict``.

    >>> td = make_tensordict(a=torch.zeros(3, 4), b=torch.zeros(3), auto_batch_size=True)
    >>> td.batch_size
    torch.Size([3])
    """
    from .tensordict import TensorDict

    if input_dict is not None:
        kwargs.update(input_dict)
    return TensorDict.from_dict(kwargs, batch_size=batch_size, device=device, auto_batch_size=auto_batch_size)


def merge_tensordicts(*tensordicts: Any,
                      callback_exist: Union[Callable[..., Any], Dict[NestedKey, Callable[..., Any]], None] = None
                      ) -> Any:
    """One TensorDict holding every key of every input, with the first input's batch size; leaves are not copied.

    For a key several inputs hold, the first one's value is kept, unless ``callback_exist`` (a function, or a
    dict key -> function) combines the values of a leaf that *every* input holds. Non-tensor entries always
    take the first value.

    >>> from torchdict import TensorDict
    >>> td = merge_tensordicts(TensorDict(a=0, c=0), TensorDict(b=1, c=1), callback_exist=lambda *v: sum(v))
    >>> sorted(td.keys()), td["c"]
    (['a', 'b', 'c'], tensor(1))
    """
    if len(tensordicts) < 2:
        raise RuntimeError(f"at least 2 tensordicts must be provided, got {len(tensordicts)}")
    out = tensordicts[0].empty(recurse=True)
    done: set = set()
    for position, source in enumerate(tensordicts):
        others = tensordicts[position + 1:] + tensordicts[:position]
        for key in source.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf_nontensor_type):
            path = key_to_tuple(key)
            if path in done:
                continue
            value = source.get(key)
            if _is_non_tensor(value):
                if position and out.get(key, None) is None and _free_path(out, path):
                    try:
                        out.set(key, value)
                    except (RuntimeError, ValueError):
                        pass
                done.add(path)
                continue
            done.add(path)
            callback = callback_exist.get(unravel_key(key)) if isinstance(callback_exist, Mapping) else \
                callback_exist
            if callback is not None and position == 0:
                values = [value] + [other.get(key, None) for other in others]
                if all(item is not None for item in values):
                    out.set(key, callback(*values))
                    continue
            out.set(key, value)
    return out


def _free_path(out: Any, path: tuple) -> bool:
    """Whether ``out`` has no leaf on the way to ``path`` (so writing there replaces nothing)."""
    node = out
    for part in path[:-1]:
        node = node.get(part, None)
        if node is None:
            return True
        if not is_tensor_collection(type(node)) or _is_non_tensor(node):
            return False
    return True


def _is_leaf_nontensor_type(cls: type) -> bool:
    return not is_tensor_collection(cls) or bool(getattr(cls, "_is_non_tensor", False))


# ---------------------------------------------------------------------------------------------- stacking
def dense_stack_tds(td_list: Any, dim: Optional[int] = None) -> Any:
    """Stack TensorDicts (a list with ``dim``, or a lazy stack's members along its stack dim) densely where
    their keys and shapes allow it, lazily otherwise; a TensorDict is returned as it is.

    >>> from torchdict import TensorDict, lazy_stack
    >>> type(dense_stack_tds(lazy_stack([TensorDict(a=torch.zeros(2)), TensorDict(a=torch.ones(2))]))).__name__
    'TensorDict'
    """
    from .lazy import LazyStackedTensorDict, maybe_dense_stack
    from .tensordict import TensorDict

    if isinstance(td_list, LazyStackedTensorDict):
        dim = td_list.stack_dim
        td_list = td_list.tensordicts
    elif isinstance(td_list, TensorDict):
        return td_list
    elif dim is None:
        raise ValueError("If a list of tensordicts is provided, stack_dim must not be None")
    return maybe_dense_stack(list(td_list), dim)


def collate(batch: Any, *, pad_keys: Optional[Mapping] = None, nested_keys: Optional[Sequence] = None,
            mask_key: Optional[NestedKey] = None) -> Any:
    """A ``DataLoader`` ``collate_fn``: samples that are TensorDicts / tensorclasses are stacked (densely when
    they agree, lazily otherwise); tensors stacked; mappings, tuples and namedtuples collated entry by entry;
    anything else by torch's ``default_collate``. Anything but a non-empty list is returned as it is.

    ``pad_keys`` (key -> padding value) pads those entries to the longest sample (as ``pad_sequence``),
    ``mask_key`` stores their masks, ``nested_keys`` stacks those entries as jagged nested tensors.

    >>> from torchdict import TensorDict
    >>> td, label = collate([(TensorDict(x=torch.zeros(3)), 0), (TensorDict(x=torch.ones(3)), 1)])
    >>> td.batch_size, label
    (torch.Size([2]), tensor([0, 1]))
    """
    if not isinstance(batch, list) or not batch:
        return batch
    first = batch[0]
    if is_tensor_collection(type(first)):
        from .lazy import maybe_dense_stack

        if pad_keys is None and nested_keys is None and mask_key is None:
            return maybe_dense_stack(batch)
        return _collate_keys(batch, pad_keys, nested_keys, mask_key)
    if isinstance(first, torch.Tensor):
        return torch.stack(batch)
    options: Dict[str, Any] = {"pad_keys": pad_keys, "nested_keys": nested_keys, "mask_key": mask_key}
    if isinstance(first, Mapping):
        return {key: collate([sample[key] for sample in batch], **options) for key in first}
    if isinstance(first, tuple):
        items = (collate(list(entries), **options) for entries in zip(*batch))
        return type(first)(*items) if hasattr(first, "_fields") else tuple(items)
    from torch.utils.data import default_collate

    return default_collate(batch)


def _collate_keys(batch: list, pad_keys: Optional[Mapping], nested_keys: Optional[Sequence],
                  mask_key: Optional[NestedKey]) -> Any:
    from .lazy import LazyStackedTensorDict, maybe_dense_stack

    pads = {unravel_key(key): value for key, value in (pad_keys or {}).items()}
    nested = [unravel_key(key) for key in nested_keys or ()]
    if mask_key is not None and not pads:
        raise ValueError("collate got a mask_key but no pad_keys to mask.")
    both = [key for key in nested if key in pads]
    if both:
        raise ValueError(f"collate got the keys {both} in both pad_keys and nested_keys.")
    if pads and batch[0].batch_dims:
        raise ValueError(
            "collate(pad_keys=...) pads the first dim of each entry, which is a batch dim of these samples "
            f"(batch_size={batch[0].batch_size}). Give the samples an empty batch size, or call pad_sequence.")
    if mask_key is not None:
        mask_key = unravel_key(mask_key)
    for sample in batch:
        keys = sample.keys(include_nested=True)
        for key in (*pads, *nested):
            if key not in keys:
                raise KeyError(f"collate got the key {key!r}, which a sample lacks.")
        if mask_key is not None and mask_key in keys:
            raise ValueError(f"collate got mask_key={mask_key!r}, which is an entry of a sample.")
    out = maybe_dense_stack([sample.exclude(*pads, *nested) for sample in batch])
    if nested and isinstance(_inner(out), LazyStackedTensorDict):
        raise ValueError(
            f"collate got nested_keys={nested}, but the other entries of the samples differ in shape, so they "
            "stack lazily and the nested tensors could not be read back. Name the entries that vary in length "
            "in pad_keys or nested_keys.")
    if pads:
        padded = pad_sequence([_inner(sample).select(*pads) for sample in batch], padding_value=pads,
                              return_mask=False if mask_key is None else mask_key)
        for key in pads:
            out.set(key, padded.get(key))
        if mask_key is not None:
            out.set(mask_key, padded.get(mask_key))
    for key in nested:
        values = [sample.get(key) for sample in batch]
        out.set(key, torch.nested.as_nested_tensor(values, layout=torch.jagged))
    return out


# ---------------------------------------------------------------------------------------------- grouping
def group_by(tensordict: Any, key: NestedKey) -> tuple:
    """``(values, groups)``: the sorted unique values of entry ``key`` along the first batch dim, and the rows
    holding each (in their order), as one gather split into views.

    >>> from torchdict import TensorDict
    >>> td = TensorDict(uid=torch.tensor([2, 0, 2, 1, 0]), reward=torch.arange(5.0), batch_size=[5])
    >>> values, groups = group_by(td, "uid")
    >>> values, [group["reward"].tolist() for group in groups]
    (tensor([0, 1, 2]), [[1.0, 4.0], [3.0], [0.0, 2.0]])
    """
    if not tensordict.batch_dims:
        raise ValueError("group_by groups the rows along the first batch dimension of the tensordict, which has none.")
    entry = _inner(tensordict).get(key, None)
    if entry is None:
        raise KeyError(f"group_by: the tensordict has no entry {key!r}.")
    if _is_non_tensor(entry):
        def hashable(row: Any) -> Any:
            return tuple(map(hashable, row)) if isinstance(row, list) else row

        rows = [hashable(row) for row in entry.tolist()]
        try:
            values = sorted(set(rows))
        except TypeError as error:
            raise TypeError(f"group_by: the values of the non-tensor entry {key!r} must be hashable and "
                            "sortable.") from error
        position_of = {value: position for position, value in enumerate(values)}
        inverse = torch.tensor([position_of[row] for row in rows], dtype=torch.long)
        counts = torch.bincount(inverse, minlength=len(values))
    elif isinstance(entry, torch.Tensor):
        values, inverse, counts = torch.unique(entry, sorted=True, return_inverse=True, return_counts=True,
                                               dim=0 if entry.ndim > 1 else None)
    else:
        raise TypeError(f"group_by needs a tensor or non-tensor entry, but {key!r} holds a {type(entry).__name__}.")
    order = torch.argsort(inverse, stable=True)
    return values, tuple(tensordict[order].split(counts.tolist(), dim=0))


# ---------------------------------------------------------------------------------------------- unpadding
def _keep_padded_rows_stacked(padded: Any, samples: list) -> None:
    """As upstream: a non-tensor entry whose padded row is a ``NonTensorStack`` (the row got pad slots)
    stays a stack in its sample, even where the slice holds only the sample's one value (which torchdict's
    stack would otherwise give back as the sample's ``NonTensorData``)."""
    keys = [key for key in padded.keys(True, True, is_leaf=_is_leaf_nontensor_type)
            if type(padded.get(key)) is NonTensorStack]
    for row, sample in enumerate(samples):
        for key in keys:
            value = sample.get(key)
            if type(value) is NonTensorData and value.batch_size and type(padded[row].get(key)) is NonTensorStack:
                sample.set(key, value.maybe_to_stack())


def unpad_sequence(padded: Any, mask: Any = None, *, pad_dim: int = 0) -> Any:
    """The samples of a ``pad_sequence(..., return_mask=True)`` result, as a lazy stack along dim 0: each row
    keeps, in every entry, the positions its mask marks along ``pad_dim`` (one contiguous run per row).

    ``mask``: a TensorDict of masks laid out as ``pad_sequence`` makes them, one boolean tensor
    ``[len(padded), max_len]`` for every entry, or None to read (and drop) ``padded["masks"]``.

    >>> from torchdict import TensorDict, pad_sequence
    >>> samples = [TensorDict(a=torch.arange(n)) for n in (3, 5)]
    >>> unpadded = unpad_sequence(pad_sequence(samples, return_mask=True))
    >>> [member["a"].tolist() for member in unpadded.tensordicts]
    [[0, 1, 2], [0, 1, 2, 3, 4]]
    """
    from .lazy import LazyStackedTensorDict

    if not padded.batch_dims:
        raise ValueError("unpad_sequence needs the samples along the first batch dimension of padded, which has none.")
    if mask is None:
        if "masks" not in padded.keys():
            raise ValueError("unpad_sequence needs a mask: pass mask=..., or pad with "
                             "pad_sequence(..., return_mask=True).")
        mask = padded.get("masks")
        padded = padded.exclude("masks")
    elif isinstance(mask, torch.Tensor) and (mask.ndim != 2 or mask.shape[0] != padded.batch_size[0]):
        raise ValueError(f"A tensor mask must have shape [len(padded), max_len], got {tuple(mask.shape)}.")
    sample_dims = padded.batch_dims - 1

    def runs(key: Any, position: int, max_len: int) -> tuple:
        """Per row: where its marked run starts, and how long it is."""
        if isinstance(mask, torch.Tensor):
            if mask.shape[-1] != max_len:
                raise ValueError(f"A tensor mask must have shape [len(padded), max_len] = [{mask.shape[0]}, {max_len}], "
                                 f"got {tuple(mask.shape)}.")
            marks = mask
        else:
            marks = mask.get(key, None)
            if marks is None:
                raise KeyError(f"The mask has no entry for key {key!r} of padded.")
            marks = marks.movedim(min(position, sample_dims) + 1, -1)
            if marks.ndim > 2:
                marks = marks.flatten(1, -2).any(1)
        if marks.shape[-1] == 0:
            return [0] * marks.shape[0], [0] * marks.shape[0]
        marks = marks.to(torch.uint8)
        starts, ends, lengths = torch.stack((marks.argmax(-1), marks.shape[-1] - 1 - marks.flip(-1).argmax(-1),
                                             marks.sum(-1))).tolist()
        if any(length and end - start + 1 != length for start, end, length in zip(starts, ends, lengths)):
            which = "" if key is None else f" of key {key!r}"
            raise ValueError(f"The mask{which} marks positions that are not contiguous in some row: unpad_sequence "
                             "keeps one contiguous run per row.")
        return starts, lengths

    positions = {}
    for key in padded.keys(True, True, is_leaf=_is_leaf_nontensor_type):
        leaf = padded.get(key)
        if _is_non_tensor(leaf):
            continue
        positions[key] = pad_dim if pad_dim >= 0 else leaf.ndim - 1 + pad_dim
    if sample_dims > 0 and all(position < sample_dims for position in positions.values()):
        # The padded dim is a batch dim of the samples: slicing the batch unpads every entry.
        batch_position = next(iter(positions.values()), pad_dim % sample_dims)
        starts, lengths = runs(next(iter(positions), None), batch_position, padded.batch_size[batch_position + 1])
        samples = [padded[row][(slice(None),) * batch_position + (slice(start, start + length),)]
                   for row, (start, length) in enumerate(zip(starts, lengths))]
        _keep_padded_rows_stacked(padded, samples)
    else:
        bounds = {key: runs(key, position, padded.get(key).shape[position + 1]) for key, position in positions.items()}
        samples = []
        for row in range(padded.batch_size[0]):
            sample = padded[row]
            cut = {}
            for key, (starts, lengths) in bounds.items():
                leaf = sample.get(key)
                position = positions[key]
                if starts[row] != 0 or lengths[row] != leaf.shape[position]:
                    cut[key] = leaf.narrow(position, starts[row], lengths[row])
            if cut:
                sample = sample.exclude(*cut)
                for key, leaf in cut.items():
                    sample.set(key, leaf)
            samples.append(sample)
    return LazyStackedTensorDict(*samples, stack_dim=0)
