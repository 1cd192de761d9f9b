"""``to()``, ``pin_memory()`` and ``record_stream()`` of a lazy stack: member by member, the stack kept.

``to`` takes every form a TensorDict's takes (device, dtype, tensor, ``memory_format=``, ``other=``,
``cast_filter=``, ``non_blocking_pin=``, the per-leaf ``to(td.attrs())``) except ``batch_size=``, which a
lazy stack refuses (its batch size comes from its members), as upstream. ``inplace=True`` converts every
member first and only then writes them back, so a call that fails leaves the stack unchanged.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

from .._apply import unwrap

__all__ = ["lazy_to", "lazy_pin_memory", "lazy_record_stream", "lazy_consolidate", "lazy_is_consolidated"]

# id of a consolidated lazy stack -> (a weak reference to it, the TensorDict holding its members, keyed "0",
# "1", ..., over one storage). By id: a lazy stack is not hashable (== is element-wise).
_CONSOLIDATED: dict = {}


def _stack_class() -> type:
    from . import LazyStackedTensorDict

    return LazyStackedTensorDict


def lazy_to(stack: Any, args: tuple, kwargs: dict) -> Any:
    """``stack.to(*args, **kwargs)``: a stack of the converted members (``stack`` when none changes)."""
    if kwargs.get("batch_size") is not None:
        raise TypeError("Cannot pass batch-size to a LazyStackedTensorDict.")
    kwargs.pop("batch_size", None)
    inplace = bool(kwargs.pop("inplace", False))
    if inplace:
        _check_unlocked(stack)
    results = [member.to(*args, **kwargs) for member in stack._tds]
    if all(result is member for result, member in zip(results, stack._tds)):
        return stack
    if inplace:
        _adopt_members(stack, results)
        return stack
    return stack._restack(results, stack._stack_dim)


def _check_unlocked(stack: Any) -> None:
    if stack._is_locked:
        raise RuntimeError("Cannot modify locked TensorDict. For in-place modification, consider using the "
                           "`set_()` method and make sure the key is present.")
    for member in stack._tds:
        if isinstance(member, _stack_class()):
            _check_unlocked(member)
        else:
            unwrap(member)._check_unlocked()


def _adopt_members(stack: Any, results: list) -> None:
    from .._moves import adopt

    for member, result in zip(stack._tds, results):
        if result is member:
            continue
        if isinstance(member, _stack_class()):
            _adopt_members(member, list(result._tds))
        else:
            adopt(member, result)


def lazy_pin_memory(stack: Any, num_threads: Optional[int] = None, inplace: bool = False) -> Any:
    """Every member's leaves pinned: a new stack, or (``inplace=True``) the members' leaves replaced."""
    pinned = [member.pin_memory(num_threads=num_threads) for member in stack._tds]
    if inplace:
        if not stack._is_locked and not any(unwrap(member)._is_locked for member in stack._tds
                                            if not isinstance(member, _stack_class())):
            _adopt_members(stack, pinned)
        return stack
    result = stack._restack(pinned, stack._stack_dim)
    if stack._is_locked:
        result.lock_()
    return result


def _streams(stack: Any, out: list) -> list:
    for member in stack._tds:
        if isinstance(member, _stack_class()):
            _streams(member, out)
        else:
            out.append(unwrap(member))
    return out


def lazy_record_stream(stack: Any, stream: Any) -> Any:
    """Every member's leaves marked as used by ``stream``; a member tied to another stream raises first."""
    members = _streams(stack, [])
    for member in members:
        current = getattr(member, "_stream", None)
        if current is not None and current != stream:
            raise RuntimeError("A stream is already associated with this TensorDict instance.")
    for member in members:
        member.record_stream(stream)
    return stack


def lazy_consolidate(stack: Any, filename: Any, options: dict) -> Any:
    """``stack.consolidate(filename, **options)``: the members over one storage, the stack kept."""
    from ..tensordict import TensorDict

    members = stack._tds
    if filename is not None or options["return_early"] or any(type(member) is not TensorDict for member in members):
        return stack._dense().consolidate(filename, **options)
    options = dict(options, inplace=False)  # the holder is new: upstream's inplace=True gives a new stack too
    holder = TensorDict({str(position): member for position, member in enumerate(members)}, batch_size=[],
                        device=members[0].device)
    packed = holder.consolidate(**options)
    result = stack._restack([packed.get(str(position)) for position in range(len(members))], stack._stack_dim)
    result._stack_name = stack._stack_name
    key = id(result)
    _CONSOLIDATED[key] = (weakref.ref(result, lambda _: _CONSOLIDATED.pop(key, None)), packed)
    return result


def lazy_is_consolidated(stack: Any) -> bool:
    entry = _CONSOLIDATED.get(id(stack))
    if entry is None or entry[0]() is not stack:
        return False
    packed = entry[1]
    if not packed.is_consolidated():
        return False
    return all(packed.get(str(position)) is member for position, member in enumerate(stack._tds))
