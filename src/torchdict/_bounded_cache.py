"""``BoundedCache``: the one kind of module-level memo torchdict keeps (shapes, probes, parsed metadata, names).

Each cache maps a small, hashable description of an input (a batch size, a file's signature, a key) to something
costly to rebuild. Two rules keep them harmless in a long-running process:

- a size cap: when full, a cache empties itself before storing (no LRU bookkeeping, so a hit stays one C-level
  ``dict.get``: these caches sit on hot paths such as ``td[i]``);
- no exception values: an exception keeps its traceback, hence every frame and tensor it passed through, alive for
  as long as the cache holds it. A cache that remembers a failure stores what is needed to raise it again.
"""
from __future__ import annotations

from typing import Any, Hashable, TypeVar

__all__ = ["BoundedCache"]

_Value = TypeVar("_Value")


class BoundedCache(dict):
    """A ``dict`` of at most ``limit`` entries, filled through :meth:`put`.

    >>> cache = BoundedCache(2)
    >>> [cache.put(n, n * n) for n in range(3)], dict(cache)
    ([0, 1, 4], {2: 4})
    """

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f"a BoundedCache holds at least one entry, got limit={limit}")
        self.limit = limit

    def put(self, key: Hashable, value: _Value) -> _Value:
        """Store ``value`` under ``key`` (emptying the cache first when it is full); returns ``value``."""
        if isinstance(value, BaseException):
            raise TypeError(f"a BoundedCache does not hold exceptions (got {type(value).__name__}): its traceback "
                            "would keep frames alive; store what is needed to raise it again")
        if len(self) >= self.limit and key not in self:
            self.clear()
        self[key] = value
        return value

    def __reduce__(self) -> Any:  # a copy or a pickle starts empty: the entries are only a memo
        return (BoundedCache, (self.limit,))
