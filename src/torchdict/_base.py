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

from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # The members every collection has, most of them made at import time (see _collection_api.py).
    from ._collection_api import CollectionAPI
else:
    CollectionAPI = object


class TensorCollection(CollectionAPI):
    __slots__ = ()

    if TYPE_CHECKING:
        # The protocol above, as type checkers see it. ``_tensordict`` is the TensorDict holding the entries of a
        # tensorclass (or TensorDictParams), and a TensorDict's own storage dict: code tells them apart with
        # ``unwrap(value) is value`` (``type(inner) is dict``), which no type narrows, hence Any.
        @property
        def _tensordict(self) -> Any: ...
        def _rewrap(self, td: Any) -> Any: ...  # a non-TensorDict collection's: one of its kind around ``td``


def is_tensor_collection(datatype: object) -> bool:
    """True for TensorDicts, tensorclass instances and the non-tensor leaves (or their classes).

    >>> from torchdict import NonTensorData, TensorDict
    >>> is_tensor_collection(TensorDict()), is_tensor_collection(NonTensorData("x"))
    (True, True)
    """
    cls = datatype if isinstance(datatype, type) else type(datatype)
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


class BoundCall:
    """A generated method: ``obj.name(*args)`` calls ``function(obj, *fixed, *args)``.

    The generic members of TensorDictBase, a tensorclass's delegated methods and the refused arithmetic of
    non-tensor data are hundreds of these, one small object each rather than a closure (a function, a cell
    and a tuple each): the objects made by ``import torchdict`` count towards setting off a full garbage
    collection of torch's heap. The fixed arguments are slots, not a tuple, for the same reason.
    """

    __slots__ = ("function", "first", "second", "count")

    def __init__(self, function: Any, *fixed: Any) -> None:
        if len(fixed) > 2:
            raise TypeError(f"BoundCall takes at most two fixed arguments, got {len(fixed)}")
        self.function = function
        self.count = len(fixed)
        self.first = fixed[0] if fixed else None
        self.second = fixed[1] if len(fixed) == 2 else None

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return self
        if self.count == 1:
            return partial(self.function, instance, self.first)
        if self.count == 2:
            return partial(self.function, instance, self.first, self.second)
        return partial(self.function, instance)
