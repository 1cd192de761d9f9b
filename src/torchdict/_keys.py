"""The one place where keys are normalised.

A *nested key* is a ``str`` or a non-empty tuple whose items are strings or
nested tuples of strings. Every public entry point runs a key through
:func:`unravel_key` (or :func:`key_to_tuple`) exactly once; internal code only
ever sees a plain ``str`` or a flat tuple of ``str``.
"""
from __future__ import annotations

from typing import Iterable, Tuple, Union

NestedKey = Union[str, Tuple["NestedKey", ...]]

__all__ = ["NestedKey", "unravel_key", "unravel_key_list", "key_to_tuple", "is_nested_key"]


def _bad_key(key: object) -> KeyError:
    return KeyError(
        "Only NestedKeys are supported: a key must be a string or a non-empty, "
        f"possibly nested tuple of strings. Got key {key!r}."
    )


def _flatten_into(key: tuple, out: list, original: object) -> None:
    for item in key:
        if type(item) is str:
            out.append(item)
        elif isinstance(item, tuple) and item:
            _flatten_into(item, out, original)
        elif isinstance(item, str):
            # A str subclass (an enum of str, say) is kept as it is, as upstream does: it hashes
            # and compares as its string value, which str() would not give for a str-mixin Enum.
            out.append(item)
        else:
            raise _bad_key(original)


def key_to_tuple(key: object) -> tuple:
    """Normalise any nested key to a flat tuple of strings.

    >>> key_to_tuple(("a", ("b", ("c",))))
    ('a', 'b', 'c')
    >>> key_to_tuple("a")
    ('a',)
    """
    if type(key) is str:
        return (key,)
    if isinstance(key, tuple):
        # Fast path: already a flat tuple of str.
        for item in key:
            if type(item) is not str:
                break
        else:
            if key:
                return key
            raise _bad_key(key)
        out: list = []
        _flatten_into(key, out, key)
        if not out:
            raise _bad_key(key)
        return tuple(out)
    if isinstance(key, str):
        return (key,)  # a str subclass, kept (see _flatten_into)
    raise _bad_key(key)


def unravel_key(key: object) -> NestedKey:
    """Normalise a nested key: a one-element key becomes a plain ``str``.

    >>> unravel_key(("a", ("b",)))
    ('a', 'b')
    >>> unravel_key((("a",),))
    'a'
    """
    if type(key) is str:
        return key
    flat = key_to_tuple(key)
    return flat[0] if len(flat) == 1 else flat


def unravel_key_list(keys: Iterable[object]) -> list:
    """Normalise each key of an iterable.

    >>> unravel_key_list(["a", ("b", ("c",))])
    ['a', ('b', 'c')]
    """
    return [unravel_key(key) for key in keys]


def is_nested_key(key: object) -> bool:
    """True if ``key`` is a valid nested key."""
    try:
        key_to_tuple(key)
    except KeyError:
        return False
    return True
