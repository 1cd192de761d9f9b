"""Marker base shared by every tensor collection (TensorDict and @tensorclass).

It lets concern modules recognise a collection without importing the
container module (which imports them), and lets a tensorclass take part in
the same recursions as a TensorDict.

Protocol of a non-TensorDict collection (a tensorclass instance):
- ``obj._tensordict`` is the TensorDict holding all its fields;
- ``obj._rewrap(td)`` builds an object of the same class around ``td``.
"""
from __future__ import annotations


class TensorCollection:
    __slots__ = ()


def is_tensor_collection(obj: object) -> bool:
    """True for TensorDicts and tensorclass instances (or classes).

    >>> from torchdict import TensorDict
    >>> is_tensor_collection(TensorDict())
    True
    """
    if isinstance(obj, type):
        return issubclass(obj, TensorCollection)
    return isinstance(obj, TensorCollection)
