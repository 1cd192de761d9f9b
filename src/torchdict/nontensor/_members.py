"""The TensorDict-like members of the non-tensor leaves that are neither shape ops nor comparisons.

``NonTensorMembersMixin`` (a base of ``NonTensorData`` and ``NonTensorStack``) gives them upstream's
answers for: the batch metadata (``batch_size`` / ``shape`` / ``names`` / ``device`` / ``dim`` ...),
locking, the dict API of a leaf without keys, moves and copies (``clone``, ``to``, dtype casts:
there is no tensor to cast, so these copy the wrapper) and ``update`` / ``update_`` / ``copy_``.

Results are built through the core module (``nontensor``), imported as a module so that the two
can import each other.
"""
from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import torch

from .. import nontensor as _core
from .._errors import locked_error
from .._names import check_names, expand_ellipsis

if TYPE_CHECKING:
    import builtins  # annotations after the class's members named bool, int, float

    from ._host import NonTensorHost
    from ..nontensor import NonTensorData, NonTensorStack
else:
    NonTensorHost = object

__all__ = ["NonTensorMembersMixin", "values_over"]

_KEEP: Any = object()  # ``empty(device=...)`` not given: keep the device




# Values a deep copy returns as they are: skipping ``deepcopy``'s dispatch keeps ``td.clone()`` cheap.
_ATOMIC = frozenset((str, int, float, bool, type(None), bytes, complex))


def _deep_copy(value: Any) -> Any:
    from copy import deepcopy

    return value if type(value) in _ATOMIC else deepcopy(value)


def _container_copy(value: Any) -> Any:
    """A list / dict value copied, not its items (upstream's ``clone(recurse=False)``)."""
    return value.copy() if type(value) in (list, dict) else value


def _refuse_entries(method: str, entries: dict) -> None:
    """A leaf takes another leaf's value(s), not entries given as keywords (upstream's ``TypeError``)."""
    if entries:
        raise TypeError(f"A non-tensor leaf's {method}() takes no entries as keyword arguments (got "
                        f"{sorted(entries)}): pass another NonTensorData or NonTensorStack.")


def values_over(leaf: Any, shape: torch.Size) -> list:
    """The values of ``leaf`` at each element of ``shape`` (broadcast from the left), flat."""
    grid = torch.arange(leaf._batch_size.numel()).view(leaf._batch_size).expand(shape)
    values = leaf._flat_values()
    return [values[i] for i in grid.reshape(-1).tolist()]


class NonTensorMembersMixin(NonTensorHost):
    """Metadata, locking, the (empty) dict API, moves, updates and comparisons of a non-tensor leaf."""

    __slots__ = ()

    # ------------------------------------------------------------------ batch metadata
    def _set_batch_size(self, value: Any) -> None:
        # A leaf without tensors takes any batch size, as upstream's (a stack only one of as many
        # elements: its values are laid out over it).
        size = _core._as_size(value)
        if type(self) is _core.NonTensorStack and size.numel() != self._batch_size.numel():
            raise RuntimeError(
                f"the number of elements of batch_size {list(size)} differs from the "
                f"{self._batch_size.numel()} values of the NonTensorStack."
            )
        self._refuse_if_locked()
        self._batch_size = size
        self._names = None

    # C getters (attrgetter): the TensorDict paths read these on every non-tensor leaf they touch.
    batch_size = property(attrgetter("_batch_size"), _set_batch_size, doc="The batch size (a torch.Size).")
    shape = property(attrgetter("_batch_size"), doc="The batch size.")

    @property
    def batch_dims(self) -> int:
        return len(self._batch_size)

    ndim = batch_dims

    def dim(self) -> int:
        return len(self._batch_size)

    def ndimension(self) -> int:
        return len(self._batch_size)

    def size(self, dim: Optional[int] = None) -> Any:
        return self._batch_size if dim is None else self._batch_size[dim]

    def numel(self) -> int:
        return self._batch_size.numel()

    def __len__(self) -> int:
        return self._batch_size[0] if self._batch_size else 0

    def __iter__(self) -> Iterator[Any]:
        if not self._batch_size:
            raise TypeError("iteration over a 0-d tensordict. Use keys(), values() or items() to iterate over "
                            "its entries.")
        return iter(self.unbind(0))

    def __bool__(self) -> bool:
        raise RuntimeError(
            "Converting a tensordict to boolean value is not permitted. Use len(td.keys()) to test for keys, "
            "td.is_empty() to test for leaves, or (a == b).all() / .any() to reduce a comparison."
        )

    def _refuse_device(self, value: Any) -> None:
        raise RuntimeError(
            "device cannot be set using tensordict.device = device, because device cannot be updated "
            "in-place. To update device, use tensordict.to(new_device), which will return a new tensordict "
            "on the new device."
        )

    device = property(attrgetter("_device"), _refuse_device, doc="The device (None: none); use ``to()`` to move.")

    @property
    def names(self) -> list:
        return list(self._names) if self._names is not None else [None] * len(self._batch_size)

    @names.setter
    def names(self, value: Optional[Sequence[Optional[str]]]) -> None:
        names = check_names(value, self._batch_size)
        if names != self._names:
            self._refuse_if_locked()
        self._names = names

    def rename_(self, *names: Optional[str], **rename_map: str) -> Any:
        """Rename the batch dims in place: new names (one per dim, or a single None to clear them) or
        ``old=new`` pairs, not both (upstream's rules); returns self."""
        if names and rename_map:
            raise ValueError("Passed both a name map and a name list. Only one is accepted.")
        if not names and not rename_map:
            if self._batch_size:
                raise ValueError("Neither a name map nor a name list was passed. Only one is accepted.")
            return self
        if rename_map:
            current = self.names
            unknown = [old for old in rename_map if old not in current]
            if unknown:
                raise ValueError(f"Some names to be renamed were not part of the tensordict names: {unknown} vs "
                                 f"{current}.")
            self.names = [rename_map.get(name, name) if name is not None else None for name in current]
        else:
            self.names = None if names == (None,) else names
        return self

    def rename(self, *names: Optional[str], **rename_map: str) -> Any:
        """A copy with renamed batch dims (``rename_``'s rules, and at least one argument)."""
        if not names and not rename_map:
            raise ValueError("Neither a name map nor a name list was passed. Only one is accepted.")
        return self._shallow().rename_(*names, **rename_map)

    def refine_names(self, *names: Any) -> Any:
        self.names = expand_ellipsis(names, self.names)
        return self

    # Properties upstream answers for a leaf without tensors.
    dtype = property(lambda self: None, doc="None: a non-tensor leaf has no dtype.")
    requires_grad = property(lambda self: False, doc="False: a non-tensor leaf has no gradient.")
    depth = property(lambda self: 0, doc="0: a non-tensor leaf has no nested levels.")
    is_cpu = property(lambda self: self._device is not None and self._device.type == "cpu")
    is_cuda = property(lambda self: self._device is not None and self._device.type == "cuda")
    is_meta = property(lambda self: self._device is not None and self._device.type == "meta")

    def is_shared(self) -> bool:
        return False

    # ------------------------------------------------------------------ locking
    @property
    def is_locked(self) -> bool:
        return self._locked

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        self._locked = bool(value)

    def _refuse_if_locked(self) -> None:
        if self._locked:
            raise locked_error()

    def lock_(self) -> Any:
        """Forbid replacing the value (``data = ...``, ``update``); returns self.

        As on a TensorDict, ``with leaf.unlock_(): ...`` (or ``lock_()``) restores the former state on exit.
        """
        self._lock_undo = self._locked
        self._locked = True
        return self

    def unlock_(self) -> Any:
        self._lock_undo = self._locked
        self._locked = False
        return self

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        undo = getattr(self, "_lock_undo", None)
        if undo is not None:
            self._locked = undo
            self._lock_undo = None

    # ------------------------------------------------------------------ the dict API (no keys)
    def keys(self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Any = None, *,
             sort: bool = False) -> list:
        """No keys: a non-tensor leaf is a value, not a TensorDict (as upstream)."""
        return []

    def values(self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Any = None, *,
               sort: bool = False) -> list:
        return []

    def items(self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Any = None, *,
              sort: bool = False) -> list:
        return []


    def get(self, key: Any, default: Any = None) -> Any:
        """``get("data")`` is the value of a ``NonTensorData`` (upstream's field); any other key gives ``default``."""
        if key == "data" and isinstance(self, _core.NonTensorData):
            return self._data
        return default

    sorted_keys = property(lambda self: [], doc="[]: a leaf has no keys.")

    def select(self, *keys: Any, inplace: bool = False, strict: bool = True, as_tensordict: bool = False) -> Any:
        """No key to select: a copy (as upstream); a key raises ``KeyError`` (unless ``strict=False``).
        ``as_tensordict=True`` on a ``NonTensorData`` gives, as upstream, an empty TensorDict of its batch
        size (its fields, with the value's, are none); a stack stays a stack."""
        if keys and strict:
            from .._errors import missing_key_error

            raise missing_key_error(keys[0], [])
        if as_tensordict and isinstance(self, _core.NonTensorData):
            from ..tensordict import TensorDict

            return TensorDict({}, batch_size=self._batch_size, device=self._device)
        return self if inplace else self._shallow()

    def exclude(self, *keys: Any, inplace: bool = False) -> Any:
        """No key to exclude: a copy (as upstream)."""
        return self if inplace else self._shallow()

    def is_empty(self) -> bool:
        """False: the leaf holds a value (as upstream)."""
        return False

    def is_non_tensor(self, key: Any = None) -> bool:
        return True

    def empty(self, recurse: bool = False, *, device: Any = _KEEP, batch_size: Any = None,
              names: Any = None) -> Any:
        """A copy holding the same value(s), optionally with another batch size / device / names (as upstream)."""
        result = self._shallow()
        if batch_size is not None:
            result._names = None
            result.batch_size = batch_size
        if device is not _KEEP:
            result._device = _core._as_device(device)
        if names is not None:
            result.names = names
        return result

    # ------------------------------------------------------------------ copies and moves
    def clone(self, recurse: bool = True) -> Any:
        """A new leaf: ``recurse=True`` deep-copies the value(s); ``recurse=False`` copies a list, tuple or
        dict value but not its items (as upstream)."""
        result = self._shallow()
        convert = _deep_copy if recurse else _container_copy
        if isinstance(result, _core.NonTensorData):
            result._data = convert(result._data)
        else:  # each element on its own, as upstream's members are copied one by one
            result._values = [convert(value) for value in result._values]
        return result

    def copy(self) -> Any:
        """``clone(recurse=False)``: a new leaf whose list / dict values are copied, not their items."""
        return self.clone(recurse=False)

    def to_tensordict(self, *, retain_none: Optional[bool] = None) -> Any:
        """``self``: a non-tensor leaf is already its own dense form (as upstream)."""
        return self

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """A copy on another device (the value itself is not moved); a dtype changes nothing."""
        from .._moves import _parse_to

        device, _, _, batch_size = _parse_to(args, dict(kwargs))
        result = self._shallow() if device is None else self._to_device(device)
        if batch_size is not None:
            result.batch_size = batch_size
        return result

    def cpu(self, **kwargs: Any) -> Any:
        return self.to("cpu")

    def cuda(self, device: Any = None, **kwargs: Any) -> Any:
        return self.to(torch.device("cuda") if device is None else torch.device("cuda", device)
                       if isinstance(device, int) else device)

    def _copy_self(self, *args: Any, **kwargs: Any) -> Any:
        return self._shallow()

    def _cast(self, *, cast_filter: Optional[Callable] = None) -> Any:
        """No tensor to cast (``cast_filter`` has nothing to choose from): a copy of the wrapper, as upstream."""
        return self._shallow()

    def contiguous(self, *, canonical: bool = False, inplace: bool = False) -> Any:
        """Nothing to make contiguous: a stack is returned itself (as upstream), a ``NonTensorData`` is copied
        unless ``inplace``."""
        if inplace or type(self) is _core.NonTensorStack:
            return self
        return self._shallow()

    # No tensor to detach or cast: a copy of the wrapper, as upstream's answer.
    detach = _copy_self
    float = double = half = bfloat16 = int = long = bool = byte = char = short = _cast
    float16 = float32 = float64 = int8 = int16 = int32 = int64 = uint8 = _cast
    complex64 = complex128 = _cast

    uint16 = uint32 = uint64 = complex32 = _cast

    def detach_(self) -> Any:
        return self

    def pin_memory_(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def zero_grad(self, set_to_none: builtins.bool = True) -> Any:
        return self

    def type(self, dst_type: Any = None, *, cast_filter: Optional[Callable] = None) -> Any:
        return self._shallow()

    def pin_memory(self, *args: Any, **kwargs: Any) -> Any:
        return self._shallow()

    def requires_grad_(self, requires_grad: builtins.bool = True) -> Any:
        return self

    # ------------------------------------------------------------------ updates
    def update(self, input_dict_or_td: Any = None, clone: builtins.bool = False, inplace: builtins.bool = False, *,
               non_blocking: builtins.bool = False, keys_to_update: Any = None, is_leaf: Optional[Callable] = None,
               update_batch_size: builtins.bool = False, ignore_lock: builtins.bool = False, **kwargs: Any) -> Any:
        """Take the value(s) of another non-tensor leaf (as upstream); returns self.

        A leaf has no keys, so the keywords that choose keys or leaves (``keys_to_update``, ``is_leaf``)
        change nothing, nor do ``non_blocking`` and ``update_batch_size``; ``ignore_lock`` does not
        unlock a leaf (as upstream). Entries given as keywords are refused (``TypeError``)."""
        _refuse_entries("update", kwargs)
        if input_dict_or_td is None:
            return self
        if not inplace:
            self._refuse_if_locked()
        return self._take(input_dict_or_td, clone)

    def update_(self, input_dict_or_td: Any = None, clone: builtins.bool = False, *,
                non_blocking: builtins.bool = False,
                keys_to_update: Any = None, **kwargs: Any) -> Any:
        """Take the value(s) of another non-tensor leaf in place (allowed on a locked leaf); returns self.
        ``non_blocking`` and ``keys_to_update`` change nothing on a leaf (as upstream)."""
        _refuse_entries("update_", kwargs)
        if input_dict_or_td is None:
            return self
        if isinstance(self, _core.NonTensorData) and not _core.is_non_tensor(input_dict_or_td):
            raise RuntimeError(
                "NonTensorDataBase.copy_ / update_ requires the source to be a NonTensorDataBase object.")
        if isinstance(self, _core.NonTensorData) and type(input_dict_or_td) is _core.NonTensorStack:
            raise RuntimeError("Cannot update a NonTensorDataBase with a NonTensorStack object.")
        return self._take(input_dict_or_td, clone)

    def copy_(self, src: Any, non_blocking: builtins.bool = False) -> Any:
        """``update_(src)`` (upstream names the source ``src`` here, ``tensordict`` on a stack)."""
        return self.update_(src)

    def _take(self, source: Any, clone: builtins.bool) -> Any:
        from copy import deepcopy

        if self._is_shared() and _core.is_non_tensor(source):
            if isinstance(self, _core.NonTensorData) and type(source) is _core.NonTensorStack:
                raise ValueError(
                    "Cannot update a NonTensorDataBase object with a NonTensorStack. Call "
                    "`non_tensor_data.maybe_to_stack()` before calling update().")
            self._write_shared_leaf(source)  # the value goes to the shared folder, for every process
            return self
        if isinstance(self, _core.NonTensorData):
            if type(source) is _core.NonTensorStack:
                raise ValueError(
                    "Cannot update a NonTensorDataBase object with a NonTensorStack. Call "
                    "`non_tensor_data.maybe_to_stack()` before calling update().")
            if not isinstance(source, _core.NonTensorData):
                raise RuntimeError(f"Unexpected type {type(source)}")
            self._data = deepcopy(source._data) if clone else source._data
        else:
            if not _core.is_non_tensor(source):
                raise NotImplementedError(
                    f"The data type {type(source)} is not supported within {type(self).__name__}.update")
            values = values_over(source, self._batch_size) if source._batch_size != self._batch_size \
                else source._flat_values()
            if len(values) != len(self._values):
                raise RuntimeError("the batch size of the source does not match the stack's.")
            self._values = deepcopy(values) if clone else values
            self._origins = None
        self._rewrite_saved()
        return self
