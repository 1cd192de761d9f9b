"""The fields of a tensorclass: instance layout, field specs, value conversion, the generated ``__init__``.

A tensorclass instance keeps its fields in one TensorDict whose storage dict *is* the
instance ``__dict__`` (:class:`FieldStorage`), so reading a tensor field is a plain
attribute lookup. This module analyses a class once, when it is built: one
:class:`FieldSpec` per annotated field (its default, whether it always holds a tensor,
what ``autocast`` converts to), then generates an ``__init__`` that converts and
validates the values into that storage dict. Fields that may hold a non-tensor get a
class-level :class:`_ValueField` accessor that unwraps ``NonTensorData``.

The class machinery built on this layout (delegation to the TensorDict, rewrapping) is
in ``_delegation.py``; the public ``@tensorclass`` / ``TensorClass`` in
``tensorclass.py``.

>>> import torch
>>> from torchdict import TensorClass
>>> class Sample(TensorClass, autocast=True):
...     x: torch.Tensor
...     n: int
>>> sample = Sample([1.0, 2.0], n=torch.tensor(3))
>>> sample.x, sample.n
(tensor([1., 2.]), 3)
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch

from .._base import TensorCollection
from .._accel import C_HELPER, descriptor_setter, field_init, front_tensorclass_slots, lengths_fit
from .._convert import fits_batch, parse_batch_size, parse_device, to_leaf
from ._generated import exec_generated
from ._indexing import install_getitem
from ..nontensor import NonTensorData, NonTensorStack
from ..tensordict import TensorDict

if TYPE_CHECKING:
    from typing import TypeGuard

    from . import TensorClass
    from ._delegation import TensorDictMethods

_Tensor = torch.Tensor
_Size = torch.Size
_EMPTY_SIZE = torch.Size(())
NON_TENSOR = (NonTensorData, NonTensorStack)
OPTION_NAMES = ("autocast", "frozen", "nocast", "shadow", "kw_only", "tensor_only", "skip_post_init_on_rebuild")


# ---------------------------------------------------------------------------- instance layout
class FieldStorage(TensorCollection):
    """The layout every tensorclass instance has, and the class-level facts about its fields.

    ``__dict__`` is the storage dict of the TensorDict holding the fields. ``_td`` is that
    TensorDict, created on first use: construction only builds the storage dict and sets
    ``_td`` to the tuple ``(batch_size, device)`` (the batch size possibly a plain tuple of
    ints, made a torch.Size when first needed).
    """

    __slots__ = ("_td", "__dict__", "__weakref__")

    # Class-level facts, set per class when it is built (no annotations: they would become fields).
    _tc_fields = {}  # type: dict
    _tc_field_names = ()  # type: tuple
    _tc_field_set = frozenset()  # type: frozenset
    _tc_options = dict.fromkeys(OPTION_NAMES, False)  # type: dict
    _tc_is_template = True
    _tc_frozen = False
    _tc_cast_filter = None  # type: Optional[Callable]  # the class's default ``cast_filter`` of the dtype casts
    _tc_rebuild_post_init = False  # __post_init__ runs on rebuilds (indexing, clone, ...): see tensorclass.py

    if TYPE_CHECKING:
        # The TensorDict, or ``(batch_size, device)`` until it is first needed; read with ``type(td) is tuple``
        # tests (the fastest), which mypy does not narrow in their else branch: hence Any.
        _td: Any

        @property
        def _tensordict(self) -> TensorDict: ...  # TensorClass's: the TensorDict holding the fields


TD_STATE = FieldStorage.__dict__["_td"]  # the descriptor of the instances' _td slot
# Setters torch.compile can be taught to trace (a descriptor's __set__ method-wrapper is opaque to it).
set_td = descriptor_setter(TD_STATE)
set_instance_dict = descriptor_setter(FieldStorage.__dict__["__dict__"])


def is_tensorclass_type(cls: type) -> TypeGuard[type[TensorClass]]:
    """True for a built tensorclass (not the ``TensorClass`` base nor an options template)."""
    return issubclass(cls, FieldStorage) and not cls._tc_is_template


# ---------------------------------------------------------------------------- field specs
class _Default:
    """The signature default of a field that has a declared default (or factory)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<default>"


_DEFAULT = _Default()


class FieldSpec:
    """What the class knows about one field (resolved once, when the class is built)."""

    __slots__ = ("name", "owner", "default", "factory", "annotation", "tensor_like", "cast_to", "raw_default",
                 "kw_only", "plain_tensor_ok")

    def __init__(self, field: dataclasses.Field, annotation: Any, owner: type[TensorDictMethods]) -> None:
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
        self.apply_options()

    def apply_options(self) -> None:
        """Recompute what depends on the owner's options (they may be changed after the class is built)."""
        # A torch.Tensor value is stored as it is, unless autocast may turn it into something else.
        self.plain_tensor_ok = self.tensor_like or not self.owner._tc_options["autocast"]

    @property
    def has_default(self) -> bool:
        return self.default is not dataclasses.MISSING or self.factory is not dataclasses.MISSING

    def default_value(self) -> Any:
        return self.factory() if self.factory is not dataclasses.MISSING else self.default


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


def _cast_target(annotation: Any) -> Optional[type[Any]]:
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
def _autocast(spec: FieldSpec, value: Any, batch_size: _Size, device: Any) -> Any:
    target = spec.cast_to
    if target is None or isinstance(value, target) or type(value) in NON_TENSOR:
        # Already cast, or a raw default wrapped to stay raw (its declared value is kept as is).
        return value
    if is_tensorclass_type(target) and isinstance(value, TensorDict):
        return target.from_tensordict(value)
    if isinstance(value, Mapping) and not issubclass(target, TensorCollection):
        return value  # a dict is never cast to a tensor or a Python type (it stays a dict)
    if issubclass(target, _Tensor):
        try:
            return torch.as_tensor(value, device=device)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"Failed to cast the value {spec.name} to the type annotation {target}.") from None
    if is_tensorclass_type(target) and isinstance(value, Mapping):
        return target(**value, batch_size=batch_size, device=device)
    if issubclass(target, TensorCollection):
        return TensorDict(value, batch_size=batch_size, device=device) if isinstance(value, Mapping) else value
    if isinstance(value, _Tensor) and target in (int, float, bool):
        value = value.item()
    return NonTensorData(target(value), batch_size, device)


def to_field_leaf(spec: FieldSpec, value: Any, batch_size: _Size, device: Any) -> Any:
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


def _store(storage: dict, spec: FieldSpec, value: Any, batch_size: _Size, device: Any) -> None:
    leaf = to_field_leaf(spec, value, batch_size, device)
    if leaf is None:
        return
    storage[spec.name] = leaf
    if spec.tensor_like and type(leaf) in NON_TENSOR:
        _guard_field(spec.owner, spec.name)


def set_field(instance: FieldStorage, spec: FieldSpec, value: Any) -> None:
    """Write one field of ``instance`` (``None`` removes its entry); nothing changes on error."""
    td = instance._tensordict
    td._check_unlocked()
    storage = td._tensordict
    if value is None:
        storage.pop(spec.name, None)
        return
    _store(storage, spec, value, td._batch_size, td._device)


def _default_leaf(spec: FieldSpec, batch_size: _Size, device: Any) -> Any:
    """The value a field takes when omitted (a raw Python default is wrapped so it stays raw)."""
    value = spec.default_value()
    if spec.raw_default and value is not None and not isinstance(value, (_Tensor, TensorCollection) + NON_TENSOR):
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
        if type(value) in NON_TENSOR:
            return value.data
        return value

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__setattr__(self.name, value)

    def __delete__(self, instance: Any) -> None:
        instance.__delattr__(self.name)


def _guard_field(cls: type[TensorDictMethods], name: str) -> None:
    """A tensor-typed field received a non-tensor value: reads must now unwrap it."""
    if not isinstance(cls.__dict__.get(name), _ValueField):
        setattr(cls, name, _ValueField(name))


def guard_all(instance: Any) -> None:
    """Give every tensor-typed field of ``instance`` that now holds a non-tensor an unwrapping accessor."""
    storage = instance._tensordict._tensordict
    for spec in type(instance)._tc_fields.values():
        if spec.tensor_like and type(storage.get(spec.name)) in NON_TENSOR:
            _guard_field(spec.owner, spec.name)


def no_field_error(cls: type[TensorDictMethods], name: str) -> AttributeError:
    return AttributeError(
        f"Cannot set the attribute {name!r}: {cls.__name__} has no such field. "
        f"Its fields are {sorted(cls._tc_field_names)}."
    )


def _negative_batch(batch_size: _Size) -> None:
    raise RuntimeError(f"batch_size must hold non-negative sizes, got {batch_size}.")


# ---------------------------------------------------------------------------- class analysis
def declare_fields(cls: type) -> tuple:
    """Make ``cls`` a dataclass (no generated methods) and return its fields, base-class fields first."""
    own = cls.__dict__
    # A field re-declared without a default must not pick up a base class's accessor as its default.
    inherited = set().union(*(getattr(base, "_tc_field_set", ()) for base in cls.__mro__[1:]))
    for name in own.get("__annotations__", {}):
        if name not in own and name in inherited:
            setattr(cls, name, dataclasses.field())
    dataclasses.dataclass(cls, init=False, repr=False, eq=False, match_args=True)
    return dataclasses.fields(cls)


def install_fields(cls: type[TensorDictMethods], fields: tuple) -> None:
    """Record the field specs of ``cls``, give it its accessors and its ``__init__``."""
    hints = _resolve_annotations(cls)
    specs = [FieldSpec(field, hints.get(field.name, field.type), cls) for field in fields]
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
    install_getitem(cls, TD_STATE)
    previous_init = cls.__dict__.get("__init__")
    if previous_init is None or getattr(previous_init, "_tc_generated", False):
        setattr(cls, "__init__", make_init(cls, specs))
        front_tensorclass_slots(cls)
    elif not hasattr(previous_init, "_tc_wrapped"):
        setattr(cls, "__init__", _wrap_user_init(previous_init))


# ---------------------------------------------------------------------------- __init__
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
                and fits_batch(value.shape, batch_size)):
            storage[spec.name] = value
        else:
            _store(storage, spec, value, batch_size, device)
    return storage


def make_init(cls: type[TensorDictMethods], specs: list) -> Callable:
    """Generate ``__init__`` (as dataclasses do) with inlined fast paths.

    When every field is a plain ``torch.Tensor`` whose leading dims match (and no
    device is asked for), they go straight into the storage dict; the one-batch-dim check
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
    plain = " and ".join(f"type({name}) is _tc_Tensor" for name in names) or "True"
    lines = [f"def __init__({this}, {', '.join(params)}):",
             "    if _tc_extra:",
             "        raise _tc_no_field(_tc_cls, next(iter(_tc_extra)))"]
    fast = all(spec.plain_tensor_ok for spec in specs)
    if fast and names and not any(spec.has_default for spec in specs):
        # The commonest call, ``Cls(*tensors, batch_size=[n])``, first and with the fewest
        # steps: one batch dim given as a list, no device, no names, tensors whose C length
        # (first size; 0 for a 0-d tensor, hence n > 0) is n. That length doubles as the type
        # test: lengths_fit says False for anything but a tensor. A tensor of any class is
        # stored as given, as the general code does. Anything else falls through to the
        # general code below, which converts, validates and raises.
        lines += ["    if type(batch_size) is list and len(batch_size) == 1 and device is None and names is None:",
                  "        _tc_b0 = batch_size[0]",
                  f"        if type(_tc_b0) is int and _tc_lengths_fit({values}, _tc_b0):",
                  f"            _tc_st = {this}.__dict__",
                  *[f"            _tc_st[{name!r}] = {name}" for name in names],
                  f"            _tc_set_td({this}, ((_tc_b0,), None))",
                  *_init_epilogue(cls, this, indent="            "),
                  "            return"]
    lines += ["    if batch_size is None:",
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
    build = f"_tc_set_dict({this}, _tc_build(_tc_specs, {values}, _tc_bs, _tc_dev))"
    if fast:
        # The fast path fills the instance's own (fresh) __dict__: cheaper than building a
        # dict and setting it through the slot's descriptor.
        stores = [f"        _tc_st[{name!r}] = {name}" for name in names]
        lines += ["    _tc_n = len(_tc_bs)",
                  f"    if _tc_dev is None and {plain} and (_tc_n == 0 or (",
                  f"            _tc_n == 1 and _tc_lengths_fit({values}, _tc_bs[0]))):",
                  f"        _tc_st = {this}.__dict__",
                  *stores,
                  "    else:",
                  f"        {build}"]
    else:
        lines += [f"    {build}"]
    lines += [f"    _tc_set_td({this}, (_tc_bs, _tc_dev))",
              "    if names is not None:",
              f"        {this}._tensordict.names = names",
              *_init_epilogue(cls, this, indent="    ")]
    namespace: dict = {
        "_tc_DEFAULT": _DEFAULT, "_tc_EMPTY": _EMPTY_SIZE, "_tc_Size": _Size, "_tc_Tensor": _Tensor,
        "_tc_parse_batch_size": parse_batch_size, "_tc_parse_device": parse_device, "_tc_build": _build_storage,
        "_tc_default": _default_leaf, "_tc_no_field": no_field_error, "_tc_cls": cls, "_tc_specs": specs,
        "_tc_set_td": set_td, "_tc_set_dict": set_instance_dict, "_tc_lengths_fit": lengths_fit,
    }
    namespace.update({f"_tc_F_{spec.name}": spec for spec in specs})
    exec_generated("\n".join(lines), f"{cls.__qualname__}.__init__", namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init._tc_generated = True
    if (field_init is not None and fast and names and len(positional) == len(specs)
            and not any(spec.has_default for spec in specs) and not _init_epilogue(cls, this, indent="")):
        # Cls(*tensors, batch_size=[n]) in C (the first branch above, without a Python frame);
        # every other call goes to the Python __init__, which it carries as __wrapped__.
        # (It runs from the type slot, see _accel.front_tensorclass_slots; the class keeps this function.)
        setattr(init, C_HELPER, field_init(tuple(names), TD_STATE, init))
    return init


def _init_epilogue(cls: type[TensorDictMethods], this: str, indent: str) -> list:
    """The generated ``__init__``'s last lines: ``__post_init__`` and the lock of a frozen class."""
    lines = []
    if hasattr(cls, "__post_init__"):
        lines.append(f"{indent}{this}.__post_init__()")
    if cls._tc_options["frozen"]:
        lines.append(f"{indent}{this}._tensordict._lock_tree()")
    return lines


def _wrap_user_init(user_init: Callable) -> Callable:
    """Keep a hand-written ``__init__``: it runs on an empty instance of the given batch."""
    import functools

    @functools.wraps(user_init)
    def __init__(self: Any, *args: Any, batch_size: Any = None, device: Any = None, names: Any = None,
                 **kwargs: Any) -> None:
        td = TensorDict(batch_size=batch_size, device=device, names=names)
        set_td(self, td)
        set_instance_dict(self, td._tensordict)
        user_init(self, *args, **kwargs)

    setattr(__init__, "_tc_wrapped", user_init)
    return __init__
