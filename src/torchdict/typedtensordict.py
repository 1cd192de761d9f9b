"""``TypedTensorDict``: a ``TensorDictBase`` whose fields are declared as class annotations (upstream's
experimental class of the same name).

::

    class State(TypedTensorDict):
        eta: Tensor
        X: Tensor
        mask: NotRequired[Tensor]       # optional
        scale: Tensor = torch.ones(())  # optional, with a default

    state = State(eta=torch.zeros(5, 3), X=torch.zeros(5, 4), batch_size=[5])
    state.eta, state["X"], state[0], state.clone()   # every result of a batch op is a State again

An instance wraps a backing collection (``_source``: a TensorDict, or any ``TensorDictBase`` given to
``from_tensordict``, which wraps it without a copy). The six primitives and every TensorDict member are
forwarded to it; results that are whole collections of the same entries come back wrapped in the class
(comparisons and reductions stay plain, as upstream). Fields are properties; a subclass adds fields to its
parent's. Options: ``class S(TypedTensorDict, frozen=True)`` or ``TypedTensorDict["frozen", "shadow"]``:
``frozen`` locks instances, ``shadow`` lets a field hide a TensorDict member; ``autocast`` / ``nocast`` /
``tensor_only`` are accepted, do nothing, and warn (as upstream).
"""
from __future__ import annotations

import inspect
import sys
import warnings
from typing import Any, ClassVar, Iterator, Optional

import torch

from ._keys import key_to_tuple
from .base import DENSE_OPERATORS, GENERIC_METHODS, IN_PLACE_OPERATORS, TensorDictBase
from .tensordict import TensorDict

__all__ = ["TypedTensorDict"]

_OPTIONS = ("shadow", "frozen", "autocast", "nocast", "tensor_only")
_NO_EFFECT = ("autocast", "nocast", "tensor_only")
_NOT_SET: Any = object()

# Members whose results are not wrapped in the class (as upstream): comparisons, reductions (a new batch), the
# conversions to other kinds, and the reads of one entry.
_PLAIN_RESULTS = frozenset({
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "eq", "ne", "lt", "le", "gt", "ge", "greater",
    "greater_equal", "less", "less_equal", "not_equal", "all", "any", "sum", "mean", "nanmean", "nansum", "prod",
    "std", "var", "max", "min", "amax", "amin", "median", "quantile", "cummax", "cummin", "to_tensordict",
    "to_lazystack", "get", "get_at", "pop", "setdefault", "get_non_tensor", "values", "items", "keys",
    "to_dict", "to_namedtuple", "to_pytree", "state_dict", "tolist", "numpy", "popitem", "split_keys",
})
# Members TypedTensorDict defines itself (the primitives, construction, attribute access, pickling).
_OWN = frozenset({
    "batch_size", "device", "names", "is_locked", "from_dict", "from_tensordict", "keys", "lock_", "unlock_",
    "get", "set", "shape", "batch_dims", "ndim", "dim", "ndimension", "size", "numel", "to_tensordict",
})


def _warn_no_effect(option: str) -> None:
    warnings.warn(f"The TypedTensorDict option {option!r} has no effect and is deprecated. It will be removed in "
                  "TensorDict 0.17. TensorClass supports this option.", DeprecationWarning, stacklevel=4)


def _is_not_required(annotation: Any) -> bool:
    origin = getattr(annotation, "__origin__", None)
    name = getattr(origin, "_name", None) or getattr(annotation, "_name", None)
    return name == "NotRequired" or str(annotation).startswith(("typing.NotRequired", "typing_extensions.NotRequired"))


def _is_class_var(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is ClassVar or str(annotation).startswith("typing.ClassVar")


def _own_annotations(cls: type) -> dict:
    """``cls``'s own annotations, string ones evaluated in its module (left as text when they don't resolve)."""
    raw = cls.__dict__.get("__annotations__", {})
    module = sys.modules.get(cls.__module__)
    namespace = dict(vars(module)) if module is not None else {}
    resolved = {}
    for name, annotation in raw.items():
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace, {cls.__name__: cls})  # noqa: S307 - the class's own text
            except Exception:  # noqa: BLE001 - an annotation that does not resolve stays text
                pass
        resolved[name] = annotation
    return resolved


def _reserved_names() -> frozenset:
    return frozenset(dir(TensorDictBase)) | frozenset(dir(TensorDict))


def _unwrap(value: Any) -> Any:
    if isinstance(value, TypedTensorDict):
        return value._source
    if type(value) in (list, tuple):
        return type(value)(_unwrap(item) for item in value)
    return value


class _FieldProperty:
    """``instance.<field>``: the entry (its default, or AttributeError, when missing); assignment writes it."""

    __slots__ = ("name", "default")

    def __init__(self, name: str, default: Any) -> None:
        self.name = name
        self.default = default

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return self if self.default is _NOT_SET else self.default
        value = instance._source._get_str(self.name, _NOT_SET)
        if value is _NOT_SET:
            if self.default is not _NOT_SET:
                return self.default
            raise AttributeError(f"'{type(instance).__name__}' has field '{self.name}' declared but not set")
        return value  # a non-tensor entry as its wrapper, as upstream's field read

    def __set__(self, instance: Any, value: Any) -> None:
        instance[self.name] = value


class TypedTensorDict(TensorDictBase):
    """A ``TensorDictBase`` whose fields are class annotations; see the module docstring.

    >>> from torch import Tensor
    >>> class State(TypedTensorDict):
    ...     eta: Tensor
    ...     X: Tensor
    >>> state = State(eta=torch.zeros(5, 3), X=torch.zeros(5, 4), batch_size=[5])
    >>> state.eta.shape, type(state[0]).__name__
    (torch.Size([5, 3]), 'State')
    """

    _source: Any  # the backing collection (an instance attribute; not a field: its name starts with "_")
    __expected_keys__: ClassVar[frozenset] = frozenset()
    __required_keys__: ClassVar[frozenset] = frozenset()
    __optional_keys__: ClassVar[frozenset] = frozenset()
    __field_defaults__: ClassVar[dict] = {}
    _shadow = _frozen = _autocast = _nocast = _tensor_only = False

    def __init_subclass__(cls, shadow: Optional[bool] = None, frozen: Optional[bool] = None,
                          autocast: Optional[bool] = None, nocast: Optional[bool] = None,
                          tensor_only: Optional[bool] = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        given = {"shadow": shadow, "frozen": frozen, "autocast": autocast, "nocast": nocast,
                 "tensor_only": tensor_only}
        option_base = cls.__name__.startswith("TypedTensorDict_")
        for option, value in given.items():
            if value is not None:
                if option in _NO_EFFECT and not option_base:
                    _warn_no_effect(option)
                setattr(cls, f"_{option}", bool(value))
        if option_base:
            return
        annotations: dict = {}
        defaults: dict = {}
        for base in reversed(cls.__mro__):
            if base is TypedTensorDict or not isinstance(base, type) or not issubclass(base, TypedTensorDict):
                continue
            own = _own_annotations(base)
            annotations.update(own)
            defaults.update(base.__dict__.get("__field_defaults__", {}))
            for name in own:
                default = base.__dict__.get(name, _NOT_SET)
                if isinstance(default, _FieldProperty):
                    default = default.default
                if default is not _NOT_SET and not isinstance(default, property):
                    defaults[name] = default
        fields = {name: annotation for name, annotation in annotations.items()
                  if not name.startswith("_") and not _is_class_var(annotation)}
        optional = {name for name, annotation in fields.items() if _is_not_required(annotation) or name in defaults}
        if not cls._shadow:
            reserved = _reserved_names()
            for name in fields:
                if name in reserved:
                    raise AttributeError(f"Field '{name}' shadows a TensorDictBase attribute. "
                                         "Use TypedTensorDict['shadow'] to allow this.")
        cls.__expected_keys__ = frozenset(fields)
        cls.__optional_keys__ = frozenset(optional)
        cls.__required_keys__ = frozenset(fields) - cls.__optional_keys__
        cls.__field_defaults__ = {name: value for name, value in defaults.items() if name in fields}
        for name in fields:
            setattr(cls, name, _FieldProperty(name, cls.__field_defaults__.get(name, _NOT_SET)))

    def __class_getitem__(cls, item: Any) -> type:
        """A base class with options on: ``class S(TypedTensorDict["frozen", "shadow"])``."""
        options = item if isinstance(item, tuple) else (item,)
        for option in options:
            if option not in _OPTIONS:
                raise ValueError(f"Unknown TypedTensorDict option: {option!r}. Valid options: {', '.join(_OPTIONS)}")
            if option in _NO_EFFECT:
                _warn_no_effect(option)
        return type(f"TypedTensorDict_{'_'.join(options)}", (cls,), {}, **{option: True for option in options})

    # ------------------------------------------------------------------ construction
    def __init__(self, _source: Optional[dict] = None, *, batch_size: Any = None, device: Any = None,
                 names: Any = None, non_blocking: Optional[bool] = None, lock: bool = False, **fields: Any) -> None:
        cls = type(self)
        if _source is not None:
            source = TensorDict(_source, batch_size=batch_size, device=device, names=names,
                                non_blocking=non_blocking, lock=lock)
            object.__setattr__(self, "_source", source)
            _warn_missing(cls, source, "{}(dict)", "use from_dict(..., check=False)")
            return
        missing = cls.__required_keys__.difference(fields)
        if missing:
            raise TypeError(f"{cls.__name__}() missing required field(s): {', '.join(sorted(missing))}")
        extra = set(fields).difference(cls.__expected_keys__)
        if extra:
            raise TypeError(f"{cls.__name__}() got unexpected field(s): {', '.join(sorted(extra))}")
        source = TensorDict(fields, batch_size=batch_size, device=device, names=names, non_blocking=non_blocking,
                            lock=lock)
        object.__setattr__(self, "_source", source)
        if cls._frozen:
            source.lock_()

    @classmethod
    def _wrap(cls, source: Any) -> "TypedTensorDict":
        instance = cls.__new__(cls)
        object.__setattr__(instance, "_source", source)
        return instance

    @classmethod
    def from_tensordict(cls, td: Any, *, check: bool = True) -> "TypedTensorDict":
        """Wrap ``td`` (any ``TensorDictBase``) without copying it: writes through either are seen by both.

        ``check=True`` refuses a ``td`` that lacks a required field (``TypeError``).
        """
        if check:
            missing = cls.__required_keys__ - set(td.keys())
            if missing:
                raise TypeError(f"{cls.__name__}.from_tensordict() missing required field(s): "
                                f"{', '.join(sorted(missing))}")
        return cls._wrap(td)

    @classmethod
    def from_dict(cls, input_dict: Any, *, auto_batch_size: Optional[bool] = None, batch_size: Any = None,
                  device: Any = None, batch_dims: Optional[int] = None, names: Any = None,
                  check: bool = True) -> "TypedTensorDict":
        """``TensorDict.from_dict`` wrapped in the class (a missing required field warns unless ``check=False``)."""
        source = TensorDict.from_dict(input_dict, auto_batch_size=auto_batch_size, batch_size=batch_size,
                                      device=device, batch_dims=batch_dims, names=names)
        if check:
            _warn_missing(cls, source, "{}.from_dict()", "pass check=False")
        return cls._wrap(source)

    # ------------------------------------------------------------------ primitives: the source's
    @property
    def batch_size(self) -> torch.Size:
        return self._source.batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        self._source.batch_size = value

    @property
    def device(self) -> Optional[torch.device]:
        return self._source.device

    @property
    def names(self) -> Any:
        return self._source.names

    @names.setter
    def names(self, value: Any) -> None:
        self._source.names = value

    @property
    def is_locked(self) -> bool:
        return self._source.is_locked

    def lock_(self) -> "TypedTensorDict":
        self._source.lock_()
        return self

    def unlock_(self) -> "TypedTensorDict":
        self._source.unlock_()
        return self

    def _keys_str(self) -> Iterator[str]:
        return self._source._keys_str()

    def _get_str(self, key: str, default: Any) -> Any:
        return self._source._get_str(key, default)

    def _set_str(self, key: str, value: Any, inplace: bool) -> None:
        self._source._set_str(key, value, inplace)

    def _del_str(self, key: str) -> None:
        self._source._del_str(key)

    def _dense(self) -> Any:
        source = self._source
        return source if isinstance(source, TensorDict) else source._dense()

    def _dense_is_copy(self) -> bool:
        source = self._source
        return False if isinstance(source, TensorDict) else source._dense_is_copy()

    def keys(self, *args: Any, **kwargs: Any) -> Any:
        return self._source.keys(*args, **kwargs)

    def get(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        return self._source.get(key, *args, **kwargs)

    def set(self, key: Any, item: Any, *args: Any, **kwargs: Any) -> "TypedTensorDict":
        self._source.set(key, _unwrap(item), *args, **kwargs)
        return self

    def to_tensordict(self, *, retain_none: Optional[bool] = None) -> Any:
        return self._source.to_tensordict(retain_none=retain_none)

    # ------------------------------------------------------------------ attribute access
    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).__expected_keys__:
            self[name] = value
            return
        object.__setattr__(self, name, value)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str) or (isinstance(index, tuple) and index and all(isinstance(part, (str, tuple))
                                                                                for part in index)):
            return self._source[index]
        return _wrap_result(self, self._source[_unwrap(index)])

    def __iter__(self) -> Iterator[Any]:
        return iter(getattr(self, "unbind")(0))

    def __reduce__(self) -> tuple:
        return (_rebuild, (type(self), self._source))

    def __repr__(self) -> str:
        from .printing import PRINT_OPTIONS, format_tensordict

        if PRINT_OPTIONS["compact"]:
            from ._compact_repr import compact_repr

            return compact_repr(self)
        return format_tensordict(self._dense(), class_name=type(self).__name__)

    @classmethod
    def __torch_function__(cls, func: Any, types: tuple, args: tuple = (), kwargs: Any = None) -> Any:
        """``torch.stack`` / ``torch.cat`` / ... of typed instances: on their sources, the result wrapped."""
        kwargs = kwargs or {}
        typed = next((value for value in _flat(args) if isinstance(value, TypedTensorDict)), None)
        result = func(*_unwrap(tuple(args)), **{name: _unwrap(value) for name, value in kwargs.items()})
        return _wrap_result(typed, result) if typed is not None else result


def _flat(args: Any) -> Iterator[Any]:
    for value in args:
        if type(value) in (list, tuple):
            yield from _flat(value)
        else:
            yield value


def _wrap_result(instance: Any, result: Any) -> Any:
    """A whole-collection result as an instance of ``instance``'s class (tuples of them element-wise)."""
    if result is instance._source:
        return instance
    if isinstance(result, TensorDictBase) and not isinstance(result, TypedTensorDict):
        return type(instance)._wrap(result)
    if type(result) is tuple and result and all(isinstance(item, TensorDictBase) for item in result):
        return tuple(_wrap_result(instance, item) for item in result)
    return result


def _rebuild(cls: Any, source: Any) -> TypedTensorDict:
    return cls._wrap(source)


def _warn_missing(cls: Any, source: Any, call: str, opt_out: str) -> None:
    missing = cls.__required_keys__.difference(source.keys())
    if missing:
        warnings.warn(
            f"{call.format(cls.__name__)} returns an instance of {cls.__name__} that misses the required field(s) "
            f"{', '.join(sorted(missing))}. Starting with TensorDict 0.17, the default will change to raising the "
            f"TypeError that the constructor raises. Pass these fields, or {opt_out} to keep the instance without "
            "them.", FutureWarning, stacklevel=3)


class _Forward:
    """A TensorDict member run on the source, its result wrapped (unless ``plain``); ``self`` for in-place."""

    __slots__ = ("name", "plain")

    def __init__(self, name: str, plain: bool) -> None:
        self.name = name
        self.plain = plain

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return getattr(TensorDict, self.name)
        member = getattr(instance._source, self.name)
        if not callable(member):
            return member if self.plain else _wrap_result(instance, member)
        name, plain = self.name, self.plain

        def forwarded(*args: Any, **kwargs: Any) -> Any:
            result = member(*_unwrap(args), **{key: _unwrap(value) for key, value in kwargs.items()})
            return result if plain and result is not instance._source else _wrap_result(instance, result)

        forwarded.__name__ = name
        return forwarded


def _install_forwards() -> None:
    names = set(GENERIC_METHODS) | set(DENSE_OPERATORS) | set(IN_PLACE_OPERATORS)
    names |= {name for name in dir(TensorDict) if not name.startswith("_")}
    names |= {"__len__", "__contains__", "__bool__", "__setitem__", "__delitem__", "__enter__", "__exit__"}
    for name in sorted(names - _OWN):
        if name in TypedTensorDict.__dict__:
            continue
        static = inspect.getattr_static(TensorDict, name, None)
        if isinstance(static, (classmethod, staticmethod, type)):
            continue
        setattr(TypedTensorDict, name, _Forward(name, name in _PLAIN_RESULTS))


_install_forwards()
