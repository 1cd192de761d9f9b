"""Row reads and writes of a ``PersistentTensorDict``: ``td[index]``, ``td[index] = value``, ``get_at``,
``set_at_``, ``update_at_`` and a ``DataLoader``'s ``__getitems__``.

Each reads or writes only the selected rows of each dataset (the plan comes from ``formats/_rows.py``); a
write casts and shapes every value before the first byte goes to the file, so a refused one writes nothing.
"""
from __future__ import annotations

from functools import partial
from numbers import Number
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import torch

from .._base import TensorCollection
from .._errors import locked_error, missing_key_error
from .._keys import key_to_tuple
from ..base import TensorDictBase
from ..nontensor import NonTensorData, NonTensorStack
from ._rows import RowPlan, plan_rows
from ._storage import GROUP, TENSOR, check_storable

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._h5_host import PersistentHost
    from .h5 import PersistentTensorDict
else:
    PersistentHost = object

__all__ = ["PersistentRowsMixin"]

_MISSING: Any = object()
_NON_TENSOR = (NonTensorData, NonTensorStack)


def _as_collection(value: Any) -> Any:
    """A tensorclass instance as the TensorDict holding its fields; any other value as it is."""
    if isinstance(value, TensorCollection) and not isinstance(value, TensorDictBase):
        return getattr(value, "_tensordict")
    return value


class PersistentRowsMixin(PersistentHost):
    """The row members of ``PersistentTensorDict`` (which provides ``_storage``, ``_node``, ``_kind``, ``_locate``...)."""

    __slots__ = ()

    def _index(self, index: Any) -> Any:
        plan = plan_rows(index, self.batch_size)
        result = self._read_rows(plan)
        if self._names is not None:
            from ..tensordict import TensorDict

            names = TensorDict({}, batch_size=self.batch_size, names=self._names)[plan.index].names
            if any(name is not None for name in names):
                result.names = names
        return result

    def _read_rows(self, plan: RowPlan) -> Any:
        from ..tensordict import TensorDict

        storage = self._storage
        entries: dict = {}
        for key in self._keys_str():
            node = self._node(key)
            kind = self._kind(node)
            if kind == TENSOR:
                if not plan.batch_size.numel():
                    # nothing selected: the empty result's shape is known without reading
                    shape = plan.batch_size + torch.Size(storage.shape(node))[plan.source_dims:]
                    entries[key] = self._to_device(torch.empty(shape, dtype=storage.dtype(node)))
                    continue
                tensor = plan.read(partial(storage.read_at, node), partial(storage.read_all, node))
                entries[key] = self._to_device(tensor)
            elif kind == GROUP:
                entries[key] = self._child(key, node)._read_rows(plan)
            else:
                entries[key] = self._read_node(key, node)[plan.index]
        batch = plan.batch_size + self.batch_size[plan.source_dims:]
        return TensorDict(entries, batch_size=batch, device=self._device)

    def __getitems__(self, indices: Any) -> Any:
        """The rows ``indices`` as one ``TensorDict`` (what a ``DataLoader`` asks a dataset for a batch)."""
        return self[indices]

    def get_at(self, key: Any, index: Any, default: Any = _MISSING) -> Any:
        """``td.get(key)[index]``, reading only the selected rows of the dataset."""
        keys = key_to_tuple(key)
        if keys not in self and not (len(keys) == 1 and keys[0] in self):
            if default is _MISSING:
                raise missing_key_error(key, self.keys(include_nested=True))
            return default
        parent, node = self._locate(keys)
        kind = parent._kind(node)
        if kind == TENSOR:
            plan = plan_rows(index, torch.Size(parent._storage.shape(node)))
            return parent._to_device(plan.read(partial(parent._storage.read_at, node),
                                               partial(parent._storage.read_all, node)))
        if kind == GROUP:
            return parent._child(keys[-1], node)[index]
        return parent._read_node(keys[-1], node)[index]

    def _set_at(self, index: Any, value: Any) -> None:
        plan = plan_rows(index, self.batch_size)
        self._check_writable()
        writes: list = []
        if isinstance(value, (Number, np.generic)) or (isinstance(value, torch.Tensor) and value.dim() == 0):
            # as upstream: a number goes into every tensor entry; the non-tensor ones are left alone
            scalar = torch.as_tensor(value)
            for key, node in self._tensor_nodes():
                writes.append((node, torch.as_tensor(scalar.item(), dtype=self._storage.dtype(node))))
        elif isinstance(value, torch.Tensor):
            for key, node in self._tensor_nodes():
                writes.append((node, value))
        else:
            writes = self._planned_row_writes(plan, value)
        # every value is cast and shaped before the first write: a refused one writes nothing
        prepared = []
        for node, tensor in writes:
            shape = torch.Size(self._storage.shape(node))
            target = plan.batch_size + shape[plan.source_dims:]
            try:
                prepared.append((node, tensor.to(self._storage.dtype(node)).expand(target), shape))
            except RuntimeError as err:
                raise RuntimeError(
                    f"td[index] = value: a value of shape {tuple(tensor.shape)} does not fit the indexed slot of "
                    f"shape {tuple(target)} (the dataset has shape {tuple(shape)}).") from err
        storage = self._storage
        if not plan.batch_size.numel():
            return  # no row selected: nothing to write (the values were checked above)
        for node, tensor, shape in prepared:
            plan.write(tensor, shape, partial(storage.write_at, node), partial(storage.read_all, node),
                       partial(storage.write_all, node), storage.dtype(node))

    def _planned_row_writes(self, plan: RowPlan, value: Any) -> list:
        """(node, tensor) for each leaf of ``value`` written at ``plan`` (missing datasets created first)."""
        from ..tensordict import TensorDict

        value = _as_collection(value)
        if not isinstance(value, TensorDictBase):
            try:
                value = TensorDict(value, batch_size=plan.batch_size)
            except RuntimeError:
                value = TensorDict(value, batch_size=[])
        if value.batch_size != plan.batch_size:
            try:
                value = value.expand(plan.batch_size)
            except RuntimeError as err:
                raise RuntimeError(f"Cannot broadcast the tensordict of batch size {value.batch_size} to the shape "
                                   f"of the indexed persistent tensordict {plan.batch_size}.") from err
        leaves = value.items(True, True, is_leaf=lambda cls: not issubclass(cls, TensorDictBase))
        for key, leaf in leaves:
            if isinstance(leaf, _NON_TENSOR):
                raise RuntimeError(f"Cannot write the non-tensor entry {key!r} at an index of a "
                                   "PersistentTensorDict: it is written as a whole. Set the entry instead.")
            check_storable(leaf, "td[index] = value", key, self._storage.format_name)
        new_keys = [key for key, _ in leaves if key not in self]
        if new_keys and self._locked:
            raise locked_error()
        for key, leaf in leaves:
            # a value that can't fill its slot is refused before a new entry is made
            if key not in new_keys:
                parent, node = self._locate(key_to_tuple(key))
                if parent._kind(node) == TENSOR:
                    target = plan.batch_size + torch.Size(parent._storage.shape(node))[plan.source_dims:]
                    try:
                        leaf.expand(target)
                    except RuntimeError as err:
                        raise RuntimeError(
                            f"td[index] = value: the value at {key!r} has shape {tuple(leaf.shape)}, which does not "
                            f"fit the indexed slot of shape {tuple(target)}.") from err
        writes = []
        for key, leaf in leaves:
            keys = key_to_tuple(key)
            if key in new_keys:
                # as on a TensorDict: a new entry, zeros outside the rows written
                shape = self.batch_size + leaf.shape[len(plan.batch_size):]
                self.set(keys, torch.zeros(shape, dtype=leaf.dtype))
            parent, node = self._locate(keys)
            if parent._kind(node) != TENSOR:
                raise RuntimeError(f"td[index] = value: the entry at {key!r} is not a tensor in the file.")
            writes.append((node, leaf))
        return writes

    def set_at_(self, key: Any, value: Any, index: Any, *, non_blocking: bool = False) -> Self:
        """``td[key][index] = value``, writing only those rows of the dataset (file writes are synchronous:
        ``non_blocking`` changes nothing)."""
        keys = key_to_tuple(key)
        parent, node = self._locate(keys)
        if parent._kind(node) != TENSOR:
            raise RuntimeError(f"set_at_: the entry at {key!r} is not a tensor dataset.")
        parent._check_writable()
        storage = parent._storage
        shape = torch.Size(storage.shape(node))
        plan = plan_rows(index, shape)
        tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        tensor = tensor.to(storage.dtype(node)).expand(plan.batch_size)
        plan.write(tensor, shape, partial(storage.write_at, node), partial(storage.read_all, node),
                   partial(storage.write_all, node), storage.dtype(node))
        return self

    def update_at_(self, input_dict_or_td: Any, idx: Any, clone: bool = False, *, non_blocking: bool = False,
                   keys_to_update: Optional[Sequence[Any]] = None) -> Self:
        """Write the entries of ``input_dict_or_td`` at the rows ``idx`` (every key must exist)."""
        from ..tensordict import TensorDict

        value = input_dict_or_td
        if not isinstance(value, TensorDictBase):
            value = TensorDict(value, batch_size=[])
        if keys_to_update is not None:
            value = value.select(*keys_to_update, strict=False)
        missing = [key for key in value.keys(True, True) if key not in self]
        if missing:
            raise missing_key_error(missing[0], self.keys(include_nested=True))
        self._set_at(idx, value)
        return self
