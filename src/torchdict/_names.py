"""Optional names for the batch dimensions (one str or None per dim)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import torch

from ._errors import locked_error

if TYPE_CHECKING:
    from typing_extensions import Self
    from ._host import TensorDictHost
    from .tensordict import TensorDict
else:
    TensorDictHost = object


def check_names(names: Optional[Sequence[Optional[str]]], batch_size: torch.Size) -> Optional[list]:
    """Validated batch-dim names, stored as None when no dim is named (the TensorDict convention)."""
    if names is None:
        return None
    names = list(names)
    if len(names) != len(batch_size):
        raise ValueError(
            "the length of the dimension names must equate the tensordict batch_dims attribute. "
            f"Got {names} for batch_dims {len(batch_size)}."
        )
    named = [name for name in names if name is not None]
    if len(set(named)) != len(named):
        raise ValueError(f"Some dimension names are non-unique: {names}.")
    return names if named else None


def expand_ellipsis(names: tuple, current: list) -> tuple:
    """``refine_names`` arguments with ``...`` replaced by the current names of the dims it spans."""
    if Ellipsis not in names:
        return names
    position = names.index(Ellipsis)
    fill = len(current) - len(names) + 1
    return names[:position] + tuple(current[position:position + fill]) + names[position + 1:]


class NamesMixin(TensorDictHost):
    __slots__ = ()

    @property
    def names(self) -> list:
        return list(self._names) if self._names is not None else [None] * len(self._batch_size)

    @names.setter
    def names(self, value: Optional[Sequence[Optional[str]]]) -> None:
        if value is None:
            new_names = None
        else:
            new_names = check_names(value, self._batch_size)
        if self._is_locked and new_names != self._names:
            # A lock freezes the metadata with the keys (stricter than upstream 0.15.3, on purpose);
            # assigning the current names changes nothing and is allowed.
            raise locked_error()
        self._names = new_names

    def refine_names(self, *names: Optional[str]) -> Self:
        """Set names for the batch dims (``...`` keeps the names of the dims it spans); returns self."""
        self.names = expand_ellipsis(names, self.names)
        return self

    def rename_(self, *names: Optional[str], **rename_map: str) -> Self:
        """Rename batch dims in place, positionally or with ``old=new``; returns self."""
        if not names and not rename_map:
            return self
        # The final names first, assigned once: a refused rename changes nothing.
        current = list(names) if names else self.names
        for old, new in rename_map.items():
            if old not in current:
                raise ValueError(f"Dimension name {old!r} not found in {current}.")
            current[current.index(old)] = new
        self.names = current
        return self

    def rename(self, *names: Optional[str], **rename_map: str) -> "TensorDict":
        """A shallow copy with renamed batch dims."""
        return self.copy().rename_(*names, **rename_map)
