"""Filled in by issue 3 (indexing)."""


class IndexingMixin:
    __slots__ = ()
