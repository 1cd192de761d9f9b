"""The TensorDict API of a tensorclass: delegation to its TensorDict and rewrapping the results.

Every public TensorDict method, property and operator is installed on ``TensorClass``
as a small function that calls the TensorDict's own and puts a result holding only
fields back into the caller's class (:func:`rewrap_result`). :class:`TensorDictMethods`
holds what needs more than that: batch indexing (the hot path of ``data[idx]``),
fields used as keys (``get``/``set``/``update``), conversions, ``__torch_function__``,
persistence (the instance itself is saved so the folder records its class), ``repr``,
pickling and copies.

>>> import torch
>>> from torchdict import tensorclass
>>> @tensorclass
... class Point:
...     xy: torch.Tensor
>>> points = Point(torch.zeros(4, 2), batch_size=[4])
>>> type(points.reshape(2, 2)).__name__, type(torch.stack([points, points])).__name__
('Point', 'Point')
"""
from __future__ import annotations


from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import torch

from .._base import BoundCall, TensorCollection
from .._convert import parse_batch_size
from .._indexing import index_basic as _index_basic
from .._indexing import index_tensordict as _index_tensordict
from .._keys import key_to_tuple
from ._conversions import (fill_none_fields, nest_tensorclasses, scalars_as_non_tensor, set_none_entry,
                                       set_none_item, warn_defaults_not_filled)
from ._fields import (NON_TENSOR, FieldStorage, guard_all, no_field_error, set_instance_dict, set_td,
                                  to_field_leaf)
from ..saving import save_collection
from ..tensordict import TensorDict

if TYPE_CHECKING:
    from typing_extensions import Self

_object_new = object.__new__
_Size = torch.Size

# Methods whose TensorDict result is an entry (or a plain export), never the collection itself.
_ENTRY_METHODS = frozenset({"get", "get_at", "pop", "popitem", "setdefault", "get_non_tensor", "to_dict",
                            "to_tensordict", "_get_path", "keys", "values", "items"})

_BINARY_OPERATORS = tuple(
    f"__{prefix}{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
                                   "or", "xor", "lshift", "rshift") for prefix in ("", "r", "i")
) + ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")
_UNARY_OPERATORS = ("__neg__", "__pos__", "__abs__", "__invert__", "__bool__", "__len__", "__contains__",
                    "__enter__", "__exit__")


# ---------------------------------------------------------------------------- errors
def _keys_error(cls: type[TensorDictMethods], extra: set) -> ValueError:
    return ValueError(
        f"Keys from the tensordict ({extra}) must correspond to the class attributes "
        f"({set(cls._tc_field_names)}); {cls.__name__} has no field named {sorted(extra)}."
    )


def _field_index_error(index: Any) -> ValueError:
    key = index if isinstance(index, str) else index[0] if len(index) == 1 else index
    return ValueError(
        f"Invalid indexing arguments: {key!r}. A tensorclass is indexed along its batch dimensions; "
        f"to read a field, use the attribute or get({key!r})."
    )


def _is_key_index(index: Any) -> bool:
    return isinstance(index, str) or (type(index) is tuple and bool(index) and isinstance(index[0], str))


# ---------------------------------------------------------------------------- rewrapping
def unwrap(value: Any) -> Any:
    """The TensorDict of a tensorclass instance (also inside lists and tuples); anything else as it is."""
    if isinstance(value, TensorDictMethods):
        return value._tensordict
    if type(value) in (list, tuple):
        return type(value)(unwrap(item) for item in value)
    return value


def rewrap_result(template: Any, source_td: Any, result: Any, name: Optional[str]) -> Any:
    """Put a TensorDict result back into ``template``'s class when it holds only its fields."""
    if result is source_td and source_td is not None:
        guard_all(template)
        return template
    if isinstance(result, TensorDict):
        if name in _ENTRY_METHODS or not result._tensordict.keys() <= type(template)._tc_field_set:
            return result
        if source_td is not None and any(result is leaf for leaf in source_td._tensordict.values()):
            return result
        return template._rewrap(result, name != "empty")  # empty()'s shell skips __post_init__ (as upstream)
    if isinstance(result, tuple) and not isinstance(result, _Size):  # a shape (get_item_shape) stays as it is
        items = [rewrap_result(template, source_td, item, name) for item in result]
        return type(result)(items) if type(result) is tuple or hasattr(type(result), "n_fields") \
            else type(result)(*items)
    if type(result) is list:
        return [rewrap_result(template, source_td, item, name) for item in result]
    return result


def _collect_tensorclasses(items: Any, found: dict) -> None:
    for item in items:
        if isinstance(item, TensorDictMethods):
            found[id(item._tensordict)] = item
        elif type(item) in (list, tuple):
            _collect_tensorclasses(item, found)


def _rebuild(cls: type[TensorDictMethods], td: TensorDict) -> Any:
    """Unpickle a tensorclass instance (``__reduce__`` names this function)."""
    return cls._from_tensordict_unchecked(td)


# ---------------------------------------------------------------------------- delegates
def _call_delegated(instance: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """The TensorDict's ``name`` called on the fields (collection arguments unwrapped), its result rewrapped."""
    td = instance._tensordict
    try:
        bound = getattr(td, name)
    except AttributeError:
        raise AttributeError(f"{type(instance).__name__!r} object has no attribute {name!r}") from None
    if args:
        args = tuple(unwrap(arg) for arg in args)
    if kwargs:
        kwargs = {key: unwrap(value) for key, value in kwargs.items()}
        if kwargs.get("as_tensordict"):  # select(..., as_tensordict=True): the TensorDict itself, not the class
            return bound(*args, **kwargs)
    cast_filter = type(instance)._tc_cast_filter
    if cast_filter is not None and name in _CASTS_WITH_FILTER and "cast_filter" not in kwargs:
        kwargs = {**kwargs, "cast_filter": cast_filter}  # the class's option; an explicit value (None too) wins
    return rewrap_result(instance, td, bound(*args, **kwargs), name)


def _delegate(name: str) -> Any:
    return BoundCall(_call_delegated, name)


# The dtype casts that take ``cast_filter=`` (a tensorclass's ``cast_filter`` option is their default).
_CASTS_WITH_FILTER = frozenset({
    "float", "double", "half", "bfloat16", "int", "long", "short", "bool", "float16", "float32", "float64", "int8",
    "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "complex64", "complex128", "complex32", "type",
    "to",  # to(dtype) (ignored without a dtype, as upstream)
})


def _binary_delegate(name: str) -> Callable:
    def operator(self: Any, other: Any) -> Any:
        td = self._tensordict
        bound = getattr(td, name, None)
        if bound is None:
            return NotImplemented
        result = bound(other._tensordict if isinstance(other, TensorDictMethods) else other)
        if result is NotImplemented:
            return result
        return rewrap_result(self, td, result, name)

    operator.__name__ = operator.__qualname__ = name
    return operator


def _delegate_property(name: str, prop: property) -> property:
    def fget(self: Any) -> Any:
        return rewrap_result(self, None, getattr(self._tensordict, name), name)

    def fset(self: Any, value: Any) -> None:
        setattr(self._tensordict, name, unwrap(value))

    return property(fget, fset if prop.fset is not None else None, doc=prop.__doc__)


def install_delegates(cls: type) -> None:
    """Expose the operators and every public TensorDict method and property on ``cls`` (unless it has its own).

    Explicit class attributes rather than a ``__getattr__`` fallback: a class with
    ``__getattr__`` loses CPython's fast attribute lookup, which field reads rely on.
    Their names are reserved: a field can't be called like one.
    """
    for name in _BINARY_OPERATORS:
        setattr(cls, name, _binary_delegate(name))
    for name in _UNARY_OPERATORS:
        setattr(cls, name, _delegate(name))
    for name in dir(TensorDict):
        if name.startswith("_") or hasattr(cls, name):
            continue
        raw = next(klass.__dict__[name] for klass in TensorDict.__mro__ if name in klass.__dict__)
        if isinstance(raw, property):
            setattr(cls, name, _delegate_property(name, raw))
        elif callable(raw) and not isinstance(raw, (classmethod, staticmethod)):
            setattr(cls, name, _delegate(name))


# ---------------------------------------------------------------------------- the methods
class TensorDictMethods(FieldStorage):
    """The part of the TensorDict API a tensorclass implements itself (a base of ``TensorClass``)."""

    __slots__ = ()

    # ------------------------------------------------------------------ rewrapping
    def _rewrap(self, td: TensorDict, post_init: bool = True) -> "Self":
        """A new instance of this class around ``td`` (no checks, no ``__init__``; ``__post_init__`` runs unless
        the class has ``skip_post_init_on_rebuild``, as upstream's rebuilds)."""
        new = _object_new(type(self))
        set_td(new, td)
        set_instance_dict(new, td._tensordict)
        if self._tc_frozen:
            td._lock_tree()
        if post_init and self._tc_rebuild_post_init:
            getattr(new, "__post_init__")()  # the user's hook: the flag (or hasattr) says the class has one
        return new

    @classmethod
    def _from_tensordict_unchecked(cls, td: TensorDict) -> "Self":
        new = _object_new(cls)
        set_td(new, td)
        set_instance_dict(new, td._tensordict)
        guard_all(new)
        if hasattr(cls, "__post_init__"):  # an instance from new data (from_tensordict, loading): always
            getattr(new, "__post_init__")()  # the user's hook: the flag (or hasattr) says the class has one
        return new

    # ------------------------------------------------------------------ indexing
    def __getitem__(self, index: Any) -> "Self":
        # The general path. Each class also gets a generated __getitem__ in front of this one
        # (_indexing.py) for data[i] / data[a:b] over plain tensor fields.
        index_type = type(index)
        if index_type is int or index_type is slice:
            # Index the storage dict and keep the result lazy, as a new instance is (no
            # TensorDict built unless names or a lock need one).
            td = self._td
            new = _object_new(type(self))
            storage = new.__dict__  # fresh and empty: filled in place (cheaper than setting one)
            if type(td) is tuple:
                batch, device = td
                if type(batch) is not _Size:
                    # Made a torch.Size once, then kept: construction leaves a plain tuple.
                    batch = _Size(batch)
                    set_td(self, (batch, device))
                names = None
            else:
                batch, device, names = td._batch_size, td._device, td._names
            new_batch, names = _index_basic(self.__dict__, batch, names, index, storage)
            if names is None and not self._tc_frozen:
                set_td(new, (new_batch, device))
            else:
                result = (TensorDict if type(td) is tuple else type(td))._new_unsafe(storage, new_batch, device, names)
                set_td(new, result)
                if self._tc_frozen:
                    result._lock_tree()
            if self._tc_rebuild_post_init:
                getattr(new, "__post_init__")()  # the user's hook: the flag (or hasattr) says the class has one
            return new
        # Any other batch index goes straight to the batch indexing (a str is never a batch index).
        if index_type is str or (index_type is tuple and index and type(index[0]) is str):
            raise _field_index_error(index)
        td = self._td
        if type(td) is tuple:
            td = self._tensordict
        result = _index_tensordict(td, index)
        new = _object_new(type(self))
        set_td(new, result)
        set_instance_dict(new, result._tensordict)
        if self._tc_frozen:
            result._lock_tree()
        if self._tc_rebuild_post_init:
            getattr(new, "__post_init__")()  # the user's hook: the flag (or hasattr) says the class has one
        return new

    setattr(__getitem__, "_tc_general", True)

    def __setitem__(self, index: Any, value: Any) -> None:
        if _is_key_index(index):
            raise _field_index_error(index)
        self._tensordict[index] = value._tensordict if isinstance(value, TensorDictMethods) else value
        guard_all(self)

    def __iter__(self) -> Any:
        return (self._rewrap(td) for td in iter(self._tensordict))

    # ------------------------------------------------------------------ fields as keys
    def get(self, key: Any, *default: Any) -> Any:
        """The field (or nested entry) at ``key``; non-tensor values come back raw.

        >>> import torch
        >>> from torchdict import TensorClass
        >>> class P(TensorClass):
        ...     x: torch.Tensor
        ...     tag: str = "a"
        >>> P(torch.zeros(2)).get("tag"), P(torch.zeros(2)).get("y", None)
        ('a', None)
        """
        value = self._tensordict.get(key, *default)
        return value.data if type(value) in NON_TENSOR else value

    def set(self, key: Any, value: Any, inplace: bool = False, non_blocking: bool = False, **kwargs: Any) -> "Self":
        """Write a field (or a nested entry under a field); returns self (``non_blocking`` goes to the copy)."""
        if non_blocking:
            kwargs["non_blocking"] = non_blocking
        keys = key_to_tuple(key)
        spec = type(self)._tc_fields.get(keys[0])
        if spec is None:
            raise no_field_error(type(self), keys[0])
        if len(keys) > 1:
            self._tensordict.set(keys, unwrap(value), inplace=inplace, **kwargs)
        elif inplace and keys[0] in self._tensordict._tensordict:
            td = self._tensordict
            self._tensordict.set(keys, to_field_leaf(spec, value, td._batch_size, td._device), inplace=True)
        else:
            setattr(self, keys[0], value)
        return self

    def update(self, input_dict_or_td: Any = None, clone: bool = False, inplace: bool = False, *,
               keys_to_update: Optional[Sequence[Any]] = None, non_blocking: bool = False,
               update_batch_size: bool = False, ignore_lock: bool = False, is_leaf: Optional[Callable] = None,
               **kwargs: Any) -> "Self":
        """Merge entries in (every top-level key must be a field), with ``TensorDict.update``'s options;
        returns self."""
        source = unwrap(input_dict_or_td)
        if isinstance(source, TensorCollection):
            top_keys = set(source.keys())  # any collection: a TensorDict, a lazy stack, a file-backed one
        elif isinstance(source, Mapping):
            top_keys = {key_to_tuple(key)[0] for key in source}
        else:
            top_keys = set()
        extra = top_keys - type(self)._tc_field_set
        if extra:
            raise _keys_error(type(self), extra)
        self._tensordict.update(source, clone, inplace, keys_to_update=keys_to_update, non_blocking=non_blocking,
                                update_batch_size=update_batch_size, ignore_lock=ignore_lock, is_leaf=is_leaf,
                                **kwargs)
        guard_all(self)
        return self

    # ------------------------------------------------------------------ conversions
    @classmethod
    def from_tensordict(cls, tensordict: TensorDict, non_tensordict: Optional[dict] = None,
                        safe: Optional[bool] = None) -> "Self":
        """Wrap ``tensordict`` (leaves shared, not copied) in this class; its keys must be fields.

        ``safe`` is deprecated (a ``DeprecationWarning``, as upstream): anything but a collection is refused
        (``RuntimeError``) whatever it says.

        An entry of a field annotated with a tensorclass (or ``Optional`` of one) that is a
        TensorDict whose keys are all fields of that class becomes an instance of it, at every
        level; those are set in a shallow copy, so ``tensordict`` itself is left as it is.
        ``non_tensordict`` gives more fields by name (set like attributes).

        >>> import torch
        >>> from torchdict import TensorClass, TensorDict
        >>> class P(TensorClass):
        ...     x: torch.Tensor
        >>> P.from_tensordict(TensorDict(x=torch.zeros(3), batch_size=[3])).x.shape
        torch.Size([3])
        """
        if safe is not None:
            import warnings

            warnings.warn("TensorClass.from_tensordict(safe=...) is deprecated and will be removed in "
                          "TensorDict 0.17 (a non-collection is always refused).", DeprecationWarning, stacklevel=2)
        if not isinstance(tensordict, TensorCollection):
            raise RuntimeError(f"Expected a TensorDictBase instance but got {type(tensordict)}")
        tensordict = unwrap(tensordict)
        extra = set(tensordict._tensordict) - cls._tc_field_set
        if extra:
            raise _keys_error(cls, extra)
        instance = cls._from_tensordict_unchecked(nest_tensorclasses(cls, tensordict, owned=False))
        for name, value in (non_tensordict or {}).items():
            setattr(instance, name, value)
        return instance

    @classmethod
    def from_dict(cls, input_dict: Mapping, *, auto_batch_size: Optional[bool] = None, batch_size: Any = None,
                  device: Any = None, batch_dims: Optional[int] = None) -> "Self":
        """Build an instance from a (nested) dict of its fields, as upstream's ``from_dict``.

        The values are converted as ``TensorDict.from_dict`` does (leaves shared, nested dicts
        become TensorDicts, or instances for fields annotated with a tensorclass); the class
        options (``autocast``, ``nocast``) play no part. A field that is missing or ``None``
        is ``None``, even one with a declared default (a ``FutureWarning`` says so, as
        upstream, which will fill the defaults in 0.17). With a non-empty ``batch_size``,
        Python scalars are stored as they are (non-tensor data). ``auto_batch_size`` (or
        ``batch_dims``) sets the batch size of every level to the leading dims its leaves share.

        >>> import torch
        >>> from torchdict import TensorClass
        >>> class P(TensorClass):
        ...     x: torch.Tensor
        >>> P.from_dict({"x": torch.zeros(3, 2)}, batch_dims=1).batch_size
        torch.Size([3])
        """
        if not isinstance(input_dict, Mapping):
            raise TypeError(f"{cls.__name__}.from_dict() expects a mapping of field names to values, got "
                            f"{type(input_dict).__name__}; wrap a TensorDict with from_tensordict().")
        if batch_size is not None and batch_dims is not None:
            raise ValueError("Cannot pass both batch_size and batch_dims to `from_dict`.")
        top_keys = {key_to_tuple(key)[0] for key in input_dict}
        extra = top_keys - cls._tc_field_set
        if extra:
            raise _keys_error(cls, extra)
        warn_defaults_not_filled(cls, top_keys)
        # A None field is a missing key (the TensorDict would store it as non-tensor data).
        values = {key: value for key, value in input_dict.items() if value is not None or key not in cls._tc_field_set}
        batch = parse_batch_size(batch_size)
        if batch:
            # A 0-dim tensor can't have a non-empty batch size: a scalar is kept as non-tensor data.
            values = scalars_as_non_tensor(values, batch, device)
        td = TensorDict.from_dict(values, auto_batch_size=auto_batch_size, batch_size=batch_size, device=device,
                                  batch_dims=batch_dims)
        return cls._from_tensordict_unchecked(nest_tensorclasses(cls, td, owned=True))

    def to_tensordict(self, *, retain_none: Optional[bool] = None) -> TensorDict:
        """A plain TensorDict holding a copy of the fields (changing it leaves this object alone).

        Tensors are cloned, nested tensorclasses become TensorDicts and non-tensor fields
        ``NonTensorData``, at every level. ``None`` fields are left out unless
        ``retain_none=True``, which writes them as ``NonTensorData(None)`` (after the others).
        """
        result = self._tensordict.to_tensordict(retain_none=retain_none)
        if retain_none:
            fill_none_fields(self, result, set_none_entry)
        return result

    def to_dict(self, *, retain_none: bool = True, convert_tensors: Union[bool, str] = False) -> dict:
        """The fields as a nested plain dict (nested tensorclasses as dicts, non-tensor values raw).

        ``None`` fields are included as ``None`` (after the stored fields, in declaration
        order, at every level) unless ``retain_none=False``; ``convert_tensors=True`` turns
        tensors into nested lists.

        >>> import torch
        >>> from typing import Optional
        >>> from torchdict import TensorClass
        >>> class P(TensorClass):
        ...     x: torch.Tensor
        ...     y: Optional[torch.Tensor] = None
        >>> P(torch.ones(2)).to_dict(convert_tensors=True)
        {'x': [1.0, 1.0], 'y': None}
        """
        result = self._tensordict.to_dict(retain_none=retain_none, convert_tensors=convert_tensors)
        if retain_none:
            fill_none_fields(self, result, set_none_item)
        return result

    # ------------------------------------------------------------------ torch integration
    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        originals: dict = {}  # id(TensorDict) -> the tensorclass instance it came from
        _collect_tensorclasses((args, tuple(kwargs.values())), originals)
        if not originals:
            return NotImplemented
        template = next(iter(originals.values()))
        result = func(*unwrap(args), **{key: unwrap(value) for key, value in kwargs.items()})
        if isinstance(result, TensorDict) and id(result) in originals:
            return originals[id(result)]  # e.g. out=: the caller's own object
        return rewrap_result(template, None, result, getattr(func, "__name__", None))

    # ------------------------------------------------------------------ persistence
    # The instance itself is saved (not its TensorDict) so that the folder records the class.
    def memmap(self, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> "Self":
        """A locked, memory-mapped copy written to ``prefix`` (see ``TensorDict.memmap``).

        >>> import tempfile, torch
        >>> from torchdict import TensorClass
        >>> class P(TensorClass):
        ...     x: torch.Tensor
        >>> folder = tempfile.mkdtemp()
        >>> _ = P(torch.ones(2)).memmap(folder)
        >>> P.load_memmap(folder).x.tolist()
        [1.0, 1.0]
        """
        return save_collection(self, prefix, copy_existing=copy_existing, **kwargs)

    save = dumps = memmap

    def memmap_(self, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> "Self":
        """Memory-map the fields in place; returns self (locked)."""
        return save_collection(self, prefix, copy_existing=copy_existing, inplace=True, **kwargs)

    def memmap_like(self, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> "Self":
        """Same fields, dtypes and shapes as zero-filled memory-mapped files."""
        return save_collection(self, prefix, copy_existing=copy_existing, like=True, **kwargs)

    @classmethod
    def load_memmap(cls, prefix: Any, *args: Any, **kwargs: Any) -> "Self":
        """Load a folder saved with ``memmap``/``save``; a plain TensorDict folder is wrapped in ``cls``."""
        loaded = TensorDict.load_memmap(prefix, *args, **kwargs)
        return loaded if isinstance(loaded, cls) else cls.from_tensordict(unwrap(loaded))

    load = load_memmap

    def pack(self, dim: int = -1, *, layout: Any = None) -> tuple:
        """``TensorDict.pack`` of the fields; the layout records this class, so ``layout.unpack`` rebuilds it."""
        from ..formats.pack import pack

        return pack(self, dim, layout=layout)

    # ------------------------------------------------------------------ python protocols
    def __repr__(self) -> str:
        from ..printing import PRINT_OPTIONS, format_leaf, indent, td_is_shared

        if PRINT_OPTIONS["compact"]:
            from .._compact_repr import compact_repr

            return compact_repr(self)
        td = self._tensordict
        storage = td._tensordict
        lines = [f"{key}={format_leaf(storage[key])}" for key in sorted(storage)]
        lines += [f"{name}=None" for name in self._tc_field_names if name not in storage]
        lines += [f"batch_size={td.batch_size}", f"device={td.device}", f"is_shared={td_is_shared(td)}"]
        return f"{type(self).__name__}(\n" + indent(",\n".join(lines)) + ")"

    def __reduce__(self) -> tuple:
        return (_rebuild, (type(self), self._tensordict))

    def __copy__(self) -> "Self":
        return self._rewrap(self._tensordict.copy())

    def __deepcopy__(self, memo: dict) -> "Self":
        import copy

        return self._rewrap(copy.deepcopy(self._tensordict, memo))

    if TYPE_CHECKING:
        # Delegated TensorDict methods whose result is rewrapped in the tensorclass, as type checkers should
        # see them: TensorDict's signatures (see _collection_api.py, which declares the rest), returning Self.
        def reshape(self, *shape: Any, **kwargs: Any) -> Self: ...
        def view(self, *shape: Any, size: Any = None, batch_size: Any = None) -> Self: ...
        def permute(self, *dims: Any) -> Self: ...
        def transpose(self, dim0: int, dim1: int) -> Self: ...
        def squeeze(self, dim: Optional[int] = None) -> Self: ...
        def unsqueeze(self, dim: int) -> Self: ...
        def expand(self, *shape: Any) -> Self: ...
        def flatten(self, start_dim: int = 0, end_dim: int = -1, *, inplace: bool = False) -> Self: ...
        def unflatten(self, dim: int, unflattened_size: Sequence[int], *, inplace: bool = False) -> Self: ...
        def unbind(self, dim: int = 0) -> tuple[Self, ...]: ...
        def split(self, split_size: Any, dim: int = 0) -> tuple[Self, ...]: ...
        def chunk(self, chunks: int, dim: int = 0) -> tuple[Self, ...]: ...
        def to(self, *args: Any, **kwargs: Any) -> Self: ...
        def cpu(self, **kwargs: Any) -> Self: ...
        def cuda(self, device: Any = None, **kwargs: Any) -> Self: ...
        def clone(self, recurse: bool = True, **kwargs: Any) -> Self: ...
        def detach(self) -> Self: ...
        def contiguous(self, *, canonical: bool = False, inplace: bool = False) -> Self: ...
        def apply(self, fn: Callable, *others: Any, **kwargs: Any) -> Self: ...
        def apply_(self, fn: Callable, *others: Any, **kwargs: Any) -> Self: ...
        def select(self, *keys: Any, inplace: bool = False, strict: bool = True,
                   as_tensordict: bool = False) -> Self: ...
        def exclude(self, *keys: Any, inplace: bool = False) -> Self: ...
        def copy(self) -> Self: ...
        def lock_(self) -> Self: ...
        def unlock_(self) -> Self: ...
        def __eq__(self, other: object) -> Self: ...  # type: ignore[override]
        def __ne__(self, other: object) -> Self: ...  # type: ignore[override]
        def __add__(self, other: Any) -> Self: ...
        def __sub__(self, other: Any) -> Self: ...
        def __mul__(self, other: Any) -> Self: ...
        def __truediv__(self, other: Any) -> Self: ...
