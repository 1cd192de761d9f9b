"""Padding along the batch dims: :func:`pad` (one TensorDict) and :func:`pad_sequence` (many, stacked).

Both rest on ``torch.nn.functional.pad`` with a constant: :func:`pad` applies one
padding to the batch dims of every leaf; :func:`pad_sequence` pads each entry of
every input to the largest size among the inputs along ``pad_dim`` and stacks the
results along a new first dim (what ``torch.nn.utils.rnn.pad_sequence(...,
batch_first=True)`` does for plain tensors). Non-tensor entries cannot hold a
number: their padded elements hold ``None``, reached through the same index grid
every other batch op uses (see :mod:`torchdict.nontensor`).

>>> import torch
>>> from torchdict import TensorDict
>>> td = TensorDict({"a": torch.ones(2, 3)}, batch_size=[2])
>>> pad(td, [1, 0], value=-1.0)["a"]
tensor([[-1., -1., -1.],
        [ 1.,  1.,  1.],
        [ 1.,  1.,  1.]])
>>> samples = [TensorDict(x=torch.ones(n)) for n in (2, 3)]
>>> padded = pad_sequence(samples, return_mask=True)
>>> padded["x"]
tensor([[1., 1., 0.],
        [1., 1., 1.]])
>>> padded["masks", "x"]
tensor([[ True,  True, False],
        [ True,  True,  True]])
"""
from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ._apply import rebuild, rewrap, tensor_leaves, unwrap
from ._base import TensorCollection
from ._errors import locked_error
from ._keys import NestedKey, key_to_tuple, unravel_key
from .nontensor import NonTensorData, NonTensorStack, _from_grid, combine_non_tensor
from ._unbatched import UnbatchedTensor

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

__all__ = ["pad", "pad_sequence"]

_Tensor = torch.Tensor
_NON_TENSOR = (NonTensorData, NonTensorStack)
_Pairs = List[Tuple[int, int]]  # (before, after) for the leading dims, first dim first


def _torch_widths(pairs: _Pairs, ndim: int) -> List[int]:
    """``pairs`` (first dim first) as ``F.pad`` wants them: last dim first, the untouched trailing dims zero."""
    widths = [0, 0] * (ndim - len(pairs))
    for before, after in reversed(pairs):
        widths += [before, after]
    return widths


def _pad_non_tensor(leaf: Any, pairs: _Pairs) -> Any:
    """A non-tensor leaf padded like a tensor of its batch shape: kept values, then ``None`` in the new slots."""
    if not any(before or after for before, after in pairs):
        return leaf
    values = leaf._flat_values()
    # One extra value, None, at index len(values): the padded slots of the index grid point at it.
    grid = torch.arange(len(values)).view(leaf.batch_size)
    grid = F.pad(grid, _torch_widths(pairs, grid.dim()), value=len(values))
    return _from_grid(grid, values + [None], leaf._flat_origins() + [None], leaf.device)


# --------------------------------------------------------------------------- pad


def _pad_pairs(batch_size: torch.Size, pad_size: Sequence[int]) -> _Pairs:
    try:
        widths = [operator.index(width) for width in pad_size]
    except TypeError:
        raise TypeError(f"pad_size must be a sequence of ints, got {pad_size!r}.") from None
    if len(widths) > 2 * len(batch_size):
        raise RuntimeError(
            "The length of pad_size must be <= 2 * the number of batch dimensions, "
            f"got {len(widths)} for batch size {list(batch_size)}."
        )
    if len(widths) % 2:
        raise RuntimeError(f"pad_size must have an even number of dimensions, got {len(widths)}.")
    pairs = list(zip(widths[::2], widths[1::2]))
    for dim, (before, after) in enumerate(pairs):
        # F.pad crops (negative widths) before it pads: the crops alone must fit in the dim.
        if batch_size[dim] + min(before, 0) + min(after, 0) < 0:
            raise RuntimeError(
                f"Pad ({before}, {after}) on batch dim {dim} (size {batch_size[dim]}) crops more elements "
                "than the dim holds."
            )
    return pairs


def _check_tree_unlocked(td: Any) -> None:
    if td._is_locked:
        raise locked_error()
    for leaf in td._tensordict.values():
        if isinstance(leaf, TensorCollection):
            _check_tree_unlocked(unwrap(leaf))


def _move_into(target: Any, source: Any) -> None:
    """Give ``target`` the leaves and batch sizes of ``source`` (same structure), keeping every sub-collection
    object of ``target`` (``inplace=True`` keeps identities, as upstream)."""
    storage = target._tensordict
    for key, leaf in storage.items():
        if isinstance(leaf, TensorCollection):
            _move_into(unwrap(leaf), unwrap(source._tensordict[key]))
        else:
            storage[key] = source._tensordict[key]  # replacing a value while iterating is allowed
    target._batch_size = source._batch_size
    target._batch_len = -1
    target._names = source._names


def pad(tensordict: Any, pad_size: Sequence[int], value: float = 0.0, inplace: bool = False,
        safe: bool = True) -> Any:
    """Pad every leaf along the batch dims with ``value`` (negative widths crop).

    ``pad_size`` is ``(dim0_before, dim0_after, dim1_before, dim1_after, ...)``, starting from
    the *first* batch dim (``torch.nn.functional.pad`` starts from the last); it may cover
    fewer dims than the batch has. Feature dims are untouched, sub-TensorDicts are padded along
    their parent's batch dims, and non-tensor entries hold ``None`` in the padded slots. The
    result keeps the dim names. ``inplace=True`` replaces the leaves of ``tensordict`` (and of
    its sub-TensorDicts, which stay the same objects) and returns it. The sizes are checked
    before anything is written, whatever ``safe`` says (the check is cheap: every leaf shares
    the batch dims).

    >>> td = TensorDict({"a": torch.zeros(3, 4, 1)}, batch_size=[3, 4])
    >>> pad(td, [0, 1, 0, 2]).batch_size
    torch.Size([4, 6])
    >>> pad(TensorDict({"a": torch.arange(4)}, [4]), [-1, 1])["a"]
    tensor([1, 2, 3, 0])
    """
    if not isinstance(tensordict, TensorCollection):
        raise TypeError(f"pad() expects a TensorDict or a tensorclass, got {type(tensordict).__name__}.")
    inner = unwrap(tensordict)
    old_batch = inner._batch_size
    pairs = _pad_pairs(old_batch, pad_size)
    if inplace:
        _check_tree_unlocked(inner)
    new_batch = torch.Size([size + before + after for size, (before, after) in zip(old_batch, pairs)]
                           + list(old_batch[len(pairs):]))
    # (an UnbatchedTensor has no batch dims to pad: kept, rebuild gives it the new batch size)
    padded_leaves = (leaf if isinstance(leaf, UnbatchedTensor) else F.pad(leaf, _torch_widths(pairs, leaf.dim()),
                                                                          value=value)
                     for leaf in tensor_leaves(inner))
    padded = rebuild(inner, padded_leaves, new_batch, non_tensor=lambda leaf, _: _pad_non_tensor(leaf, pairs))
    padded._names = inner._names  # padding keeps each dim where it is
    if inplace:
        _move_into(inner, padded)
        return tensordict
    return rewrap(tensordict, padded)


# --------------------------------------------------------------------------- pad_sequence


def _path(key: tuple) -> NestedKey:
    return key[0] if len(key) == 1 else key


class _PadSequence:
    """One call of :func:`pad_sequence`: its options, and the padded tensor entries seen so far (for the masks)."""

    def __init__(self, pad_dim: int, padding_value: Any, padding_side: str) -> None:
        self.pad_dim = pad_dim
        self.right = padding_side == "right"
        if isinstance(padding_value, Mapping):
            self.values = {key_to_tuple(key): value for key, value in padding_value.items()}
            self.default = 0.0
        else:
            self.values = {}
            self.default = padding_value
        self.padded: list = []  # (path, padded dim, each input's length along it, common length)

    def widths(self, ndim: int, dim: int, missing: int) -> List[int]:
        pairs = [(0, 0)] * dim + [(0, missing) if self.right else (missing, 0)]
        return _torch_widths(pairs, ndim)

    def stack_padded(self, leaves: list, dim: int, length: int, value: Any) -> _Tensor:
        """``leaves`` padded to ``length`` along ``dim`` and stacked along a new first dim."""
        return torch.stack([F.pad(leaf, self.widths(leaf.dim(), dim, length - leaf.shape[dim]), value=value)
                            for leaf in leaves])

    def tensor_entry(self, leaves: list, path: tuple) -> _Tensor:
        shapes = [leaf.shape for leaf in leaves]
        first = shapes[0]
        if not first:
            raise RuntimeError(f"Cannot pad scalars: the entry {_path(path)!r} has no dims.")
        dim = self.pad_dim + len(first) if self.pad_dim < 0 else self.pad_dim
        if not 0 <= dim < len(first):
            raise IndexError(f"pad_dim={self.pad_dim} is out of range for the entry {_path(path)!r} of shape "
                             f"{tuple(first)}.")
        for shape in shapes:
            if len(shape) != len(first) or shape[:dim] != first[:dim] or shape[dim + 1:] != first[dim + 1:]:
                raise RuntimeError(
                    f"pad_sequence failed for key {_path(path)!r}: the entries must have the same shape except "
                    f"along dim {dim}, got shapes {[tuple(item) for item in shapes]}."
                )
        lengths = [shape[dim] for shape in shapes]
        self.padded.append((path, dim, lengths, max(lengths)))
        return self.stack_padded(leaves, dim, max(lengths), self.values.get(path, self.default))

    def non_tensor_entry(self, leaves: list, path: tuple) -> Any:
        target = _max_batch([leaf.batch_size for leaf in leaves], path)
        padded = []
        for leaf in leaves:
            missing = [size - own for size, own in zip(target, leaf.batch_size)]
            padded.append(_pad_non_tensor(leaf, [(0, n) if self.right else (n, 0) for n in missing]))
        return combine_non_tensor(padded, torch.stack)

    def storage(self, inners: list, path: tuple) -> dict:
        """The stacked storage of ``inners`` (one level of the inputs, same keys)."""
        storages = [inner._tensordict for inner in inners]
        first = storages[0]
        for position, storage in enumerate(storages):
            if storage.keys() != first.keys():
                level = f" in the sub-tensordicts at {_path(path)!r}" if path else ""
                raise KeyError(
                    f"tensordict {position} has keys {sorted(storage)} but tensordict 0 has keys {sorted(first)}"
                    f"{level}; all tensordicts must have the same keys."
                )
        result = {}
        for key, leaf in first.items():
            leaves = [storage[key] for storage in storages]
            where = path + (key,)
            if isinstance(leaf, _Tensor):
                kind: Any = _Tensor
            elif isinstance(leaf, TensorCollection):
                kind = TensorCollection
            else:
                kind = _NON_TENSOR
            if not all(isinstance(item, kind) for item in leaves):
                found = ", ".join(f"tensordict {i}: {type(item).__name__}" for i, item in enumerate(leaves))
                raise TypeError(f"Cannot pad the entries at key {_path(where)!r}: they are of different kinds "
                                f"({found}).")
            if kind is _Tensor:
                result[key] = self.tensor_entry(leaves, where)
            elif kind is TensorCollection:
                result[key] = rewrap(leaf, self.collection([unwrap(item) for item in leaves], where))
            else:
                result[key] = self.non_tensor_entry(leaves, where)
        return result

    def collection(self, inners: list, path: tuple) -> Any:
        """The inputs' collections at ``path`` (the inputs themselves for ``()``), padded and stacked."""
        batch = _max_batch([inner._batch_size for inner in inners], path)
        n_padded = len(self.padded)
        storage = self.storage(inners, path)
        if len(self.padded) == n_padded:
            # No tensor leaf below says which dim is padded (with tensor leaves, any batch dim on which
            # the inputs differ is one the leaves differ on, so it was checked as their pad dim).
            self.check_leafless_batches(inners, path)
        first = inners[0]
        return first._new_unsafe(storage, torch.Size([len(inners), *batch]), first._device)

    def check_leafless_batches(self, inners: list, path: tuple) -> None:
        batches = [inner._batch_size for inner in inners]
        differing = {dim for batch in batches for dim, size in enumerate(batch) if size != batches[0][dim]}
        if not differing:
            return
        ndim = len(batches[0])
        dim = self.pad_dim + ndim if self.pad_dim < 0 else self.pad_dim
        where = f" at {_path(path)!r}" if path else ""
        if not 0 <= dim < ndim:
            raise IndexError(f"pad_dim={self.pad_dim} is out of range for the batch sizes{where} {batches}.")
        if differing != {dim}:
            raise RuntimeError(f"pad_sequence can only pad along dim {dim}, but the batch sizes{where} differ "
                               f"along dims {sorted(differing)}: {batches}.")

    def masks(self, result: Any, top_batches: list) -> Any:
        """One bool entry per padded tensor entry: True where the input had data.

        Its shape is the result's batch size, followed by the padded length when the entry was padded
        along a feature dim."""
        n_batch = len(top_batches[0])
        masks = result._new_unsafe({}, result._batch_size, result._device)
        for path, dim, lengths, length in self.padded:
            if dim < n_batch:
                shapes = top_batches
            else:
                shapes = [torch.Size([*batch, own]) for batch, own in zip(top_batches, lengths)]
                dim = n_batch
            ones = [torch.ones(shape, dtype=torch.bool, device=result.device) for shape in shapes]
            masks.set(path, self.stack_padded(ones, dim, length, False))
        return masks


def _max_batch(batches: list, path: tuple) -> torch.Size:
    """The elementwise largest of ``batches`` (which must have as many dims)."""
    if any(len(batch) != len(batches[0]) for batch in batches):
        where = f" at {_path(path)!r}" if path else ""
        raise RuntimeError(f"pad_sequence expects batch sizes with as many dims{where}, got "
                           f"{[list(batch) for batch in batches]}.")
    return torch.Size([max(sizes) for sizes in zip(*batches)])


def _masks_path(return_mask: Any) -> Optional[tuple]:
    if return_mask is False:
        return None
    if return_mask is True:
        return ("masks",)
    try:
        return key_to_tuple(return_mask)
    except KeyError:
        raise TypeError(f"return_mask must be a bool or a nested key, got {return_mask!r}.") from None


def _check_free(storage: dict, path: tuple, return_mask: Any) -> None:
    """The masks must not land on (or go through) an entry of the inputs."""
    for depth, key in enumerate(path):
        entry = storage.get(key)
        if entry is None:
            return
        if depth == len(path) - 1 or not isinstance(entry, TensorCollection):
            raise KeyError(f"return_mask={return_mask!r}: the tensordicts already hold an entry at "
                           f"{_path(path[:depth + 1])!r}; choose another key for the masks.")
        storage = unwrap(entry)._tensordict


def _check_padding_keys(storage: dict, keys: list) -> None:
    """Every key of a ``padding_value`` mapping names a leaf (tensor or non-tensor) of the inputs."""
    missing = []
    for key in keys:
        entry: Any = None
        level: Optional[dict] = storage
        for part in key:
            entry = level.get(part) if level is not None else None
            level = unwrap(entry)._tensordict if isinstance(entry, TensorCollection) else None
        if entry is None or level is not None:  # missing, or a sub-TensorDict
            missing.append(_path(key))
    if missing:
        raise KeyError(f"padding_value has keys {missing} that name no entry of the tensordicts.")


def _check_out(out: Any, result: Any, path: tuple = ()) -> None:
    """Refuse before writing anything what ``out.update(result, inplace=True)`` would fail on half-way."""
    storage = out._tensordict
    for key, value in result._tensordict.items():
        existing = storage.get(key)
        where = _path(path + (key,))
        if existing is None:
            if out._is_locked:
                raise locked_error()
        elif isinstance(value, TensorCollection) and isinstance(existing, TensorCollection):
            _check_out(unwrap(existing), unwrap(value), path + (key,))
        elif isinstance(value, _Tensor) and isinstance(existing, _Tensor):
            if existing.shape != value.shape:
                raise RuntimeError(f"out holds an entry of shape {tuple(existing.shape)} at {where!r}, the "
                                   f"padded entry has shape {tuple(value.shape)}.")
        elif isinstance(value, _NON_TENSOR) and isinstance(existing, _NON_TENSOR):
            if out._is_locked:
                raise locked_error()
        else:
            raise RuntimeError(f"out holds a {type(existing).__name__} at {where!r}, where the padded result "
                               f"holds a {type(value).__name__}.")


def pad_sequence(list_of_tensordicts: Sequence[Any], pad_dim: int = 0,
                 padding_value: "float | Mapping[NestedKey, float]" = 0.0, out: Any = None,
                 return_mask: "bool | NestedKey" = False, padding_side: str = "right") -> Any:
    """Pad every entry to the largest size among the inputs along ``pad_dim``, and stack along a new first dim.

    - ``pad_dim`` counts the dims of each entry (batch dims included); negative counts from each
      entry's last dim. Every batch dim on which the inputs differ must be a padded one: the result's
      batch is ``[len(list_of_tensordicts), *largest batch]``;
    - ``padding_value`` is a number, or a mapping from entry keys to numbers (other entries get 0);
      non-tensor entries hold ``None`` in padded batch slots;
    - ``padding_side="left"`` puts the padding before the data;
    - ``return_mask=True`` (or a key) adds a ``"masks"`` (or that key) sub-TensorDict with one bool
      entry per tensor entry, True where an input had data: of the result's batch shape, followed by
      the padded length when ``pad_dim`` is a feature dim of that entry;
    - ``out`` receives the result (its entries are written in place, missing ones added) and is returned.

    >>> tds = [TensorDict({"a": torch.ones(n, 2)}, batch_size=[n]) for n in (1, 3)]
    >>> padded = pad_sequence(tds, padding_value=-1.0)
    >>> padded.batch_size, padded["a"][0]
    (torch.Size([2, 3]), tensor([[ 1.,  1.],
            [-1., -1.],
            [-1., -1.]]))
    """
    if not len(list_of_tensordicts):
        raise RuntimeError("list_of_tensordicts cannot be empty")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    for position, item in enumerate(list_of_tensordicts):
        if not isinstance(item, TensorCollection):
            raise TypeError(f"pad_sequence expects TensorDicts or tensorclasses, got a {type(item).__name__} "
                            f"at position {position}.")
    try:
        pad_dim = operator.index(pad_dim)
    except TypeError:
        raise TypeError(f"pad_dim must be an int, got {pad_dim!r}.") from None
    first = list_of_tensordicts[0]
    inners = [unwrap(item) for item in list_of_tensordicts]
    masks_path = _masks_path(return_mask)
    if masks_path is not None:
        if unwrap(first) is not first:
            raise RuntimeError("Expected 'return_mask=False' when list_of_tensordicts contains tensorclasses: "
                               "convert them to TensorDicts first to get the masks.")
        _check_free(inners[0]._tensordict, masks_path, return_mask)
    run = _PadSequence(pad_dim, padding_value, padding_side)
    if run.values:
        _check_padding_keys(inners[0]._tensordict, list(run.values))
    result = run.collection(inners, ())
    if masks_path is not None and run.padded:
        result.set(unravel_key(masks_path), run.masks(result, [inner._batch_size for inner in inners]))
    if out is None:
        return rewrap(first, result)
    out_inner = unwrap(out)
    if out_inner._batch_size != result._batch_size:
        raise RuntimeError(f"the out tensordict has batch size {out_inner._batch_size}, expected "
                           f"{result._batch_size} for the padded result.")
    _check_out(out_inner, result)
    out_inner.update(result, inplace=True)
    return out


# --------------------------------------------------------------------------- the TensorDict members


class PaddingMixin(TensorDictHost):
    """``td.pad(...)`` (the function above as a method) and ``td.to_padded_tensor(...)``."""

    __slots__ = ()

    def pad(self, pad_size: Sequence[int], value: float = 0.0, inplace: bool = False, safe: bool = True) -> Any:
        """:func:`torchdict.pad` of this TensorDict (``pad_size`` from the first batch dim).

        >>> TensorDict(a=torch.zeros(3), batch_size=[3]).pad([1, 1]).batch_size
        torch.Size([5])
        """
        return pad(self, pad_size, value=value, inplace=inplace, safe=safe)

    def to_padded_tensor(self, padding: float = 0.0, mask_key: Any = None) -> Any:
        """The nested-tensor leaves as padded tensors (``torch.nested.to_padded_tensor(leaf, padding)``); the
        other leaves are kept. ``mask_key`` only applies to a ragged batch, which a TensorDict never has
        (``RuntimeError``, as upstream).

        >>> nested = torch.nested.nested_tensor([torch.zeros(2), torch.ones(3)], layout=torch.jagged)
        >>> TensorDict(a=nested, batch_size=[2]).to_padded_tensor(padding=-1)["a"]
        tensor([[ 0.,  0., -1.],
                [ 1.,  1.,  1.]])
        """
        if mask_key is not None:
            raise RuntimeError("mask_key should only be provided if the heterogenous dimension is part of the "
                               "batch-size.")
        leaves = tensor_leaves(self)
        padded = [torch.nested.to_padded_tensor(leaf, padding) if leaf.is_nested else leaf for leaf in leaves]
        return rebuild(self, iter(padded), self._batch_size)
