"""The other ways to build a TensorDict: ``fromkeys``, ``from_dict``, ``from_namedtuple``,
``from_dataclass``, ``from_any``, and the in-place inference ``auto_batch_size_`` / ``auto_device_``."""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ._apply import unwrap
from ._base import TensorCollection
from ._convert import to_leaf
from ._keys import key_to_tuple
from ._rebatch import restore_batches, snapshot_batches
from .nontensor import NonTensorData, NonTensorStack
from ._unbatched import UnbatchedTensor

if TYPE_CHECKING:
    from typing import Callable

    from typing_extensions import Self

    from ._host import TensorDictHost
    from .tensordict import TensorDict
else:
    TensorDictHost = object


class ConstructorsMixin(TensorDictHost):
    __slots__ = ()

    @classmethod
    def fromkeys(cls, keys: Sequence[Any], value: Any = 0) -> Self:
        """A new TensorDict with every key set to ``value`` (one shared leaf).

        >>> TensorDict.fromkeys(["a", ("b", "c")], 0)["b", "c"]
        tensor(0)
        """
        td = cls()
        leaf = to_leaf(value, None, td._batch_size, None)
        for key in keys:
            td._set_path(key_to_tuple(key), leaf)
        return td

    @classmethod
    def from_dict(cls, input_dict: Mapping, *, auto_batch_size: Optional[bool] = None,
                  batch_size: Any = None, device: Any = None, batch_dims: Optional[int] = None,
                  names: Optional[Sequence[Optional[str]]] = None) -> Self:
        """Recursively convert a (nested) mapping.

        With ``batch_dims`` (or ``auto_batch_size=True``) the batch size is the
        leading dims shared by every leaf (at most ``batch_dims`` of them).

        >>> TensorDict.from_dict({"a": torch.zeros(3, 2)}, batch_dims=1).batch_size
        torch.Size([3])
        """
        if isinstance(input_dict, Mapping) and any(type(key) is tuple for key in input_dict):
            # Tuple keys merge into the levels the other keys make (the constructor refuses a str key
            # that would replace a level written through a tuple key): they go last.
            input_dict = {**{key: value for key, value in input_dict.items() if type(key) is not tuple},
                          **{key: value for key, value in input_dict.items() if type(key) is tuple}}
        td = cls(input_dict, batch_size=batch_size, device=device)
        if batch_size is None and (auto_batch_size or batch_dims is not None):
            td.auto_batch_size_(batch_dims)
        if names is not None:
            td.names = names
        return td

    @classmethod
    def from_namedtuple(cls, named_tuple: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                        device: Any = None, batch_size: Any = None) -> "TensorDict":
        """A TensorDict with one entry per field of a namedtuple; nested namedtuples, dataclasses,
        mappings and plain tuples (keys ``"0"``, ``"1"``, ...) become nested TensorDicts.

        Tensors are stored as they are (no copy) unless ``device`` moves them. The batch size is
        ``batch_size``, or with ``auto_batch_size=True`` inferred as by ``auto_batch_size_``
        (``batch_dims`` caps it, and is ignored, with a warning, without ``auto_batch_size``).

        >>> from collections import namedtuple
        >>> Point = namedtuple("Point", ["x", "y"])
        >>> TensorDict.from_namedtuple(Point(torch.zeros(3), torch.ones(3, 2)), auto_batch_size=True).batch_size
        torch.Size([3])
        """
        if not _is_namedtuple(named_tuple):
            raise TypeError(f"from_namedtuple expects a namedtuple, got {type(named_tuple).__name__}.")
        source = {name: _to_source(value) for name, value in zip(named_tuple._fields, named_tuple)}
        return _build(cls, "from_namedtuple", source, auto_batch_size, batch_dims, device, batch_size)

    @classmethod
    def from_dataclass(cls, dataclass: Any, *, dest_cls: Any = None, auto_batch_size: bool = False,
                       batch_dims: Optional[int] = None, as_tensorclass: bool = False, device: Any = None,
                       batch_size: Any = None) -> "TensorDict":
        """A TensorDict with one entry per field of a dataclass instance (nested dataclasses,
        namedtuples, mappings and tuples become nested TensorDicts; tensorclass and TensorDict
        values are kept as they are). Batch size and device as in ``from_namedtuple``.

        A dataclass *type* whose fields all have defaults gives a TensorDict of the defaults; any
        other type raises ``TypeError``. ``as_tensorclass=True`` returns a tensorclass instance (of
        ``dest_cls`` when given; a tensorclass type for a dataclass type) through
        :func:`torchdict.from_dataclass`; without it ``dest_cls`` changes nothing, as upstream.

        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class Obs:
        ...     pixels: torch.Tensor
        ...     label: str = "cat"
        >>> td = TensorDict.from_dataclass(Obs(torch.zeros(2, 4)), auto_batch_size=True)
        >>> td.batch_size, td["label"]
        (torch.Size([2, 4]), 'cat')
        """
        if as_tensorclass:
            from ._factories import from_dataclass

            return from_dataclass(dataclass, dest_cls=dest_cls, auto_batch_size=auto_batch_size,
                                  batch_dims=batch_dims, device=device, batch_size=batch_size)
        return _build(cls, "from_dataclass", _dataclass_source(dataclass), auto_batch_size, batch_dims, device,
                      batch_size)

    @classmethod
    def from_schema(cls, schema: dict, *, batch_size: Any = None, storage: Optional[str] = None, device: Any = None,
                    **kwargs: Any) -> Any:
        """A zero-filled collection with one entry per ``schema`` key, ``(element shape, dtype)``, of batch
        ``batch_size``. ``storage``: None (a TensorDict), ``"memmap"`` (``prefix=``, as ``memmap_like``),
        ``"shared"`` (shared memory), ``"h5"`` / ``"zarr"`` (a PersistentTensorDict at ``filename=``),
        ``"redis"`` / ``"dragonfly"`` (a TensorDictStore; ``host=``, ``port=``...). ``ValueError`` otherwise.

        >>> td = TensorDict.from_schema({"obs": ([4], torch.uint8), "reward": ([], torch.float32)}, batch_size=[2])
        >>> td["obs"].shape, td["reward"].dtype
        (torch.Size([2, 4]), torch.float32)
        """
        from ._from_schema import from_schema

        return from_schema(schema, batch_size, storage, device, kwargs)

    @classmethod
    def from_any(cls, obj: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                 device: Any = None, batch_size: Any = None) -> Any:
        """A TensorDict from a mapping, namedtuple, dataclass, tuple (keys ``"0"``, ``"1"``, ...) or
        numpy structured array (batch size: the array's shape unless ``batch_size`` or
        ``auto_batch_size`` says otherwise; numeric fields share the array's memory where their
        layout allows, others are copied). A TensorDict or tensorclass is returned as it is (the
        options are not applied, as upstream); so is a tensor, or any other leaf value, since
        ``from_any`` is also what converts the values of a nested structure. A list becomes a tensor
        when it is a rectangular grid of numbers, else a ``NonTensorStack`` of its items (as upstream).

        >>> TensorDict.from_any((torch.zeros(2), {"b": torch.ones(2)}), auto_batch_size=True)["1", "b"]
        tensor([1., 1.])
        """
        if isinstance(obj, TensorCollection):
            return obj
        if _is_struct_array(obj):
            if batch_size is None and not auto_batch_size:
                batch_size = obj.shape
            return _build(cls, "from_any", _struct_source(obj), auto_batch_size, batch_dims, device, batch_size)
        if _is_namedtuple(obj):
            return cls.from_namedtuple(obj, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                                       batch_size=batch_size)
        if dataclasses.is_dataclass(obj):
            return cls.from_dataclass(obj, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                                      batch_size=batch_size)
        if isinstance(obj, (Mapping, tuple)):
            return _build(cls, "from_any", _to_source(obj), auto_batch_size, batch_dims, device, batch_size)
        if isinstance(obj, list):
            if _is_number_grid(obj):
                return torch.tensor(obj)
            return NonTensorStack.from_list(obj)
        return obj  # a tensor or another leaf value

    @classmethod
    def from_tuple(cls, obj: Any, *, auto_batch_size: bool = False, batch_dims: Optional[int] = None,
                   device: Any = None, batch_size: Any = None) -> "TensorDict":
        """A tuple as a TensorDict with keys ``"0"``, ``"1"``, ... (nested tuples, mappings, namedtuples and
        dataclasses become nested TensorDicts; numbers tensors; other values non-tensor data).

        >>> TensorDict.from_tuple((torch.zeros(3, 4), torch.ones(3)), auto_batch_size=True).batch_size
        torch.Size([3])
        """
        source = {str(position): _to_source(item) for position, item in enumerate(obj)}
        return _build(cls, "from_tuple", source, auto_batch_size, batch_dims, device, batch_size)

    @classmethod
    def from_list(cls, input: Sequence[Any], *, auto_batch_size: Optional[bool] = None, batch_size: Any = None,
                  device: Any = None, batch_dims: Optional[int] = None,
                  names: Optional[Sequence[Optional[str]]] = None, lazy: Optional[bool] = None) -> Any:
        """Stack a list of dicts (each through ``from_dict``) or collections along a new first dim: densely
        when they agree (or ``lazy=False``), lazily when not (or ``lazy=True``).

        ``batch_size`` starts with the list's length (each element gets the rest); ``batch_dims`` counts the
        list dim; ``names`` names every dim of the result.

        >>> TensorDict.from_list([{"a": torch.zeros(3)}, {"a": torch.ones(3)}], batch_size=[2, 3]).batch_size
        torch.Size([2, 3])
        """
        from .lazy import lazy_stack, maybe_dense_stack

        stack: Callable[..., Any] = maybe_dense_stack if lazy is None else lazy_stack if lazy else torch.stack
        member_batch = None
        if batch_size is not None:
            batch_size = torch.Size([batch_size]) if isinstance(batch_size, int) else torch.Size(batch_size)
            if not batch_size or batch_size[0] != len(input):
                raise ValueError(f"The provided batch size ({batch_size}) does not match the length of the list "
                                 f"({len(input)}).")
            member_batch = batch_size[1:]
        member_dims = None if batch_dims is None else batch_dims - 1
        members = [item if isinstance(item, TensorCollection) else
                   cls.from_dict(item, auto_batch_size=auto_batch_size, batch_size=member_batch,
                                 batch_dims=member_dims, device=device,
                                 names=None if names is None else list(names)[1:])
                   for item in input]
        result = stack(members)
        ignored = []
        if batch_size is not None and result.batch_size != batch_size:
            ignored.append("batch_size")
        if device is not None and result.device != torch.device(device):
            ignored.append("device")
        if ignored:
            warnings.warn(f"from_list ignores {' and '.join(ignored)} for the tensor collections of the list: the "
                          "result keeps the batch size and device of their stack.", FutureWarning, stacklevel=2)
        if names is not None:
            if len(names) == result.batch_dims:
                result.names = names
            else:
                warnings.warn(f"from_list ignores names={names}, whose length is not the number of batch dims of "
                              "the result.", FutureWarning, stacklevel=2)
        return result

    @classmethod
    def from_pytree(cls, pytree: Any, *, batch_size: Any = None, auto_batch_size: bool = False,
                    batch_dims: Optional[int] = None) -> Any:
        """Nested lists / tuples / namedtuples / dicts as a TensorDict that :meth:`to_pytree` turns back into
        the same structure (each container records its type in a ``"_pytree_type"`` entry).

        >>> td = TensorDict.from_pytree({"obs": torch.zeros(3, 4), "pair": (torch.zeros(3), torch.ones(3))},
        ...                             auto_batch_size=True)
        >>> td.batch_size, type(td.to_pytree()["pair"]).__name__
        (torch.Size([3]), 'tuple')
        """
        from ._pytree_convert import from_pytree

        return from_pytree(cls, pytree, batch_size, auto_batch_size, batch_dims)

    def from_dict_instance(self, input_dict: Mapping, *, auto_batch_size: Optional[bool] = None,
                           batch_size: Any = None, device: Any = None, batch_dims: Optional[int] = None,
                           names: Optional[Sequence[Optional[str]]] = None) -> "TensorDict":
        """``from_dict`` that gives a nested dict the type of this TensorDict's entry at the same key (a
        tensorclass, recursively), e.g. to turn ``to_dict()``'s output back into tensorclasses; the values of
        this TensorDict are not used.

        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.from_dict_instance({"a": torch.ones(2)}, batch_size=[2])["a"]
        tensor([1., 1.])
        """
        from .tensorclass import is_tensorclass

        source: dict = {}
        for key, value in input_dict.items():
            template = self._tensordict.get(key) if type(key) is str else None
            if isinstance(value, Mapping) and template is not None:
                if is_tensorclass(template):
                    value = type(template).from_dict(dict(value), batch_size=batch_size, device=device)
                elif isinstance(template, ConstructorsMixin):
                    value = template.from_dict_instance(value, auto_batch_size=auto_batch_size,
                                                        batch_size=batch_size, device=device, batch_dims=batch_dims)
            source[key] = value
        from .tensordict import TensorDict

        return TensorDict.from_dict(source, auto_batch_size=auto_batch_size, batch_size=batch_size, device=device,
                                    batch_dims=batch_dims, names=names)

    def auto_device_(self) -> Self:
        """Set the device of this TensorDict and of every nested one to the device all tensor
        leaves share, or to ``None`` when they are on several devices (or there are none);
        no data moves. Returns self.

        >>> td = TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)})
        >>> td.auto_device_().device, td["n"].device
        (device(type='cpu'), device(type='cpu'))
        """
        devices: set = set()
        _collect_devices(self, devices)
        _set_device_tree(self, devices.pop() if len(devices) == 1 else None)
        return self

    def auto_batch_size_(self, batch_dims: Optional[int] = None, keep_compliant_size: bool = False) -> Self:
        """Set the batch size to the leading dims common to every leaf (at most ``batch_dims``),
        and each sub-TensorDict's to those common to its own leaves, as upstream; returns self.

        >>> td = TensorDict({"a": torch.zeros(4, 2), "n": {"b": torch.zeros(4, 3)}}).auto_batch_size_()
        >>> td.batch_size, td["n"].batch_size
        (torch.Size([4]), torch.Size([4, 3]))

        With ``batch_dims`` and ``keep_compliant_size=True``, a sub-TensorDict that already has
        ``batch_dims`` batch dims or more keeps its batch size.
        """
        # Level by level, the sub-TensorDicts first: a refusal part-way (a locked level) is undone.
        levels = snapshot_batches(self)
        try:
            _auto_batch_size(self, batch_dims, keep_compliant_size and batch_dims is not None)
        except BaseException:
            restore_batches(levels)
            raise
        return self


def _auto_batch_size(td: Any, batch_dims: Optional[int], keep_compliant: bool = False) -> None:
    # The sub-TensorDicts first: the dims common to a part of the leaves extend those common to all.
    subs = [value for value in td._tensordict.values() if isinstance(value, ConstructorsMixin)]
    for sub in subs:
        if keep_compliant and batch_dims is not None and len(sub.batch_size) >= batch_dims:
            continue
        _auto_batch_size(sub, batch_dims, keep_compliant)
    # (an UnbatchedTensor has no batch dims: the batch size comes from the other leaves, as upstream)
    shapes = [leaf.shape for _, leaf in td.items(True, True) if not isinstance(leaf, UnbatchedTensor)]
    common: list = []
    if shapes:
        for dims in zip(*shapes):
            if any(dim != dims[0] for dim in dims) or (batch_dims is not None and len(common) >= batch_dims):
                break
            common.append(dims[0])
    td.batch_size = torch.Size(common)



def _is_number_grid(items: list) -> bool:
    """True for a list of numbers, or a list of such lists all of one length (what ``torch.tensor`` takes whole)."""
    if all(isinstance(item, (bool, int, float)) for item in items):
        return True
    if not all(isinstance(item, list) for item in items) or len({len(item) for item in items}) != 1:
        return False
    return all(_is_number_grid(item) for item in items)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _is_struct_array(obj: Any) -> bool:
    # Tested without importing numpy: it is not a dependency.
    return type(obj).__module__ == "numpy" and getattr(getattr(obj, "dtype", None), "names", None) is not None


def _to_source(value: Any) -> Any:
    """``value`` with the containers upstream turns into nested TensorDicts made plain dicts
    (namedtuples, dataclass instances, mappings, tuples with keys ``"0"``, ``"1"``, ...); the
    rest (tensors, lists, scalars, TensorDicts, tensorclasses) is left for the constructor."""
    if isinstance(value, TensorCollection):
        return value
    if _is_namedtuple(value):
        return {name: _to_source(item) for name, item in zip(value._fields, value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _dataclass_source(value)
    if isinstance(value, Mapping):
        return {key: _to_source(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return {str(index): _to_source(item) for index, item in enumerate(value)}
    return value


def _dataclass_source(obj: Any) -> dict:
    if isinstance(obj, TensorCollection):
        # A tensorclass is a dataclass too: its fields are the entries of its TensorDict.
        return dict(unwrap(obj)._tensordict)
    if not dataclasses.is_dataclass(obj):
        raise TypeError(f"from_dataclass expects a dataclass, got {type(obj).__name__}.")
    if isinstance(obj, type):
        return _dataclass_defaults(obj)
    return {field.name: _to_source(getattr(obj, field.name)) for field in dataclasses.fields(obj)}


def _dataclass_defaults(cls: type) -> dict:
    defaults = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = _to_source(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = _to_source(field.default_factory())
        else:
            raise TypeError(f"from_dataclass got the dataclass type {cls.__name__}, whose field {field.name!r} has "
                            "no default: pass an instance.")
    return defaults


def _struct_source(array: Any) -> dict:
    source: dict[str, Any] = {}
    for name in array.dtype.names:
        field = array[name]
        if field.dtype.names is not None:
            source[name] = _struct_source(field)
        elif field.dtype.kind in "biufc":
            source[name] = _numeric_field(field)
        else:
            source[name] = field  # strings, objects: stored as NonTensorData holding the array
    return source


def _numeric_field(field: Any) -> torch.Tensor:
    try:
        return torch.from_numpy(field)  # shares the array's memory
    except (ValueError, TypeError, RuntimeError):
        # A field whose record stride is not a multiple of its item size (or in a non-native
        # byte order) cannot be viewed by torch: copy it, contiguous and native.
        return torch.from_numpy(field.astype(field.dtype.newbyteorder("="), copy=True))


def _build(cls: type[ConstructorsMixin], name: str, source: dict, auto_batch_size: bool, batch_dims: Optional[int], device: Any,
           batch_size: Any) -> Any:
    """``from_dict`` with the batch options of from_namedtuple / from_dataclass / from_any."""
    if batch_size is not None and auto_batch_size:
        raise TypeError(f"{name}: batch_size and auto_batch_size cannot both be given.")
    if batch_dims is not None and not auto_batch_size:
        # As upstream 0.15: batch_dims alone does not infer (from_dict differs); say so.
        warnings.warn(f"{name} ignores batch_dims={batch_dims} without auto_batch_size=True.", UserWarning,
                      stacklevel=3)
        batch_dims = None
    return cls.from_dict(source, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
                         batch_size=batch_size)


def _collect_devices(td: Any, devices: set) -> None:
    for value in td._tensordict.values():
        if isinstance(value, torch.Tensor):
            devices.add(value.device)
        elif isinstance(value, TensorCollection):
            _collect_devices(unwrap(value), devices)


def _set_device_tree(td: Any, device: Optional[torch.device]) -> None:
    td._device = device
    storage = td._tensordict
    for key, value in storage.items():
        if isinstance(value, TensorCollection):
            _set_device_tree(unwrap(value), device)
        elif isinstance(value, (NonTensorData, NonTensorStack)) and value.device != device:
            storage[key] = value._to_device(device)  # the wrappers are immutable: replace (same key, no resize)
