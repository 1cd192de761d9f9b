"""Shape operations on the batch dimensions (view, reshape, permute, unbind, split, ...).

Every op works out the new batch size once, from the batch size alone (or a
zero-stride *probe* tensor of the batch shape, which also raises torch's own
error for a bad argument), then maps a tensor op that touches the leading
batch dims only over the leaves with :func:`_apply.map_batch`. Feature dims
are never touched, and leaves are torch views wherever torch gives views.
Dims are made non-negative against the *batch* dims before reaching a leaf,
whose ``-1`` would otherwise mean its last feature dim. Sizes are passed to
torch as separate ints (``leaf.view(*sizes)``): torch parses those faster
than one tuple.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from . import _options
from ._apply import map_batch, rewrap, unwrap
from ._base import TensorCollection
from ._context import (
    undo_flip,
    undo_movedim,
    undo_permute,
    undo_reshape,
    undo_roll,
    undo_transpose,
    undo_view,
    write_back,
)
from ._errors import batch_mismatch_error
from ._indexing import batch_probe
from ._locking import keep_lock, keep_lock_all
from .nontensor import NonTensorData
from ._unbatched import UnbatchedTensor as _Unbatched, with_batch_size

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_Tensor = torch.Tensor
_Size = torch.Size
_MISSING: Any = object()


# --------------------------------------------------------------------------- argument parsing


def parse_shape(args: tuple) -> tuple:
    """``f(3, 4)``, ``f((3, 4))``, ``f([3, 4])`` and ``f(torch.Size(...))`` all give ``(3, 4)``."""
    if len(args) == 1 and not isinstance(args[0], int):
        return tuple(args[0])
    return tuple(args)


def incompatible_dim_error(dim: int, batch_size: torch.Size) -> IndexError:
    return IndexError(f"Incompatible dim {dim} for tensordict with shape {batch_size}.")


def batch_dim(dim: int, batch_size: torch.Size) -> int:
    """``dim`` as a non-negative batch dim, or the upstream IndexError."""
    n_batch = len(batch_size)
    if not -n_batch <= dim < n_batch:
        raise incompatible_dim_error(dim, batch_size)
    return dim + n_batch if dim < 0 else dim


def infer_shape(shape: tuple, numel: int) -> torch.Size:
    """Resolve one ``-1`` in ``shape`` for a batch of ``numel`` elements (errors as upstream)."""
    inferred = [position for position, size in enumerate(shape) if size == -1]
    if len(inferred) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = 1
    for size in shape:
        if size != -1:
            known *= size
    if inferred:
        if known == 0 or numel % known:
            raise RuntimeError(f"invalid shape {list(shape)} for a batch of {numel} elements")
        shape = shape[:inferred[0]] + (numel // known,) + shape[inferred[0] + 1:]
    elif known != numel or any(size < 0 for size in shape):
        raise RuntimeError(f"invalid shape {list(shape)} for a batch of {numel} elements")
    return _Size(shape)


def _resizer(method: str, new_batch: torch.Size, n_batch: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``leaf.<method>(*new_batch, *feature dims)`` (view, reshape or expand)."""
    if new_batch:
        if method == "view":
            return lambda leaf: leaf.view(*new_batch, *leaf.shape[n_batch:])
        if method == "reshape":
            return lambda leaf: leaf.reshape(*new_batch, *leaf.shape[n_batch:])
        return lambda leaf: leaf.expand(*new_batch, *leaf.shape[n_batch:])
    # No batch dims left: the feature shape alone, as one tuple (torch needs at least one argument).
    return lambda leaf: getattr(leaf, method)(leaf.shape[n_batch:])


def _with_names(result: Any, names: Optional[list]) -> Any:
    result._names = names if names is not None and any(name is not None for name in names) else None
    return result


# --------------------------------------------------------------------------- one result


def view(td: Any, args: tuple, size: Any, batch_size: Any) -> Any:
    if len(args) == 1 and isinstance(args[0], torch.dtype):
        return view_dtype(td, args[0])
    if args:
        shape = parse_shape(args)
    else:
        shape = tuple(size if size is not None else (batch_size if batch_size is not None else ()))
    return _resize(td, shape, "view")


def _resize(td: Any, shape: tuple, method: str) -> Any:
    """``view`` / ``reshape`` of the batch dims to ``shape`` (``-1`` inferred); ``td`` itself when unchanged."""
    batch = td._batch_size
    if shape == tuple(batch):
        return td
    new_batch = infer_shape(shape, batch.numel())
    if new_batch == batch:
        return td
    return map_batch(td, _resizer(method, new_batch, len(batch)), new_batch)


def view_dtype(td: Any, dtype: torch.dtype) -> Any:
    """``leaf.view(dtype)`` for every leaf; a leaf whose batch dims would change raises E-BATCH."""
    batch = td._batch_size
    n_batch = len(batch)

    def reinterpret(leaf: torch.Tensor) -> torch.Tensor:
        result = leaf.view(dtype)
        if result.shape[:n_batch] != batch:
            raise batch_mismatch_error(batch, result.shape, "<view(dtype)>")
        return result

    # (an UnbatchedTensor's payload is reinterpreted too, as upstream's: the op acts on values)
    return map_batch(td, reinterpret, batch, unbatched=lambda leaf: leaf.view(dtype))


def reshape(td: Any, args: tuple) -> Any:
    return _resize(td, parse_shape(args), "reshape")


def unsqueeze(td: Any, dim: int) -> Any:
    batch = td._batch_size
    n_batch = len(batch)
    if not -n_batch - 1 <= dim <= n_batch:
        raise RuntimeError(
            "unsqueezing is allowed for dims comprised between `-td.batch_dims - 1` and `td.batch_dims` "
            f"only. Got dim={dim} with a batch size of {batch}."
        )
    if dim < 0:
        dim += n_batch + 1
    new_batch = batch[:dim] + (1,) + batch[dim:]
    result = map_batch(td, lambda leaf: leaf.unsqueeze(dim), new_batch)
    if td._names is not None:
        _with_names(result, td._names[:dim] + [None] + td._names[dim:])
    return result


def squeeze(td: Any, dim: Optional[int]) -> Any:
    batch = td._batch_size
    if dim is None:
        dims = tuple(position for position, size in enumerate(batch) if size == 1)
        if not dims:
            return td
    else:
        dim = batch_dim(dim, batch)
        if batch[dim] != 1:
            return td
        dims = (dim,)
    new_batch = _Size(size for position, size in enumerate(batch) if position not in dims)
    result = map_batch(td, lambda leaf: leaf.squeeze(dims), new_batch)
    if td._names is not None:
        _with_names(result, [name for position, name in enumerate(td._names) if position not in dims])
    return result


def permute(td: Any, args: tuple) -> Any:
    dims = parse_shape(args)
    batch = td._batch_size
    n_batch = len(batch)
    if len(dims) != n_batch or not all(-n_batch <= dim < n_batch for dim in dims):
        raise ValueError("Received an permutation order incompatible with the tensordict shape.")
    dims = tuple(dim + n_batch if dim < 0 else dim for dim in dims)
    if sorted(dims) != list(range(n_batch)):
        raise ValueError(
            f"Cannot compute the permutation, got dims={list(dims)} but expected a permutation of "
            f"{list(range(n_batch))}."
        )
    if dims == tuple(range(n_batch)):
        return td
    new_batch = _Size(batch[dim] for dim in dims)
    result = map_batch(td, _permuter(dims), new_batch)
    if td._names is not None:
        _with_names(result, [td._names[dim] for dim in dims])
    return result


def _permuter(dims: tuple) -> Callable[[torch.Tensor], torch.Tensor]:
    """``leaf.permute(*dims, *feature dims)``, the full order built once per leaf rank."""
    orders: dict = {}
    n_batch = len(dims)

    def permuted(leaf: torch.Tensor) -> torch.Tensor:
        rank = leaf.dim()
        order = orders.get(rank)
        if order is None:
            order = orders[rank] = dims + tuple(range(n_batch, rank))
        return leaf.permute(*order)  # varargs parse faster than one tuple argument

    return permuted


def transpose(td: Any, dim0: int, dim1: int) -> Any:
    batch = td._batch_size
    n_batch = len(batch)
    if not (-n_batch <= dim0 < n_batch and -n_batch <= dim1 < n_batch):
        raise ValueError("dim0 and dim1 must be within the range of the number of dimensions.")
    dim0, dim1 = dim0 % n_batch, dim1 % n_batch
    if dim0 == dim1:
        return td
    sizes = list(batch)
    sizes[dim0], sizes[dim1] = sizes[dim1], sizes[dim0]
    result = map_batch(td, lambda leaf: leaf.transpose(dim0, dim1), _Size(sizes))
    if td._names is not None:
        names = list(td._names)
        names[dim0], names[dim1] = names[dim1], names[dim0]
        _with_names(result, names)
    return result


def movedim(td: Any, source: Any, destination: Any) -> Any:
    batch = td._batch_size
    if not batch:  # torch treats a 0-dim tensor as having one dim here; a batch of none has no dim to move
        first = source if isinstance(source, int) else next(iter(source), 0)
        raise IndexError(f"Dimension out of range (expected to be in range of [-0, -1], but got {first})")
    new_batch = batch_probe(batch).movedim(source, destination).shape  # torch's checks and errors
    n_batch = len(batch)
    sources = [source] if isinstance(source, int) else list(source)
    destinations = [destination] if isinstance(destination, int) else list(destination)
    sources = [dim % n_batch for dim in sources]
    destinations = [dim % n_batch for dim in destinations]
    # The permutation torch applies, so names (and leaves) follow it.
    rest = iter(dim for dim in range(n_batch) if dim not in sources)
    order = [0] * n_batch
    placed = dict(zip(destinations, sources))
    for position in range(n_batch):
        order[position] = placed[position] if position in placed else next(rest)
    if order == list(range(n_batch)):
        return td
    result = map_batch(td, _permuter(tuple(order)), new_batch)
    if td._names is not None:
        _with_names(result, [td._names[dim] for dim in order])
    return result


def expand(td: Any, args: tuple) -> Any:
    shape = parse_shape(args)
    batch = td._batch_size
    n_batch = len(batch)
    if len(shape) < n_batch:
        raise RuntimeError(
            f"the number of sizes provided ({len(shape)}) must be greater or equal to the number of "
            f"dimensions in the TensorDict ({n_batch})"
        )
    offset = len(shape) - n_batch
    sizes = list(shape)
    for position, old in enumerate(batch):
        new = shape[offset + position]
        if new == -1:
            sizes[offset + position] = old
        elif old != 1 and new != old:
            raise RuntimeError(
                "Incompatible expanded shape: The expanded shape length at non-singleton dimension should be "
                f"same as the original length. target_shape = {shape}, existing_shape = {batch}"
            )
    if any(size < 0 for size in sizes):
        raise RuntimeError(f"invalid expanded shape {shape} for a batch of size {batch}")
    new_batch = _Size(sizes)
    result = map_batch(td, _resizer("expand", new_batch, n_batch), new_batch)
    if td._names is not None:
        _with_names(result, [None] * offset + list(td._names))
    return result


def flatten(td: Any, start_dim: int, end_dim: int) -> Any:
    batch = td._batch_size
    n_batch = len(batch)
    if not n_batch:
        # As upstream: an end dim counted from the back needs the whole (empty) batch, from 0.
        if end_dim == -1 and start_dim != 0:
            raise ValueError(f"Incompatible end_dim {end_dim} for tensordict with shape {batch}.")
        batch_probe(batch).flatten(start_dim, end_dim)  # torch's range checks and errors
        return map_batch(td, lambda leaf: leaf.unsqueeze(0), _Size((1,)))
    new_batch = batch_probe(batch).flatten(start_dim, end_dim).shape  # torch's checks and errors
    start, end = start_dim % n_batch, end_dim % n_batch
    if start == end:
        return td
    result = map_batch(td, lambda leaf: leaf.flatten(start, end), new_batch)
    if td._names is not None:
        _with_names(result, td._names[:start] + [None] + td._names[end + 1:])
    return result


def unflatten(td: Any, dim: int, sizes: Sequence[int]) -> Any:
    batch = td._batch_size
    dim = batch_dim(dim, batch)
    sizes = tuple(sizes)
    new_batch = batch_probe(batch).unflatten(dim, sizes).shape  # torch's checks and errors
    result = map_batch(td, lambda leaf: leaf.unflatten(dim, sizes), new_batch)
    if td._names is not None:
        _with_names(result, td._names[:dim] + [None] * len(sizes) + td._names[dim + 1:])
    return result


def repeat(td: Any, args: tuple) -> Any:
    repeats = parse_shape(args)
    batch = td._batch_size
    if len(repeats) != len(batch):
        raise ValueError(
            "The number of repeat elements must match the number of dimensions of the tensordict. "
            f"Got {len(repeats)} but ndim={len(batch)}."
        )
    new_batch = _Size(size * times for size, times in zip(batch, repeats))
    n_batch = len(batch)
    return map_batch(td, lambda leaf: leaf.repeat(*repeats, *([1] * (leaf.dim() - n_batch))), new_batch)


def tile(td: Any, args: tuple) -> Any:
    """``torch.tile`` on the batch dims: fewer repeats than batch dims repeat the last ones,
    more add leading batch dims."""
    repeats = parse_shape(args)
    n_batch = len(td._batch_size)
    for _ in range(len(repeats) - n_batch):
        td = unsqueeze(td, 0)
    return repeat(td, (1,) * (n_batch - len(repeats)) + tuple(repeats))


def repeat_interleave(td: Any, repeats: Any, dim: Optional[int], output_size: Optional[int]) -> Any:
    """``leaf.repeat_interleave`` along a batch dim (``dim=None``: along the flattened batch)."""
    if dim is None:
        td, dim = reshape(td, (-1,)), 0
    batch = td._batch_size
    dim = batch_dim(dim, batch)
    new_batch = batch_probe(batch).repeat_interleave(repeats, dim, output_size=output_size).shape  # torch's checks
    return _keep_names(td, map_batch(
        td, lambda leaf: leaf.repeat_interleave(repeats, dim, output_size=output_size), new_batch))


def flip(td: Any, args: tuple) -> Any:
    batch = td._batch_size
    dims = tuple(batch_dim(dim, batch) for dim in parse_shape(args))
    return _keep_names(td, map_batch(td, lambda leaf: leaf.flip(dims), batch))


def roll(td: Any, shifts: Any, dims: Any) -> Any:
    batch = td._batch_size
    n_batch = len(batch)
    if dims is None:
        # Like torch: roll the flattened batch, then restore its shape.
        def rolled(leaf: torch.Tensor) -> torch.Tensor:
            flat = leaf.reshape((-1,) + leaf.shape[n_batch:])
            return flat.roll(shifts, 0).view(leaf.shape)

        return _keep_names(td, map_batch(td, rolled, batch))
    if isinstance(dims, int):
        dims = batch_dim(dims, batch)
    else:
        dims = tuple(batch_dim(dim, batch) for dim in dims)
    return _keep_names(td, map_batch(td, lambda leaf: leaf.roll(shifts, dims), batch))


def narrow(td: Any, dim: int, start: int, length: int) -> Any:
    batch = td._batch_size
    dim = batch_dim(dim, batch)
    new_batch = batch_probe(batch).narrow(dim, start, length).shape  # torch's checks and errors
    return _keep_names(td, map_batch(td, lambda leaf: leaf.narrow(dim, start, length), new_batch))


def gather(td: Any, dim: int, index: torch.Tensor) -> Any:
    """``leaf.gather(dim, index)`` with ``index`` (of the batch's ndim) expanded over each leaf's feature dims."""
    batch = td._batch_size
    n_batch = len(batch)
    dim = batch_dim(dim, batch)
    new_batch = batch_probe(batch).gather(dim, index).shape  # torch's checks and errors
    index_shape = index.shape

    def gathered(leaf: torch.Tensor) -> torch.Tensor:
        extra = leaf.shape[n_batch:]
        if not extra:
            return leaf.gather(dim, index)
        expanded = index.view(index_shape + (1,) * len(extra)).expand(index_shape + extra)
        return leaf.gather(dim, expanded)

    return map_batch(td, gathered, new_batch)


def _keep_names(td: Any, result: Any) -> Any:
    result._names = td._names
    return result


# --------------------------------------------------------------------------- several results


def _split_storage(storage: dict, split: Callable[[torch.Tensor], Sequence[torch.Tensor]], n_batch: int,
                   batch_sizes: list) -> list:
    """One storage dict per piece: ``split(leaf)`` gives the pieces of each tensor leaf."""
    results: list = [{} for _ in batch_sizes]
    for key, leaf in storage.items():
        if type(leaf) is _Tensor or (isinstance(leaf, _Tensor) and not isinstance(leaf, _Unbatched)):
            for result, piece in zip(results, split(leaf)):
                result[key] = piece
        elif isinstance(leaf, _Unbatched):  # no batch dims to split: the same payload in every piece
            extra = leaf.batch_size[n_batch:]
            for result, size in zip(results, batch_sizes):
                result[key] = with_batch_size(leaf, size + extra)
        elif isinstance(leaf, TensorCollection) and type(getattr(unwrap(leaf), "_tensordict", None)) is not dict:
            # A nested lazy stack: each piece is what the split gives an index grid of the batch.
            from ._nested_foreign import regroup_foreign

            lead = leaf.batch_size[:n_batch]
            pieces = split(torch.arange(lead.numel()).reshape(lead))
            for result, piece, size in zip(results, pieces, batch_sizes):
                result[key] = regroup_foreign(leaf, piece, n_batch, size)
        elif isinstance(leaf, TensorCollection):
            inner = unwrap(leaf)
            extra = inner._batch_size[n_batch:]
            inner_sizes = [size + extra for size in batch_sizes]
            pieces = _split_storage(inner._tensordict, split, n_batch, batch_sizes)
            for result, piece, size in zip(results, pieces, inner_sizes):
                result[key] = rewrap(leaf, inner._new_unsafe(piece, size, inner._device))
        elif isinstance(leaf, NonTensorData):
            extra = leaf.batch_size[n_batch:]
            for result, size in zip(results, batch_sizes):
                result[key] = leaf._with_batch_size(size + extra)
        else:
            grids = split(leaf._code_grid())
            for result, grid in zip(results, grids):
                result[key] = leaf._batch_op(lambda _, grid=grid: grid)
    return results


def _split_into(td: Any, split: Callable, batch_sizes: list, names: Optional[list]) -> tuple:
    storages = _split_storage(td._tensordict, split, len(td._batch_size), batch_sizes)
    device = td._device
    new = td._new_unsafe
    return tuple(new(storage, size, device, names) for storage, size in zip(storages, batch_sizes))


def unbind(td: Any, dim: int) -> tuple:
    batch = td._batch_size
    dim = batch_dim(dim, batch)
    new_batch = batch[:dim] + batch[dim + 1:]
    names = None if td._names is None else td._names[:dim] + td._names[dim + 1:]
    if names is not None and not any(names):
        names = None
    return _split_into(td, lambda leaf: leaf.unbind(dim), [new_batch] * batch[dim], names)


def _pieces(td: Any, dim: int, make: Callable[[torch.Tensor], Sequence[torch.Tensor]]) -> tuple:
    """Split-like ops: the batch sizes come from ``make`` applied to the probe."""
    sizes = [piece.shape for piece in make(batch_probe(td._batch_size))]
    return _split_into(td, make, sizes, td._names)


def split(td: Any, split_size: Any, dim: int) -> tuple:
    dim = batch_dim(dim, td._batch_size)
    return _pieces(td, dim, lambda leaf: leaf.split(split_size, dim))


def chunk(td: Any, chunks: int, dim: int) -> tuple:
    dim = batch_dim(dim, td._batch_size)
    return _pieces(td, dim, lambda leaf: leaf.chunk(chunks, dim))


def tensor_split(td: Any, indices_or_sections: Any, dim: int) -> tuple:
    dim = batch_dim(dim, td._batch_size)
    return _pieces(td, dim, lambda leaf: leaf.tensor_split(indices_or_sections, dim))


# --------------------------------------------------------------------------- the mixin


class ShapeMixin(TensorDictHost):
    """Shape ops on the batch dims. Those with an inverse are declared with ``write_back``:
    used in a ``with`` block, what changed in the result is written back to the parent on exit."""

    __slots__ = ()

    @write_back(undo_view)
    def view(self, *shape: Any, size: Any = None, batch_size: Any = None) -> Any:
        """The same leaves viewed with a new batch shape (``-1`` inferred); ``view(dtype)`` per leaf.

        A view to the current shape returns ``self``.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(3, 4, 5)}, batch_size=[3, 4]).view(-1)["a"].shape
        torch.Size([12, 5])
        """
        if _options.LAZY_LEGACY and size is None and batch_size is None and not _is_dtype_view(shape):
            return _legacy_view(self, "view", *shape)
        return keep_lock(self, view(self, shape, size, batch_size))

    @write_back(undo_reshape)
    def reshape(self, *shape: Any, **kwargs: Any) -> Any:
        """Like :meth:`view` but copies the leaves that can't be viewed.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3, 4]).reshape(2, 6).batch_size
        torch.Size([2, 6])
        """
        if not shape:
            # ``td.reshape(*batch)`` with an empty ``batch`` means the shape ``()``, as upstream reads it.
            shape = (kwargs.get("shape", kwargs.get("batch_size", ())),)
        return keep_lock(self, reshape(self, shape))

    @write_back(undo_reshape)
    def unsqueeze(self, dim: int) -> Any:
        """Insert a batch dim of size 1 at ``dim`` (negative dims count from the last batch dim).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(3, 4, 5)}, batch_size=[3, 4]).unsqueeze(-1)["a"].shape
        torch.Size([3, 4, 1, 5])
        """
        if _options.LAZY_LEGACY:
            return _legacy_view(self, "unsqueeze", dim)
        return keep_lock(self, unsqueeze(self, dim))

    @write_back(undo_reshape)
    def squeeze(self, dim: Optional[int] = None) -> Any:
        """Drop batch dims of size 1 (all of them, or ``dim``); feature dims are kept.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(3, 1, 1)}, batch_size=[3, 1]).squeeze()["a"].shape
        torch.Size([3, 1])
        """
        return keep_lock(self, squeeze(self, dim))

    @write_back(undo_permute)
    def permute(self, *dims: Any) -> Any:
        """Reorder the batch dims.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(3, 4, 5)}, batch_size=[3, 4]).permute(1, 0)["a"].shape
        torch.Size([4, 3, 5])
        """
        if _options.LAZY_LEGACY:
            return _legacy_view(self, "permute", *dims)
        return keep_lock(self, permute(self, dims))

    @write_back(undo_transpose)
    def transpose(self, dim0: int, dim1: int) -> Any:
        """Swap two batch dims.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(3, 4, 5)}, batch_size=[3, 4]).transpose(0, 1).batch_size
        torch.Size([4, 3])
        """
        if _options.LAZY_LEGACY:
            return _legacy_view(self, "transpose", dim0, dim1)
        return keep_lock(self, transpose(self, dim0, dim1))

    def swapaxes(self, axis0: int, axis1: int) -> Any:
        """``transpose(axis0, axis1)`` (numpy's spelling)."""
        return self.transpose(axis0, axis1)

    def swapdims(self, axis0: int, axis1: int) -> Any:
        """``transpose(axis0, axis1)`` (upstream names its arguments as ``swapaxes`` does)."""
        return self.transpose(axis0, axis1)

    @write_back(undo_movedim)
    def movedim(self, source: Any, destination: Any) -> Any:
        """Move batch dims ``source`` to positions ``destination`` (as ``torch.movedim``)."""
        return keep_lock(self, movedim(self, source, destination))

    moveaxis = movedim

    def expand(self, *shape: Any) -> Any:
        """Broadcast to a larger batch (``-1`` keeps a dim); new dims have stride 0.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(4, 5)}, batch_size=[4]).expand(2, 4)["a"].shape
        torch.Size([2, 4, 5])
        """
        return keep_lock(self, expand(self, shape))

    def expand_as(self, other: Any) -> Any:
        """``expand`` to ``other``'s batch size (or shape for a tensor)."""
        return keep_lock(self, expand(self, (other.shape,)))

    @write_back(undo_reshape)
    def flatten(self, start_dim: int = 0, end_dim: int = -1, *, inplace: bool = False) -> Any:
        """Merge batch dims ``start_dim..end_dim`` into one (all of them by default).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(3, 4, 5)}, batch_size=[3, 4]).flatten()["a"].shape
        torch.Size([12, 5])
        """
        result = flatten(self, 0 if start_dim is None else start_dim, -1 if end_dim is None else end_dim)
        return _in_place(self, result) if inplace else keep_lock(self, result)

    @write_back(undo_reshape)
    def unflatten(self, dim: int, unflattened_size: Sequence[int], *, inplace: bool = False) -> Any:
        """Split batch dim ``dim`` into ``unflattened_size`` (one ``-1`` allowed).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(12, 5)}, batch_size=[12]).unflatten(0, (3, -1)).batch_size
        torch.Size([3, 4])
        """
        result = unflatten(self, dim, unflattened_size)
        return _in_place(self, result) if inplace else keep_lock(self, result)

    def unbind(self, dim: int = 0) -> tuple:
        """A tuple of views, one per index along batch dim ``dim``.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> [td.batch_size for td in TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]).unbind(1)]
        [torch.Size([2]), torch.Size([2]), torch.Size([2])]
        """
        return unbind(self, dim)

    def split(self, split_size: Any, dim: int = 0) -> tuple:
        """Pieces of ``split_size`` (an int or a list of sizes) along batch dim ``dim``, as ``torch.split``.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> [td.batch_size for td in TensorDict({"a": torch.zeros(5)}, batch_size=[5]).split(2)]
        [torch.Size([2]), torch.Size([2]), torch.Size([1])]
        """
        if isinstance(split_size, int) and split_size <= 0:
            raise ValueError(f"TensorDict.split: split_size must be positive, got {split_size}.")
        return keep_lock_all(self, split(self, split_size, dim))

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        """``chunks`` pieces (or fewer) along batch dim ``dim``, as ``torch.chunk``."""
        if not isinstance(chunks, int) or chunks <= 0:
            raise ValueError(f"chunks must be a strictly positive integer, got {chunks}.")
        return keep_lock_all(self, chunk(self, chunks, dim))

    def tensor_split(self, indices_or_sections: Any, dim: int = 0) -> tuple:
        """As ``torch.tensor_split`` along batch dim ``dim``."""
        return tensor_split(self, indices_or_sections, dim)

    def repeat(self, *repeats: Any, inplace: bool = False) -> Any:
        """Tile the batch dims ``repeats`` times each (feature dims are not repeated); ``inplace=True`` makes
        this TensorDict hold the result (its identity and nested TensorDicts kept) and returns it."""
        return _inplace_or_new(self, repeat(self, repeats), inplace)

    def tile(self, *dims_args: Any, dims: Any = None) -> Any:
        """As ``torch.tile`` on the batch dims (``td.tile(2)`` or ``td.tile((2, 2))``).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.zeros(2, 3, 5)}, batch_size=[2, 3]).tile(2)["a"].shape
        torch.Size([2, 6, 5])
        """
        return tile(self, _dims_argument(dims_args, dims, "tile"))

    def repeat_interleave(self, repeats: Any, dim: Optional[int] = None, *, output_size: Optional[int] = None,
                          inplace: bool = False) -> Any:
        """Repeat each element along batch dim ``dim`` (the flattened batch when None), as torch.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict({"a": torch.arange(3)}, batch_size=[3]).repeat_interleave(2)["a"]
        tensor([0, 0, 1, 1, 2, 2])
        """
        return _inplace_or_new(self, repeat_interleave(self, repeats, dim, output_size), inplace)

    @write_back(undo_flip)
    def flip(self, *dims_args: Any, dims: Any = None) -> Any:
        """Reverse the order along the given batch dims (``td.flip(0, 1)``, ``td.flip((0, 1))`` or ``dims=``)."""
        return keep_lock(self, flip(self, _dims_argument(dims_args, dims, "flip")))

    @write_back(undo_roll)
    def roll(self, shifts: Any, dims: Any = None, *, inplace: bool = False) -> Any:
        """Roll along batch dims (the flattened batch when ``dims`` is None); ``inplace`` as :meth:`repeat`."""
        result = roll(self, shifts, dims)
        return _inplace_or_new(self, result, inplace) if inplace else keep_lock(self, result)

    def fliplr(self) -> Any:
        """``flip(1)``, as ``torch.fliplr`` (needs 2 batch dims or more); the data is copied."""
        if self.batch_dims < 2:
            raise RuntimeError("fliplr requires at least 2 batch dimensions")
        return self.flip(1)

    def flipud(self) -> Any:
        """``flip(0)``, as ``torch.flipud`` (needs a batch dim); the data is copied."""
        if self.batch_dims < 1:
            raise RuntimeError("flipud requires at least 1 batch dimension")
        return self.flip(0)

    def rot90(self, k: int = 1, dims: Sequence[int] = (0, 1)) -> Any:
        """Rotate by 90 degrees ``k`` times in the plane of batch dims ``dims`` (as ``torch.rot90``: from the
        first towards the second); the feature dims are not rotated, the names follow their dims.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.arange(6).view(2, 3), batch_size=[2, 3]).rot90()["a"]
        tensor([[2, 5],
                [1, 4],
                [0, 3]])
        """
        if self.batch_dims < 2:
            raise RuntimeError("rot90 requires at least 2 batch dimensions")
        return keep_lock(self, _rotated(self, k, tuple(dims)))

    def narrow(self, dim: int, start: int, length: int) -> Any:
        """A view of ``length`` elements from ``start`` along batch dim ``dim``."""
        return keep_lock(self, narrow(self, dim, start, length))

    def gather(self, dim: int, index: torch.Tensor, out: Any = None, *, inplace: bool = False) -> Any:
        """``torch.gather`` along batch dim ``dim``; ``index`` has the batch's ndim.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict({"a": torch.arange(6).view(2, 3)}, batch_size=[2, 3])
        >>> td.gather(1, torch.tensor([[2], [0]]))["a"]
        tensor([[2],
                [3]])
        """
        if out is not None and inplace:
            raise ValueError("`out` and `inplace=True` are mutually exclusive in gather.")
        result = gather(self, dim, index)
        if out is not None:
            out.update_(result)
            return out
        return _inplace_or_new(self, result, inplace)


def _rotated(td: Any, k: int, dims: tuple) -> Any:
    """``torch.rot90`` of the batch dims (checked on the index grid first, with torch's own errors)."""
    n_batch = td.batch_dims
    new_batch = _Size(torch.rot90(batch_probe(td._batch_size), k, dims).shape)  # torch's checks and errors
    first, second = (dim % n_batch for dim in dims)
    names = None
    if td._names is not None and (k % 4) in (1, 3):
        names = list(td._names)
        names[first], names[second] = names[second], names[first]
    elif td._names is not None:
        names = list(td._names)
    result = map_batch(td, lambda leaf: torch.rot90(leaf, k, (first, second)), new_batch)
    if names is not None:
        result._names = names
    return result


def _dims_argument(positional: tuple, dims: Any, name: str) -> tuple:
    """``flip`` / ``tile``'s dims given as ``op(0, 1)``, ``op((0, 1))`` or ``op(dims=...)`` (upstream's name)."""
    if dims is not None:
        if positional:
            raise TypeError(f"{name}() got dims both as positional arguments and as a keyword.")
        return (dims,)
    return positional


def _inplace_or_new(td: Any, result: Any, inplace: bool) -> Any:
    if not inplace:
        return result
    from ._inplace_results import take_over

    return take_over(td, result)


def _legacy_view(td: Any, name: str, *args: Any) -> Any:
    """``set_lazy_legacy(True)``: a lazy view that reads from and writes to ``td``."""
    from ._legacy_lazy import lazy_view

    return lazy_view(td, name, *args)


def _is_dtype_view(shape: tuple) -> bool:
    return len(shape) == 1 and isinstance(shape[0], torch.dtype)


def _in_place(td: Any, result: Any) -> Any:
    """Make ``td`` hold ``result``'s entries and batch size (the ``inplace=True`` forms)."""
    if result is td:
        return td
    td._check_unlocked()
    td._tensordict = result._tensordict
    td._batch_size = result._batch_size
    td._batch_len = -1
    td._names = result._names
    return td
