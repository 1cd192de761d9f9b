"""Key-structure operations of a lazy stack, member by member, as upstream tensordict 0.15.3 does them.

Upstream runs these on each member, so ragged leaves are fine and exclusive keys are
kept (``split_keys``, ``separates``, ``fill_``, ``create_nested``, ``update_``, ...).
In-place ones check every member first (the key must be in each of them) or write
member by member with the earlier members' writes undone if a later one fails, so a
failed call changes nothing.

Conversions that would silently drop exclusive keys raise upstream's
``RuntimeError("the method <name> cannot complete when there are exclusive keys.")``
(``to_dict``, ``numpy``, ``to_namedtuple``, ``state_dict``, ``flatten_keys``,
``unflatten_keys``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from .._base import TensorCollection
from .._errors import locked_error, missing_key_error
from .._keys import key_to_tuple

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object

_NO: Any = object()


def exclusive_keys_error(method: str) -> RuntimeError:
    # Upstream's wording.
    return RuntimeError(f"the method {method} cannot complete when there are exclusive keys.")


class LazyKeyOpsMixin(LazyHost):
    """The class using it provides ``tensordicts``, ``stack_dim``, ``batch_size``, ``keys``, ``get``,
    ``set``, ``set_``, ``contiguous``, ``is_locked``, ``_member_values`` and ``_restack``."""

    __slots__ = ()

    # ------------------------------------------------------------------ exclusive keys
    def _has_exclusive_keys(self) -> bool:
        """True when some member holds a key (at any depth) that another lacks."""
        key_sets = [set(td.keys(True)) for td in self.tensordicts]
        if any(keys != key_sets[0] for keys in key_sets[1:]):
            return True
        return any(isinstance(td, LazyKeyOpsMixin) and td._has_exclusive_keys() for td in self.tensordicts)

    def _refuse_exclusive(self, method: str) -> None:
        if self._has_exclusive_keys():
            raise exclusive_keys_error(method)

    def to_dict(self, *, retain_none: bool = True, convert_tensors: Any = False, tolist_first: bool = False) -> dict:
        """The dense stack's ``to_dict`` (exclusive keys raise upstream's RuntimeError)."""
        self._refuse_exclusive("to_dict")
        return self.contiguous().to_dict(retain_none=retain_none, convert_tensors=convert_tensors,
                                         tolist_first=tolist_first)

    def numpy(self) -> Any:
        self._refuse_exclusive("to_dict")
        return self.contiguous().numpy()

    def to_namedtuple(self, dest_cls: Optional[Any] = None) -> Any:
        self._refuse_exclusive("to_dict")
        return self.contiguous().to_namedtuple(dest_cls)

    def state_dict(self, destination: Any = None, prefix: str = "", keep_vars: bool = False,
                   flatten: bool = True) -> Any:
        self._refuse_exclusive("state_dict")
        return self.contiguous().state_dict(destination, prefix, keep_vars, flatten)

    def flatten_keys(self, separator: str = ".", inplace: bool = False, is_leaf: Optional[Callable] = None) -> Any:
        """Each member's ``flatten_keys`` (a lazy stack; ``inplace``: the members' keys change)."""
        self._refuse_exclusive("flatten_keys")
        if inplace:
            self._check_members_writable()
            for td in self.tensordicts:
                td.flatten_keys(separator, inplace=True, is_leaf=is_leaf)
            return self
        return self._restack([td.flatten_keys(separator, is_leaf=is_leaf) for td in self.tensordicts],
                             self.stack_dim)

    def unflatten_keys(self, separator: str = ".", inplace: bool = False) -> Any:
        """Each member's ``unflatten_keys`` (a lazy stack; ``inplace``: the members' keys change)."""
        self._refuse_exclusive("unflatten_keys")
        if inplace:
            self._check_members_writable()
            for td in self.tensordicts:
                td.unflatten_keys(separator, inplace=True)
            return self
        return self._restack([td.unflatten_keys(separator) for td in self.tensordicts], self.stack_dim)

    def tolist(self, *, convert_nodes: bool = True, convert_tensors: Any = False, tolist_first: bool = False,
               as_linked_list: bool = False) -> Any:
        """Nested lists along the batch dims of each element's ``tolist`` (elements keep their exclusive
        keys; ragged leaves are fine)."""
        options = dict(convert_nodes=convert_nodes, convert_tensors=convert_tensors, tolist_first=tolist_first,
                       as_linked_list=as_linked_list)
        result = [element.tolist(**options) for element in self.unbind(0)]
        if as_linked_list:  # the outer list bound to the stack, as upstream's
            from .._linked_list import LinkedList

            return LinkedList(result, td=self)
        return result

    # ------------------------------------------------------------------ checks
    def _check_members_writable(self) -> None:
        if self.is_locked or any(td.is_locked for td in self.tensordicts):
            raise locked_error()

    def _require_key(self, key: Any) -> None:
        """The KeyError of the first member lacking ``key``, before anything changes."""
        for td in self.tensordicts:
            if key_to_tuple(key) not in td:
                raise missing_key_error(key, td.keys())

    def _each(self, method: str, *args: Any, **kwargs: Any) -> list:
        return [getattr(td, method)(*args, **kwargs) for td in self.tensordicts]

    # ------------------------------------------------------------------ writing entries
    def setdefault(self, key: Any, default: Any, inplace: bool = False) -> Any:
        """``get(key)`` when every member has ``key``; else ``set(key, default)`` first."""
        if key not in self:
            self.set(key, default, inplace=inplace)
        return self.get(key)

    def set_at_(self, key: Any, value: Any, index: Any, *, non_blocking: bool = False) -> Any:
        """Write ``value`` into the existing entry ``key`` at batch ``index``: one member's ``set_at_`` when
        ``index`` picks one member along the stack dim, else the stacked entry written at ``index`` and
        copied back into the members (a ragged entry raises then)."""
        split = self._split_index(index)
        if isinstance(split.stack_item, int):
            member_index = split.member_index if split.member_index else slice(None)
            self.tensordicts[split.stack_item].set_at_(key, value, member_index)
            return self
        stacked = self.get(key).clone()
        stacked[index] = value
        self.set_(key, stacked)
        return self

    def set_non_tensor(self, key: Any, value: Any) -> Any:
        """``member.set_non_tensor(key, value)`` in every member; returns self."""
        self._check_members_writable()
        self._each("set_non_tensor", key, value)
        return self

    def fill_(self, key: Any, value: Any) -> Any:
        """Fill the entry ``key`` of every member (ragged ones too) with ``value``; returns self."""
        self._require_key(key)
        self._each("fill_", key, value)
        return self

    def create_nested(self, key: Any) -> Any:
        """An empty sub-TensorDict at ``key`` in every member; returns self."""
        self._check_members_writable()
        self._each("create_nested", key)
        return self

    def clear(self) -> Any:
        """Delete the keys every member has (exclusive keys stay, as upstream); returns self."""
        keys = list(self.keys())
        if keys:
            self._check_members_writable()
        for key in keys:
            del self[key]
        return self

    def filter_empty_(self) -> Any:
        """Each member's ``filter_empty_()``; returns self."""
        self._each("filter_empty_")
        return self

    def rename_key_(self, old_key: Any, new_key: Any, safe: bool = False) -> Any:
        """Rename ``old_key`` in every member (each must have it); returns self."""
        self._check_members_writable()
        self._require_key(old_key)
        if safe:
            for td in self.tensordicts:
                if new_key in td.keys(True):
                    td.rename_key_(old_key, new_key, safe=True)  # the member's own error, before any change
        self._each("rename_key_", old_key, new_key, safe=safe)
        return self

    def rename_keys(self, mapping: Mapping, *, strict: bool = True) -> Any:
        """A lazy stack of the members with the keys of ``mapping`` renamed (all at once: ``{"a": "b",
        "b": "a"}`` swaps them); see :func:`torchdict._rename_keys.rename_keys`."""
        from .._rename_keys import rename_keys

        return self._restack([rename_keys(td, mapping, strict=strict) for td in self.tensordicts], self.stack_dim)

    def popitem(self) -> tuple:
        """Remove the last key every member has; returns ``(key, stacked value)``."""
        keys = list(self.keys())
        if not keys:
            raise KeyError("popitem(): tensordict is empty")
        key = keys[-1]
        value = self.get(key)
        del self[key]
        return key, value

    # ------------------------------------------------------------------ pieces of the key set
    def split_keys(self, *key_sets: Any, inplace: bool = False, default: Any = _NO, strict: bool = True,
                   reproduce_struct: bool = False) -> tuple:
        """Each member's ``split_keys``, restacked: one lazy stack per key set and one for the rest."""
        kwargs = dict(strict=strict, reproduce_struct=reproduce_struct)
        if default is not _NO:
            kwargs["default"] = default
        pieces = [td.split_keys(*key_sets, **kwargs) for td in self.tensordicts]
        stacks = [self._restack([member[position] for member in pieces], self.stack_dim)
                  for position in range(len(pieces[0]))]
        if inplace:
            self._check_members_writable()
            rest = stacks[-1]
            for td, remainder in zip(self.tensordicts, rest.tensordicts):
                for key in list(td.keys()):
                    if key not in remainder.keys():
                        del td[key]
            return (*stacks[:-1], self)
        return tuple(stacks)

    def separates(self, *keys: Any, default: Any = _NO, strict: bool = True, filter_empty: bool = True) -> Any:
        """Remove ``keys`` from every member; returns them as a lazy stack."""
        kwargs = dict(strict=strict, filter_empty=filter_empty)
        if default is not _NO:
            kwargs["default"] = default
        if strict and default is _NO:
            for key in keys:
                self._require_key(key)
        self._check_members_writable()
        return self._restack([td.separates(*keys, **kwargs) for td in self.tensordicts], self.stack_dim)

    # ------------------------------------------------------------------ updates from another collection
    def _source_parts(self, source: Any) -> list:
        """``source`` (a collection of this batch size, or a dict of full-batch values) as one part per
        member, along the stack dim."""
        if isinstance(source, Mapping) and not isinstance(source, TensorCollection):
            from ..tensordict import TensorDict

            source = TensorDict(source, batch_size=self.batch_size)
        if not isinstance(source, TensorCollection):
            raise TypeError(f"Expected a TensorDict or a dict, got {type(source).__name__}.")
        if source.batch_size[:len(self.batch_size)] != self.batch_size:
            raise RuntimeError(f"The source's batch size {source.batch_size} does not start with "
                               f"{self.batch_size}.")
        return list(source.unbind(self.stack_dim))

    def _member_writes(self, write: Callable[[Any, Any], Any], parts: Sequence[Any],
                       values_change: bool = True) -> None:
        """``write(member, part)`` for every member; the members written before a failing one are put
        back as they were (their entries, and their values too when ``values_change``: the writes
        copy into the existing tensors)."""
        backups = []
        try:
            for td, part in zip(self.tensordicts, parts):
                backups.append((td, td.copy(), td.clone() if values_change else None))
                write(td, part)
        except BaseException:
            for td, structure, values in backups[:-1]:
                for key in list(td.keys()):
                    del td[key]
                td.update(structure)
                if values is not None:
                    td.update_(values)
            raise

    def update_(self, input_dict_or_td: Any = None, clone: bool = False, *, non_blocking: bool = False,
                keys_to_update: Optional[Sequence[Any]] = None, **kwargs: Any) -> Any:
        """Each member's ``update_`` (copy into its existing entries) with its part of the source; without a
        source, the keyword arguments are the entries (as TensorDict's)."""
        parts = self._source_parts(kwargs if input_dict_or_td is None else input_dict_or_td)
        self._member_writes(lambda td, part: td.update_(part, clone=clone, keys_to_update=keys_to_update), parts)
        return self

    def copy_(self, tensordict: Any, non_blocking: bool = False) -> Any:
        """``update_(tensordict)``: copy its values into the members' entries."""
        return self.update_(tensordict, non_blocking=non_blocking)

    def update_at_(self, input_dict_or_td: Any, idx: Any, clone: bool = False, *, non_blocking: bool = False,
                   keys_to_update: Optional[Sequence[Any]] = None) -> Any:
        """Copy ``input_dict_or_td`` into the entries at batch index ``idx`` (through to the members)."""
        target = self[idx]
        target.update_(input_dict_or_td, clone=clone, keys_to_update=keys_to_update)
        return self

    def copy_at_(self, tensordict: Any, idx: Any, non_blocking: bool = False, *, fast: bool = True) -> Any:
        """``update_at_(tensordict, idx)``; ``fast=True`` raises upstream's RuntimeError (the tensor-only
        copy path is not for lazy stacks)."""
        if fast:
            raise RuntimeError("copy_at_(..., fast=True) requires the optimized tensor-only copy path, but the "
                               "source, destination, or index is not compatible. Use fast=False or update_at_ "
                               "for the general update semantics.")
        return self.update_at_(tensordict, idx)

    # ------------------------------------------------------------------ reading one entry
    def get_at(self, key: Any, index: Any, default: Any = None) -> Any:
        """``get(key)[index]``; ``default`` when some member lacks ``key`` (as upstream)."""
        value = self.get(key, _NO)
        return default if value is _NO else value[index]


__all__ = ["LazyKeyOpsMixin", "exclusive_keys_error"]
