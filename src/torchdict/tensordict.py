"""The TensorDict container: storage, the dict API, batch size, device and lock.

Tensor-like behaviour (indexing, shape ops, arithmetic, moves, persistence,
modules, ...) lives in one mixin per concern module; this file only keeps
what every one of them relies on.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import FunctionType
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from . import _keyops, _options, _update
from ._accel import install_tensordict_getitem, leaves_fit, leaves_fit_batch, shape_fits, tensor_len as _tensor_len
from ._apply import ApplyMixin
from ._autograd import AutogradMixin
from ._base import TensorCollection
from .base import TensorDictBase
from ._constructors import ConstructorsMixin
from ._conversions import ConversionsMixin
from ._context import ContextMixin, undo_flatten_keys, undo_unflatten_keys, write_back
from ._convert import (check_tensor, fits_batch, parse_batch_size, parse_device, quick_batch_len,
                       to_leaf)
from ._batch_dims import BatchDimsMixin
from ._fused_ops import FusedOpsMixin
from ._introspection import IntrospectionMixin
from ._errors import (
    KeyThroughLeafError,
    batch_mismatch_error,
    entry_shape_error,
    MessageKeyError,
    inplace_error,
    locked_error,
    missing_key_error,
    through_leaf_error,
)
from ._indexing import IndexingMixin, index_basic
from ._keys import key_to_tuple
from ._key_members import KeyMembersMixin
from ._locking import LockingMixin
from ._names import NamesMixin
from ._rebatch import set_batch_size
from ._moves import MovesMixin
from ._ops import OpsMixin
from ._padding import PaddingMixin
from ._new_collections import NewCollectionsMixin
from ._shape import ShapeMixin
from ._state_dict import StateDictMixin
from ._torch_function import TorchFunctionMixin
from ._unbatched import UnbatchedTensor as _Unbatched
from ._views import ItemsView, KeysView, ValuesView, entries_of as _storage_of
from ._write_checks import broadcasts_into
from .distributed import DistributedMixin
from ._module_swap import ModuleMixin
from .nontensor import NonTensorData, NonTensorStack, NON_TENSOR_TYPES
from .parallel import ParallelMixin
from ._persistence_mixin import PersistenceMixin

__all__ = ["TensorDict"]

_Tensor = torch.Tensor
_NON_TENSOR = (NonTensorData, NonTensorStack)
_NOT_TENSOR_LIKE = (TensorCollection, NonTensorData, NonTensorStack)
_MISSING: Any = object()
_NO_DEFAULT: Any = object()  # get(key) without a default: None when missing, E-LEAF through a leaf


def _as_td(value: Any) -> "TensorDict":
    """The TensorDict behind a collection (a tensorclass keeps one in ``_tensordict``)."""
    return value if type(value) is TensorDict or isinstance(value, TensorDict) else value._tensordict


_object_new = object.__new__


def new_unsafe(cls: type[TensorDict], source: dict, batch_size: torch.Size, device: Optional[torch.device] = None,
               names: Optional[list] = None) -> "TensorDict":
    """A ``cls`` instance built from already-valid parts, skipping every check (``cls._new_unsafe``).

    ``source`` is adopted as the storage (not copied); its values must be valid leaves for
    ``batch_size`` and ``device``. A module function so the hottest paths (``td[i]``) call it
    without binding a classmethod each time.
    """
    td = _object_new(cls)
    # _init_state's assignments, inlined: every op result is built here.
    td._tensordict = source
    td._batch_size = batch_size
    td._batch_len = -1  # not known yet: the first write checks in full, then records it
    td._device = device
    td._names = names
    td._is_locked = False
    td._lock_parents = 0
    td._cm = None
    td._is_memmap = False
    td._saved_path = None
    return td


class TensorDict(
    ApplyMixin,
    IndexingMixin,
    ShapeMixin,
    NewCollectionsMixin,
    OpsMixin,
    MovesMixin,
    TorchFunctionMixin,
    ContextMixin,
    NamesMixin,
    PersistenceMixin,
    ModuleMixin,
    ParallelMixin,
    DistributedMixin,
    LockingMixin,
    ConstructorsMixin,
    ConversionsMixin,
    StateDictMixin,
    KeyMembersMixin,
    PaddingMixin,
    AutogradMixin,
    IntrospectionMixin,
    FusedOpsMixin,
    BatchDimsMixin,
    TensorDictBase,
):
    """A dictionary of tensors sharing leading batch dimensions.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(3, 4), "next": {"obs": torch.ones(3, 4)}}, batch_size=[3])
    >>> td["next", "obs"].shape
    torch.Size([3, 4])
    >>> td[0].batch_size
    torch.Size([])
    """

    # _batch_len: quick_batch_len(_batch_size), or -1 until a write computes it. _consolidated and _stream
    # (consolidate(), record_stream(); _consolidate.py) are left unset until used: read them with getattr.
    __slots__ = ("_tensordict", "_batch_size", "_batch_len", "_device", "_names", "_is_locked", "_lock_parents",
                 "_cm", "_is_memmap", "_saved_path", "_consolidated", "_stream", "__weakref__")

    # torch looks ``__torch_function__`` up on every TensorDict argument in a way that walks
    # the MRO each time (measured); found first here, ``torch.stack`` of 10 saves ~2 µs.
    __torch_function__ = TorchFunctionMixin.__dict__["__torch_function__"]

    # ------------------------------------------------------------------ construction
    def __init__(
        self,
        source: Any = None,
        batch_size: Any = None,
        device: Any = None,
        names: Optional[Sequence[Optional[str]]] = None,
        non_blocking: Optional[bool] = None,
        lock: bool = False,
        **kwargs: Any,
    ) -> None:
        if source is None:
            source = kwargs
        elif kwargs:
            raise ValueError("Either a dictionary or a sequence of kwargs must be provided, not both.")
        elif type(source) is dict:
            pass  # the common case, before the slower isinstance tests (Mapping is an ABC)
        elif isinstance(source, TensorDict):
            source = source._tensordict
        elif not isinstance(source, Mapping):
            raise ValueError(
                "A TensorDict source is expected to be a TensorDictBase sub-type or a Mapping, "
                f"found type(source)={type(source)}."
            )
        batch_size = parse_batch_size(batch_size)
        device = parse_device(device)
        n_batch = len(batch_size)
        if n_batch and device is None and type(source) is dict and (
                leaves_fit(source, batch_size[0]) if n_batch == 1 else leaves_fit_batch(source, batch_size)):
            # A flat dict of tensors (the commonest call), checked in C-level passes; anything else
            # is converted and checked entry by entry below.
            self._init_state(dict(source), batch_size, None, None)
            source = {}
        else:
            self._init_state({}, batch_size, device, None)
        storage = self._tensordict
        non_blocking = bool(non_blocking)
        wrote_paths = False  # a tuple key wrote some level: a later str key must not replace it
        for key, value in source.items():
            if wrote_paths and type(key) is str and key in storage:
                raise MessageKeyError(f"The entry {key} is already present in tensordict (written through a "
                                      "tuple key of the same source).")
            if type(key) is str and isinstance(value, _Tensor):
                # Fast path for the common case: a str key and a tensor value (check_tensor also places
                # a tensor subclass: an UnbatchedTensor gets the batch size).
                if (n_batch and not fits_batch(value.shape, batch_size)) or type(value) is not _Tensor:
                    value = check_tensor(value, key, batch_size, device, non_blocking)
                elif device is not None and value.device != device:
                    value = value.to(device, non_blocking=non_blocking)
                storage[key] = value
            elif type(key) is str and type(value) is dict:
                # A nested plain dict: what to_leaf does with a Mapping, without its type tests.
                storage[key] = TensorDict(value, batch_size, device, non_blocking=non_blocking)
            else:
                self._set_path(key_to_tuple(key), value, non_blocking=non_blocking)
                wrote_paths = True
        if n_batch and (batch_size[0] < 0 if n_batch == 1 else min(batch_size) < 0):
            raise RuntimeError(f"batch_size must hold non-negative sizes, got {batch_size}.")
        if names is not None:
            self.names = names
        if lock:
            self._lock_tree()

    # Build a TensorDict from already-valid parts, skipping every check (see new_unsafe).
    # A copy of new_unsafe named after the attribute: Dynamo (torch 2.13) reads a classmethod back
    # through the attribute its function is named after.
    _new_unsafe = classmethod(FunctionType(new_unsafe.__code__, new_unsafe.__globals__, "_new_unsafe",
                                           new_unsafe.__defaults__))

    def _init_state(self, storage: dict, batch_size: torch.Size, device: Optional[torch.device],
                    names: Optional[list]) -> None:
        # The same assignments are inlined in _new_unsafe: keep the two in step.
        self._tensordict = storage
        self._batch_size = batch_size
        self._batch_len = quick_batch_len(batch_size)
        self._device = device
        self._names = names
        self._is_locked = False
        self._lock_parents = 0
        self._cm = None
        self._is_memmap = False
        self._saved_path = None

    def _new_like(self, source: dict, batch_size: Optional[torch.Size] = None) -> "TensorDict":
        """An unlocked TensorDict with this one's class, device (and names when the batch is kept)."""
        if batch_size is None:
            return self._new_unsafe(source, self._batch_size, self._device, self._names)
        return self._new_unsafe(source, batch_size, self._device)

    # ------------------------------------------------------------------ metadata
    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, new_size: Any) -> None:
        new_size = parse_batch_size(new_size)
        if new_size != self._batch_size:  # the current size changes nothing (allowed when locked too)
            # Every level that must change is checked (leaves, lock) before any changes: see _rebatch.
            set_batch_size(self, new_size)

    @property
    def shape(self) -> torch.Size:
        return self._batch_size

    @property
    def batch_dims(self) -> int:
        return len(self._batch_size)

    @property
    def ndim(self) -> int:
        return len(self._batch_size)

    def dim(self) -> int:
        return len(self._batch_size)

    ndimension = dim

    def numel(self) -> int:
        return self._batch_size.numel()

    def size(self, dim: Optional[int] = None) -> Any:
        if dim is None:
            return self._batch_size
        return self._batch_size[dim]

    @property
    def device(self) -> Optional[torch.device]:
        return self._device

    @device.setter
    def device(self, value: Any) -> None:
        raise RuntimeError(
            "device cannot be set using tensordict.device = device, because device cannot be updated "
            "in-place. To update device, use tensordict.to(new_device), which will return a new "
            "tensordict on the new device. You can also use tensordict.to(new_device) as a context "
            "manager for temporary device changes."
        )

    def clear_device_(self) -> "TensorDict":
        """Forget the device constraint (recursively), without moving data; returns self."""
        self._device = None
        for leaf in self._tensordict.values():
            if isinstance(leaf, TensorCollection):
                # TensorDicts, lazy stacks and tensorclasses have it; another kind raises its AttributeError.
                leaf.clear_device_()  # type: ignore[attr-defined]
        return self

    # ------------------------------------------------------------------ reading
    def __getitem__(self, index: Any) -> Any:
        # `index.__class__ is` rather than type(x) or isinstance: the attribute read is the cheapest exact
        # type test in CPython 3.11 (in C, td[key] runs from the type slot; this is the pure-Python and
        # the traced path).
        if index.__class__ is str:
            try:
                value = self._tensordict[index]
            except KeyError:
                raise missing_key_error(index, self._tensordict) from None
            # type(), not __class__, for the value: Dynamo can't read __class__ of a tensor subclass with
            # __torch_function__ (an UnbatchedTensor).
            if type(value) is _Tensor:
                return value
            return value.data if type(value) in NON_TENSOR_TYPES else value
        if index.__class__ is int:
            # td[i], the other hot read (iterating a dataset): straight to the basic indexing.
            storage: dict = {}
            new_batch, names = index_basic(self._tensordict, self._batch_size, self._names, index, storage)
            return new_unsafe(self.__class__, storage, new_batch, self._device, names)
        return self._getitem_slow(index)

    def _getitem_slow(self, index: Any) -> Any:
        if index.__class__ is tuple:
            # Fast path: a flat tuple of str walking through plain TensorDicts (a missing key
            # leaves it for _get_path, which words the error).
            value = self
            try:
                for key in index:
                    if key.__class__ is not str or value.__class__ is not TensorDict:
                        break
                    value = value._tensordict[key]
                else:
                    if type(value) is _Tensor:
                        return value
                    if not index:
                        return self
                    return value.data if type(value) in NON_TENSOR_TYPES else value
            except KeyError:
                pass
            if _is_key_tuple(index):
                value = self._get_path(key_to_tuple(index))
                return value.data if type(value) in NON_TENSOR_TYPES else value
        elif isinstance(index, str):
            if index.__class__ is str:  # a str __getitem__ did not find
                raise missing_key_error(index, self._tensordict)
            value = self._get_path((index,))  # a str subclass (an enum of str, say)
            return value.data if type(value) in NON_TENSOR_TYPES else value
        return self._index(index)

    def get(self, key: Any, default: Any = _NO_DEFAULT) -> Any:
        """The entry at ``key``; ``None`` (or the given default) when missing.

        A nested key that walks through a leaf raises ``KeyThroughLeafError``, unless a
        default is given (then it is returned, as upstream does). Non-tensor entries are
        returned as their ``NonTensorData`` wrapper.

        >>> TensorDict(a=1).get("b", "default")
        'default'
        """
        if type(key) is str:
            value = self._tensordict.get(key, default)
            if value is _NO_DEFAULT:
                if _options.GET_DEFAULTS_TO_NONE:
                    return None
                raise missing_key_error(key, self._tensordict)
            return value
        keys = key_to_tuple(key)
        if default is _NO_DEFAULT:
            return self._get_path(keys, None if _options.GET_DEFAULTS_TO_NONE else _MISSING)
        try:
            return self._get_path(keys, default)
        except KeyThroughLeafError:
            return default

    def _get_path(self, keys: tuple, default: Any = _MISSING) -> Any:
        storage = self._tensordict
        last = len(keys) - 1
        position = 0
        for key in keys:
            value = storage.get(key, _MISSING)
            if position == last:
                if value is _MISSING:
                    if default is not _MISSING:
                        return default
                    raise missing_key_error(keys if last else key, storage)
                return value
            # Walking down: a plain TensorDict first (one type test), the other cases after.
            if type(value) is TensorDict:
                storage = value._tensordict
            elif value is _MISSING:
                if default is not _MISSING:
                    return default
                raise missing_key_error(keys, storage)
            elif isinstance(value, TensorCollection):
                storage = _storage_of(value)
            else:
                raise through_leaf_error(key, value, keys[position + 1])
            position += 1
        return self

    def get_at(self, key: Any, index: Any, default: Any = _NO_DEFAULT) -> Any:
        """``td.get(key)[index]``; ``default`` (None) when the key is missing, as upstream."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            if default is not _NO_DEFAULT:
                return default
            if _options.GET_DEFAULTS_TO_NONE:
                return None
            raise missing_key_error(key, self._tensordict)
        return value[index]

    def get_non_tensor(self, key: Any, default: Any = _MISSING) -> Any:
        """The raw Python value of a non-tensor entry."""
        value = self._get_path(key_to_tuple(key), default)
        if type(value) in NON_TENSOR_TYPES:
            return value.data
        return value

    def is_non_tensor(self, key: Any) -> bool:
        return type(self._get_path(key_to_tuple(key))) in NON_TENSOR_TYPES

    def keys(self, include_nested: bool = False, leaves_only: bool = False,
             is_leaf: Optional[Callable[[type], bool]] = None, *, sort: bool = False) -> KeysView:
        """A live view of the keys (post-order, insertion order unless ``sort``)."""
        return KeysView(self, include_nested, leaves_only, is_leaf, sort)

    def values(self, include_nested: bool = False, leaves_only: bool = False,
               is_leaf: Optional[Callable[[type], bool]] = None, *, sort: bool = False) -> ValuesView:
        return ValuesView(self, include_nested, leaves_only, is_leaf, sort)

    def items(self, include_nested: bool = False, leaves_only: bool = False,
              is_leaf: Optional[Callable[[type], bool]] = None, *, sort: bool = False) -> ItemsView:
        return ItemsView(self, include_nested, leaves_only, is_leaf, sort)

    @property
    def sorted_keys(self) -> list:
        return sorted(self._tensordict)

    def __contains__(self, key: Any) -> bool:
        if type(key) is str:
            return key in self._tensordict
        if isinstance(key, tuple):
            return self.keys(include_nested=True).__contains__(key)
        raise RuntimeError("key must be a NestedKey (a str or a possibly tuple of str).")

    def __len__(self) -> int:
        return self._batch_size[0] if self._batch_size else 0

    def __iter__(self) -> Iterator["TensorDict"]:
        if not self._batch_size:
            raise TypeError(
                "iteration over a 0-d tensordict. Use keys(), values() or items() to iterate over its entries."
            )
        return iter(self.unbind(0))

    def __bool__(self) -> bool:
        raise RuntimeError(
            "Converting a tensordict to boolean value is not permitted. Use len(td.keys()) to test for "
            "keys, td.is_empty() to test for leaves, or (a == b).all() / .any() to reduce a comparison."
        )

    def is_empty(self) -> bool:
        """True when the TensorDict holds no leaf (empty sub-tds don't count)."""
        for _ in self.keys(True, True, is_leaf=_is_any_leaf):
            return False
        return True

    # ------------------------------------------------------------------ writing
    def __setitem__(self, index: Any, value: Any) -> None:
        if index.__class__ is str:
            if self._is_locked:
                raise locked_error()
            # (an UnbatchedTensor, which has no batch dims, takes the general path: to_leaf places it)
            if type(value) is _Tensor or (isinstance(value, _Tensor) and not isinstance(value, _Unbatched)):
                # The quick check (see quick_batch_len): the C length of the tensor against the
                # recorded one; anything else gets the full check. This sets the speed of td[key] = t.
                batch_len = self._batch_len
                if batch_len and _tensor_len(value) != batch_len and not (
                        batch_len < 0 and shape_fits(value, self._batch_size)):  # a batch of 2+ dims
                    self._check_fits(value, index)
                if self._device is not None and value.device != self._device:
                    value = value.to(self._device)
                self._tensordict[index] = value
            else:
                self._set_path((index,), value)
            return
        if index.__class__ is tuple:
            # Fast path: a tensor written through existing plain TensorDicts. Stored keys are
            # str only, so a nested tuple, an int or an unhashable index among the levels misses
            # (KeyError/TypeError) and anything unusual takes the general path below. Depths 2
            # and 3 are unrolled: a loop over index[:-1] costs more than the lookups.
            parent = None
            try:
                depth = len(index)
                if depth == 3:
                    first, second, last = index
                    parent = self._tensordict[first]
                    if parent.__class__ is TensorDict:
                        parent = parent._tensordict[second]
                elif depth == 2:
                    first, last = index
                    parent = self._tensordict[first]
                else:
                    last = index[-1]
                    if depth > 3:
                        parent = self
                        for key in index[:-1]:
                            if type(parent) is not TensorDict:
                                break
                            parent = parent._tensordict[key]
            except (KeyError, TypeError, IndexError):  # IndexError: td[()] = value
                parent = None
            if (parent.__class__ is TensorDict and last.__class__ is str and isinstance(value, _Tensor)
                    and (type(value) is _Tensor or not isinstance(value, _Unbatched))
                    and not parent._is_locked and (parent._device is None or value.device == parent._device)):
                batch_len = parent._batch_len
                if not batch_len or _tensor_len(value) == batch_len or fits_batch(value.shape, parent._batch_size):
                    parent._tensordict[last] = value
                    return
            if index and _is_key_tuple(index):
                self._set_path(key_to_tuple(index), value)
                return
        elif isinstance(index, str):  # a str subclass (an enum of str, say)
            self._set_path((index,), value)
            return
        self._set_at_index(index, value)

    def _check_fits(self, value: torch.Tensor, key: Any) -> None:
        """The full batch check of a write (E-BATCH); records the quick one for the next write."""
        batch_size = self._batch_size
        if not fits_batch(value.shape, batch_size):
            raise batch_mismatch_error(batch_size, value.shape, key)
        self._batch_len = quick_batch_len(batch_size)

    def set(self, key: Any, item: Any, inplace: bool = False, *, non_blocking: bool = False,
            **kwargs: Any) -> "TensorDict":
        """Write ``item`` at ``key``; with ``inplace=True`` copy into an existing entry. Returns self.

        >>> TensorDict().set(("a", "b"), 1)["a", "b"]
        tensor(1)
        """
        self._set_path(key_to_tuple(key), item, inplace=inplace, non_blocking=non_blocking)
        return self

    # ------------------------------------------------------------------ TensorDictBase primitives
    # TensorDict overrides every generic method with its own code; these serve generic code that is
    # handed a TensorDict (another collection's ``_assign_from``, a nested level of a generic walk).
    def _keys_str(self) -> Iterator[str]:
        return iter(self._tensordict)

    def _get_str(self, key: str, default: Any) -> Any:
        return self._tensordict.get(key, default)

    def _set_str(self, key: str, value: Any, inplace: bool) -> None:
        if inplace:
            self._tensordict[key].copy_(value)
        else:
            if self._is_locked and key not in self._tensordict:
                raise locked_error()
            self._tensordict[key] = value

    def _del_str(self, key: str) -> None:
        if self._is_locked:
            raise locked_error()
        del self._tensordict[key]

    def _dense(self) -> "TensorDict":
        return self

    def _dense_is_copy(self) -> bool:
        return False

    def _parent_of(self, keys: tuple, create: bool) -> "TensorDict":
        """The TensorDict holding ``keys[-1]``, creating missing levels when ``create``."""
        td = self
        for position, key in enumerate(keys[:-1]):
            value = td._tensordict.get(key, _MISSING)
            if value is _MISSING:
                if not create:
                    raise missing_key_error(keys, td._tensordict)
                if td._is_locked:
                    raise locked_error()
                value = td._new_unsafe({}, td._batch_size, td._device)
                td._tensordict[key] = value
            elif not isinstance(value, TensorCollection):
                if create:
                    raise MessageKeyError(
                        f"The entry {key} is already present in tensordict and is a "
                        f"{type(value).__name__}, so the nested key {keys} cannot be set through it."
                    )
                raise through_leaf_error(key, value, keys[position + 1])
            td = _as_td(value)
        return td

    def _set_path(self, keys: tuple, value: Any, inplace: bool = False, non_blocking: bool = False) -> None:
        if value is self:
            raise _update.self_insertion_error(keys if len(keys) > 1 else keys[0])
        td = self
        if len(keys) > 1:
            # The deepest existing level (_deepest_level, inlined: this is td["a", "b", "c"] = v's path).
            missing = -1
            for position in range(len(keys) - 1):
                level = td._tensordict.get(keys[position], _MISSING)
                if level is _MISSING:
                    missing = position
                    break
                if level.__class__ is not TensorDict:
                    if not isinstance(level, TensorCollection):
                        raise self._through_leaf(keys[position], level, keys)
                    level = _as_td(level)
                td = level
            if missing >= 0:
                # The missing levels are made only once the value is known to fit them: a refused write
                # leaves no empty level behind.
                if td._is_locked:
                    raise locked_error()
                leaf = to_leaf(value, keys, td._batch_size, td._device, non_blocking)
                for level_key in keys[missing:-1]:
                    level = td._new_unsafe({}, td._batch_size, td._device)
                    td._tensordict[level_key] = level
                    td = level
                td._tensordict[keys[-1]] = leaf
                return
        key = keys[-1]
        if inplace:
            existing = td._tensordict.get(key, _MISSING)
            if existing is not _MISSING:
                td._set_inplace(key, existing, value, keys, non_blocking)
                return
        if td._is_locked:
            raise locked_error()
        td._tensordict[key] = to_leaf(value, keys if len(keys) > 1 else key, td._batch_size, td._device,
                                      non_blocking)

    @staticmethod
    def _through_leaf(key: str, value: Any, keys: tuple) -> KeyError:
        """A nested key to write that walks through a leaf (as ``_parent_of(create=True)`` words it)."""
        return MessageKeyError(f"The entry {key} is already present in tensordict and is a "
                               f"{type(value).__name__}, so the nested key {keys} cannot be set through it.")

    def _set_inplace(self, key: str, existing: Any, value: Any, full_key: Any, non_blocking: bool) -> None:
        if isinstance(existing, _Tensor):
            if isinstance(value, _Tensor):
                pass
            elif isinstance(value, _NOT_TENSOR_LIKE) or isinstance(value, Mapping):
                raise inplace_error(full_key, self)
            else:
                value = to_leaf(value, full_key, torch.Size(()), None)
                if not isinstance(value, _Tensor):
                    raise inplace_error(full_key, self)
            batch_size = self._batch_size
            if not fits_batch(value.shape, batch_size):
                value = check_tensor(value, full_key, batch_size, None)
            try:
                existing.copy_(value, non_blocking=non_blocking)  # torch checks before writing: nothing is written
            except RuntimeError as error:
                raise self._copy_error(full_key, existing, value, error) from error
        elif isinstance(existing, TensorCollection):
            if isinstance(value, Mapping):
                value = to_leaf(value, full_key, self._batch_size, self._device)
            if not isinstance(value, TensorCollection):
                raise inplace_error(full_key, self)
            _as_td(existing).update_(value, non_blocking=non_blocking)
        else:
            value = to_leaf(value, full_key, self._batch_size, self._device)
            if type(value) not in NON_TENSOR_TYPES:
                raise inplace_error(full_key, self)
            if type(value) is NonTensorData and type(existing) is not NonTensorData and isinstance(
                    existing, NonTensorData):
                value = type(existing)(value, value.batch_size, value.device)  # a MetaData stays one (upstream's)
            if not existing._write_shared_leaf(value):  # a shared leaf (share_non_tensor) writes its folder
                self._tensordict[key] = value

    def set_(self, key: Any, item: Any, *, non_blocking: bool = False) -> "TensorDict":
        """Copy ``item`` into the existing entry at ``key`` (allowed when locked); returns self."""
        if type(key) is str:
            existing = self._tensordict.get(key, _MISSING)
            if existing is _MISSING:
                raise missing_key_error(key, self._tensordict)
            if isinstance(item, _Tensor) and isinstance(existing, _Tensor) and (
                    fits_batch(item.shape, self._batch_size)):
                try:
                    existing.copy_(item, non_blocking=non_blocking)  # torch checks before writing
                except RuntimeError as error:
                    raise self._copy_error(key, existing, item, error) from error
                return self
            self._set_inplace(key, existing, item, key, non_blocking)
            return self
        keys = key_to_tuple(key)
        td = self._parent_of(keys, create=False) if len(keys) > 1 else self
        existing = td._tensordict.get(keys[-1], _MISSING)
        if existing is _MISSING:
            raise missing_key_error(key, td._tensordict)
        td._set_inplace(keys[-1], existing, item, keys if len(keys) > 1 else keys[0], non_blocking)
        return self

    def _copy_error(self, key: Any, existing: torch.Tensor, value: torch.Tensor, error: RuntimeError) -> Exception:
        """The error of a refused ``existing.copy_(value)``: upstream's ``InplaceWriteError`` naming the key and
        both shapes when the shapes are the cause (torch's message names neither the key nor the entry)."""
        if not broadcasts_into(value.shape, existing.shape):
            return entry_shape_error(key, self, value.shape, existing.shape)
        return inplace_error(key, self, error)

    def set_at_(self, key: Any, value: Any, index: Any, *, non_blocking: bool = False) -> "TensorDict":
        """``td[key][index] = value`` (allowed when locked); returns self."""
        existing = self._get_path(key_to_tuple(key))
        if isinstance(existing, TensorCollection):
            existing[index] = value
        else:
            existing[index] = value
        return self

    def set_non_tensor(self, key: Any, value: Any) -> "TensorDict":
        """Store ``value`` as non-tensor data even if it could become a tensor; returns self."""
        keys = key_to_tuple(key)
        td = self._parent_of(keys, create=True) if len(keys) > 1 else self
        td._check_unlocked()
        td._tensordict[keys[-1]] = NonTensorData(value, td._batch_size, td._device)
        return self

    def setdefault(self, key: Any, default: Any, inplace: bool = False) -> Any:
        """The value at ``key``, setting it to ``default`` first when missing."""
        keys = key_to_tuple(key)
        if self._get_path(keys, None) is None:
            self._set_path(keys, default, inplace=inplace)
        return self[keys if len(keys) > 1 else keys[0]]

    def update(self, input_dict_or_td: Any = None, clone: bool = False, inplace: bool = False, *,
               non_blocking: bool = False, keys_to_update: Optional[Sequence[Any]] = None,
               is_leaf: Optional[Callable[[type], bool]] = None, update_batch_size: bool = False,
               ignore_lock: bool = False, **kwargs: Any) -> "TensorDict":
        """Merge entries in, recursing into sub-TensorDicts; returns self."""
        return _update.update(self, input_dict_or_td, clone=clone, inplace=inplace, non_blocking=non_blocking,
                              keys_to_update=keys_to_update, is_leaf=is_leaf,
                              update_batch_size=update_batch_size, ignore_lock=ignore_lock, kwargs=kwargs)

    def update_(self, input_dict_or_td: Any = None, clone: bool = False, *, non_blocking: bool = False,
                keys_to_update: Optional[Sequence[Any]] = None, **kwargs: Any) -> "TensorDict":
        """Copy entries into existing ones, in place (allowed when locked); returns self."""
        return _update.update_(self, input_dict_or_td, clone=clone, non_blocking=non_blocking,
                               keys_to_update=keys_to_update, kwargs=kwargs)

    def copy_(self, tensordict: Any, non_blocking: bool = False) -> "TensorDict":
        """``update_(tensordict)``: copy its entries into the existing ones, in place; returns self."""
        return self.update_(tensordict, non_blocking=non_blocking)

    def update_at_(self, input_dict_or_td: Any, idx: Any, clone: bool = False, *, non_blocking: bool = False,
                   keys_to_update: Optional[Sequence[Any]] = None) -> "TensorDict":
        """Write entries in place at batch index ``idx``; returns self."""
        return _update.update_at_(self, input_dict_or_td, idx, clone=clone, keys_to_update=keys_to_update)

    def copy_at_(self, tensordict: Any, idx: Any, non_blocking: bool = False, *, fast: bool = True) -> "TensorDict":
        """Write ``tensordict``'s entries in place at batch index ``idx``.

        ``fast=True`` (upstream's default) takes a TensorDict of tensors that fit ``self[idx]`` exactly and
        refuses anything else with ``RuntimeError``; ``fast=False`` is ``update_at_`` (dicts, broadcasting,
        tensor indices).
        """
        if fast:
            _update.check_fast_copy(self, tensordict, idx)
        return self.update_at_(tensordict, idx, non_blocking=non_blocking)

    # ------------------------------------------------------------------ removing
    def __delitem__(self, key: Any) -> None:
        keys = key_to_tuple(key)
        td = self._parent_of(keys, create=False) if len(keys) > 1 else self
        td._check_unlocked()
        try:
            del td._tensordict[keys[-1]]
        except KeyError:
            raise KeyError(key) from None

    def del_(self, key: Any) -> "TensorDict":
        del self[key]
        return self

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its value (or ``default`` when missing)."""
        keys = key_to_tuple(key)
        try:
            td = self._parent_of(keys, create=False) if len(keys) > 1 else self
        except (KeyError, KeyThroughLeafError):
            if default is not _MISSING:
                return default
            raise
        if keys[-1] not in td._tensordict:
            if default is not _MISSING:
                return default
            raise missing_key_error(key, td._tensordict)
        td._check_unlocked()
        return td._tensordict.pop(keys[-1])

    def popitem(self) -> tuple:
        """Remove and return the last inserted ``(key, value)`` pair."""
        self._check_unlocked()
        try:
            return self._tensordict.popitem()
        except KeyError:
            raise KeyError("popitem(): dictionary is empty") from None

    def clear(self) -> "TensorDict":
        self._check_unlocked()
        self._tensordict.clear()
        return self

    def rename_key_(self, old_key: Any, new_key: Any, safe: bool = False) -> "TensorDict":
        """Move an entry to a new key; returns self."""
        return _keyops.rename_key_(self, old_key, new_key, safe)

    # ------------------------------------------------------------------ structure
    def copy(self) -> "TensorDict":
        """A shallow copy: new containers (sub-tds too), the same leaves."""
        storage = {}
        for key, leaf in self._tensordict.items():
            storage[key] = leaf.copy() if isinstance(leaf, TensorCollection) else leaf
        return self._new_like(storage)

    def select(self, *keys: Any, inplace: bool = False, strict: bool = True, as_tensordict: bool = False) -> "TensorDict":
        """Only the given keys, with the nested structure kept; leaves are shared.

        ``as_tensordict=True`` matters for a tensorclass (a TensorDict instead of an instance of its class).
        """
        return _keyops.select(self, keys, inplace=inplace, strict=strict)

    def exclude(self, *keys: Any, inplace: bool = False) -> "TensorDict":
        """All but the given keys (missing ones are ignored)."""
        return _keyops.exclude(self, keys, inplace=inplace)

    def split_keys(self, *key_sets: Any, inplace: bool = False, default: Any = _keyops.NO_DEFAULT, strict: bool = True,
                   reproduce_struct: bool = False) -> tuple:
        """One TensorDict per key set, plus one with the remaining keys."""
        return _keyops.split_keys(self, key_sets, inplace=inplace, default=default, strict=strict,
                                  reproduce_struct=reproduce_struct)

    def separates(self, *keys: Any, default: Any = _keyops.NO_DEFAULT, strict: bool = True,
                  filter_empty: bool = True) -> "TensorDict":
        """Remove ``keys`` from self (in place) and return them as a TensorDict of their own."""
        return _keyops.split_keys(self, (list(keys),), inplace=True, default=default, strict=strict,
                                  reproduce_struct=not filter_empty)[0]

    @write_back(undo_flatten_keys, shares_leaves=True)
    def flatten_keys(self, separator: str = ".", inplace: bool = False,
                     is_leaf: Optional[Callable[[type], bool]] = None) -> "TensorDict":
        """Nested keys joined by ``separator`` into a single level."""
        return _keyops.flatten_keys(self, separator, inplace, is_leaf)

    @write_back(undo_unflatten_keys, shares_leaves=True)
    def unflatten_keys(self, separator: str = ".", inplace: bool = False) -> "TensorDict":
        """Keys split on ``separator`` into nested TensorDicts."""
        return _keyops.unflatten_keys(self, separator, inplace)

    def to_dict(self, *, retain_none: bool = True, convert_tensors: Any = False,
                tolist_first: bool = False) -> dict:
        """A nested plain ``dict`` (non-tensor entries as their raw values); ``convert_tensors=True``
        turns the tensors into nested lists, ``"numpy"`` into arrays."""
        result = {}
        for key, leaf in self._tensordict.items():
            if isinstance(leaf, TensorCollection):
                dense = leaf if type(getattr(leaf, "_tensordict", None)) is dict else getattr(leaf, "_tensordict", None)
                # A nested lazy stack has no TensorDict inside: its own to_dict (ragged: RuntimeError, as upstream).
                result[key] = (dense if isinstance(dense, TensorDict) else leaf).to_dict(
                    retain_none=retain_none, convert_tensors=convert_tensors)
            elif type(leaf) in NON_TENSOR_TYPES:
                # a stack's values as plain nested lists (its .data is a linked list), as upstream
                value = leaf.tolist() if type(leaf) is NonTensorStack else leaf.data
                if value is None and not retain_none:
                    continue
                result[key] = value
            else:
                result[key] = (leaf.numpy(force=True) if convert_tensors == "numpy"
                               else leaf.tolist() if convert_tensors else leaf)
        return result

    def __repr__(self) -> str:
        from .printing import format_tensordict

        return format_tensordict(self)

    def __reduce__(self) -> tuple:
        return (_rebuild, (type(self), self._tensordict, self._batch_size, self._device, self._names,
                           self._is_locked))


install_tensordict_getitem(TensorDict, _NON_TENSOR)  # td["key"] in C when the extension is built


def _rebuild(cls: type[TensorDict], storage: dict, batch_size: torch.Size, device: Any, names: Any,
             locked: bool) -> TensorDict:
    td = cls._new_unsafe(storage, batch_size, device, names)
    if locked:
        td._lock_tree()
    return td


def _is_any_leaf(cls: type) -> bool:
    return not issubclass(cls, TensorCollection)


def _is_key_tuple(index: tuple) -> bool:
    for item in index:
        if type(item) is str or isinstance(item, str):  # a str subclass is a key too
            continue
        if type(item) is tuple and item and _is_key_tuple(item):
            continue
        return False
    return True
