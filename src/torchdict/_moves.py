"""Filled in by issue 3 (copies and moves)."""


class MovesMixin:
    __slots__ = ()
