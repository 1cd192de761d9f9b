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

The collection and each level's result dict are built in C when the extension is built
(``collect_tree``, ``zip_dict`` of ``_accel``); :func:`py_collect_tree` is the collector's
pure-Python twin.
"""
from __future__ import annotations

import operator
from itertools import compress, islice, repeat
from typing import Any, Optional

import torch

from ._accel import collect_tree, lengths_fit, zip_dict

_Tensor = torch.Tensor
_ONLY_TENSOR = {_Tensor}
_not = operator.not_
_is = operator.is_


# A level of the tree, as both collectors give it: (td, keys, start, count, subs, ordered, path):
# the TensorDict; its tensors' keys (the storage itself when they come first: zip stops after
# them); where its tensors start in the list of all leaves and how many there are; its
# sub-TensorDicts as [(key, sub)] in storage order; whether the tensors come before the
# sub-TensorDicts in the storage; its key path from the root.


def plain_tree_storage(run: Any, td: Any, batch_size: torch.Size) -> Optional[dict]:
    """The storage of ``apply(fn)``'s result for a plain tree, or None (nothing called) for any other."""
    n_batch = len(batch_size)
    if (n_batch > 1 or (n_batch == 1 and batch_size[0] <= 0) or batch_size is not td._batch_size
            or run.device is not None):
        return None  # another batch or a device to move to: the per-level path
    if collect_tree is not None:
        collected = collect_tree(td, batch_size, type(td)._batch_size)  # the slot's descriptor
    else:
        collected = py_collect_tree(td, batch_size)
    if collected is None:
        return None
    leaves, levels = collected
    results = list(map(run.fn, leaves))
    if n_batch:
        fits = lengths_fit(results, batch_size[0])  # False sends None, a number...: to the per-result checks
    else:
        fits = set(map(type, results)) == _ONLY_TENSOR
    return _rebuild(run, iter(levels), results, batch_size, fits)


def py_collect_tree(td: Any, batch_size: torch.Size) -> Optional[tuple]:
    """``(leaves, levels)`` of a plain tree, depth first, or None: the twin of the C collect_tree."""
    leaves: list = []
    levels: list = []
    if not _collect(td, {_Tensor, type(td)}, batch_size, (), leaves, levels):
        return None
    return leaves, levels


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
        levels.append((td, storage, start, len(storage), [], True, path))
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
    levels.append((td, keys, start, n_tensors, subs, ordered, path))
    for key, sub in subs:
        if not _collect(sub, allowed, batch_size, path + (key,), leaves, levels):
            return False
    return True


def _rebuild(run: Any, levels: Any, results: list, batch_size: torch.Size, fits: bool) -> dict:
    """The storage of the next level (and, recursively, of its sub-TensorDicts)."""
    td, keys, start, count, subs, ordered, path = next(levels)
    if fits:
        # The level's results under its tensors' keys (when keys is the storage, its later
        # keys, the sub-TensorDicts', are left out).
        out = zip_dict(keys, results, start, count)
    else:
        out = {}
        n_batch = len(batch_size)
        for key, value in zip(keys, results[start:start + count]):
            if value is None:
                run.dropped = True
            else:
                out[key] = run._checked(value, path + (key,) if path else key, batch_size, n_batch)
    for key, sub in subs:
        inner = _rebuild(run, levels, results, batch_size, fits)
        if not inner and run.drops_empty(sub):
            continue  # everything in it was dropped
        out[key] = sub._new_unsafe(inner, sub._batch_size, run.device, sub._names)
    if subs and not ordered:
        storage = td._tensordict
        out = {key: out[key] for key in storage if key in out}  # the storage's order
    return out
