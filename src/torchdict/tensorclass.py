"""@tensorclass: typed, dataclass-like containers with every TensorDict operation.

A tensorclass instance keeps all its fields in one TensorDict, ``self._tensordict``
(non-tensor fields as ``NonTensorData``), and is a ``TensorCollection``: the core's
recursions treat it like a TensorDict and rebuild it with ``_rewrap(td)``.

Speed comes from one trick: the instance ``__dict__`` *is* the storage dict of that
TensorDict (``self.__dict__ is self._tensordict._tensordict``), so reading a tensor
field is a plain attribute lookup. Fields that may hold non-tensor values get a
class-level property that unwraps ``NonTensorData`` (a data descriptor wins over the
instance dict). Everything else a TensorDict can do is delegated to the TensorDict
and the result rewrapped in the same class when it holds only fields.

Invariant relied on: a TensorDict's storage dict is mutated in place, never rebound
(``td._tensordict = {...}``) on a TensorDict that a tensorclass wraps.

>>> import torch
>>> from torchdict import tensorclass
>>> @tensorclass
... class Pair:
...     x: torch.Tensor
...     tag: str = "none"
>>> pair = Pair(torch.zeros(4, 3), batch_size=[4])
>>> pair[1:3].x.shape, pair[0].tag
(torch.Size([2, 3]), 'none')
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, overload

import torch

from ._base import TensorCollection
from ._convert import parse_batch_size, parse_device, to_leaf
from ._indexing import index_tensordict as _index_tensordict
from ._keys import key_to_tuple
from ._saved_classes import register_saved_class
from .nontensor import NonTensorData, NonTensorStack
from .saving import save_collection
from .tensordict import TensorDict

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # pragma: no cover - exercised on 3.10 only
    try:
        from typing_extensions import dataclass_transform
    except ImportError:
        def dataclass_transform(**kwargs: Any) -> Callable[[Any], Any]:
            return lambda obj: obj

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["tensorclass", "TensorClass", "is_tensorclass"]

_T = TypeVar("_T")
_Tensor = torch.Tensor
_Size = torch.Size
_EMPTY_SIZE = torch.Size(())
_NON_TENSOR = (NonTensorData, NonTensorStack)
_OPTION_NAMES = ("autocast", "frozen", "nocast", "shadow", "kw_only")
_DEFAULT_OPTIONS = dict.fromkeys(_OPTION_NAMES, False)
_object_new = object.__new__
# The C-level length of a tensor (torch.Tensor.__len__ is a slower Python wrapper).
_tensor_len = getattr(torch._C, "TensorBase", getattr(torch._C, "_TensorBase", None)).__len__


class _Default:
    """The signature default of a field that has a declared default (or factory)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<default>"


_DEFAULT = _Default()


class _FieldSpec:
    """What the class knows about one field (resolved once, when the class is built)."""

    __slots__ = ("name", "owner", "default", "factory", "annotation", "tensor_like", "cast_to", "raw_default",
                 "kw_only", "plain_tensor_ok")

    def __init__(self, field: dataclasses.Field, annotation: Any, owner: type) -> None:
        self.name = field.name
        self.owner = owner
        self.default = field.default
        self.factory = field.default_factory
        self.annotation = annotation
        self.kw_only = bool(field.kw_only is True)
        self.tensor_like = _is_tensor_like(annotation)
        self.cast_to = _cast_target(annotation)
        # A declared default of a field typed with a plain Python type is stored as it is.
        target = self.cast_to
        self.raw_default = (target is not None and not self.tensor_like
                            and not issubclass(target, (_Tensor, TensorCollection)))
        # A torch.Tensor value is stored as it is, unless autocast may turn it into something else.
        self.plain_tensor_ok = self.tensor_like or not owner._tc_options["autocast"]

    @property
    def has_default(self) -> bool:
        return self.default is not dataclasses.MISSING or self.factory is not dataclasses.MISSING

    def default_value(self) -> Any:
        return self.factory() if self.factory is not dataclasses.MISSING else self.default


# ---------------------------------------------------------------------------- annotations
def _is_tensor_like(annotation: Any) -> bool:
    """True when the field always holds a tensor or a collection (no unwrapping needed)."""
    if isinstance(annotation, type):
        return issubclass(annotation, (_Tensor, TensorCollection))
    if isinstance(annotation, str):
        name = annotation.replace(" ", "")
        for prefix in ("Optional[", "typing.Optional["):
            if name.startswith(prefix) and name.endswith("]"):
                name = name[len(prefix):-1]
        return name.rsplit(".", 1)[-1] in ("Tensor", "TensorDict")
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is typing.Union or type(annotation).__name__ == "UnionType":
        return bool(args) and all(_is_tensor_like(arg) for arg in args)
    return False


def _cast_target(annotation: Any) -> Optional[type]:
    """The class ``autocast`` converts a value to, or None when the annotation names none."""
    if isinstance(annotation, type):
        return None if annotation is object else annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _cast_target(args[0]) if len(args) == 1 else None
    if isinstance(origin, type):
        return origin
    return None


def _resolve_annotations(cls: type) -> dict:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a forward reference that can't be resolved yet: resolve field by field
        module_globals = getattr(sys.modules.get(cls.__module__), "__dict__", {})
        hints = {}
        for field in dataclasses.fields(cls):
            annotation = field.type
            if isinstance(annotation, str):
                try:
                    annotation = eval(annotation, dict(module_globals), dict(vars(cls)))  # noqa: S307
                except Exception:
                    pass
            hints[field.name] = annotation
        return hints


# ---------------------------------------------------------------------------- values
def _autocast(spec: _FieldSpec, value: Any, batch_size: _Size, device: Any) -> Any:
    target = spec.cast_to
    if target is None or isinstance(value, target):
        return value
    if is_tensorclass(target) and isinstance(value, TensorDict):
        return target.from_tensordict(value)
    if isinstance(value, Mapping) and not issubclass(target, TensorCollection):
        return value  # a dict is never cast to a tensor or a Python type (it stays a dict)
    if issubclass(target, _Tensor):
        try:
            return torch.as_tensor(value, device=device)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"Failed to cast the value {spec.name} to the type annotation {target}.") from None
    if is_tensorclass(target) and isinstance(value, Mapping):
        return target(**value, batch_size=batch_size, device=device)
    if issubclass(target, TensorCollection):
        return TensorDict(value, batch_size=batch_size, device=device) if isinstance(value, Mapping) else value
    if isinstance(value, _Tensor) and target in (int, float, bool):
        value = value.item()
    return NonTensorData(target(value), batch_size, device)


def _to_field_leaf(spec: _FieldSpec, value: Any, batch_size: _Size, device: Any) -> Any:
    """Convert a user value for field ``spec`` into a storage leaf (validated), or None."""
    if value is None:
        return None
    options = spec.owner._tc_options
    if options["autocast"]:
        value = _autocast(spec, value, batch_size, device)
    if not isinstance(value, (_Tensor, TensorCollection, NonTensorData, NonTensorStack)):
        # A dict or a tuple stays what it is (no TensorDict, no tensor), as upstream.
        if isinstance(value, (Mapping, tuple)) or (options["nocast"] and type(value) in (bool, int, float)):
            value = NonTensorData(value, batch_size, device)
    return to_leaf(value, spec.name, batch_size, device)


def _store(storage: dict, spec: _FieldSpec, value: Any, batch_size: _Size, device: Any) -> None:
    leaf = _to_field_leaf(spec, value, batch_size, device)
    if leaf is None:
        return
    storage[spec.name] = leaf
    if spec.tensor_like and type(leaf) in _NON_TENSOR:
        _guard_field(spec.owner, spec.name)


def _default_leaf(spec: _FieldSpec, batch_size: _Size, device: Any) -> Any:
    """The value a field takes when omitted (a raw Python default is wrapped so it stays raw)."""
    value = spec.default_value()
    if spec.raw_default and value is not None and not isinstance(value, (_Tensor, TensorCollection) + _NON_TENSOR):
        return NonTensorData(value, batch_size, device)
    return value


# ---------------------------------------------------------------------------- field access
class _ValueField:
    """Class-level accessor for a field that may hold a non-tensor: returns the raw value."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__.get(self.name)
        if type(value) in _NON_TENSOR:
            return value.data
        return value

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__setattr__(self.name, value)

    def __delete__(self, instance: Any) -> None:
        instance.__delattr__(self.name)


def _guard_field(cls: type, name: str) -> None:
    """A tensor-typed field received a non-tensor value: reads must now unwrap it."""
    if not isinstance(cls.__dict__.get(name), _ValueField):
        setattr(cls, name, _ValueField(name))


def _guard_all(instance: Any) -> None:
    storage = instance._tensordict._tensordict
    for spec in type(instance)._tc_fields.values():
        if spec.tensor_like and type(storage.get(spec.name)) in _NON_TENSOR:
            _guard_field(spec.owner, spec.name)


def _no_field_error(cls: type, name: str) -> AttributeError:
    return AttributeError(
        f"Cannot set the attribute {name!r}: {cls.__name__} has no such field. "
        f"Its fields are {sorted(cls._tc_field_names)}."
    )


def _negative_batch(batch_size: _Size) -> None:
    raise RuntimeError(f"batch_size must hold non-negative sizes, got {batch_size}.")


def _keys_error(cls: type, extra: set) -> ValueError:
    return ValueError(
        f"Keys from the tensordict ({extra}) must correspond to the class attributes "
        f"({set(cls._tc_field_names)}); {cls.__name__} has no field named {sorted(extra)}."
    )


def _field_index_error(index: Any) -> ValueError:
    key = index if type(index) is str else index[0] if len(index) == 1 else index
    return ValueError(
        f"Invalid indexing arguments: {key!r}. A tensorclass is indexed along its batch dimensions; "
        f"to read a field, use the attribute or get({key!r})."
    )


def _is_key_index(index: Any) -> bool:
    return type(index) is str or (type(index) is tuple and bool(index) and type(index[0]) is str)


# ---------------------------------------------------------------------------- rewrapping
# Methods whose TensorDict result is an entry (or a plain export), never the collection itself.
_ENTRY_METHODS = frozenset({"get", "get_at", "pop", "popitem", "setdefault", "get_non_tensor", "to_dict",
                            "to_tensordict", "_get_path", "keys", "values", "items"})


def _unwrap(value: Any) -> Any:
    if isinstance(value, TensorClass):
        return value._tensordict
    if type(value) in (list, tuple):
        return type(value)(_unwrap(item) for item in value)
    return value


def _rewrap_result(template: Any, source_td: Any, result: Any, name: Optional[str]) -> Any:
    """Put a TensorDict result back into ``template``'s class when it holds only its fields."""
    if result is source_td and source_td is not None:
        _guard_all(template)
        return template
    if isinstance(result, TensorDict):
        if name in _ENTRY_METHODS or not result._tensordict.keys() <= type(template)._tc_field_set:
            return result
        if source_td is not None and any(result is leaf for leaf in source_td._tensordict.values()):
            return result
        return template._rewrap(result)
    if isinstance(result, tuple):
        items = [_rewrap_result(template, source_td, item, name) for item in result]
        return type(result)(items) if type(result) is tuple or hasattr(type(result), "n_fields") \
            else type(result)(*items)
    if type(result) is list:
        return [_rewrap_result(template, source_td, item, name) for item in result]
    return result


def _delegate(name: str) -> Callable:
    """A method calling the TensorDict's ``name`` and rewrapping its result."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        td = self._tensordict
        try:
            bound = getattr(td, name)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}") from None
        if args:
            args = tuple(_unwrap(arg) for arg in args)
        if kwargs:
            kwargs = {key: _unwrap(value) for key, value in kwargs.items()}
        return _rewrap_result(self, td, bound(*args, **kwargs), name)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``TensorDict.{name}`` on the fields; a result holding only fields keeps the class."
    return method


def _binary_delegate(name: str) -> Callable:
    def operator(self: Any, other: Any) -> Any:
        td = self._tensordict
        bound = getattr(td, name, None)
        if bound is None:
            return NotImplemented
        result = bound(other._tensordict if isinstance(other, TensorClass) else other)
        if result is NotImplemented:
            return result
        return _rewrap_result(self, td, result, name)

    operator.__name__ = operator.__qualname__ = name
    return operator


def _delegate_property(name: str, prop: property) -> property:
    def fget(self: Any) -> Any:
        return _rewrap_result(self, None, getattr(self._tensordict, name), name)

    def fset(self: Any, value: Any) -> None:
        setattr(self._tensordict, name, _unwrap(value))

    return property(fget, fset if prop.fset is not None else None, doc=prop.__doc__)


def _install_delegates(cls: type) -> None:
    """Expose every public TensorDict method and property on ``cls`` (unless it has its own).

    Explicit class attributes rather than a ``__getattr__`` fallback: a class with
    ``__getattr__`` loses CPython's fast attribute lookup, which field reads rely on.
    Their names are reserved: a field can't be called like one.
    """
    for name in dir(TensorDict):
        if name.startswith("_") or hasattr(cls, name):
            continue
        raw = next(klass.__dict__[name] for klass in TensorDict.__mro__ if name in klass.__dict__)
        if isinstance(raw, property):
            setattr(cls, name, _delegate_property(name, raw))
        elif callable(raw) and not isinstance(raw, (classmethod, staticmethod)):
            setattr(cls, name, _delegate(name))


_BINARY_OPERATORS = tuple(
    f"__{prefix}{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
                                   "or", "xor", "lshift", "rshift") for prefix in ("", "r", "i")
) + ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")
_UNARY_OPERATORS = ("__neg__", "__pos__", "__abs__", "__invert__", "__bool__", "__len__", "__contains__",
                    "__enter__", "__exit__")


# ---------------------------------------------------------------------------- the base class
if TYPE_CHECKING:
    @dataclasses.dataclass
    class _ConstructorArguments(TensorCollection):
        """What type checkers see: every tensorclass takes these keyword arguments."""

        batch_size: Any = dataclasses.field(default=None, kw_only=True)
        device: Any = dataclasses.field(default=None, kw_only=True)
        names: Any = dataclasses.field(default=None, kw_only=True)

    _Base = _ConstructorArguments
else:
    _Base = TensorCollection


@dataclass_transform()
class TensorClass(_Base):
    """Base class alternative to ``@tensorclass``: fields come from the annotations.

    Options go in as class keywords or by subscription: ``class D(TensorClass, nocast=True)``
    or ``class D(TensorClass["nocast"])``.

    >>> import torch
    >>> class Obs(TensorClass):
    ...     pixels: torch.Tensor
    ...     step: int = 0
    >>> obs = Obs(torch.zeros(2, 8), batch_size=[2])
    >>> obs.reshape(2, 1).batch_size, obs.step
    (torch.Size([2, 1]), 0)
    """

    # ``_td`` is the TensorDict, created on first use: construction only builds the storage
    # dict (the instance ``__dict__``) and sets ``_td`` to the tuple ``(batch_size, device)``
    # (the batch size possibly a plain tuple of ints, made a torch.Size when first needed).
    __slots__ = ("_td", "__dict__", "__weakref__")
    __hash__ = None  # type: ignore[assignment]

    # Class-level facts about the fields (no annotations here: they would become fields).
    _tc_fields = {}  # type: dict
    _tc_field_names = ()  # type: tuple
    _tc_field_set = frozenset()  # type: frozenset
    _tc_options = _DEFAULT_OPTIONS  # type: dict
    _tc_is_template = True
    _tc_frozen = False

    def __init_subclass__(cls, *, _template: bool = False, **options: Any) -> None:
        unknown = set(options) - set(_OPTION_NAMES)
        if unknown:
            raise TypeError(f"Unknown tensorclass option(s) {sorted(unknown)}; expected some of {_OPTION_NAMES}.")
        super().__init_subclass__()
        merged = dict(cls._tc_options)
        merged.update({key: bool(value) for key, value in options.items()})
        cls._tc_options = merged
        cls._tc_frozen = merged["frozen"]
        cls._tc_is_template = _template
        if not _template:
            _build_class(cls)

    def __class_getitem__(cls, options: Any) -> type:
        """``TensorClass["nocast"]``, ``TensorClass["autocast", "frozen"]``: a base with options."""
        names = options if isinstance(options, tuple) else (options,)
        for option in names:
            if option not in _OPTION_NAMES:
                raise ValueError(f"Unknown tensorclass option {option!r}; expected one of {_OPTION_NAMES}.")
        return _template_class(cls, tuple(sorted(names)))

    # ------------------------------------------------------------------ protocol
    @property
    def _tensordict(self) -> TensorDict:
        """The TensorDict holding the fields (its storage dict is this instance's ``__dict__``)."""
        td = self._td
        if type(td) is tuple:
            td = TensorDict._new_unsafe(self.__dict__, _Size(td[0]), td[1])
            _set_td(self, td)
        return td

    def _rewrap(self, td: TensorDict) -> "Self":
        """A new instance of this class around ``td`` (no checks, no ``__init__``)."""
        new = _object_new(type(self))
        _set_td(new, td)
        _set_instance_dict(new, td._tensordict)
        if self._tc_frozen:
            td._lock_tree()
        return new

    @classmethod
    def _from_tensordict_unchecked(cls, td: TensorDict) -> "Self":
        new = _object_new(cls)
        _set_td(new, td)
        _set_instance_dict(new, td._tensordict)
        _guard_all(new)
        return new

    # ------------------------------------------------------------------ attributes
    def __setattr__(self, name: str, value: Any) -> None:
        spec = type(self)._tc_fields.get(name)
        if spec is not None:
            if self._tc_frozen:
                raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
            _set_field(self, spec, value)
        elif name == "_tensordict":
            _set_td(self, value)
            _set_instance_dict(self, value._tensordict)
        elif hasattr(getattr(type(self), name, None), "__set__"):
            object.__setattr__(self, name, value)
        else:
            raise _no_field_error(type(self), name)

    def __delattr__(self, name: str) -> None:
        if name not in type(self)._tc_field_set:
            raise _no_field_error(type(self), name)
        if self._tc_frozen:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        td = self._tensordict
        td._check_unlocked()
        td._tensordict.pop(name, None)

    @property
    def batch_size(self) -> torch.Size:
        td = self._td
        if type(td) is not tuple:
            return td._batch_size
        if type(td[0]) is not _Size:
            td = (_Size(td[0]), td[1])
            _set_td(self, td)
        return td[0]

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        self._tensordict.batch_size = value

    shape = property(batch_size.fget, doc="The batch size (read-only alias).")

    @property
    def device(self) -> Optional[torch.device]:
        return self._tensordict._device

    @device.setter
    def device(self, value: Any) -> None:
        self._tensordict.device = value

    @property
    def names(self) -> list:
        return self._tensordict.names

    @names.setter
    def names(self, value: Any) -> None:
        self._tensordict.names = value

    @property
    def batch_dims(self) -> int:
        return len(self.batch_size)

    ndim = batch_dims

    @property
    def is_locked(self) -> bool:
        return self._tensordict._is_locked

    # ------------------------------------------------------------------ indexing
    def __getitem__(self, index: Any) -> "Self":
        # The hot path of ``data[idx]``: straight to the batch indexing (a str is never a batch index).
        if type(index) is str or (type(index) is tuple and index and type(index[0]) is str):
            raise _field_index_error(index)
        td = self._td
        if type(td) is tuple:
            td = self._tensordict
        result = _index_tensordict(td, index)
        new = _object_new(type(self))
        _set_td(new, result)
        _set_instance_dict(new, result._tensordict)
        if self._tc_frozen:
            result._lock_tree()
        return new

    def __setitem__(self, index: Any, value: Any) -> None:
        if _is_key_index(index):
            raise _field_index_error(index)
        self._tensordict[index] = value._tensordict if isinstance(value, TensorClass) else value
        _guard_all(self)

    def __iter__(self) -> Any:
        return (self._rewrap(td) for td in iter(self._tensordict))

    # ------------------------------------------------------------------ fields as keys
    def get(self, key: Any, *default: Any) -> Any:
        """The field (or nested entry) at ``key``; non-tensor values come back raw.

        >>> class P(TensorClass):
        ...     x: torch.Tensor
        ...     tag: str = "a"
        >>> P(torch.zeros(2)).get("tag"), P(torch.zeros(2)).get("y", None)
        ('a', None)
        """
        value = self._tensordict.get(key, *default)
        return value.data if type(value) in _NON_TENSOR else value

    def set(self, key: Any, value: Any, inplace: bool = False, **kwargs: Any) -> "Self":
        """Write a field (or a nested entry under a field); returns self."""
        keys = key_to_tuple(key)
        spec = type(self)._tc_fields.get(keys[0])
        if spec is None:
            raise _no_field_error(type(self), keys[0])
        if len(keys) > 1:
            self._tensordict.set(keys, _unwrap(value), inplace=inplace, **kwargs)
        elif inplace and keys[0] in self._tensordict._tensordict:
            td = self._tensordict
            self._tensordict.set(keys, _to_field_leaf(spec, value, td._batch_size, td._device), inplace=True)
        else:
            setattr(self, keys[0], value)
        return self

    def update(self, source: Any = None, *args: Any, **kwargs: Any) -> "Self":
        """Merge entries in (every top-level key must be a field); returns self."""
        source = _unwrap(source)
        if isinstance(source, TensorCollection):
            top_keys = set(source._tensordict)
        elif isinstance(source, Mapping):
            top_keys = {key_to_tuple(key)[0] for key in source}
        else:
            top_keys = set()
        extra = top_keys - type(self)._tc_field_set
        if extra:
            raise _keys_error(type(self), extra)
        self._tensordict.update(source, *args, **kwargs)
        _guard_all(self)
        return self

    # ------------------------------------------------------------------ conversions
    @classmethod
    def from_tensordict(cls, tensordict: TensorDict, non_tensordict: Optional[dict] = None) -> "Self":
        """Wrap ``tensordict`` (shared, not copied) in this class; its keys must be fields.

        ``non_tensordict`` gives more fields by name (set like attributes).

        >>> class P(TensorClass):
        ...     x: torch.Tensor
        >>> P.from_tensordict(TensorDict(x=torch.zeros(3), batch_size=[3])).x.shape
        torch.Size([3])
        """
        tensordict = _unwrap(tensordict)
        extra = set(tensordict._tensordict) - cls._tc_field_set
        if extra:
            raise _keys_error(cls, extra)
        instance = cls._from_tensordict_unchecked(tensordict)
        for name, value in (non_tensordict or {}).items():
            setattr(instance, name, value)
        return instance

    def to_tensordict(self) -> TensorDict:
        """A TensorDict holding a copy of the fields (changing it leaves this object alone)."""
        return self._tensordict.clone()

    # ------------------------------------------------------------------ torch integration
    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        originals: dict = {}  # id(TensorDict) -> the tensorclass instance it came from
        _collect_tensorclasses((args, tuple(kwargs.values())), originals)
        if not originals:
            return NotImplemented
        template = next(iter(originals.values()))
        result = func(*_unwrap(args), **{key: _unwrap(value) for key, value in kwargs.items()})
        if isinstance(result, TensorDict) and id(result) in originals:
            return originals[id(result)]  # e.g. out=: the caller's own object
        return _rewrap_result(template, None, result, getattr(func, "__name__", None))

    # ------------------------------------------------------------------ persistence
    # The instance itself is saved (not its TensorDict) so that the folder records the class.
    def memmap(self, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> "Self":
        """A locked, memory-mapped copy written to ``prefix`` (see ``TensorDict.memmap``).

        >>> import tempfile
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
        return loaded if isinstance(loaded, cls) else cls.from_tensordict(_unwrap(loaded))

    load = load_memmap

    # ------------------------------------------------------------------ python protocols
    def __repr__(self) -> str:
        from .printing import format_leaf, indent, td_is_shared

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
        # Delegated TensorDict methods, as type checkers should see them.
        def reshape(self, *shape: Any) -> Self: ...
        def view(self, *shape: Any) -> Self: ...
        def permute(self, *dims: Any) -> Self: ...
        def transpose(self, dim0: int, dim1: int) -> Self: ...
        def squeeze(self, dim: Optional[int] = None) -> Self: ...
        def unsqueeze(self, dim: int) -> Self: ...
        def expand(self, *shape: Any) -> Self: ...
        def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Self: ...
        def unflatten(self, dim: int, unflattened_size: Any) -> Self: ...
        def unbind(self, dim: int = 0) -> tuple[Self, ...]: ...
        def split(self, split_size: Any, dim: int = 0) -> tuple[Self, ...]: ...
        def chunk(self, chunks: int, dim: int = 0) -> tuple[Self, ...]: ...
        def to(self, *args: Any, **kwargs: Any) -> Self: ...
        def cpu(self) -> Self: ...
        def cuda(self, device: Any = None) -> Self: ...
        def clone(self, recurse: bool = True) -> Self: ...
        def detach(self) -> Self: ...
        def contiguous(self) -> Self: ...
        def apply(self, fn: Callable, *others: Any, **kwargs: Any) -> Self: ...
        def apply_(self, fn: Callable, *others: Any, **kwargs: Any) -> Self: ...
        def select(self, *keys: Any, inplace: bool = False, strict: bool = True) -> Self: ...
        def exclude(self, *keys: Any, inplace: bool = False) -> Self: ...
        def copy(self) -> Self: ...
        def keys(self, include_nested: bool = False, leaves_only: bool = False) -> Any: ...
        def values(self, include_nested: bool = False, leaves_only: bool = False) -> Any: ...
        def items(self, include_nested: bool = False, leaves_only: bool = False) -> Any: ...
        def zero_(self) -> Self: ...
        def lock_(self) -> Self: ...
        def unlock_(self) -> Self: ...
        def to_dict(self) -> dict: ...
        def numel(self) -> int: ...
        def dim(self) -> int: ...
        def __len__(self) -> int: ...
        def __eq__(self, other: object) -> Self: ...  # type: ignore[override]
        def __ne__(self, other: object) -> Self: ...  # type: ignore[override]
        def __add__(self, other: Any) -> Self: ...
        def __sub__(self, other: Any) -> Self: ...
        def __mul__(self, other: Any) -> Self: ...
        def __truediv__(self, other: Any) -> Self: ...


for _name in _BINARY_OPERATORS:
    setattr(TensorClass, _name, _binary_delegate(_name))
for _name in _UNARY_OPERATORS:
    setattr(TensorClass, _name, _delegate(_name))
del _name
_install_delegates(TensorClass)

_set_td = TensorClass.__dict__["_td"].__set__
_set_instance_dict = TensorClass.__dict__["__dict__"].__set__


def _set_field(instance: TensorClass, spec: _FieldSpec, value: Any) -> None:
    td = instance._tensordict
    td._check_unlocked()
    storage = td._tensordict
    if value is None:
        storage.pop(spec.name, None)
        return
    _store(storage, spec, value, td._batch_size, td._device)


def _collect_tensorclasses(items: Any, found: dict) -> None:
    for item in items:
        if isinstance(item, TensorClass):
            found[id(item._tensordict)] = item
        elif type(item) in (list, tuple):
            _collect_tensorclasses(item, found)


def _rebuild(cls: type, td: TensorDict) -> Any:
    return cls._from_tensordict_unchecked(td)


_TEMPLATES: dict = {}


def _template_class(base: type, options: tuple) -> type:
    key = (base, options)
    template = _TEMPLATES.get(key)
    if template is None:
        template = type(base)(f"{base.__name__}[{', '.join(map(repr, options))}]", (base,), {"__slots__": ()},
                              _template=True, **dict.fromkeys(options, True))
        _TEMPLATES[key] = template
    return template


# ---------------------------------------------------------------------------- building a class
def _build_storage(specs: list, values: tuple, batch_size: _Size, device: Any) -> dict:
    """The storage dict for ``values`` (one per field), each converted and validated."""
    storage: dict = {}
    batch_size = _Size(batch_size)
    n_batch = len(batch_size)
    if n_batch and min(batch_size) < 0:
        _negative_batch(batch_size)
    for spec, value in zip(specs, values):
        if value is None:
            continue
        if (type(value) is _Tensor and device is None and spec.plain_tensor_ok
                and value.shape[:n_batch] == batch_size):
            storage[spec.name] = value
        else:
            _store(storage, spec, value, batch_size, device)
    return storage


def _make_init(cls: type, specs: list) -> Callable:
    """Generate ``__init__`` (as dataclasses do) with one inlined fast path.

    When every field is a plain ``torch.Tensor`` whose leading dims match (and no
    device is asked for), the storage dict is built in one go; the one-batch-dim check
    uses the C length of a tensor (its first size, 0 for a 0-d tensor, hence ``b0 > 0``).
    Anything else goes through :func:`_build_storage`, which converts, validates and
    raises E-BATCH.
    """
    positional = [spec for spec in specs if not spec.kw_only and not cls._tc_options["kw_only"]]
    keyword = [spec for spec in specs if spec not in positional]
    seen_default = False
    for spec in positional:
        if spec.has_default:
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {spec.name!r} follows default argument")
    this = "_tc_self" if any(spec.name == "self" for spec in specs) else "self"
    params = [spec.name + ("=_tc_DEFAULT" if spec.has_default else "") for spec in positional]
    params += ["*"] + [spec.name + ("=_tc_DEFAULT" if spec.has_default else "") for spec in keyword]
    params += ["batch_size=None", "device=None", "names=None", "**_tc_extra"]
    names = [spec.name for spec in specs]
    values = "(" + "".join(f"{name}, " for name in names) + ")"
    literal = "{" + ", ".join(f"{name!r}: {name}" for name in names) + "}"
    plain = " and ".join(f"type({name}) is _tc_Tensor" for name in names) or "True"
    fast = all(spec.plain_tensor_ok for spec in specs)
    lines = [f"def __init__({this}, {', '.join(params)}):",
             "    if _tc_extra:",
             "        raise _tc_no_field(_tc_cls, next(iter(_tc_extra)))",
             "    if batch_size is None:",
             "        _tc_bs = _tc_EMPTY",
             "    elif type(batch_size) is _tc_Size:",
             "        _tc_bs = batch_size",
             # A one-dim list stays a tuple until the batch size is asked for (torch.Size() is slow).
             "    elif type(batch_size) is list and len(batch_size) == 1 and type(batch_size[0]) is int:",
             "        _tc_bs = (batch_size[0],)",
             "    else:",
             "        _tc_bs = _tc_parse_batch_size(batch_size)",
             "    _tc_dev = None if device is None else _tc_parse_device(device)"]
    for spec in specs:
        if spec.has_default:
            lines += [f"    if {spec.name} is _tc_DEFAULT:",
                      f"        {spec.name} = _tc_default(_tc_F_{spec.name}, _tc_bs, _tc_dev)"]
    if fast:
        length_checks = " and ".join(f"_tc_len({name}) == _tc_b0" for name in names) or "True"
        lines += ["    _tc_n = len(_tc_bs)",
                  f"    if _tc_dev is None and {plain}:",
                  "        if _tc_n == 1 and (_tc_b0 := _tc_bs[0]) > 0 and " + length_checks + ":",
                  f"            _tc_st = {literal}",
                  "        elif _tc_n == 0:",
                  f"            _tc_st = {literal}",
                  "        else:",
                  f"            _tc_st = _tc_build(_tc_specs, {values}, _tc_bs, _tc_dev)",
                  "    else:",
                  f"        _tc_st = _tc_build(_tc_specs, {values}, _tc_bs, _tc_dev)"]
    else:
        lines += [f"    _tc_st = _tc_build(_tc_specs, {values}, _tc_bs, _tc_dev)"]
    lines += [f"    _tc_set_td({this}, (_tc_bs, _tc_dev))",
              f"    _tc_set_dict({this}, _tc_st)",
              "    if names is not None:",
              f"        {this}._tensordict.names = names"]
    if hasattr(cls, "__post_init__"):
        lines.append(f"    {this}.__post_init__()")
    if cls._tc_options["frozen"]:
        lines.append(f"    {this}._tensordict._lock_tree()")
    namespace: dict = {
        "_tc_DEFAULT": _DEFAULT, "_tc_EMPTY": _EMPTY_SIZE, "_tc_Size": _Size, "_tc_Tensor": _Tensor,
        "_tc_parse_batch_size": parse_batch_size, "_tc_parse_device": parse_device, "_tc_build": _build_storage,
        "_tc_default": _default_leaf, "_tc_no_field": _no_field_error, "_tc_cls": cls, "_tc_specs": specs,
        "_tc_set_td": _set_td, "_tc_set_dict": _set_instance_dict, "_tc_len": _tensor_len,
    }
    namespace.update({f"_tc_F_{spec.name}": spec for spec in specs})
    exec("\n".join(lines), namespace)  # noqa: S102 - generated from field names only
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init._tc_generated = True
    return init


def _wrap_user_init(user_init: Callable) -> Callable:
    """Keep a hand-written ``__init__``: it runs on an empty instance of the given batch."""
    import functools

    @functools.wraps(user_init)
    def __init__(self: Any, *args: Any, batch_size: Any = None, device: Any = None, names: Any = None,
                 **kwargs: Any) -> None:
        td = TensorDict(batch_size=batch_size, device=device, names=names)
        _set_td(self, td)
        _set_instance_dict(self, td._tensordict)
        user_init(self, *args, **kwargs)

    __init__._tc_wrapped = user_init  # type: ignore[attr-defined]
    return __init__


_reserved_cache: list = []


def _reserved_names() -> frozenset:
    if not _reserved_cache:
        names = {name for name in dir(TensorDict) if not name.startswith("__")}
        names |= {name for name in dir(TensorClass) if not name.startswith("__")}
        _reserved_cache.append(frozenset(names))
    return _reserved_cache[0]


_NEVER_SHADOWED = frozenset({"_tensordict", "batch_size", "device", "names", "shape"})


def _check_field_names(cls: type, names: list) -> None:
    reserved = _NEVER_SHADOWED if cls._tc_options["shadow"] else _reserved_names()
    for name in names:
        if name in reserved or name.startswith("_tc_"):
            hint = "" if name in _NEVER_SHADOWED else (
                " To allow it, pass shadow=True (@tensorclass(shadow=True) or TensorClass['shadow']).")
            raise AttributeError(
                f"Attribute name {name} can't be used with @tensorclass or TensorClass, as tensorclasses "
                f"have a member of that name.{hint}"
            )


def _build_class(cls: type) -> None:
    """Turn an annotated subclass of TensorClass into a tensorclass (fields, accessors, __init__)."""
    own = cls.__dict__
    # A field re-declared without a default must not pick up a base class's accessor as its default.
    inherited = set().union(*(getattr(base, "_tc_field_set", ()) for base in cls.__mro__[1:]))
    for name in own.get("__annotations__", {}):
        if name not in own and name in inherited:
            setattr(cls, name, dataclasses.field())
    previous_init = own.get("__init__")
    dataclasses.dataclass(cls, init=False, repr=False, eq=False, match_args=True)
    fields = dataclasses.fields(cls)
    _check_field_names(cls, [field.name for field in fields])
    hints = _resolve_annotations(cls)
    specs = [_FieldSpec(field, hints.get(field.name, field.type), cls) for field in fields]
    for spec in specs:
        if spec.tensor_like:
            # Reads go straight to the instance dict; the class attribute (None, never the
            # default, which lives in the spec) answers for a field that holds nothing.
            setattr(cls, spec.name, None)
        else:
            setattr(cls, spec.name, _ValueField(spec.name))
    cls._tc_fields = {spec.name: spec for spec in specs}
    cls._tc_field_names = tuple(spec.name for spec in specs)
    cls._tc_field_set = frozenset(cls._tc_field_names)
    if previous_init is None or getattr(previous_init, "_tc_generated", False):
        cls.__init__ = _make_init(cls, specs)
    elif not hasattr(previous_init, "_tc_wrapped"):
        cls.__init__ = _wrap_user_init(previous_init)
    # Saved folders name their class; loading finds it here and never imports a module.
    register_saved_class(cls)
    _register_pytree(cls)


def _register_pytree(cls: type) -> None:
    # Makes instances pytree nodes: torch.vmap, torch.func and tree_map see through them.
    from ._pytree import register_collection_class

    register_collection_class(cls)


def _fix_class_cells(namespace: dict, old: type, new: type) -> None:
    """Point zero-argument ``super()`` cells of copied methods at the new class."""
    for value in namespace.values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        functions = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [value]
        for function in functions:
            closure = getattr(function, "__closure__", None)
            if not closure:
                continue
            for cell_name, cell in zip(function.__code__.co_freevars, closure):
                if cell_name == "__class__" and cell.cell_contents is old:
                    cell.cell_contents = new


# ---------------------------------------------------------------------------- public API
@overload
def tensorclass(cls: type[_T], /) -> type[_T]: ...


@overload
def tensorclass(cls: None = None, /, *, autocast: bool = False, frozen: bool = False, nocast: bool = False,
                shadow: bool = False, kw_only: bool = False) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform()
def tensorclass(cls: Any = None, /, *, autocast: bool = False, frozen: bool = False, nocast: bool = False,
                shadow: bool = False, kw_only: bool = False) -> Any:
    """Turn an annotated class into a tensorclass (a dataclass-like TensorDict).

    Options: ``autocast`` casts values to the field annotations; ``frozen`` forbids
    assignments and locks the content; ``nocast`` keeps Python numbers as they are;
    ``shadow`` allows field names that hide a TensorDict method; ``kw_only`` makes
    every field keyword-only.

    >>> import torch
    >>> @tensorclass
    ... class MyData:
    ...     image: torch.Tensor
    ...     label: torch.Tensor
    >>> data = MyData(torch.zeros(10, 3), torch.arange(10), batch_size=[10])
    >>> data[data.label > 6].batch_size
    torch.Size([3])
    """
    options = {"autocast": autocast, "frozen": frozen, "nocast": nocast, "shadow": shadow, "kw_only": kw_only}

    def wrap(user_cls: type) -> type:
        chosen = {key: value for key, value in options.items() if value}
        if issubclass(user_cls, TensorClass):
            # Already built by TensorClass.__init_subclass__: apply the options to it.
            user_cls._tc_options = {**user_cls._tc_options, **chosen}
            user_cls._tc_frozen = user_cls._tc_options["frozen"]
            _check_field_names(user_cls, list(user_cls._tc_field_names))
            for spec in user_cls._tc_fields.values():
                spec.plain_tensor_ok = spec.tensor_like or not user_cls._tc_options["autocast"]
            if getattr(user_cls.__dict__.get("__init__"), "_tc_generated", False):
                user_cls.__init__ = _make_init(user_cls, list(user_cls._tc_fields.values()))
            return user_cls
        skipped = {"__dict__", "__weakref__"}
        slots = user_cls.__dict__.get("__slots__", ())
        skipped.update([slots] if isinstance(slots, str) else slots)
        namespace = {key: value for key, value in user_cls.__dict__.items() if key not in skipped}
        namespace.pop("__slots__", None)
        bases = tuple(base for base in user_cls.__bases__ if base is not object) + (TensorClass,)
        new_cls = type(user_cls)(user_cls.__name__, bases, namespace, **chosen)
        _fix_class_cells(namespace, user_cls, new_cls)
        return new_cls

    return wrap if cls is None else wrap(cls)


def is_tensorclass(obj: Any) -> bool:
    """True for a tensorclass (decorated or a TensorClass subclass) or one of its instances.

    >>> is_tensorclass(TensorDict())
    False
    """
    cls = obj if isinstance(obj, type) else type(obj)
    return issubclass(cls, TensorClass) and not cls._tc_is_template
