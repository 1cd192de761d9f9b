"""Batch-shape operations of a lazy stack that keep it lazy, as upstream tensordict 0.15.3 does.

A lazy stack never copies its members to change its batch shape: the members are
rearranged instead (restacked along another dim, each transformed by the matching
member op, or regrouped into nested lazy stacks). So these work on ragged members
and exclusive keys alike.

- ``view`` / ``reshape`` / ``flatten`` / ``unflatten``: when the new shape only merges a
  run of adjacent dims, or splits one dim, the members are *regrouped*: merging dims
  ``i..j`` unbinds the stack along them and stacks every piece along ``i``; splitting
  dim ``i`` chunks it and stacks the chunks. Other shapes: ``view`` raises upstream's
  ``RuntimeError`` ("Cannot call `view` on a lazy stacked tensordict. Call `reshape`
  instead."), ``reshape`` reshapes the dense stack.
- ``permute`` / ``transpose`` / ``movedim`` (and their aliases), ``squeeze`` /
  ``unsqueeze``, ``repeat``, ``repeat_interleave``, ``split`` / ``chunk`` /
  ``tensor_split`` and ``atleast_*d``: the members' own op, restacked along the
  dim where the stack dim ends up (the members themselves along the stack dim).
- ``expand``: the members expanded, stacked densely when they hold the same keys
  and shapes (``maybe_dense_stack``), else lazily (``broadcast_to`` is the dense
  stack's, as upstream).

Arguments are checked by the dense op on a leafless TensorDict of the stack's
batch size (the *probe*), so errors are the dense TensorDict's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

import torch

from .._shape import parse_shape

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object

_Size = torch.Size
_NO: Any = object()  # "not given" for ``device`` (None means no device)


def merged_run(new: Sequence[int], old: Sequence[int]) -> Optional[Tuple[int, int]]:
    """``(i, j)`` when ``new`` is ``old`` with its dims ``i..j`` merged into dim ``i`` of ``new``, else None.

    This is the test upstream regroups with: the first position where the shapes differ, counted
    from the front, must be the first one counted from the back. (When one shape is a prefix of the
    other, the front count stops at the last shared position, as upstream's.)
    """
    if not new or not old or _Size(new).numel() != _Size(old).numel():
        return None
    pairs = list(zip(new, old))
    front = next((k for k, (a, b) in enumerate(pairs) if a != b), len(pairs) - 1)
    back_pairs = list(zip(reversed(new), reversed(old)))
    back = next((k for k, (a, b) in enumerate(back_pairs) if a != b), len(back_pairs) - 1)
    if front != len(new) - back - 1:
        return None
    return front, len(old) - back - 1


class LazyShapeMixin(LazyHost):
    """Shape ops of a lazy stack; the class using it provides ``tensordicts``, ``stack_dim``,
    ``batch_size``, ``contiguous``, ``unbind`` and ``_restack(members, stack_dim)``."""

    __slots__ = ()

    # ------------------------------------------------------------------ helpers
    def _probe(self) -> Any:
        """A leafless dense TensorDict of this batch size: the dense ops check arguments on it.

        In a ragged stack (members of different batch sizes: ``-1`` in the batch size) those dims stand in
        with size 2, so that dim checks pass and they are never squeezed; ops whose result sizes depend on
        them refuse a ragged stack first (:meth:`_refuse_ragged`).
        """
        from ..tensordict import TensorDict

        batch = self.batch_size
        if -1 in batch:
            batch = torch.Size([2 if size == -1 else size for size in batch])
        return TensorDict({}, batch_size=batch)

    def _flat_ragged(self, shape: Sequence[int], op: str) -> Any:
        """A ragged stack (stacked along dim 0) made one-dim: a lazy stack of every element, member after member."""
        rows = [row for td in self.tensordicts for row in td.reshape(-1).unbind(0)]
        if self.stack_dim != 0 or len(shape) != 1 or shape[0] not in (-1, len(rows)):
            self._refuse_ragged(op)
        return self._restack(rows, 0)

    def _refuse_ragged(self, op: str) -> None:
        if -1 in self.batch_size:
            raise RuntimeError(f"{op}() needs the sizes of every batch dim, but the members of this lazy stack have "
                               f"different batch sizes (batch size {list(self.batch_size)}): apply it to each "
                               "member (unbind the stack dim) instead.")

    def _keep_lock(self, result: Any) -> Any:
        if self.is_locked and not result.is_locked:
            result.lock_()
        return result

    # ------------------------------------------------------------------ view / reshape
    def _regroup(self, shape: torch.Size) -> Any:
        """The members rearranged to batch ``shape``, or None when ``shape`` does more than merge a run of
        adjacent dims or split one dim."""
        batch = self.batch_size
        merged = merged_run(shape, batch)
        if merged is not None:
            start, end = merged
            pieces: List[Any] = [self]
            for _ in range(start, end + 1):
                pieces = [piece for td in pieces for piece in td.unbind(start)]
            return self._keep_lock(self._restack(pieces, start))
        split = merged_run(batch, shape)
        if split is None:
            return None
        start, end = split
        result: Any = self
        for dim in range(start, end):
            result = self._restack(list(result.chunk(shape[dim], dim)), dim)
        # A shape that drops size-1 dims at ``start``: unbind them, as upstream.
        removed = len(batch) - len(shape)
        if removed > 0 and all(size == 1 for size in batch[start:start + removed]):
            for _ in range(removed):
                (result,) = result.unbind(start)
        return self._keep_lock(result)

    def view(self, *shape: Any, size: Any = None, batch_size: Any = None) -> Any:
        """The stack with batch ``shape`` (``-1`` inferred), regrouping the members; ``view(dtype)`` views
        every member's leaves. A shape that is not a merge of adjacent dims or a split of one dim raises
        ``RuntimeError`` (use ``reshape``).

        >>> import torch
        >>> from torchdict import TensorDict, lazy_stack
        >>> td = lazy_stack([TensorDict(a=torch.zeros(3), batch_size=[3]) for _ in range(2)])
        >>> flat = td.view(-1)
        >>> type(flat).__name__, flat.batch_size
        ('LazyStackedTensorDict', torch.Size([6]))
        """
        if len(shape) == 1 and isinstance(shape[0], torch.dtype):
            return self._restack([td.view(shape[0]) for td in self.tensordicts], self.stack_dim)
        self._refuse_ragged("view")
        wanted = parse_shape(shape) if shape or size is None else tuple(size)
        new = self._probe().reshape(wanted).batch_size  # -1 inferred, the dense errors
        if new == self.batch_size:
            return self
        result = self._regroup(new)
        if result is None:
            raise RuntimeError("Cannot call `view` on a lazy stacked tensordict. Call `reshape` instead.")
        return result

    def reshape(self, *shape: Any, **kwargs: Any) -> Any:
        """The stack with batch ``shape``: the members regrouped when ``shape`` merges adjacent dims or splits
        one, else the dense stack reshaped (ragged members raise then)."""
        if not shape:
            shape = (kwargs.get("shape", kwargs.get("batch_size", ())),)
        if -1 in self.batch_size:
            return self._flat_ragged(parse_shape(shape), "reshape")
        new = self._probe().reshape(parse_shape(shape)).batch_size
        if new == self.batch_size:
            return self
        result = self._regroup(new)
        if result is None:
            result = self.contiguous().reshape(new)
        return result

    def flatten(self, start_dim: Optional[int] = 0, end_dim: Optional[int] = -1, *, inplace: bool = False) -> Any:
        """Merge batch dims ``start_dim..end_dim`` (regrouping the members)."""
        if inplace:
            raise NotImplementedError("flatten(inplace=True) is not supported on a LazyStackedTensorDict: call "
                                      "to_tensordict() first.")
        if -1 in self.batch_size:
            start, end = (0 if start_dim is None else start_dim), (-1 if end_dim is None else end_dim)
            if start % self.batch_dims == 0 and end % self.batch_dims == self.batch_dims - 1:
                return self._flat_ragged((-1,), "flatten")
            self._refuse_ragged("flatten")
        new = self._probe().flatten(0 if start_dim is None else start_dim, -1 if end_dim is None else end_dim)
        return self.reshape(new.batch_size)

    def unflatten(self, dim: int, unflattened_size: Sequence[int], *, inplace: bool = False) -> Any:
        """Split batch dim ``dim`` into ``unflattened_size`` (regrouping the members)."""
        if inplace:
            raise NotImplementedError("unflatten(inplace=True) is not supported on a LazyStackedTensorDict: call "
                                      "to_tensordict() first.")
        self._refuse_ragged("unflatten")
        return self.reshape(self._probe().unflatten(dim, unflattened_size).batch_size)

    # ------------------------------------------------------------------ permutations
    def permute(self, *dims: Any) -> Any:
        """Reorder the batch dims: the members permuted, restacked where the stack dim lands."""
        order = list(parse_shape(dims))
        self._probe().permute(order)  # the dense checks and errors
        n_batch = len(self.batch_size)
        order = [dim % n_batch for dim in order]
        return self._permuted(order)

    def _permuted(self, order: List[int]) -> Any:
        stack_dim = self.stack_dim
        if order == sorted(order):
            return self
        member_order = [dim - (dim > stack_dim) for dim in order if dim != stack_dim]
        members = [td.permute(member_order) for td in self.tensordicts]
        return self._restack(members, order.index(stack_dim))

    def transpose(self, dim0: int, dim1: int) -> Any:
        """Swap two batch dims (members transposed or moved, restacked)."""
        self._probe().transpose(dim0, dim1)
        n_batch = len(self.batch_size)
        order = list(range(n_batch))
        order[dim0 % n_batch], order[dim1 % n_batch] = order[dim1 % n_batch], order[dim0 % n_batch]
        return self._permuted(order)

    def swapaxes(self, axis0: int, axis1: int) -> Any:
        """``transpose(axis0, axis1)``."""
        return self.transpose(axis0, axis1)

    def swapdims(self, axis0: int, axis1: int) -> Any:
        """``transpose(axis0, axis1)`` (upstream's parameter names)."""
        return self.transpose(axis0, axis1)

    def movedim(self, source: Any, destination: Any) -> Any:
        """Move batch dims as ``torch.movedim`` (members permuted, restacked)."""
        self._probe().movedim(source, destination)  # the dense checks and errors
        return self._permuted(_movedim_order(len(self.batch_size), source, destination))

    def moveaxis(self, source: Any, destination: Any) -> Any:
        """``movedim(source, destination)``."""
        return self.movedim(source, destination)

    # ------------------------------------------------------------------ size-1 dims
    def squeeze(self, dim: Optional[int] = None) -> Any:
        """Drop batch dims of size 1 (all, or ``dim`` if its size is 1): along the stack dim, the single
        member itself; along others, the members squeezed."""
        if dim is None:
            result = self
            for position in range(len(self.batch_size) - 1, -1, -1):
                if self.batch_size[position] == 1:
                    result = result.squeeze(position)
            return result
        self._probe().squeeze(dim)
        dim %= len(self.batch_size)
        if self.batch_size[dim] != 1:
            return self
        stack_dim = self.stack_dim
        if dim == stack_dim:
            return self.tensordicts[0]
        members = [td.squeeze(dim - (dim > stack_dim)) for td in self.tensordicts]
        return self._restack(members, stack_dim - (dim < stack_dim))

    def unsqueeze(self, dim: int) -> Any:
        """Insert a batch dim of size 1 (the members unsqueezed, restacked)."""
        self._probe().unsqueeze(dim)
        dim %= len(self.batch_size) + 1
        stack_dim = self.stack_dim
        if dim > stack_dim:
            return self._restack([td.unsqueeze(dim - 1) for td in self.tensordicts], stack_dim)
        return self._restack([td.unsqueeze(dim) for td in self.tensordicts], stack_dim + 1)

    def atleast_1d(self) -> Any:
        return self._at_least(1)

    def atleast_2d(self) -> Any:
        return self._at_least(2)

    def atleast_3d(self) -> Any:
        return self._at_least(3)

    def _at_least(self, n_dims: int) -> Any:
        """Leading size-1 dims up to ``n_dims`` batch dims (as upstream and the dense TensorDict do for
        every ``atleast_*d``, unlike ``torch.atleast_3d`` of a tensor)."""
        result = self
        while len(result.batch_size) < n_dims:
            result = result.unsqueeze(0)
        return result

    # ------------------------------------------------------------------ expand / repeat
    def expand(self, *shape: Any) -> Any:
        """Broadcast to a larger batch: each member expanded (a size-1 stack dim repeats its member), then
        stacked densely when the members hold the same keys and shapes, else lazily."""
        from ..lazy import maybe_dense_stack

        if -1 in self.batch_size:
            return self._expand_ragged(parse_shape(shape))
        new = self._probe().expand(*shape).batch_size
        n_new, n_old = len(new), len(self.batch_size)
        stack_dim = n_new - n_old + self.stack_dim
        count = new[stack_dim]
        members = self.tensordicts
        if count != len(members):  # a stack dim of size 1 expanded: its member, repeated
            members = [members[0].copy() for _ in range(count)]
        member_shape = [size for position, size in enumerate(new) if position != stack_dim]
        return maybe_dense_stack([td.expand(*member_shape) for td in members], stack_dim)

    def _expand_ragged(self, shape: Sequence[int]) -> Any:
        """``expand`` of a ragged stack: new leading dims only, the ragged dims given as -1 (each member keeps its
        own size there), as upstream."""
        old = self.batch_size
        lead = len(shape) - len(old)
        aligned = list(shape[lead:])
        if lead < 0 or any(size == -1 and want != -1 for size, want in zip(old, aligned)):
            self._refuse_ragged("expand")
        stack_dim = self.stack_dim
        if aligned[stack_dim] not in (-1, old[stack_dim]):
            self._refuse_ragged("expand")
        del aligned[stack_dim]
        members = [td.expand(*shape[:lead], *aligned) for td in self.tensordicts]
        return self._restack(members, stack_dim + lead)

    def broadcast_to(self, shape: Sequence[int]) -> Any:
        """The dense stack broadcast to ``shape`` (as upstream; ``expand`` keeps the members)."""
        return self.contiguous().broadcast_to(shape)

    def expand_as(self, other: Any) -> Any:
        """``expand(other.shape)``; a TensorDict ``other`` expands each leaf as its leaf."""
        from .._base import TensorCollection

        if isinstance(other, TensorCollection):
            return self.apply(lambda x, y: x.expand_as(y), other, batch_size=other.batch_size)
        return self.expand(*other.shape)

    def repeat(self, *repeats: Any, inplace: bool = False) -> Any:
        """Tile the batch dims: each member repeated along its dims, the member list repeated along the
        stack dim. ``inplace=True`` is refused (``NotImplementedError``, as upstream) after the checks."""
        self._refuse_ragged("repeat")
        counts = list(parse_shape(repeats))
        self._probe().repeat(*counts)
        _refuse_inplace("repeat", inplace)
        if len(counts) != len(self.batch_size):
            return self.contiguous().repeat(*counts)  # new leading dims: the dense op
        along_stack = counts.pop(self.stack_dim)
        members = [td.repeat(*counts) if counts else td.clone(False) for td in self.tensordicts]
        return self._restack([td for _ in range(along_stack) for td in members], self.stack_dim)

    def repeat_interleave(self, repeats: Any, dim: Optional[int] = None, *,
                          output_size: Optional[int] = None, inplace: bool = False) -> Any:
        """Repeat each element along ``dim``: along the stack dim the members, else each member.
        ``inplace=True`` is refused (``NotImplementedError``, as upstream)."""
        _refuse_inplace("repeat_interleave", inplace)
        if dim is None:
            return self.contiguous().repeat_interleave(repeats, dim, output_size=output_size)
        self._probe().repeat_interleave(repeats, dim, output_size=output_size)
        dim %= len(self.batch_size)
        stack_dim = self.stack_dim
        members = self.tensordicts
        if dim != stack_dim:
            return self._restack([td.repeat_interleave(repeats, dim - (dim > stack_dim), output_size=output_size)
                                  for td in members], stack_dim)
        if isinstance(repeats, torch.Tensor) and repeats.numel() != 1:
            counts = repeats.tolist()
        else:
            counts = [int(repeats)] * len(members)
        return self._restack([td for td, count in zip(members, counts) for _ in range(count)], stack_dim)

    # ------------------------------------------------------------------ pieces
    def split(self, split_size: Any, dim: int = 0) -> tuple:
        """Pieces along ``dim``, each a lazy stack: runs of members along the stack dim, the members' own
        pieces along other dims."""
        pieces = self._probe().split(split_size, dim)
        dim %= len(self.batch_size)
        sizes = [piece.batch_size[dim] for piece in pieces]
        return self._split_pieces(sizes, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        """``chunks`` pieces (or fewer) along ``dim``, as ``torch.chunk``; each a lazy stack."""
        pieces = self._probe().chunk(chunks, dim)
        dim %= len(self.batch_size)
        return self._split_pieces([piece.batch_size[dim] for piece in pieces], dim)

    def tensor_split(self, indices_or_sections: Any, dim: int = 0) -> tuple:
        """As ``torch.tensor_split`` along ``dim``; each piece a lazy stack."""
        pieces = self._probe().tensor_split(indices_or_sections, dim)
        dim %= len(self.batch_size)
        return self._split_pieces([piece.batch_size[dim] for piece in pieces], dim)

    def _no_member(self, dim: int) -> Any:
        """A piece with no member along the stack dim: an empty dense TensorDict of that batch size (a lazy
        stack needs a member; upstream gives a member-less lazy stack)."""
        from ..tensordict import TensorDict

        batch = list(self.batch_size)
        batch[dim] = 0
        return TensorDict({}, batch_size=batch, device=self.device)

    def _split_pieces(self, sizes: List[int], dim: int) -> tuple:
        stack_dim = self.stack_dim
        members = self.tensordicts
        if dim == stack_dim:
            starts = [sum(sizes[:position]) for position in range(len(sizes))]
            return tuple(self._restack(members[start:start + size], stack_dim) if size else self._no_member(dim)
                         for start, size in zip(starts, sizes))
        member_pieces = [td.split(sizes, dim - (dim > stack_dim)) for td in members]
        return tuple(self._restack([pieces[position] for pieces in member_pieces], stack_dim)
                     for position in range(len(sizes)))


    # ------------------------------------------------------------------ new collections of another batch
    def _new_filled(self, method: str, size: Any, args: tuple, options: dict, empty_lazy: bool) -> Any:
        """The dense stack's ``new_<kind>(*args, ...)`` (``size`` is the batch size asked for), on the stack's
        device unless one is given.

        With ``empty_lazy`` and a ``size`` that reaches the stack dim, as upstream: a lazy stack (along the
        same dim, of ``size[stack_dim]`` members) of leafless copies of the first member's structure.
        """
        options = {name: value for name, value in options.items() if value is not _NO}
        if empty_lazy:
            shape = list(parse_shape(size))
            if len(shape) > self.stack_dim:
                count = shape.pop(self.stack_dim)
                member = self.tensordicts[0].empty(recurse=True).new_empty(shape, empty_lazy=True)
                result = self._restack([member.copy() for _ in range(count)], self.stack_dim)
                result._stack_name = self._stack_name
                return result
        options.setdefault("device", self.device)
        return getattr(self.contiguous(), method)(*args, empty_lazy=empty_lazy, **options)

    def new_zeros(self, *size: Any, dtype: Optional[torch.dtype] = None, device: Any = _NO,
                  requires_grad: bool = False, layout: torch.layout = torch.strided,
                  pin_memory: Optional[bool] = None, empty_lazy: bool = False) -> Any:
        """A TensorDict of batch ``size`` with the dense stack's structure, zeros everywhere."""
        return self._new_filled("new_zeros", size, size, dict(dtype=dtype, device=device, requires_grad=requires_grad,
                                layout=layout, pin_memory=pin_memory), empty_lazy)

    def new_ones(self, *size: Any, dtype: Optional[torch.dtype] = None, device: Any = _NO,
                 requires_grad: bool = False, layout: torch.layout = torch.strided,
                 pin_memory: Optional[bool] = None, empty_lazy: bool = False) -> Any:
        """A TensorDict of batch ``size`` with the dense stack's structure, ones everywhere."""
        return self._new_filled("new_ones", size, size, dict(dtype=dtype, device=device, requires_grad=requires_grad,
                                layout=layout, pin_memory=pin_memory), empty_lazy)

    def new_empty(self, *size: Any, dtype: Optional[torch.dtype] = None, device: Any = _NO,
                  requires_grad: bool = False, layout: torch.layout = torch.strided,
                  pin_memory: Optional[bool] = None, empty_lazy: bool = False) -> Any:
        """A TensorDict of batch ``size`` with the dense stack's structure, uninitialised."""
        return self._new_filled("new_empty", size, size, dict(dtype=dtype, device=device, requires_grad=requires_grad,
                                layout=layout, pin_memory=pin_memory), empty_lazy)

    def new_full(self, size: Sequence[int], fill_value: Any, *, dtype: Optional[torch.dtype] = None,
                 device: Any = _NO, requires_grad: bool = False, layout: torch.layout = torch.strided,
                 pin_memory: Optional[bool] = None, empty_lazy: bool = False) -> Any:
        """A TensorDict of batch ``size`` with the dense stack's structure, ``fill_value`` everywhere."""
        return self._new_filled("new_full", size, (size, fill_value), dict(
            dtype=dtype, device=device, requires_grad=requires_grad, layout=layout, pin_memory=pin_memory),
            empty_lazy)


def _refuse_inplace(name: str, inplace: bool) -> None:
    """Upstream's lazy stacks refuse the in-place forms of the ops that change the batch size."""
    if inplace:
        raise NotImplementedError(f"{name}(inplace=True) is not supported on a LazyStackedTensorDict: call "
                                  ".to_tensordict() first, or use inplace=False.")


def _movedim_order(n_batch: int, source: Any, destination: Any) -> List[int]:
    """The permutation ``torch.movedim(source, destination)`` applies to ``n_batch`` dims."""
    sources = [source] if isinstance(source, int) else list(source)
    destinations = [destination] if isinstance(destination, int) else list(destination)
    sources = [dim % n_batch for dim in sources]
    destinations = [dim % n_batch for dim in destinations]
    rest = iter(dim for dim in range(n_batch) if dim not in sources)
    placed = dict(zip(destinations, sources))
    return [placed[position] if position in placed else next(rest) for position in range(n_batch)]
