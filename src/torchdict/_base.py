"""Marker base shared by every tensor collection (TensorDict and @tensorclass).

It lets concern modules recognise a collection without importing the
container module (which imports them), and lets a tensorclass take part in
the same recursions as a TensorDict.

Protocol of a non-TensorDict collection (a tensorclass instance):
- ``obj._tensordict`` is the TensorDict holding all its fields;
- ``obj._rewrap(td)`` builds an object of the same class around ``td``.

The non-tensor leaves (``NonTensorData`` / ``NonTensorStack``) are *not* ``TensorCollection``
subclasses: every internal recursion tests ``isinstance(x, TensorCollection)`` to descend into a
nested TensorDict, and those leaves hold no entries. The public :func:`is_tensor_collection` still
answers True for them, as upstream does (there they are a tensorclass and a lazy stack); internal
code never calls it, and must keep testing ``TensorCollection``.
"""
from __future__ import annotations

from typing import Any


class TensorCollection:
    __slots__ = ()


def is_tensor_collection(obj: object) -> bool:
    """True for TensorDicts, tensorclass instances and the non-tensor leaves (or their classes).

    >>> from torchdict import NonTensorData, TensorDict
    >>> is_tensor_collection(TensorDict()), is_tensor_collection(NonTensorData("x"))
    (True, True)
    """
    cls = obj if isinstance(obj, type) else type(obj)
    # ``_is_non_tensor`` is the class marker of NonTensorData / NonTensorStack (upstream's name too).
    return issubclass(cls, TensorCollection) or getattr(cls, "_is_non_tensor", False) is True


_TENSORDICT_CLASS: Any = None


def tensordict_class() -> Any:
    """``torchdict.TensorDict``, for the modules that ``tensordict.py`` itself imports (they can't import it
    at module level); looked up once, then kept."""
    global _TENSORDICT_CLASS
    if _TENSORDICT_CLASS is None:
        from .tensordict import TensorDict

        _TENSORDICT_CLASS = TensorDict
    return _TENSORDICT_CLASS
