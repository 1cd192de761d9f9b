"""``apply(fn)`` on a nested tree of plain TensorDicts in one pass (the common nested call).

The general path (``_ApplyRun._plain_storage``) handles one level at a time: it calls
``fn`` on the level's tensors, checks the results, then recurses into each
sub-TensorDict, paying its fixed costs once per level. When the tree is plain (every
level holds only plain tensors and sub-TensorDicts of the root's class and batch size),
this module instead collects every leaf first, calls ``fn`` over all of them in one
C-level loop, checks all the results in one pass, and rebuilds the levels.

The leaves are collected in the order the per-level path calls ``fn`` (a level's tensors,
then its sub-TensorDicts, depth first), so the calls and their order are the same; the
one difference is that when a result is refused (a wrong batch), ``fn`` has already run
on every leaf, not only on those before it. For any other tree, :func:`plain_tree_storage`
returns None before calling anything.
"""
from __future__ import annotations

import operator
from itertools import compress, islice, repeat
from typing import Any, Optional

import torch

from ._accel import lengths_fit

_Tensor = torch.Tensor
_ONLY_TENSOR = {_Tensor}
_not = operator.not_
_is = operator.is_


class _Level:
    """One TensorDict of the tree: its tensor keys, its sub-TensorDicts, where its leaves start."""

    __slots__ = ("td", "keys", "start", "count", "subs", "ordered", "path")

    def __init__(self, td: Any, keys: Any, start: int, count: int, subs: list, ordered: bool, path: tuple) -> None:
        self.td = td
        self.keys = keys  # the tensors' keys first (the storage itself when they come first)
        self.start = start  # where its tensors start in the list of all leaves
        self.count = count  # how many tensors
        self.subs = subs  # [(key, sub-TensorDict)], in storage order
        self.ordered = ordered  # the tensors come before the sub-TensorDicts in the storage
        self.path = path


def plain_tree_storage(run: Any, td: Any, batch_size: torch.Size) -> Optional[dict]:
    """The storage of ``apply(fn)``'s result for a plain tree, or None (nothing called) for any other."""
    n_batch = len(batch_size)
    if (n_batch > 1 or (n_batch == 1 and batch_size[0] <= 0) or batch_size is not td._batch_size
            or run.device is not None):
        return None  # another batch or a device to move to: the per-level path
    leaves: list = []
    levels: list = []
    if not _collect(td, {_Tensor, type(td)}, batch_size, (), leaves, levels):
        return None
    results = list(map(run.fn, leaves))
    if n_batch:
        fits = lengths_fit(results, batch_size[0])  # False sends None, a number...: to the per-result checks
    else:
        fits = set(map(type, results)) == _ONLY_TENSOR
    return _rebuild(run, iter(levels), results, batch_size, fits)


def _collect(td: Any, allowed: set, batch_size: torch.Size, path: tuple, leaves: list, levels: list) -> bool:
    """Append ``td``'s tensors to ``leaves`` and its level to ``levels``, depth first; False if not plain.

    ``allowed`` is ``{torch.Tensor, the root's class}``.
    """
    storage = td._tensordict
    values = storage.values()
    value_types = list(map(type, values))
    types = set(value_types)
    start = len(leaves)
    if types == _ONLY_TENSOR or not types:
        leaves.extend(values)
        levels.append(_Level(td, storage, start, len(storage), [], True, path))
        return True
    if not types <= allowed:
        return False
    # Counted by identity (list.count's first test): the sub-TensorDicts are the few.
    n_tensors = value_types.count(_Tensor)
    n_subs = len(value_types) - n_tensors
    if value_types[n_tensors:].count(_Tensor) == 0:
        # The usual layout, tensors then sub-TensorDicts: split by position (the few
        # sub-TensorDicts read from the end; the storage's first keys are the tensors').
        keys: Any = storage
        leaves.extend(values)
        del leaves[-n_subs:]
        subs = list(islice(reversed(storage.items()), n_subs))[::-1]
        ordered = True
    else:
        is_tensor = list(map(_is, value_types, repeat(_Tensor)))
        keys = list(compress(storage, is_tensor))
        leaves.extend(compress(values, is_tensor))
        subs = list(compress(storage.items(), map(_not, is_tensor)))
        ordered = False
    for _, sub in subs:
        if sub._batch_size != batch_size:
            return False  # a longer batch: the per-level path handles it
    levels.append(_Level(td, keys, start, n_tensors, subs, ordered, path))
    for key, sub in subs:
        if not _collect(sub, allowed, batch_size, path + (key,), leaves, levels):
            return False
    return True


def _rebuild(run: Any, levels: Any, results: list, batch_size: torch.Size, fits: bool) -> dict:
    """The storage of the next level (and, recursively, of its sub-TensorDicts)."""
    level = next(levels)
    keys = level.keys
    start = level.start
    # A list slice (one copy in C) rather than islice over a shared iterator (a call per item).
    own = results[start:start + level.count]
    if fits:
        # zip stops with the level's results: when keys is the storage, its later keys
        # (the sub-TensorDicts') are left out.
        out = dict(zip(keys, own))
    else:
        out = {}
        n_batch = len(batch_size)
        path = level.path
        for key, value in zip(keys, own):
            if value is None:
                run.dropped = True
            else:
                out[key] = run._checked(value, path + (key,) if path else key, batch_size, n_batch)
    for key, sub in level.subs:
        inner = _rebuild(run, levels, results, batch_size, fits)
        if not inner and run.drops_empty(sub):
            continue  # everything in it was dropped
        out[key] = sub._new_unsafe(inner, sub._batch_size, run.device, sub._names)
    if level.subs and not level.ordered:
        storage = level.td._tensordict
        out = {key: out[key] for key in storage if key in out}  # the storage's order
    return out
