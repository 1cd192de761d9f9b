"""``rename_keys(td, mapping)``: many entries renamed at once, on a new structure over the same leaves.

Written on the public dict API (``copy``, ``keys``, ``get``, ``set``, ``del``), so it serves any
collection; the lazy stack uses it for each member. The renames happen together: ``{"a": "b",
"b": "a"}`` swaps two entries, and a sub-TensorDict emptied by the moves is removed (as upstream
tensordict 0.15.3's ``rename_keys``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, List

from ._errors import missing_key_error
from ._keys import key_to_tuple


def _is_inside(inner: tuple, outer: tuple) -> bool:
    return len(inner) > len(outer) and inner[:len(outer)] == outer


def rename_keys(td: Any, mapping: Mapping, *, strict: bool = True) -> Any:
    """A copy of ``td`` (same leaves) with each key of ``mapping`` renamed to its value.

    Raises ``KeyError`` for a missing source when ``strict`` (skipped otherwise) and ``ValueError``
    for two sources with one destination, a source inside another source (or a destination inside
    another destination), or a destination already present and not renamed away.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> out = rename_keys(TensorDict(a=torch.zeros(()), b=torch.ones(())), {"a": "b", "b": "a"})
    >>> out["a"], out["b"]
    (tensor(1.), tensor(0.))
    """
    pairs: List[tuple] = []
    for old, new in mapping.items():
        old_path, new_path = key_to_tuple(old), key_to_tuple(new)
        if not old_path or not new_path or not all(old_path) or not all(new_path):
            raise KeyError(f"rename_keys: empty key in {old!r} -> {new!r}.")
        if old_path not in td:
            if strict:
                raise missing_key_error(old, td.keys())
            continue
        pairs.append((old_path, new_path))
    sources = [old for old, _ in pairs]
    destinations = [new for _, new in pairs]
    if len(set(destinations)) != len(destinations):
        raise ValueError(f"rename_keys: two sources have the same destination in {dict(mapping)!r}.")
    for group, what in ((sources, "source"), (destinations, "destination")):
        for first in group:
            for second in group:
                if _is_inside(first, second):
                    raise ValueError(f"rename_keys: the {what} {first!r} lies inside the {what} {second!r}.")
    for new in destinations:
        if new in td and new not in sources and not any(_is_inside(new, old) for old in sources):
            raise ValueError(f"rename_keys: the destination {new!r} is already present and is not renamed away.")
    result = td.copy()
    values = [result.get(old) for old in sources]
    for old in sources:
        del result[old]
        _drop_emptied_parents(result, old)
    for new, value in zip(destinations, values):
        result.set(new, value)
    return result


def _drop_emptied_parents(td: Any, path: tuple) -> None:
    """Remove the sub-TensorDicts above ``path`` that the removal left empty."""
    for depth in range(len(path) - 1, 0, -1):
        parent = path[:depth]
        node = td.get(parent)
        if len(list(node.keys())):
            return
        del td[parent]
