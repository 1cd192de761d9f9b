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

This module is the public face: the decorator, the ``TensorClass`` base (its options,
attributes and batch properties) and ``is_tensorclass``. The instance layout, field
specs and the generated ``__init__`` are in ``_fields.py``; the delegated
TensorDict API (indexing, torch functions, rewrapping, repr, pickling, persistence) in
``_delegation.py``.

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
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, overload

import torch

from .._saved_classes import register_saved_class
from ._delegation import TensorDictMethods, install_delegates
from ._formats import FormatReadersMixin
from ._delegation import _rebuild  # noqa: F401 - pickles written before the split name it here
from ._fields import (OPTION_NAMES, TD_STATE, declare_fields, install_fields, is_tensorclass_type,
                                  make_init, no_field_error, set_field, set_instance_dict, set_td)
from ._indexing import install_getitem
from ..tensordict import TensorDict

if TYPE_CHECKING:  # the minimum Python (3.10) takes it from typing_extensions
    from typing_extensions import dataclass_transform
elif sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # pragma: no cover - exercised on 3.10 only
    try:
        from typing_extensions import dataclass_transform
    except ImportError:
        def dataclass_transform(**kwargs: Any) -> Callable[[Any], Any]:
            return lambda obj: obj

__all__ = ["tensorclass", "TensorClass", "is_tensorclass"]

_T = TypeVar("_T")
_Size = torch.Size


# ---------------------------------------------------------------------------- the base class
if TYPE_CHECKING:
    @dataclasses.dataclass
    class _ConstructorArguments(TensorDictMethods):
        """What type checkers see: every tensorclass takes these keyword arguments."""

        batch_size: Any = dataclasses.field(default=None, kw_only=True)
        device: Any = dataclasses.field(default=None, kw_only=True)
        names: Any = dataclasses.field(default=None, kw_only=True)

    _Base = _ConstructorArguments
else:
    _Base = TensorDictMethods


@dataclass_transform()
class TensorClass(FormatReadersMixin, _Base):
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

    # The instance layout (``_td`` and ``__dict__``) and the class-level facts about the
    # fields (``_tc_fields``, ``_tc_options``, ...) come from ``FieldStorage``.
    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]

    def __init_subclass__(cls, *, _template: bool = False, cast_filter: Optional[Callable] = None,
                          **options: Any) -> None:
        unknown = set(options) - set(OPTION_NAMES)
        if unknown:
            raise TypeError(f"Unknown tensorclass option(s) {sorted(unknown)}; expected some of {OPTION_NAMES}.")
        super().__init_subclass__()
        merged = dict(cls._tc_options)
        merged.update({key: bool(value) for key, value in options.items()})
        if merged["tensor_only"] and (merged["autocast"] or merged["nocast"]):
            raise TypeError("tensor_only and autocast or nocast are exclusive features.")
        cls._tc_options = merged
        cls._tc_frozen = merged["frozen"]
        if cast_filter is not None:
            cls._tc_cast_filter = cast_filter  # inherited by subclasses, as upstream
        cls._tc_rebuild_post_init = hasattr(cls, "__post_init__") and not merged["skip_post_init_on_rebuild"]
        cls._tc_is_template = _template
        if not _template:
            _build_class(cls)

    def __class_getitem__(cls, options: Any) -> type:
        """``TensorClass["nocast"]``, ``TensorClass["autocast", "frozen"]``: a base with options."""
        names = options if isinstance(options, tuple) else (options,)
        for option in names:
            if option not in OPTION_NAMES:
                raise ValueError(f"Unknown tensorclass option {option!r}; expected one of {OPTION_NAMES}.")
        return _template_class(cls, tuple(sorted(names)))

    # ------------------------------------------------------------------ protocol
    @property
    def _tensordict(self) -> TensorDict:
        """The TensorDict holding the fields (its storage dict is this instance's ``__dict__``)."""
        td = self._td
        if type(td) is tuple:
            td = TensorDict._new_unsafe(self.__dict__, _Size(td[0]), td[1])
            set_td(self, td)
        return td

    # ------------------------------------------------------------------ attributes
    def __setattr__(self, name: str, value: Any) -> None:
        spec = type(self)._tc_fields.get(name)
        if spec is not None:
            if self._tc_frozen:
                raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
            set_field(self, spec, value)
        elif name == "_tensordict":
            set_td(self, value)
            set_instance_dict(self, value._tensordict)
        elif hasattr(getattr(type(self), name, None), "__set__"):
            object.__setattr__(self, name, value)
        else:
            raise no_field_error(type(self), name)

    def __delattr__(self, name: str) -> None:
        if name not in type(self)._tc_field_set:
            raise no_field_error(type(self), name)
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
            set_td(self, td)
        return td[0]

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        self._tensordict.batch_size = value

    # batch_size's own getter (no second property call); getattr: mypy sees a property with a setter as overloaded.
    shape = property(getattr(batch_size, "fget"), doc="The batch size (read-only alias).")

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


install_delegates(TensorClass)

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
_reserved_cache: list = []


def _reserved_names() -> frozenset:
    if not _reserved_cache:
        names = {name for name in dir(TensorDict) if not name.startswith("__")}
        names |= {name for name in dir(TensorClass) if not name.startswith("__")}
        _reserved_cache.append(frozenset(names))
    return _reserved_cache[0]


_NEVER_SHADOWED = frozenset({"_tensordict", "batch_size", "device", "names", "shape"})


def _check_field_names(cls: type[TensorDictMethods], names: list) -> None:
    reserved = _NEVER_SHADOWED if cls._tc_options["shadow"] else _reserved_names()
    for name in names:
        if name in reserved or name.startswith("_tc_"):
            hint = "" if name in _NEVER_SHADOWED else (
                " To allow it, pass shadow=True (@tensorclass(shadow=True) or TensorClass['shadow']).")
            raise AttributeError(
                f"Attribute name {name} can't be used with @tensorclass or TensorClass, as tensorclasses "
                f"have a member of that name.{hint}"
            )


def _check_tensor_only(cls: type[TensorDictMethods]) -> None:
    """``tensor_only``: every field annotated with a tensor or collection type (``Optional`` of one allowed)."""
    if not cls._tc_options["tensor_only"]:
        return
    for spec in cls._tc_fields.values():
        if not spec.tensor_like:
            raise TypeError("tensor_only requires types to be Tensor, Tensor-subtypes or None.")


def _build_class(cls: type[TensorDictMethods]) -> None:
    """Turn an annotated subclass of TensorClass into a tensorclass (fields, accessors, __init__)."""
    fields = declare_fields(cls)
    _check_field_names(cls, [field.name for field in fields])
    install_fields(cls, fields)
    _check_tensor_only(cls)
    # Saved folders name their class; loading finds it here and never imports a module.
    register_saved_class(cls)
    _register_pytree(cls)


def _register_pytree(cls: type) -> None:
    # Makes instances pytree nodes: torch.vmap, torch.func and tree_map see through them.
    from .._pytree import register_collection_class

    register_collection_class(cls)


def _fix_class_cells(namespace: dict, old: type, new: type) -> None:
    """Point zero-argument ``super()`` cells of copied methods at the new class."""
    for value in namespace.values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        functions = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [value]
        for function in functions:
            closure = getattr(function, "__closure__", None)
            if not closure or function is None:
                continue
            for cell_name, cell in zip(function.__code__.co_freevars, closure):
                if cell_name == "__class__" and cell.cell_contents is old:
                    cell.cell_contents = new


# ---------------------------------------------------------------------------- public API
@overload
def tensorclass(cls: type[_T], /) -> type[_T]: ...


@overload
def tensorclass(cls: None = None, /, *, autocast: bool = False, frozen: bool = False, nocast: bool = False,
                shadow: bool = False, tensor_only: bool = False, skip_post_init_on_rebuild: bool = False,
                cast_filter: Optional[Callable] = None, kw_only: bool = False) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform()
def tensorclass(cls: Any = None, /, *, autocast: bool = False, frozen: bool = False, nocast: bool = False,
                shadow: bool = False, tensor_only: bool = False, skip_post_init_on_rebuild: bool = False,
                cast_filter: Optional[Callable] = None, kw_only: bool = False) -> Any:
    """Turn an annotated class into a tensorclass (a dataclass-like TensorDict).

    Options: ``autocast`` casts values to the field annotations; ``frozen`` forbids
    assignments and locks the content; ``nocast`` keeps Python numbers as they are;
    ``shadow`` allows field names that hide a TensorDict method; ``kw_only`` makes
    every field keyword-only; ``tensor_only`` requires every field to be annotated with a
    tensor or collection type (exclusive with ``autocast`` / ``nocast``);
    ``skip_post_init_on_rebuild`` runs ``__post_init__`` only when an instance is built
    from new data (``__init__``, ``from_tensordict``, ``from_dict``, loading), not when an
    op rebuilds one from another's data (indexing, ``clone``, ``to``, ``torch.stack``);
    ``cast_filter(key, leaf) -> bool`` is the instances' default filter of the dtype casts.

    >>> import torch
    >>> @tensorclass
    ... class MyData:
    ...     image: torch.Tensor
    ...     label: torch.Tensor
    >>> data = MyData(torch.zeros(10, 3), torch.arange(10), batch_size=[10])
    >>> data[data.label > 6].batch_size
    torch.Size([3])
    """
    options = {"autocast": autocast, "frozen": frozen, "nocast": nocast, "shadow": shadow, "kw_only": kw_only,
               "tensor_only": tensor_only, "skip_post_init_on_rebuild": skip_post_init_on_rebuild}
    if tensor_only and (autocast or nocast):
        raise TypeError("tensor_only and autocast or nocast are exclusive features.")

    def wrap(user_cls: type) -> type:
        chosen: dict = {key: value for key, value in options.items() if value}
        if issubclass(user_cls, TensorClass):
            # Already built by TensorClass.__init_subclass__: apply the options to it.
            user_cls._tc_options = {**user_cls._tc_options, **chosen}
            user_cls._tc_frozen = user_cls._tc_options["frozen"]
            if cast_filter is not None:
                user_cls._tc_cast_filter = cast_filter
            user_cls._tc_rebuild_post_init = (hasattr(user_cls, "__post_init__")
                                              and not user_cls._tc_options["skip_post_init_on_rebuild"])
            _check_tensor_only(user_cls)
            _check_field_names(user_cls, list(user_cls._tc_field_names))
            for spec in user_cls._tc_fields.values():
                spec.apply_options()
            if getattr(user_cls.__dict__.get("__init__"), "_tc_generated", False):
                setattr(user_cls, "__init__", make_init(user_cls, list(user_cls._tc_fields.values())))
            install_getitem(user_cls, TD_STATE)  # frozen now: the general path, which locks
            return user_cls
        skipped = {"__dict__", "__weakref__"}
        slots = user_cls.__dict__.get("__slots__", ())
        skipped.update([slots] if isinstance(slots, str) else slots)
        namespace = {key: value for key, value in user_cls.__dict__.items() if key not in skipped}
        namespace.pop("__slots__", None)
        bases = tuple(base for base in user_cls.__bases__ if base is not object) + (TensorClass,)
        if cast_filter is not None:
            chosen["cast_filter"] = cast_filter
        metaclass: Callable[..., type] = type(user_cls)  # the user class's metaclass builds the new one
        new_cls = metaclass(user_cls.__name__, bases, namespace, **chosen)
        _fix_class_cells(namespace, user_cls, new_cls)
        return new_cls

    return wrap if cls is None else wrap(cls)


def is_tensorclass(obj: Any) -> bool:
    """True for a tensorclass (decorated or a TensorClass subclass) or one of its instances.

    >>> is_tensorclass(TensorDict())
    False
    """
    return is_tensorclass_type(obj if isinstance(obj, type) else type(obj))
