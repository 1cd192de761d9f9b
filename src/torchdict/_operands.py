"""The other operand of a leaf-wise op, lined up with the leaves of a TensorDict.

An operand is one of:

- a Python number (or a 0-dim tensor): used as is with every leaf;
- a tensor: broadcast against the batch size as torch broadcasts shapes (a
  ``(3,)`` tensor meets the last batch dim), then applied to each leaf from the
  left, over its batch dims, whatever its feature dims: a ``(3,)`` tensor scales
  each row of a batch-``[3]`` TensorDict. A tensor with more dims than the batch
  grows the batch in front (batch ``[3]`` and a ``(4, 3)`` tensor give batch
  ``[4, 3]``), as upstream does;
- a TensorDict (or tensorclass) with the same keys: leaves are paired by key.
  The two batch sizes broadcast like tensor shapes (``[3]`` with ``[1]`` gives
  ``[3]``), and so do the feature dims, separately, so that batch element
  meets batch element even when the leaves have different numbers of dims.

Every view made here is a ``view`` (never a copy), so in-place ops write
through them into the leaves.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ._apply import flat_tensors, unwrap
from ._base import TensorCollection
from ._bounded_cache import BoundedCache
from ._errors import keys_mismatch_error

_Tensor = torch.Tensor
_SCALARS = (bool, int, float, complex)
# C-level getters torch.compile can trace too (Dynamo can't call an attrgetter made outside the compiled code).
_dtype_of = getattr(torch.Tensor, "dtype").__get__  # (a getset descriptor)
_ndim_of = torch.Tensor.dim

UNSUPPORTED: Any = object()  # what as_operand returns for a type no leaf-wise op accepts


def as_operand(other: Any) -> Any:
    """``other`` as a number, a tensor or a TensorDict; :data:`UNSUPPORTED` for anything else."""
    if isinstance(other, _SCALARS) or isinstance(other, _Tensor):
        return other
    if isinstance(other, TensorCollection):
        inner = unwrap(other)
        # A lazy stack has no storage of its own: its dense stack is the operand (as upstream).
        return other.contiguous() if inner is None else inner
    if type(other).__module__ == "numpy":
        import numpy

        if isinstance(other, numpy.ndarray):
            return torch.as_tensor(other)
        if isinstance(other, numpy.generic):
            return other.item()
    return UNSUPPORTED


def padded(tensor: torch.Tensor, ndim: int, cache: dict) -> torch.Tensor:
    """``tensor`` with trailing singleton dims up to ``ndim`` dims (one view per ndim, cached)."""
    view = cache.get(ndim)
    if view is None:
        missing = ndim - tensor.ndim
        view = cache[ndim] = tensor.view(tensor.shape + (1,) * missing) if missing > 0 else tensor
    return view


def grow_error(batch_size: torch.Size, new_batch: torch.Size) -> RuntimeError:
    """An op that must keep the batch size (in place, where, clamp, ...) was given an operand that grows it."""
    return RuntimeError(f"output with shape {list(batch_size)} doesn't match the broadcast shape {list(new_batch)}")


def tensor_operands(batch_size: torch.Size, leaves: list, other: torch.Tensor) -> tuple:
    """``(leaves, per-leaf views of other, new batch size)`` for a tensor operand.

    ``other`` broadcasts against the batch size as torch broadcasts two shapes (its last
    dim meets the last batch dim), then lines up with each leaf's batch dims, the leaf's
    feature dims following (``other`` gets trailing singleton dims). Dims it has beyond the
    batch's grow the batch in front, as they would for a tensor of the batch's shape.
    """
    n_batch, n_other = len(batch_size), other.ndim
    new_batch = torch.broadcast_shapes(batch_size, other.shape)
    if n_other < n_batch:
        other = other.view((1,) * (n_batch - n_other) + other.shape)
    elif n_other > n_batch:
        extra = (1,) * (n_other - n_batch)
        leaves = [leaf.view(extra + leaf.shape) for leaf in leaves]
    cache: dict = {}
    return leaves, [padded(other, leaf.ndim, cache) for leaf in leaves], new_batch


def align(leaf: torch.Tensor, n_batch: int, to_batch: int, to_features: int) -> torch.Tensor:
    """View ``leaf`` (with ``n_batch`` batch dims) as ``to_batch`` batch dims and ``to_features`` feature dims."""
    n_features = leaf.ndim - n_batch
    if n_batch == to_batch and n_features == to_features:
        return leaf
    shape = leaf.shape
    return leaf.view((1,) * (to_batch - n_batch) + shape[:n_batch] + (1,) * (to_features - n_features)
                     + shape[n_batch:])


def _not_collection(cls: type) -> bool:
    return not issubclass(cls, TensorCollection)


def keys_mismatch(td: Any, other: Any) -> KeyError:
    """The KeyError naming the leaves that only one of two TensorDicts holds."""
    def leaf_keys(collection: Any) -> set:
        return set(collection.keys(include_nested=True, leaves_only=True, is_leaf=_not_collection))

    first, second = leaf_keys(td), leaf_keys(other)
    if first == second:  # the difference is in empty sub-TensorDicts
        first, second = set(td.keys(include_nested=True)), set(other.keys(include_nested=True))
    return keys_mismatch_error(first - second, second - first)


def _mixed_leaf_error(key: tuple) -> TypeError:
    shown = key[0] if len(key) == 1 else key
    return TypeError(f"Cannot combine a tensor with non-tensor data at key {shown!r}.")


def _pair_foreign(leaf: Any, other_leaf: Any, leaves: list, others: list) -> bool:
    """Pair the member leaves of two nested lazy stacks of the same layout (the result is rebuilt
    member-wise, so it stays a lazy stack); False for any other pair."""
    from ._nested_foreign import foreign_leaves

    if type(getattr(unwrap(other_leaf), "_tensordict", None)) is dict or leaf.batch_size != other_leaf.batch_size:
        return False
    mine: list = []
    theirs: list = []
    foreign_leaves(leaf, mine)
    foreign_leaves(other_leaf, theirs)
    if len(mine) != len(theirs) or any(a.shape != b.shape for a, b in zip(mine, theirs)):
        return False
    leaves.extend(mine)
    others.extend(theirs)
    return True


def _pair_storages(storage: dict, other_storage: dict, leaves: list, others: list, non_tensor_pairs: dict,
                   path: tuple) -> bool:
    """Collect the tensor leaves of two storages, paired by key; False when the keys differ."""
    if storage.keys() != other_storage.keys():
        return False
    for key, leaf in storage.items():
        other_leaf = other_storage[key]
        if isinstance(leaf, _Tensor):
            if not isinstance(other_leaf, _Tensor):
                if isinstance(other_leaf, TensorCollection):
                    return False
                raise _mixed_leaf_error(path + (key,))
            leaves.append(leaf)
            others.append(other_leaf)
        elif isinstance(leaf, TensorCollection):
            if not isinstance(other_leaf, TensorCollection):
                return False
            if type(getattr(unwrap(leaf), "_tensordict", None)) is not dict:
                if not _pair_foreign(leaf, other_leaf, leaves, others):
                    return False
                continue
            if not _pair_storages(unwrap(leaf)._tensordict, unwrap(other_leaf)._tensordict, leaves, others,
                                  non_tensor_pairs, path + (key,)):
                return False
        else:
            if isinstance(other_leaf, TensorCollection):
                return False
            if isinstance(other_leaf, _Tensor):
                raise _mixed_leaf_error(path + (key,))
            non_tensor_pairs[id(leaf)] = other_leaf
    return True


class TdOperands:
    """The tensor leaves of ``td`` and ``other`` paired by key and viewed so that they broadcast.

    ``leaves``/``others`` are in :func:`tensor_leaves` order of ``td``;
    ``batch_size`` is the broadcast batch; ``flat`` says ``td`` holds only
    tensors (so a result is ``dict(zip(td._tensordict, results))``);
    ``non_tensor_pairs`` maps ``id(non-tensor leaf of td)`` to ``other``'s.
    """

    __slots__ = ("leaves", "others", "batch_size", "non_tensor_pairs", "flat")

    def __init__(self, td: Any, other: Any) -> None:
        storage, other_storage = td._tensordict, other._tensordict
        flat_leaves = flat_tensors(storage)
        flat_others: Optional[list] = None
        self.non_tensor_pairs: dict = {}
        if flat_leaves is not None and storage.keys() == other_storage.keys():
            candidates = list(map(other_storage.__getitem__, storage))  # in td's key order
            if all(issubclass(leaf_type, _Tensor) for leaf_type in set(map(type, candidates))):
                flat_others = candidates
        self.flat = flat_others is not None
        if flat_leaves is not None and flat_others is not None:
            leaves, others = flat_leaves, flat_others
        else:
            leaves, others = [], []
            if not _pair_storages(storage, other_storage, leaves, others, self.non_tensor_pairs, ()):
                raise keys_mismatch(td, other)
        batch, other_batch = td._batch_size, other._batch_size
        if batch == other_batch:
            self.batch_size = batch
            n_batch = len(batch)
            ndims, other_ndims = list(map(_ndim_of, leaves)), list(map(_ndim_of, others))
            if ndims != other_ndims:  # two C-level passes first: the common case is equal dims
                for position, (ndim, other_ndim) in enumerate(zip(ndims, other_ndims)):
                    if ndim != other_ndim:
                        features = max(ndim, other_ndim) - n_batch
                        leaves[position] = align(leaves[position], n_batch, n_batch, features)
                        others[position] = align(others[position], n_batch, n_batch, features)
        else:
            self.batch_size = torch.broadcast_shapes(batch, other_batch)
            n_new, n_batch, n_other = len(self.batch_size), len(batch), len(other_batch)
            for position, (leaf, other_leaf) in enumerate(zip(leaves, others)):
                features = max(leaf.ndim - n_batch, other_leaf.ndim - n_other)
                leaves[position] = align(leaf, n_batch, n_new, features)
                others[position] = align(other_leaf, n_other, n_new, features)
        self.leaves, self.others = leaves, others


def operand_per_leaf(td: Any, leaves: list, value: Any, name: str) -> tuple:
    """``(leaves, operand)`` for an op that keeps ``td``'s batch size (clamp, lerp, where, in place).

    The operand is ``value`` itself for None, a number or a 0-dim tensor, else a
    list with one view per leaf; ``leaves`` may come back as views too (when a
    TensorDict operand has more feature dims). Raises when ``value`` would grow
    the batch.
    """
    if value is None:
        return leaves, None
    operand = as_operand(value)
    if operand is UNSUPPORTED:
        raise TypeError(f"{name}(): unsupported operand type {type(value).__name__} for a TensorDict.")
    batch_size = td._batch_size
    if isinstance(operand, TensorCollection):
        pairs = TdOperands(td, operand)
        if pairs.batch_size != batch_size:
            raise grow_error(batch_size, pairs.batch_size)
        return pairs.leaves, pairs.others
    if isinstance(operand, _Tensor) and operand.ndim:
        views, others, new_batch = tensor_operands(batch_size, leaves, operand)
        if new_batch != batch_size:
            raise grow_error(batch_size, new_batch)
        return views, others
    return leaves, operand


# --------------------------------------------------------------------------- in-place preflight

# key -> None (the op works) or (exception type, args) of what it raised: never the exception itself.
_PREFLIGHT: BoundedCache = BoundedCache(4096)


def empty_like_operand(value: Any) -> Any:
    """A stand-in for ``value`` with no elements (tensors) or ``value`` itself (numbers)."""
    if isinstance(value, _Tensor):
        return torch.empty((0,) if value.ndim else (), dtype=value.dtype, device=value.device)
    return value


def describe(value: Any) -> Any:
    """What about an operand decides whether an in-place op accepts it (for the preflight cache)."""
    if isinstance(value, _Tensor):
        return (value.dtype, value.ndim == 0, value.device.type)
    return (type(value), value)


def preflight(key: Any, run: Any) -> None:
    """Raise what ``run()`` raises: ``run`` does the op on empty tensors of the leaves' dtypes.

    In-place ops call this once per distinct leaf dtype before writing anything,
    so that dtype errors (``int64 += 0.5``, ``bool += 1``, an op not implemented
    for a dtype) leave the TensorDict unchanged instead of striking halfway
    through its leaves. Results are cached by ``key`` (None: don't cache).
    """
    cached: Any = UNSUPPORTED
    if key is not None:
        try:
            cached = _PREFLIGHT.get(key, UNSUPPORTED)
        except TypeError:  # an unhashable part (e.g. a list kwarg): run it every time
            key = None
    if cached is None:
        return
    if cached is not UNSUPPORTED:
        error_type, args = cached
        raise error_type(*args)
    try:
        run()
    except Exception as error:  # noqa: BLE001 - re-raised as torch raised it
        if key is not None and _rebuilds(error):
            _PREFLIGHT.put(key, (type(error), error.args))
        raise error.with_traceback(None) from None
    if key is not None:
        _PREFLIGHT.put(key, None)


def _rebuilds(error: Exception) -> bool:
    """True when ``type(error)(*error.args)`` gives the same error (so the cache can raise it again)."""
    try:
        again = type(error)(*error.args)
    except Exception:  # noqa: BLE001 - a constructor that wants more than its args: not cached
        return False
    return str(again) == str(error)


def check_inplace_shapes(leaves: list, others: Any) -> None:
    """Each operand view must broadcast to its leaf's shape (an in-place op can't grow a leaf)."""
    if not isinstance(others, list):
        return
    for leaf, item in zip(leaves, others):
        if leaf.shape != item.shape:
            shape = torch.broadcast_shapes(leaf.shape, item.shape)
            if shape != leaf.shape:
                raise RuntimeError(f"output with shape {list(leaf.shape)} doesn't match the broadcast shape "
                                   f"{list(shape)}")


def leaves_by_dtype(leaves: list) -> list:
    """One leaf per distinct dtype (what an in-place preflight needs to look at)."""
    dtypes = set(map(_dtype_of, leaves))  # a C-level pass over the leaves
    if len(dtypes) == 1:
        return leaves[:1]
    return list({leaf.dtype: leaf for leaf in leaves}.values())


def distinct_leaves(leaves: list, others: Any = None) -> tuple:
    """``(leaves, others)`` with repeated leaf objects kept once (with their first operand).

    A TensorDict may hold one tensor under several keys (``fromkeys`` does); an
    in-place op must change each entry once, not once per key.
    """
    if len(set(map(id, leaves))) == len(leaves):
        return leaves, others
    seen: set = set()
    keep = []
    for position, leaf in enumerate(leaves):
        if id(leaf) not in seen:
            seen.add(id(leaf))
            keep.append(position)
    kept_others = [others[position] for position in keep] if isinstance(others, list) else others
    return [leaves[position] for position in keep], kept_others
