"""Names of a lazy stack's batch dims: the members' names, with the stack dim's own name.

As upstream, the stack dim's name is kept by the stack (the members don't have that dim), and
renaming a lazy stack renames its members' dims too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Sequence

from .._errors import locked_error

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object


class LazyNamesMixin(LazyHost):
    """The class using it provides ``tensordicts``, ``stack_dim``, ``batch_size``, ``is_locked`` and a
    ``_stack_name`` slot."""

    __slots__ = ()

    @property
    def names(self) -> List[Optional[str]]:
        """The members' dim names (the first member's) with the stack dim's name inserted."""
        names = list(self.tensordicts[0].names)
        names.insert(self.stack_dim, self._stack_name)
        return names

    @names.setter
    def names(self, value: Optional[Sequence[Optional[str]]]) -> None:
        self.rename_(*(value if value is not None else [None] * len(self.batch_size)))

    def _set_names(self, names: List[Optional[str]]) -> None:
        if len(names) != len(self.batch_size):
            raise ValueError("the length of the dimension names must equate the tensordict batch_dims attribute. "
                             f"Got {names} for batch_dims {len(self.batch_size)}.")
        named = [name for name in names if name is not None]
        if len(set(named)) != len(named):
            raise ValueError(f"Some dimension names are non-unique: {names}.")
        if names == self.names:
            return
        if self.is_locked:
            raise locked_error()
        member_names = names[:self.stack_dim] + names[self.stack_dim + 1:]
        for td in self.tensordicts:  # checked above: the members accept them
            td.names = member_names
        self._stack_name = names[self.stack_dim]

    def rename_(self, *names: Optional[str], **rename_map: str) -> Any:
        """Rename the batch dims in place (positionally, or ``old=new``), the members' dims too; returns self."""
        if not names and not rename_map:
            return self
        if len(names) == 1 and isinstance(names[0], (list, tuple)):
            names = tuple(names[0])
        current = list(names) if names else self.names
        for old, new in rename_map.items():
            if old not in current:
                raise ValueError(f"Dimension name {old!r} not found in {current}.")
            current[current.index(old)] = new
        self._set_names(current)
        return self

    def rename(self, *names: Optional[str], **rename_map: str) -> Any:
        """A copy (same leaves, members copied) with renamed batch dims."""
        result = self.copy()
        result._stack_name = self._stack_name
        return result.rename_(*names, **rename_map)

    def refine_names(self, *names: Any) -> Any:
        """Set names for the batch dims (``...`` keeps the names of the dims it spans); returns self."""
        if Ellipsis in names:
            position = names.index(Ellipsis)
            fill = len(self.batch_size) - len(names) + 1
            names = names[:position] + tuple(self.names[position:position + fill]) + names[position + 1:]
        self._set_names(list(names))
        return self
