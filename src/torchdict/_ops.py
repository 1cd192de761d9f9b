"""Filled in by issue 3 (arithmetic)."""


class OpsMixin:
    __slots__ = ()
