"""The leaf-wise recursions, and apply / apply_ / named_apply on top of them.

- :func:`map_batch` is used by every op that acts on the batch dimensions
  (indexing, shape ops, stacking, ...): it applies a tensor function to each
  tensor leaf, the same function to the index grid of each non-tensor stack,
  and rebuilds nested TensorDicts (and tensorclasses) whose batch sizes follow
  from the parent's new batch size.
- :func:`tensor_leaves` / :func:`rebuild` split a TensorDict into the flat
  list of its tensor leaves and put a list of results back into the same
  structure; ops that process all leaves at once (``torch._foreach_*``
  arithmetic, reductions, ``to``, ``clone``) use them, with
  :func:`flat_tensors` as the shortcut for a TensorDict holding only tensors.
- :func:`apply` is the user-facing variant: ``fn`` per leaf, ``None`` drops a key.
"""
from __future__ import annotations

import operator
from itertools import compress, repeat
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from ._apply_tree import plain_tree_storage
from ._base import TensorCollection
from ._accel import lengths_fit
from ._convert import fits_batch, parse_batch_size, parse_device, to_leaf
from ._errors import batch_mismatch_error, inplace_error, missing_key_error
from ._keys import key_to_tuple
from ._unbatched import UnbatchedTensor as _Unbatched, with_batch_size
from ._write_checks import check_copy
from .nontensor import NonTensorData, NonTensorStack

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_Tensor = torch.Tensor
_MISSING: Any = object()


def is_sub_collection(value: Any) -> bool:
    """A nested TensorDict (or tensorclass), as opposed to a tensor or non-tensor data."""
    return isinstance(value, TensorCollection) and not isinstance(value, (NonTensorData, NonTensorStack))


def unwrap(value: Any) -> Any:
    """The TensorDict behind a collection (a tensorclass keeps one in ``_tensordict``)."""
    inner = getattr(value, "_tensordict", None)
    return value if type(inner) is dict else inner


def rewrap(original: Any, td: Any) -> Any:
    """Put ``td`` back in the same kind of collection as ``original``."""
    return td if unwrap(original) is original else original._rewrap(td)


def map_batch(td: Any, fn: Callable[[torch.Tensor], torch.Tensor], batch_size: torch.Size,
              device: Any = _MISSING, unbatched: Optional[Callable] = None) -> Any:
    """A new TensorDict of batch ``batch_size`` whose leaves are ``fn(leaf)``.

    ``fn`` must act on the leading (batch) dims only and keep any trailing
    dims, so that a nested TensorDict with a longer batch gets
    ``batch_size + its extra dims``. An ``UnbatchedTensor`` leaf is kept (with
    the new batch size), or given to ``unbatched`` when the op acts on values too.
    """
    storage = _map_batch_storage(td._tensordict, fn, len(td._batch_size), batch_size, unbatched)
    return td._new_unsafe(storage, batch_size, td._device if device is _MISSING else device)


def _map_batch_storage(storage: dict, fn: Callable, old_dims: int, batch_size: torch.Size,
                       unbatched: Optional[Callable] = None) -> dict:
    result = {}
    for key, leaf in storage.items():
        if type(leaf) is _Tensor:
            result[key] = fn(leaf)
        elif isinstance(leaf, _Tensor):
            # An UnbatchedTensor has no batch dims: the same payload, with its TensorDict's new batch size.
            if isinstance(leaf, _Unbatched):
                leaf = leaf if unbatched is None else unbatched(leaf)
                result[key] = with_batch_size(leaf, batch_size + leaf.batch_size[old_dims:])
            else:
                result[key] = fn(leaf)
        elif isinstance(leaf, TensorCollection):
            inner = unwrap(leaf)
            if type(getattr(inner, "_tensordict", None)) is not dict:  # a nested lazy stack: its own path
                from ._nested_foreign import map_foreign_batch

                result[key] = map_foreign_batch(leaf, fn, old_dims, batch_size)
                continue
            inner_batch = batch_size + inner._batch_size[old_dims:]
            mapped = inner._new_unsafe(
                _map_batch_storage(inner._tensordict, fn, old_dims, batch_size, unbatched), inner_batch,
                inner._device
            )
            result[key] = rewrap(leaf, mapped)
        elif isinstance(leaf, NonTensorData):
            result[key] = leaf._with_batch_size(batch_size + leaf.batch_size[old_dims:])
        else:
            result[key] = leaf._batch_op(fn)
    return result


def flat_tensors(storage: dict) -> Optional[list]:
    """The values of ``storage`` when every one is a tensor (the common, flat case), else None.

    Leaf-wise ops use it to skip the recursion: the result storage is then
    ``dict(zip(storage, results))``.
    """
    values = list(storage.values())
    for leaf_type in set(map(type, values)):  # a C-level pass: usually one type, torch.Tensor
        if not issubclass(leaf_type, _Tensor) or (leaf_type is not _Tensor and issubclass(leaf_type, _Unbatched)):
            return None  # (an UnbatchedTensor needs the per-leaf path: rebuild gives it its batch size)
    return values


def tensor_leaves(td: Any, out: Optional[list] = None) -> list:
    """Every tensor leaf of ``td`` (nested ones too), in the order :func:`rebuild` consumes them."""
    out = [] if out is None else out
    for leaf in td._tensordict.values():
        if isinstance(leaf, _Tensor):
            out.append(leaf)
        elif isinstance(leaf, TensorCollection):
            inner = unwrap(leaf)
            if type(getattr(inner, "_tensordict", None)) is dict:
                tensor_leaves(inner, out)
            else:  # a nested lazy stack: its members' leaves
                from ._nested_foreign import foreign_leaves

                foreign_leaves(leaf, out)
    return out


def keep_non_tensor(leaf: Any, batch_size: torch.Size) -> Any:
    """Default for :func:`rebuild`: a non-tensor leaf follows the new batch size."""
    if leaf.batch_size == batch_size:
        return leaf
    if isinstance(leaf, NonTensorData):
        return leaf._with_batch_size(batch_size)
    return leaf._batch_op(lambda grid: grid.expand(batch_size))


DROP: Any = object()  # returned by a rebuild's ``non_tensor`` hook to leave the entry out


def rebuild(td: Any, results: Any, batch_size: torch.Size, batch_of: Optional[Callable] = None,
            non_tensor: Callable = keep_non_tensor, device: Any = _MISSING) -> Any:
    """A TensorDict shaped like ``td`` whose tensor leaves are taken, in order, from ``results``.

    ``results`` is an iterator yielding one tensor per entry of
    :func:`tensor_leaves` (``td``'s order). Nested collections get the batch
    ``batch_of(their old batch)``, by default ``batch_size`` followed by their
    extra dims. ``non_tensor(leaf, new_batch)`` maps each non-tensor leaf (or
    returns :data:`DROP`). With ``device``, the result and every nested
    collection get that device; otherwise each keeps its own. Names are kept
    where the batch size is unchanged.
    """
    n_old = len(td._batch_size)
    if batch_of is None:
        def batch_of(old: torch.Size) -> torch.Size:
            return batch_size + old[n_old:]
    storage = _rebuild_storage(td._tensordict, results, batch_of, non_tensor, device)
    names = td._names if batch_size == td._batch_size else None
    return td._new_unsafe(storage, batch_size, td._device if device is _MISSING else device, names)


def _rebuild_storage(storage: dict, results: Any, batch_of: Callable, non_tensor: Callable, device: Any) -> dict:
    out = {}
    for key, leaf in storage.items():
        if type(leaf) is _Tensor:
            out[key] = next(results)
        elif isinstance(leaf, _Tensor):
            value = next(results)
            if isinstance(value, _Unbatched):  # fn kept it unbatched: it follows its TensorDict's batch size
                value = with_batch_size(value, batch_of(leaf.batch_size) if isinstance(leaf, _Unbatched)
                                        else value.batch_size)
            out[key] = value
        elif isinstance(leaf, TensorCollection):
            inner = unwrap(leaf)
            if type(getattr(inner, "_tensordict", None)) is not dict:  # a nested lazy stack: rebuilt member-wise
                from ._nested_foreign import rebuild_foreign

                out[key] = rebuild_foreign(leaf, results, batch_of, non_tensor, device)
                continue
            inner_batch = batch_of(inner._batch_size)
            inner_storage = _rebuild_storage(inner._tensordict, results, batch_of, non_tensor, device)
            names = inner._names if inner_batch == inner._batch_size else None
            inner_device = inner._device if device is _MISSING else device
            out[key] = rewrap(leaf, inner._new_unsafe(inner_storage, inner_batch, inner_device, names))
        else:
            value = non_tensor(leaf, batch_of(leaf.batch_size))
            if value is not DROP:
                out[key] = value
    return out


def apply(td: Any, fn: Callable, others: tuple, *, batch_size: Any = None, device: Any = _MISSING,
          names: Any = _MISSING, inplace: bool = False, default: Any = _MISSING, filter_empty: Optional[bool] = None,
          propagate_lock: bool = False, call_on_nested: bool = False, is_leaf: Optional[Callable] = None,
          out: Any = None, named: bool = False, nested_keys: bool = False, prefix: tuple = ()) -> Any:
    """``fn`` on every tensor leaf of ``td`` (and the same-key leaves of ``others``); see ``ApplyMixin.apply``."""
    new_batch = td._batch_size if batch_size is None else parse_batch_size(batch_size)
    new_device = td._device if device is _MISSING else parse_device(device)
    run = _ApplyRun(fn, new_device, inplace, default, filter_empty, call_on_nested, is_leaf, named, nested_keys)
    other_storages = [_storage_of(other) for other in others]
    storage = run.storage(td, other_storages, new_batch, prefix)
    if inplace:
        # Every result was computed and checked before this first write: a failing fn or a result that
        # doesn't fit its leaf leaves td unchanged.
        for leaf, value in run.pending:
            leaf.copy_(value)
        return td
    if out is not None:
        out.update(td._new_unsafe(storage, new_batch, new_device), inplace=True)
        return out
    if not storage and (filter_empty is True or (run.dropped and filter_empty is None)):
        return None
    result = td._new_unsafe(storage, new_batch, new_device)
    if batch_size is None and names is _MISSING:
        result._names = td._names
    elif names is not _MISSING and names is not None:
        result.names = names
    if propagate_lock and td._is_locked:
        result._lock_tree()
    return result


def _storage_of(other: Any) -> dict:
    if isinstance(other, TensorCollection):
        return unwrap(other)._tensordict
    if isinstance(other, dict):
        return other
    raise TypeError(f"apply() expects TensorDicts as the other arguments, got {type(other).__name__}.")


def _non_tensor_for_batch(leaf: Any, batch_size: torch.Size) -> Any:
    """A non-tensor leaf (or an UnbatchedTensor, which ``fn`` skips) carried into a result of batch ``batch_size``."""
    if isinstance(leaf, _Unbatched):
        return with_batch_size(leaf, batch_size)
    if leaf.batch_size == batch_size:
        return leaf
    if isinstance(leaf, NonTensorData):
        return leaf._with_batch_size(batch_size)  # (its class too: a MetaData stays one)
    if leaf.batch_size.numel() != batch_size.numel():
        # One value per element can't be re-laid out over a different number of elements:
        # the whole list becomes one shared value.
        data = leaf.data
        return NonTensorData(data, batch_size, leaf.device)
    return leaf._with_batch_size(batch_size)


# C-level getters torch.compile can trace too (Dynamo can't call an attrgetter made outside the compiled code).
# The getset descriptors' readers (torch's stubs type these attributes as their values, hence getattr).
_shape_of = getattr(_Tensor, "shape").__get__
_is_cpu = getattr(_Tensor, "is_cpu").__get__
_first = operator.itemgetter(0)
_ONLY_TENSOR = {_Tensor}


def _plain_results_fit(results: list, n_batch: int, first: int, on_cpu: bool) -> bool:
    """True when every result is a tensor fitting a batch of ``n_batch`` dims whose first size is
    ``first`` (1-d batch), on the CPU when ``on_cpu``; False sends the results through the
    per-result checks of ``_checked`` (and their errors)."""
    if n_batch == 1 and first > 0 and not on_cpu:
        # One C-level pass: the first size of each result (False for None, a TensorDict, a number).
        return lengths_fit(results, first)
    if set(map(type, results)) != _ONLY_TENSOR:
        return False
    if on_cpu and not all(map(_is_cpu, results)):
        return False
    if n_batch == 0:
        return True
    try:
        return set(map(_first, map(_shape_of, results))) == {first}
    except IndexError:  # a 0-dim result
        return False


class _ApplyRun:
    """One call of apply: its options, and whether some leaf was dropped (``fn`` returned None)."""

    __slots__ = ("fn", "device", "inplace", "default", "filter_empty", "call_on_nested", "is_leaf", "named",
                 "nested_keys", "dropped", "written", "pending")

    def __init__(self, fn: Callable, device: Any, inplace: bool, default: Any, filter_empty: Optional[bool],
                 call_on_nested: bool, is_leaf: Optional[Callable], named: bool, nested_keys: bool) -> None:
        self.fn = fn
        self.device = device
        self.inplace = inplace
        self.default = default
        self.filter_empty = filter_empty
        self.call_on_nested = call_on_nested
        self.is_leaf = is_leaf
        self.named = named
        self.nested_keys = nested_keys
        self.dropped = False
        # In place, a tensor held under several keys (``fromkeys`` shares one) is written once.
        self.written: set = set()
        self.pending: list = []  # in place: (leaf, checked result), written once every result is known

    def drops_empty(self, sub: Any) -> bool:
        """Whether a sub-TensorDict whose result holds nothing is left out: by default when ``fn``
        emptied it, with ``filter_empty=True`` also when it held nothing (as upstream)."""
        return self.filter_empty is True or (self.filter_empty is None and bool(sub._tensordict))

    def storage(self, td: Any, other_storages: list, batch_size: torch.Size, prefix: tuple) -> dict:
        """The result storage for ``td`` (empty when ``inplace``: the leaves are written instead)."""
        storage = td._tensordict
        default = self.default
        if other_storages and default is _MISSING:
            for other_storage in other_storages:
                if other_storage.keys() != storage.keys():
                    missing = storage.keys() - other_storage.keys()
                    if missing:
                        first = sorted(missing)[0]
                        raise missing_key_error(prefix + (first,) if prefix else first, other_storage)
        if not other_storages and not self.named and not self.inplace:
            if not prefix and not self.call_on_nested and self.is_leaf is None:
                tree = plain_tree_storage(self, td, batch_size)  # the whole tree in one pass
                if tree is not None:
                    return tree
            return self._plain_storage(td, batch_size, prefix)
        n_batch = len(batch_size)
        fn, named, inplace, pending = self.fn, self.named, self.inplace, self.pending
        result: dict = {}
        for key, leaf in storage.items():
            other_leaves = [other_storage.get(key, default) for other_storage in other_storages]
            if not isinstance(leaf, _Tensor) or (batch_size is not td._batch_size and isinstance(leaf, _Unbatched)):
                entry = self._non_tensor_entry(td, key, leaf, other_leaves, batch_size, prefix)
                if entry is not DROP:
                    result[key] = entry
                continue
            if inplace:
                if id(leaf) in self.written:
                    continue
                self.written.add(id(leaf))
            name = prefix + (key,) if self.nested_keys and prefix else key
            value = fn(name, leaf, *other_leaves) if named else fn(leaf, *other_leaves)
            if value is None:
                self.dropped = True
            elif inplace:
                if value is not leaf:
                    # The common result (a tensor of the leaf's shape) needs no other check.
                    if type(value) is not _Tensor or value.shape != leaf.shape or leaf.requires_grad:
                        self._check_inplace(td, prefix + (key,) if prefix else key, leaf, value, batch_size)
                    pending.append((leaf, value))
            else:
                result[key] = self._checked(value, name, batch_size, n_batch)
        return result

    def _plain_storage(self, td: Any, batch_size: torch.Size, prefix: tuple) -> dict:
        """The common case (one TensorDict, unnamed, not in place), kept lean: it sets apply's speed.

        ``fn`` is called on the tensor leaves in a C-level loop (``map``) and the results are
        checked in C-level passes (:func:`_plain_results_fit`: the cheapest exact batch check is
        the leading size of a 1-d batch). Anything unusual (None, non-tensors, another batch)
        goes through the per-result checks of :meth:`_checked`.
        """
        fn = self.fn
        n_batch = len(batch_size)
        device = self.device
        on_cpu = device is not None and device.type == "cpu"
        storage = td._tensordict
        values = list(storage.values())
        if set(map(type, values)) == _ONLY_TENSOR:  # the common case, in one C-level pass
            keys: Any = storage
            leaves = values
            is_tensor: list = []
        else:
            is_tensor = list(map(isinstance, values, repeat(_Tensor)))
            if batch_size is not td._batch_size:
                # A new batch size (a fn that reshapes the batch): an UnbatchedTensor is not given to fn,
                # it takes the new batch size (as upstream).
                is_tensor = [kept and not isinstance(value, _Unbatched) for kept, value in zip(is_tensor, values)]
            keys = list(compress(storage, is_tensor))
            leaves = list(compress(values, is_tensor))
        results = list(map(fn, leaves))
        fits = (n_batch <= 1 and (device is None or on_cpu)
                and _plain_results_fit(results, n_batch, batch_size[0] if n_batch else 0, on_cpu))
        if keys is storage and fits:
            return dict(zip(storage, results))
        dropped = []
        if fits and not any(is_tensor[len(leaves):]):
            # The tensors come first (sub-TensorDicts are usually added last): the order holds.
            result: dict = dict(zip(keys, results))
        elif fits:
            result = dict.fromkeys(storage)  # every key first, to keep the storage's order
            result.update(zip(keys, results))
        else:
            result = dict.fromkeys(storage)
            for key, value in zip(keys, results):
                if value is None:
                    self.dropped = True
                    dropped.append(key)
                else:
                    result[key] = self._checked(value, prefix + (key,) if prefix else key, batch_size, n_batch)
        if keys is not storage:
            # Only the few other entries (sub-TensorDicts, non-tensors), picked at C level.
            is_other = list(map(operator.not_, is_tensor))
            for key, leaf in zip(compress(storage, is_other), compress(values, is_other)):
                entry = self._non_tensor_entry(td, key, leaf, [], batch_size, prefix)
                if entry is DROP:
                    dropped.append(key)
                else:
                    result[key] = entry
        for key in dropped:
            # pop: the tensors-first result above holds no key yet for a dropped sub-TensorDict.
            result.pop(key, None)
        return result

    @staticmethod
    def _check_inplace(td: Any, name: Any, leaf: torch.Tensor, value: Any, batch_size: torch.Size) -> None:
        """Refuse, before anything is written, a result ``apply_`` can't copy into its leaf (upstream's types:
        E-BATCH for leading dims that don't fit the batch, ``InplaceWriteError`` otherwise)."""
        if not isinstance(value, _Tensor):
            raise inplace_error(name, td, f"fn returned a {type(value).__name__}, not a tensor")
        if not isinstance(leaf, _Unbatched) and not fits_batch(value.shape, batch_size):
            raise batch_mismatch_error(batch_size, value.shape, name)
        check_copy(name, td, leaf, value)

    def _checked(self, value: Any, name: Any, batch_size: torch.Size, n_batch: int) -> Any:
        """``fn``'s return as a leaf of a TensorDict of batch ``batch_size`` on the result's device."""
        if isinstance(value, _Tensor):
            if type(value) is not _Tensor and isinstance(value, _Unbatched):
                # No batch dims to check: it follows the result's batch size.
                if self.device is not None and value.device != self.device:
                    value = value.to(self.device)
                return with_batch_size(value, batch_size)
            if not fits_batch(value.shape, batch_size):
                raise batch_mismatch_error(batch_size, value.shape, name)
            if self.device is not None and value.device != self.device:
                value = value.to(self.device)
            return value
        if isinstance(value, TensorCollection):
            return value
        return to_leaf(value, name, batch_size, self.device)

    def _non_tensor_entry(self, td: Any, key: str, leaf: Any, other_leaves: list, batch_size: torch.Size,
                          prefix: tuple) -> Any:
        """The result for a sub-collection or non-tensor leaf (or DROP)."""
        if isinstance(leaf, TensorCollection):
            if self.call_on_nested or (self.is_leaf is not None and self.is_leaf(type(leaf))):
                name = prefix + (key,) if self.nested_keys and prefix else key
                value = self.fn(name, leaf, *other_leaves) if self.named else self.fn(leaf, *other_leaves)
                if value is None:
                    self.dropped = True
                    return DROP
                return DROP if self.inplace else self._checked(value, name, batch_size, len(batch_size))
            inner = unwrap(leaf)
            if type(getattr(inner, "_tensordict", None)) is not dict:  # a nested lazy stack: its own apply
                return self._foreign_entry(td, key, leaf, other_leaves, batch_size, prefix)
            if batch_size is td._batch_size:
                inner_batch = inner._batch_size
            else:
                inner_batch = batch_size + inner._batch_size[len(td._batch_size):]
            path = prefix + (key,)
            inner_others = [self._inner_storage(item, path) for item in other_leaves] if other_leaves else other_leaves
            inner_storage = self.storage(inner, inner_others, inner_batch, path)
            if self.inplace:
                return DROP
            if not inner_storage and self.drops_empty(inner):
                return DROP  # everything in it was dropped
            names = inner._names if inner_batch is inner._batch_size else None
            return rewrap(leaf, inner._new_unsafe(inner_storage, inner_batch, self.device, names))
        if self.inplace:
            return DROP
        # Non-tensor data is passed through without calling fn.
        return _non_tensor_for_batch(leaf, batch_size + leaf.batch_size[len(td._batch_size):])

    def _foreign_entry(self, td: Any, key: str, leaf: Any, other_leaves: list, batch_size: torch.Size,
                       prefix: tuple) -> Any:
        """A nested lazy stack: its own (member-wise) apply, so ragged members stay ragged, as upstream."""
        options: dict = {}
        if self.default is not _MISSING:
            options["default"] = self.default
        if self.inplace:
            leaf.apply_(self.fn, *other_leaves, **options)
            return DROP
        if self.filter_empty is not None:
            options["filter_empty"] = self.filter_empty
        if self.call_on_nested:
            options["call_on_nested"] = True
        if self.is_leaf is not None:
            options["is_leaf"] = self.is_leaf
        if self.device is not None and self.device != leaf.device:
            options["device"] = self.device
        if batch_size is not td._batch_size:
            options["batch_size"] = batch_size + leaf.batch_size[len(td._batch_size):]
        if self.named:
            result = leaf.named_apply(self.fn, *other_leaves, nested_keys=self.nested_keys, prefix=prefix + (key,),
                                      **options)
        else:
            result = leaf.apply(self.fn, *other_leaves, **options)
        if result is None:
            self.dropped = True
            return DROP
        return result

    def _inner_storage(self, item: Any, path: tuple) -> dict:
        """The storage an "other" holds where ``td`` has a sub-collection (the default fills a missing one)."""
        if isinstance(item, TensorCollection):
            return unwrap(item)._tensordict
        if self.default is not _MISSING and item is self.default:
            return {}
        raise KeyError(f"apply(): the other TensorDict holds a {type(item).__name__} at {path!r}, where the "
                       f"first holds a TensorDict.")


class ApplyMixin(TensorDictHost):
    __slots__ = ()

    def apply(self, fn: Callable, *others: Any, batch_size: Any = None, device: Any = _MISSING,
              names: Any = _MISSING, inplace: bool = False, default: Any = _MISSING,
              filter_empty: Optional[bool] = None, propagate_lock: bool = False, call_on_nested: bool = False,
              is_leaf: Optional[Callable] = None, out: Any = None, **constructor_kwargs: Any) -> Any:
        """``fn(leaf, *other_leaves)`` on every tensor leaf, recursing into sub-TensorDicts.

        - a ``None`` return drops the key; when everything is dropped the result is ``None``
          (``filter_empty=False`` keeps the emptied sub-TensorDicts, and an empty result;
          ``filter_empty=True`` also leaves out the sub-TensorDicts that held nothing, and gives None
          for an empty result);
        - non-tensor entries are passed through without calling ``fn``;
        - ``others`` are TensorDicts with the same keys (``KeyError`` otherwise, unless
          ``default=`` fills the missing entries);
        - ``batch_size=``/``device=``/``names=`` set the result's; each return must fit
          the batch size (``RuntimeError`` otherwise);
        - ``inplace=True`` copies the results into the leaves and returns self;
        - the result is unlocked unless ``propagate_lock=True``.

        >>> import torch
        >>> from torchdict import TensorDict
        >>> TensorDict(a=torch.ones(2)).apply(lambda x: x * 2)["a"]
        tensor([2., 2.])
        >>> data = TensorDict({"a": torch.tensor(1.0), "b": torch.tensor(1)}, [])
        >>> list(data.apply(lambda x: x if x.dtype == torch.float else None).keys())
        ['a']
        """
        if constructor_kwargs:
            raise TypeError(f"apply() got unexpected keyword arguments {sorted(constructor_kwargs)}.")
        return apply(self, fn, others, batch_size=batch_size, device=device, names=names, inplace=inplace,
                     default=default, filter_empty=filter_empty, propagate_lock=propagate_lock,
                     call_on_nested=call_on_nested, is_leaf=is_leaf, out=out)

    def apply_(self, fn: Callable, *others: Any, **kwargs: Any) -> Any:
        """``apply`` writing the results back into the existing leaves (allowed when locked); returns self.

        >>> td = TensorDict(a=torch.zeros(2))
        >>> td.apply_(lambda x: x + 1)["a"]
        tensor([1., 1.])
        """
        return apply(self, fn, others, inplace=True, **kwargs)

    def named_apply(self, fn: Callable, *others: Any, nested_keys: bool = False, batch_size: Any = None,
                    device: Any = _MISSING, names: Any = _MISSING, inplace: bool = False, default: Any = _MISSING,
                    filter_empty: Optional[bool] = None, propagate_lock: bool = False,
                    call_on_nested: bool = False, is_leaf: Optional[Callable] = None, out: Any = None,
                    **constructor_kwargs: Any) -> Any:
        """``fn(key, leaf, *other_leaves)``; with ``nested_keys=True`` keys are full tuples.

        ``prefix=("p",)`` (a keyword upstream accepts too) puts a path in front of those full keys.

        >>> td = TensorDict(a=torch.zeros(2), b={"c": torch.zeros(2)})
        >>> td.named_apply(lambda key, x: x if key != "a" else None)["b", "c"]
        tensor([0., 0.])
        """
        prefix = constructor_kwargs.pop("prefix", ())
        if constructor_kwargs:
            raise TypeError(f"named_apply() got unexpected keyword arguments {sorted(constructor_kwargs)}.")
        return apply(self, fn, others, batch_size=batch_size, device=device, names=names, inplace=inplace,
                     default=default, filter_empty=filter_empty, propagate_lock=propagate_lock,
                     call_on_nested=call_on_nested, is_leaf=is_leaf, out=out, named=True,
                     nested_keys=nested_keys, prefix=key_to_tuple(prefix) if prefix else ())
