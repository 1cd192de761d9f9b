"""Filled in by issue 6 (persistence)."""


class PersistenceMixin:
    __slots__ = ()
