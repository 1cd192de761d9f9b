"""Filled in by issue 5."""


class ModuleMixin:
    __slots__ = ()
