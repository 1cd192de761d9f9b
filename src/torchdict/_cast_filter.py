"""``cast_filter=`` of the dtype casts (``td.float(cast_filter=is_inexact)``, ``td.type(dtype, cast_filter=...)``):
only the tensor leaves the predicate selects are cast.

The predicate is called as ``cast_filter(key, leaf)`` with the leaf's full key as a tuple of str (as
upstream), so ``is_inexact`` / ``is_integer`` / ... (last argument tested) fit directly.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from ._apply import rebuild, unwrap
from ._base import TensorCollection


def keyed_tensor_leaves(td: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """``(key tuple, tensor leaf)`` in the order ``_apply.tensor_leaves`` gives the leaves."""
    for key, leaf in td._tensordict.items():
        if isinstance(leaf, torch.Tensor):
            yield prefix + (key,), leaf
        elif isinstance(leaf, TensorCollection):
            yield from keyed_tensor_leaves(unwrap(leaf), prefix + (key,))


def cast_filtered(td: Any, cast: Callable[[torch.Tensor], torch.Tensor], cast_filter: Callable[..., bool],
                  keep_lock: bool = True) -> Any:
    """``td`` with ``cast(leaf)`` for the tensor leaves ``cast_filter(key, leaf)`` selects (the others kept).

    The predicate runs on every leaf before any cast, so a failing predicate raises before any work.
    """
    pairs = list(keyed_tensor_leaves(td))
    chosen = [bool(cast_filter(key, leaf)) for key, leaf in pairs]
    results = [cast(leaf) if take else leaf for (_, leaf), take in zip(pairs, chosen)]
    result = rebuild(td, iter(results), td._batch_size)
    if keep_lock and td._is_locked:
        result._lock_tree()
    return result
