"""Conversions out of a TensorDict and size introspection (``ConversionsMixin``).

``to_tensordict`` (a plain TensorDict deep copy), ``to_namedtuple``, ``tolist`` (one dict per batch element),
``numpy`` (nested dicts of arrays), ``filter_non_tensor_data``, ``param_count``, ``bytes``
and ``data_ptr``, with upstream tensordict's signatures.
"""
from __future__ import annotations

from collections import namedtuple
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Union

import torch

from ._apply import rebuild, tensor_leaves, unwrap
from ._base import TensorCollection
from .nontensor import NON_TENSOR_TYPES

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_Tensor = torch.Tensor


def _distinct(leaves: List[torch.Tensor], count_duplicates: bool) -> List[torch.Tensor]:
    # A tensor object held under several keys counts once; views of one storage are distinct
    # tensors and each counts (as upstream).
    if count_duplicates:
        return leaves
    return list({id(leaf): leaf for leaf in leaves}.values())


def _ordered_leaves(td: Any, order: Any) -> List[torch.Tensor]:
    """The tensor leaves in ``keys(True, True)`` order, by sorted key (``order=True``), or in the order of a
    list naming every leaf key (anything else is a ``RuntimeError``, as upstream)."""
    from ._keys import key_to_tuple

    pairs = [(key, leaf) for key, leaf in td.items(include_nested=True, leaves_only=True)
             if isinstance(leaf, torch.Tensor)]
    if order is None or order is False:
        return [leaf for _, leaf in pairs]
    by_key = {key_to_tuple(key): leaf for key, leaf in pairs}
    if order is True:
        return [by_key[key] for key in sorted(by_key, key=".".join)]
    wanted = [key_to_tuple(key) for key in order]
    if set(wanted) != set(by_key) or len(wanted) != len(by_key):
        raise RuntimeError("The provided set of keys differs from the tensordict list of keys.")
    return [by_key[key] for key in wanted]


class ConversionsMixin(TensorDictHost):
    __slots__ = ()

    def to_tensordict(self, *, retain_none: Any = None) -> Any:
        """A plain TensorDict copy: new tensors (``clone``), nested tensorclasses as TensorDicts.

        Unlocked; device and names kept. ``retain_none`` is accepted for upstream's signature
        (it only matters for a tensorclass's ``None`` fields).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.zeros(2))
        >>> copy = td.to_tensordict()
        >>> copy["a"] is td["a"], torch.equal(copy["a"], td["a"])
        (False, True)
        """
        from .tensordict import TensorDict

        storage: dict = {}
        for key, value in self._tensordict.items():
            if isinstance(value, _Tensor):
                # clone() of a tensor subclass (a MemoryMappedTensor) gives a plain tensor.
                storage[key] = torch.Tensor.clone(value)
            elif isinstance(value, TensorCollection):
                storage[key] = unwrap(value).to_tensordict(retain_none=retain_none)
            else:
                storage[key] = value.clone()
        return TensorDict._new_unsafe(storage, self._batch_size, self._device, self._names)

    def as_tensor(self) -> Any:
        """The leaves converted with their own ``as_tensor()`` method where they have one (kept otherwise:
        plain tensors and memory-mapped tensors have none); a locked TensorDict gives a locked result."""
        def convert(leaf: torch.Tensor) -> torch.Tensor:
            method = getattr(type(leaf), "as_tensor", None)
            return method(leaf) if callable(method) else leaf

        result = rebuild(self, iter([convert(leaf) for leaf in tensor_leaves(self)]), self._batch_size)
        if self._is_locked:
            result._lock_tree()
        return result

    def cat_from_tensordict(self, dim: int = 0, *, sorted: Any = None, out: Optional[torch.Tensor] = None
                            ) -> torch.Tensor:
        """``torch.cat`` of every tensor leaf (``dim`` counts the leaves' dims); ``sorted=True`` orders the leaves
        by key, a list of every leaf key gives the order.

        >>> td = TensorDict(a=torch.zeros(2, 1), b=torch.ones(2, 1), batch_size=[2])
        >>> td.cat_from_tensordict(1)
        tensor([[0., 1.],
                [0., 1.]])
        """
        leaves = _ordered_leaves(self, sorted)
        return torch.cat(leaves, dim) if out is None else torch.cat(leaves, dim, out=out)

    def stack_from_tensordict(self, dim: int = 0, *, sorted: Any = None, out: Optional[torch.Tensor] = None
                              ) -> torch.Tensor:
        """``torch.stack`` of every tensor leaf (they must share one shape); ``sorted`` as in
        :meth:`cat_from_tensordict`."""
        leaves = _ordered_leaves(self, sorted)
        return torch.stack(leaves, dim) if out is None else torch.stack(leaves, dim, out=out)

    def densify(self, layout: torch.layout = torch.strided) -> Any:
        """This TensorDict with every lazy stack it holds made dense (a TensorDict: equal shapes stacked, others
        as nested tensors of ``layout`` along the stack dim); a TensorDict without lazy stacks gives a new
        TensorDict over the same leaves."""
        from ._densify import densify

        return densify(self, layout)

    def attrs(self, *, fields: Sequence[str] = ("device", "dtype", "shape"), num_threads: Optional[int] = None) -> Any:
        """A TensorDict (no batch dims) describing each tensor leaf with a :class:`~torchdict.TensorAttrs` (its
        ``fields``: device, dtype, shape); non-tensor entries are kept.

        >>> TensorDict(a=torch.zeros(3), batch_size=[3]).attrs()["a"].tgt_dtype
        torch.float32
        """
        from ._tensor_attrs import attrs

        return attrs(self, fields, num_threads)

    def to_pytree(self) -> Any:
        """The nested lists / tuples / dicts ``from_pytree`` built this TensorDict from (self when it was not).

        >>> TensorDict.from_pytree({"a": [torch.zeros(2), torch.ones(2)]}).to_pytree()
        {'a': [tensor([0., 0.]), tensor([1., 1.])]}
        """
        from ._pytree_convert import to_pytree

        return to_pytree(self)

    def to_namedtuple(self, dest_cls: Optional[Any] = None) -> Any:
        """The entries as a namedtuple of class ``GenericDict`` (a new class per level, fields in key
        order): tensors as they are (not copied), nested TensorDicts and tensorclasses as nested
        ``GenericDict``, non-tensor entries as their values. A key that is not a valid field name
        raises ``ValueError``.

        ``dest_cls`` is called with the entries as keyword arguments instead. A namedtuple class
        is used for this level only (its nested levels are ``GenericDict``); any other callable
        (``dict``, ``types.SimpleNamespace``, ...) for every level.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.zeros(2), n={"s": "text"}).to_namedtuple()
        GenericDict(a=tensor([0., 0.]), n=GenericDict(s='text'))
        >>> TensorDict(a=torch.zeros(2), n={"s": "text"}).to_namedtuple(dest_cls=dict)
        {'a': tensor([0., 0.]), 'n': {'s': 'text'}}
        """
        # A namedtuple class has fixed fields, so it cannot describe the nested levels.
        nested_cls = None if hasattr(dest_cls, "_fields") else dest_cls
        values: dict = {}
        for key, value in self._tensordict.items():
            if isinstance(value, _Tensor):
                values[key] = value
            elif isinstance(value, TensorCollection):
                values[key] = unwrap(value).to_namedtuple(nested_cls)
            else:
                values[key] = value.data
        make = namedtuple("GenericDict", list(values)) if dest_cls is None else dest_cls
        return make(**values)

    def tolist(self, *, convert_nodes: bool = True, convert_tensors: Union[bool, str] = False,
               tolist_first: bool = False, as_linked_list: bool = False) -> Any:
        """The batch as nested lists, one entry per element: a dict (``convert_nodes=True``) or a
        TensorDict. ``convert_tensors=True`` turns each tensor into Python numbers (``"numpy"``:
        arrays). With no batch dims, the result is that one entry. ``tolist_first`` is accepted for
        upstream's signature and changes nothing here. ``as_linked_list``: the outer list is a
        ``torchdict.utils.LinkedList`` bound to this TensorDict (``result[i] = {...}`` writes ``self[i]``),
        as upstream's.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.arange(2.0), batch_size=[2]).tolist(convert_tensors=True)
        [{'a': 0.0}, {'a': 1.0}]
        """
        del tolist_first

        def entry(element: Any) -> Any:
            if not convert_nodes:
                return element
            return element.to_dict(convert_tensors=convert_tensors)

        def walk(td: Any, depth: int) -> Any:
            if depth == 0:
                return entry(td)
            return [walk(item, depth - 1) for item in td.unbind(0)]

        result = walk(self, self.batch_dims)
        if as_linked_list and self.batch_dims:
            from ._linked_list import LinkedList

            return LinkedList(result, td=self)
        return result

    def numpy(self) -> dict:
        """Nested dicts of numpy arrays (non-tensor entries as their values, stacks as lists).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.ones(2)).numpy()["a"].tolist()
        [1.0, 1.0]
        """
        return self.to_dict(convert_tensors="numpy")

    def filter_non_tensor_data(self) -> Any:
        """A TensorDict without the non-tensor entries, at every level (the leaves are shared).

        >>> from torchdict import TensorDict
        >>> list(TensorDict(a=1, s="text").filter_non_tensor_data().keys())
        ['a']
        """
        storage: dict = {}
        for key, value in self._tensordict.items():
            if type(value) in NON_TENSOR_TYPES:
                continue
            if isinstance(value, TensorCollection):
                inner = unwrap(value)
                filtered = inner.filter_non_tensor_data()
                value = value if filtered._tensordict.keys() == inner._tensordict.keys() else filtered
            storage[key] = value
        return self._new_like(storage)

    def param_count(self, *, count_duplicates: bool = True) -> int:
        """How many elements the tensor leaves hold (``count_duplicates=False``: a tensor held
        under several keys counts once).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.zeros(3), b={"c": torch.zeros(3, 2)}).param_count()
        9
        """
        return sum(leaf.numel() for leaf in _distinct(tensor_leaves(self), count_duplicates))

    def bytes(self, *, count_duplicates: bool = True) -> int:
        """How many bytes the tensor leaves' elements take (an expanded leaf counts its full
        shape, as ``numel() * element_size()``).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.zeros(3), b={"c": torch.zeros(3, 2)}).bytes()
        36
        """
        return sum(leaf.numel() * leaf.element_size()
                   for leaf in _distinct(tensor_leaves(self), count_duplicates))

    def data_ptr(self, *, storage: bool = False) -> Any:
        """A TensorDict (no batch) of each tensor leaf's ``data_ptr()`` (with ``storage=True``:
        its storage's), as 0-dim int64 tensors; non-tensor entries are left out."""
        from .tensordict import TensorDict

        result: dict = {}
        for key, value in self._tensordict.items():
            if isinstance(value, _Tensor):
                pointer = value.untyped_storage().data_ptr() if storage else value.data_ptr()
                result[key] = torch.tensor(pointer, dtype=torch.int64)
            elif isinstance(value, TensorCollection):
                result[key] = unwrap(value).data_ptr(storage=storage)
        return TensorDict._new_unsafe(result, torch.Size(()), None)
