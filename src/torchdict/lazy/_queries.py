"""What a lazy stack says about itself without stacking its members: keys in upstream's orders, sizes
(``bytes``, ``param_count``), ``dtype``, ``depth``, the kind of an entry, non-tensor entries.

Upstream tensordict 0.15.3 answers these from the members (so ragged leaves are fine), counting the
exclusive keys where it walks every member's leaves (``bytes``, ``param_count``, ``dtype``) and only
the shared keys where it walks the stack's keys (``depth``, ``sorted_keys``, ``non_tensor_items``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional

import torch

from ._ops import _MISSING
from ._reductions import member_leaves

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object

_Tensor = torch.Tensor
_SENTINEL: Any = object()


class LazyQueriesMixin(LazyHost):
    """Queries; the class using it provides ``tensordicts``, ``keys`` (shared keys, post-order),
    ``get``, ``_member_values`` and ``__contains__``."""

    __slots__ = ()

    # ------------------------------------------------------------------ keys in upstream's orders
    def valid_keys(self, include_nested: bool = False, leaves_only: bool = False,
                   is_leaf: Optional[Callable] = None, *, sort: bool = False) -> list:
        """``keys(...)``: the keys every member has."""
        return self.keys(include_nested, leaves_only, is_leaf, sort=sort)

    @property
    def sorted_keys(self) -> list:
        """The top-level keys every member has, sorted."""
        return sorted(self.keys())

    def items(self, include_nested: bool = False, leaves_only: bool = False,
              is_leaf: Optional[Callable] = None, *, sort: bool = False) -> Iterator[tuple]:
        """``(key, self.get(key))`` for the keys every member has.

        Nested keys come in pre-order (a sub-TensorDict before its entries), as upstream's lazy
        stack lists them here (its ``keys()`` lists them in post-order). A ragged tensor entry raises
        the ``get`` error when the iteration reaches it.

        >>> import torch
        >>> from torchdict import TensorDict, lazy_stack
        >>> [(key, value.shape) for key, value in lazy_stack([TensorDict(a=torch.zeros(2))] * 3).items()]
        [('a', torch.Size([3, 2]))]
        """
        if sort:
            keys = self.keys(include_nested, leaves_only, is_leaf, sort=True)
        else:
            keys = _pre_order(self.keys(include_nested, leaves_only, is_leaf))
        for key in keys:
            yield key, self.get(key)

    def values(self, include_nested: bool = False, leaves_only: bool = False,
               is_leaf: Optional[Callable] = None, *, sort: bool = False) -> Iterator[Any]:
        """``self.get(key)`` in the order of :meth:`items`."""
        for _, value in self.items(include_nested, leaves_only, is_leaf, sort=sort):
            yield value

    # ------------------------------------------------------------------ sizes and dtypes of every member
    def bytes(self, *, count_duplicates: bool = True) -> int:
        """The bytes of every member's tensor leaves (ragged leaves and exclusive keys too)."""
        return sum(td.bytes(count_duplicates=count_duplicates) for td in self.tensordicts)

    def param_count(self, *, count_duplicates: bool = True) -> int:
        """The elements of every member's tensor leaves (ragged leaves and exclusive keys too)."""
        return sum(td.param_count(count_duplicates=count_duplicates) for td in self.tensordicts)

    @property
    def dtype(self) -> Optional[torch.dtype]:
        """The dtype every member's tensor leaves share, or None (exclusive keys count)."""
        dtypes = {leaf.dtype for leaf in member_leaves(self)}
        return dtypes.pop() if len(dtypes) == 1 else None

    @property
    def depth(self) -> int:
        """Levels of nested TensorDicts among the keys every member has."""
        depths = [len(key) - 1 for key in self.keys(True, True) if isinstance(key, tuple)]
        return max(depths, default=0)

    def data_ptr(self, *, storage: bool = False) -> Any:
        """A TensorDict (no batch) holding each member's ``data_ptr()`` under ``"0"``, ``"1"``, ..."""
        from ..tensordict import TensorDict

        return TensorDict({str(position): td.data_ptr(storage=storage) for position, td in
                           enumerate(self.tensordicts)}, batch_size=[])

    def is_contiguous(self) -> bool:
        """False: a lazy stack is never one contiguous block (as upstream)."""
        return False

    def is_shared(self) -> bool:
        """True when every member's leaves are in shared memory."""
        return all(td.is_shared() for td in self.tensordicts)

    def is_memmap(self) -> bool:
        """True when every member's leaves are memory-mapped."""
        return all(td.is_memmap() for td in self.tensordicts)

    # ------------------------------------------------------------------ entries
    def entry_class(self, key: Any) -> type:
        """The class of the stacked entry at ``key``: ``torch.Tensor``, ``LazyStackedTensorDict`` for
        sub-TensorDicts, ``NonTensorStack`` for non-tensor data (without stacking ragged tensors);
        ``NoneType`` when some member lacks ``key`` (as upstream)."""
        from ..lazy import LazyStackedTensorDict
        from ..nontensor import NonTensorStack

        values = self._member_values(key)
        if values is _MISSING:
            return type(None)  # as upstream: the class of the missing entry, None
        if all(isinstance(value, _Tensor) for value in values):
            return _Tensor
        if all(hasattr(value, "keys") for value in values):
            return LazyStackedTensorDict
        return NonTensorStack

    def is_non_tensor(self, key: Any) -> bool:
        """True when ``key`` holds non-tensor data (every member must have it: KeyError otherwise)."""
        from ..lazy import _missing_key_error
        from ..nontensor import is_non_tensor

        values = self._member_values(key)
        if values is _MISSING:
            raise _missing_key_error(key, self.keys())
        return all(is_non_tensor(value) for value in values)

    def non_tensor_items(self, include_nested: bool = False) -> tuple:
        """``(key, stacked non-tensor entry)`` for the non-tensor keys every member has."""
        keys = self.keys(include_nested)
        return tuple((key, self.get(key)) for key in keys if self._holds_non_tensor(key))

    def _holds_non_tensor(self, key: Any) -> bool:
        from ..nontensor import is_non_tensor

        values = self._member_values(key)
        return values is not _MISSING and all(is_non_tensor(value) for value in values)

    def get_non_tensor(self, key: Any, default: Any = _SENTINEL) -> Any:
        """The stacked values of a non-tensor entry (nested lists along the batch dims); a tensor entry as
        ``get``. ``default`` when some member lacks the key (a KeyError without one)."""
        value = self.get(key, _SENTINEL)
        if value is _SENTINEL:
            if default is _SENTINEL:
                from ..lazy import _missing_key_error

                raise _missing_key_error(key, self.keys())
            return default
        return value.tolist() if hasattr(value, "tolist") and self._holds_non_tensor(key) else value

    # ------------------------------------------------------------------ device and dtype questions
    @property
    def is_cpu(self) -> bool:
        """True when the stack's device is a CPU (False without a device)."""
        return self.device is not None and self.device.type == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    @property
    def is_meta(self) -> bool:
        return self.device is not None and self.device.type == "meta"

    def is_floating_point(self) -> bool:
        """True when every stacked tensor leaf is floating point, looked at in key order: the first that is
        not answers False, and a ragged leaf reached before raises the ragged-read error (as upstream)."""
        from ._ops import is_ragged
        from ..lazy import _ragged_error

        for key in self.keys(True, True):
            values = self._member_values(key)
            if not all(isinstance(value, _Tensor) for value in values):
                continue
            if is_ragged(values):
                raise _ragged_error(key, [value.shape for value in values])
            if not values[0].is_floating_point():
                return False
        return True


def _pre_order(keys: List[Any]) -> List[Any]:
    """``keys`` (a post-order walk: entries before their sub-TensorDict) in pre-order (a sub-TensorDict
    before its entries), each level in the order its entries first appear."""
    paths = [(key,) if isinstance(key, str) else tuple(key) for key in keys]
    return [path[0] if len(path) == 1 else path for path in _pre_order_paths(paths)]


def _pre_order_paths(paths: List[tuple]) -> List[tuple]:
    groups: dict = {}
    for path in paths:  # dicts keep the order in which each first part first appears
        groups.setdefault(path[0], []).append(path)
    ordered: List[tuple] = []
    for root, group in groups.items():
        if (root,) in group:
            ordered.append((root,))
        ordered += [(root, *rest) for rest in _pre_order_paths([path[1:] for path in group if len(path) > 1])]
    return ordered
