"""Filled in by issue 3 (torch functions)."""


class TorchFunctionMixin:
    __slots__ = ()
