"""``LinkedList``: the list of a non-tensor stack's values that ``td[key]`` returns, whose item assignments
write back into the stack (upstream's ``tensordict.utils.LinkedList``).

The list keeps a weak reference to the collection it was read from (a ``NonTensorStack``, a
``NonTensorData`` or a TensorDict, for ``tolist(as_linked_list=True)``) and, for the inner lists of a stack
with several batch dims, the index of its row there. ``values[i] = v`` writes ``collection[row + (i,)] = v``;
if that write raises, the list is put back as it was. The methods that change the length (``append``,
``extend``, ``insert``, ``pop``, ``remove``, ``clear``, ``del``, ``+=``, ``*=``) act on the list only and
unlink it: later assignments stay in the list. A copy (``pickle``, ``copy``, a slice) is a plain, unlinked
list of the same items (as upstream, a slice is a ``list``).
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Tuple

import torch

if TYPE_CHECKING:
    from typing import SupportsIndex

    from typing_extensions import Self


def _unlinked() -> Any:
    return None


class LinkedList(list):
    """A list of non-tensor values whose item assignments write back to the collection it was read from.

    ``LinkedList(iterable)`` without ``td`` is a plain list that writes nowhere.

    >>> from torchdict import TensorDict
    >>> td = TensorDict(batch_size=[3])
    >>> td["names"] = ["a", "b", "c"]
    >>> values = td["names"]
    >>> values[0] = "z"
    >>> td.get("names").tolist(), values
    (['z', 'b', 'c'], LinkedList(['z', 'b', 'c']))
    """

    def __init__(self, *args: Any, td: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._td: Callable[[], Any] = weakref.ref(td) if td is not None else _unlinked
        self._row: Tuple[Any, ...] = ()  # the index of this list in the collection (inner lists of a stack)

    @classmethod
    def _bound(cls, items: Iterable[Any], td: Any, row: Tuple[Any, ...]) -> "LinkedList":
        """A list bound to ``td`` at the row ``row`` (its items are ``td[row + (i,)]``)."""
        linked = cls(items, td=td)
        linked._row = row
        return linked

    def _unlink(self) -> None:
        self._td = _unlinked

    def __setitem__(self, key: Any, value: Any) -> None:
        target = self._td()
        if target is None:
            super().__setitem__(key, value)
            return
        is_slice = isinstance(key, slice)
        old = list(self) if is_slice else list.__getitem__(self, key)  # IndexError here writes nothing
        super().__setitem__(key, value)
        try:
            target[self._row + (key,) if self._row else key] = value
        except BaseException:
            super().__setitem__(slice(None) if is_slice else key, old)
            raise

    def tolist(self) -> list:
        """A plain list copy, not linked (inner linked lists become plain lists too)."""
        return [item.tolist() if isinstance(item, LinkedList) else item for item in self]

    # The methods that change the length: the list alone, unlinked (its positions no longer match).
    def append(self, object: Any) -> None:
        self._unlink()
        super().append(object)

    def extend(self, iterable: Iterable[Any]) -> None:
        self._unlink()
        super().extend(iterable)

    def insert(self, index: Any, object: Any) -> None:
        self._unlink()
        super().insert(index, object)

    def pop(self, index: Any = -1) -> Any:
        self._unlink()
        return super().pop(index)

    def remove(self, value: Any) -> None:
        self._unlink()
        super().remove(value)

    def clear(self) -> None:
        self._unlink()
        super().clear()

    def __delitem__(self, index: Any) -> None:
        self._unlink()
        super().__delitem__(index)

    def __iadd__(self, other: Iterable[Any]) -> Self:  # type: ignore[misc]  # list's own pair of signatures
        self._unlink()
        return super().__iadd__(other)

    def __imul__(self, other: SupportsIndex) -> Self:
        self._unlink()
        return super().__imul__(other)

    def __repr__(self) -> str:
        return f"LinkedList({list.__repr__(self)})"

    def __eq__(self, other: Any) -> bool:
        return list(self) == other

    def __ne__(self, other: Any) -> bool:
        return list(self) != other

    __hash__ = None

    def __reduce__(self) -> tuple:
        # A copy is not linked (a weak reference does not pickle).
        return type(self), (list(self),)

    def __copy__(self) -> "LinkedList":
        return type(self)(self)


def nested_linked_list(values: list, td: Any, batch_dims: int, row: Tuple[Any, ...] = ()) -> LinkedList:
    """``values`` (nested lists, one level per batch dim of ``td``, ``batch_dims`` of them) as linked lists
    bound to ``td``: the inner list at ``values[i]`` writes to ``td[row + (i, ...)]``."""
    if len(row) + 1 < batch_dims:  # the items are rows (one more batch dim below), not values
        values = [nested_linked_list(item, td, batch_dims, row + (position,)) for position, item in enumerate(values)]
    return LinkedList._bound(values, td, row)


def _register_pytree() -> None:
    """A linked list flattens as a list, and unflattens as a plain list (as upstream registers it)."""
    pytree: Any = torch.utils._pytree
    if LinkedList not in pytree.SUPPORTED_NODES:
        pytree.register_pytree_node(LinkedList, pytree._list_flatten, pytree._list_unflatten,
                                    serialized_type_name="torchdict.utils.LinkedList",
                                    flatten_with_keys_fn=pytree._list_flatten_with_keys)


__all__ = ["LinkedList", "nested_linked_list"]

LinkedList.__module__ = "torchdict.utils"  # its public home (pickles name it there)

_register_pytree()
