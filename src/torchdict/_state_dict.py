"""``state_dict`` / ``load_state_dict``: a TensorDict in ``nn.Module``'s checkpoint format.

The format is upstream tensordict's, so checkpoints move between the two libraries: an
``OrderedDict`` of the tensor leaves under their nested keys joined by ``"."``, with a
``_metadata`` attribute (which ``nn.Module`` state dicts carry too, and which ``torch.save``
/ ``torch.load`` keep) mapping the dotted name of every level to ``{"batch_size", "device"}``
(plus ``"names"`` when the level has names) and of every non-tensor leaf to its value
(``"_type"`` and ``"_non_tensor"``). The root level's name is the prefix without its
trailing dot (``""`` without a prefix).

Loading reads the whole state dict and checks it against the TensorDict into a plan before
anything is written, so a failed load leaves the TensorDict as it was.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

import torch

from ._base import TensorCollection
from ._convert import fits_batch, to_leaf
from ._errors import InplaceWriteError, MessageKeyError, incompatible_batch_error, locked_error
from ._keyops import _as_td
from ._keys import key_to_tuple
from .nontensor import NonTensorData, NonTensorStack

if TYPE_CHECKING:
    from typing_extensions import Self
    from ._host import TensorDictHost
    from .tensordict import TensorDict
else:
    TensorDictHost = object

_Tensor = torch.Tensor
_NON_TENSOR = (NonTensorData, NonTensorStack)
_NON_TENSOR_TYPES = ("NonTensorData", "NonTensorStack")
_MISSING: Any = object()


# ------------------------------------------------------------------------------ writing
def _meta_name(prefix: str) -> str:
    # nn.Module's convention: a level's metadata sits under its prefix without the trailing dot.
    return prefix[:-1] if prefix.endswith(".") else prefix


def _level_meta(td: Any) -> dict:
    meta = {"batch_size": td.batch_size, "device": td.device}
    if td._names is not None:
        meta["names"] = list(td._names)
    return meta


def _non_tensor_meta(leaf: Any) -> dict:
    # The inner dict is upstream's own layout for a non-tensor value (it reads it back as is).
    return {"batch_size": leaf.batch_size, "device": leaf.device, "_type": type(leaf).__name__,
            "_non_tensor": {"data": leaf.data, "_metadata": None, "_is_non_tensor": True}}


def _new_out() -> Any:
    # nn.Module's state-dict layout: an OrderedDict carrying a ``_metadata`` attribute (no type says so).
    out: Any = OrderedDict()
    out._metadata = OrderedDict()
    return out


def _dump(td: Any, out: Any, prefix: str, keep_vars: bool, flatten: bool, seen: set) -> Any:
    out._metadata[_meta_name(prefix)] = _level_meta(td)
    for key, value in td.items():
        name = prefix + key
        if flatten:
            # A literal dotted key and a nested one would share a name: one entry would be lost.
            if name in seen:
                raise MessageKeyError(
                    f"state_dict(): the key {name!r} names two entries once nested keys are joined with '.'; "
                    "use flatten=False or rename one of them.")
            seen.add(name)
        if isinstance(value, _Tensor):
            out[name] = value if keep_vars else value.detach()
        elif isinstance(value, TensorCollection):
            if flatten:
                _dump(_as_td(value), out, name + ".", keep_vars, True, seen)
            else:
                out[name] = _dump(_as_td(value), _new_out(), "", keep_vars, False, set())
        elif flatten:
            out._metadata[name] = _non_tensor_meta(value)
        else:
            # Upstream's nested layout: an empty mapping whose own metadata holds the value.
            out[name] = holder = _new_out()
            holder._metadata[""] = _non_tensor_meta(value)
    return out


# ------------------------------------------------------------------------------ reading
def _splitter(metadata: Optional[Mapping]) -> Any:
    """How to turn a flat name into a nested key.

    With metadata (what ``state_dict()`` and ``nn.Module.state_dict()`` give), the recorded
    levels say where a name splits: ``"x.y"`` stays one key unless a level ``"x"`` is recorded,
    so TensorDicts with dotted keys (``flatten_keys()``) round trip. Without it, every dot splits.
    """
    if metadata is None:
        return lambda name: tuple(name.split("."))
    paths: dict = {}

    def split(name: str) -> tuple:
        cut = name.rfind(".")
        while cut >= 0:  # the longest recorded level that prefixes the name
            parent = paths.get(name[:cut])
            if parent is not None:
                return parent + (name[cut + 1:],)
            cut = name.rfind(".", 0, cut)
        return (name,)

    levels = [name for name, meta in metadata.items() if name and meta.get("_type") not in _NON_TENSOR_TYPES]
    for name in sorted(levels, key=len):  # parents first
        paths[name] = split(name)
    return split


def _level(tree: dict, path: tuple) -> dict:
    node = tree
    for depth, key in enumerate(path):
        node = node.setdefault(key, {})
        if type(node) is not dict:
            raise MessageKeyError(f"The state dict holds both a leaf at {'.'.join(path[:depth + 1])!r} and "
                                  "entries under it.")
    return node


def _put(tree: dict, path: tuple, leaf: Any) -> None:
    node = _level(tree, path[:-1])
    if type(node.get(path[-1])) is dict:
        raise MessageKeyError(f"The state dict holds both a leaf at {'.'.join(path)!r} and entries under it.")
    if not isinstance(leaf, (_Tensor, NonTensorData, NonTensorStack)):
        leaf = to_leaf(leaf, path, torch.Size(()), None)  # a number becomes a tensor, a str non-tensor data
    node[path[-1]] = leaf


def _non_tensor_leaf(meta: dict) -> Any:
    data = meta["_non_tensor"]["data"]
    batch_size = torch.Size(meta.get("batch_size", ()))
    if meta["_type"] == "NonTensorStack":
        return NonTensorStack.from_nested_list(data, batch_size)
    return NonTensorData(data, batch_size)


def _read(mapping: Mapping, path: tuple, from_flatten: bool, tree: dict, metas: dict) -> None:
    """Add ``mapping``'s leaves to ``tree`` (nested dicts) and its level metadata to ``metas``."""
    metadata = getattr(mapping, "_metadata", None)
    own = metadata.get("", {}) if metadata is not None else {}
    if own.get("_type") in _NON_TENSOR_TYPES:  # flatten=False's holder of a non-tensor value
        _put(tree, path, _non_tensor_leaf(own))
        return
    _level(tree, path)  # a level exists even when empty
    metas[path] = own
    flat_split = _splitter(metadata) if from_flatten else None

    def split(name: Any) -> tuple:  # a tuple key (a plain dict's) is a nested key already
        return flat_split(name) if flat_split is not None and type(name) is str else key_to_tuple(name)

    for key, value in mapping.items():
        if isinstance(value, Mapping):
            _read(value, path + split(key), from_flatten, tree, metas)
        else:
            _put(tree, path + split(key), value)
    for name, meta in (metadata or {}).items():
        if not name:
            continue
        if meta.get("_type") in _NON_TENSOR_TYPES:
            _put(tree, path + split(name), _non_tensor_leaf(meta))
        elif from_flatten:  # with literal keys, the nested mappings say where the levels are
            _level(tree, path + split(name))
            metas[path + split(name)] = meta


# ------------------------------------------------------------------------------ loading
class _Plan:
    """What a load will write, gathered while checking, so that a refused load writes nothing."""

    def __init__(self, strict: bool, assign: bool) -> None:
        self.strict = strict
        self.assign = assign
        self.unexpected: list = []  # in the state dict, not in the TensorDict
        self.missing: list = []  # in the TensorDict, not in the state dict
        self.levels: list = []  # (td, batch_size, names)
        self.puts: list = []  # (td, key, leaf)
        self.copies: list = []  # (destination tensor, source tensor)

    def apply(self) -> None:
        for td, batch_size, names in self.levels:
            td._batch_size = batch_size
            td._batch_len = -1
            td._names = names
        for td, key, leaf in self.puts:
            td._tensordict[key] = leaf
        with torch.no_grad():  # as nn.Module: a Parameter leaf is written in place too
            for destination, source in self.copies:
                destination.copy_(source)


def _dotted(path: tuple) -> str:
    return ".".join(path)


def _plan_level(td: Any, node: dict, meta: dict, metas: dict, path: tuple, parent_batch: torch.Size,
                plan: _Plan) -> None:
    batch_size = torch.Size(meta["batch_size"]) if "batch_size" in meta else td._batch_size
    if batch_size[:len(parent_batch)] != parent_batch:
        raise RuntimeError(f"the TensorDict {_dotted(path)} has shape {batch_size} which is incompatible with "
                           f"the batch-size {parent_batch}.")
    names = meta.get("names", td._names if batch_size == td._batch_size else None)
    if names is not None and len(names) != len(batch_size):
        raise ValueError(f"The names {names} recorded for {_dotted(path) or 'the root'} don't match its batch "
                         f"size {batch_size}.")
    if batch_size != td._batch_size or names != td._names:
        if td._is_locked:
            raise locked_error()  # a lock freezes the batch size and names too, as their setters say
        plan.levels.append((td, batch_size, names))
    storage = td._tensordict
    written = set()  # keys whose entry this load replaces
    for key, item in node.items():
        full = path + (key,)
        existing = storage.get(key, _MISSING)
        if existing is _MISSING:
            if plan.strict:
                plan.unexpected.append(_dotted(full))
                continue
            if td._is_locked:
                raise locked_error()
            if type(item) is dict:
                leaf = _fresh_level(td, item, metas, full, batch_size, plan)
            else:
                leaf = to_leaf(item, full, batch_size, td._device)
            plan.puts.append((td, key, leaf))
            written.add(key)
        elif type(item) is dict:
            if not isinstance(existing, TensorCollection):
                raise InplaceWriteError(f"The state dict holds entries under {_dotted(full)!r}, where the "
                                        f"TensorDict holds a {type(existing).__name__} leaf.")
            sub = _as_td(existing)
            _plan_level(sub, item, metas.get(full, {}), metas, full, batch_size, plan)
        elif isinstance(existing, TensorCollection):
            raise InplaceWriteError(f"The state dict holds a leaf at {_dotted(full)!r}, where the TensorDict "
                                    "holds a sub-TensorDict.")
        elif plan.assign:
            if td._is_locked:
                raise locked_error()
            plan.puts.append((td, key, to_leaf(item, full, batch_size, td._device)))
            written.add(key)
        elif isinstance(existing, _Tensor) and isinstance(item, _Tensor):
            if item.shape != existing.shape:
                raise InplaceWriteError(
                    f"size mismatch for {_dotted(full)!r}: copying a value of shape {item.shape} from the state "
                    f"dict into the entry of shape {existing.shape} (assign=True replaces the entry instead).")
            plan.copies.append((existing, item))
        elif not isinstance(existing, _Tensor) and not isinstance(item, _Tensor):
            # A non-tensor value is replaced, as set_() does (allowed when locked).
            plan.puts.append((td, key, to_leaf(item, full, batch_size, td._device)))
            written.add(key)
        else:
            raise InplaceWriteError(f"Cannot load the {type(item).__name__} at {_dotted(full)!r} in place of the "
                                    f"TensorDict's {type(existing).__name__} (assign=True replaces the entry).")
    for key, existing in storage.items():
        if key not in node:
            plan.missing.append(_dotted(path + (key,)))
        if key in written or batch_size == td._batch_size:
            continue
        # An entry kept (or copied into) must fit the level's new batch size.
        if isinstance(existing, NonTensorData):
            plan.puts.append((td, key, existing._with_batch_size(batch_size)))
        elif key not in node or not isinstance(existing, TensorCollection):  # loaded sub-levels check themselves
            shape = existing.shape if isinstance(existing, _Tensor) else existing.batch_size
            if not fits_batch(shape, batch_size):
                raise incompatible_batch_error(_dotted(path + (key,)), shape, batch_size)


def _fresh_level(parent: Any, node: dict, metas: dict, path: tuple, batch_size: torch.Size, plan: _Plan) -> Any:
    """A new sub-TensorDict for a level the TensorDict lacks (filled when the plan is applied)."""
    sub = parent._new_unsafe({}, batch_size, parent._device)
    _plan_level(sub, node, metas.get(path, {}), metas, path, batch_size, plan)
    return sub


# ------------------------------------------------------------------------------ mixin
class StateDictMixin(TensorDictHost):
    __slots__ = ()

    def state_dict(self, destination: Any = None, prefix: str = "", keep_vars: bool = False,
                   flatten: bool = True) -> Any:
        """The tensor leaves under ``nn.Module``-style dotted keys, for ``torch.save``.

        Batch sizes, devices, names and non-tensor values are kept in the result's
        ``_metadata`` attribute (as ``nn.Module`` does for its versions). Tensors are detached
        unless ``keep_vars``; ``flatten=False`` gives nested dicts instead of dotted keys.

        >>> td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2, 3)}, "s": "hi"}, batch_size=[2])
        >>> sd = td.state_dict()
        >>> list(sd)
        ['a', 'n.b']
        >>> sd._metadata["s"]["_non_tensor"]["data"]
        'hi'
        >>> list(td.state_dict(prefix="td.", flatten=False))
        ['td.a', 'td.n', 'td.s']
        """
        if destination is None:
            destination = OrderedDict()
        if not hasattr(destination, "_metadata"):
            try:
                destination._metadata = OrderedDict()
            except AttributeError:
                raise TypeError(
                    f"state_dict(destination=...) needs a mapping that takes attributes, such as an OrderedDict "
                    f"(got {type(destination).__name__}): batch sizes and non-tensor values are kept in its "
                    "_metadata attribute.") from None
        return _dump(self, destination, prefix, keep_vars, flatten, set())

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False,
                        from_flatten: Optional[bool] = None) -> Self:
        """Load a ``state_dict()`` (or any mapping of tensors); returns self.

        Tensors are copied into the existing leaves (shapes must match; the dtype is cast),
        or replace them with ``assign=True``. Batch sizes, names and non-tensor values are
        restored from the metadata. ``strict=False`` adds the keys the TensorDict lacks and
        keeps those the state dict lacks. ``from_flatten`` (default: whether the state dict
        has ``_metadata``) says the keys are dotted names to split. Nothing is written if the
        load is refused.

        >>> td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2, 3)}, "s": "hi"}, batch_size=[2])
        >>> restored = TensorDict().load_state_dict(td.state_dict(), strict=False)
        >>> restored.batch_size, restored["n", "b"].shape, restored["s"]
        (torch.Size([2]), torch.Size([2, 3]), 'hi')
        """
        if from_flatten is None:
            from_flatten = hasattr(state_dict, "_metadata")
        tree: dict = {}
        metas: dict = {}
        _read(state_dict, (), from_flatten, tree, metas)
        plan = _Plan(strict, assign)
        _plan_level(self, tree, metas.get((), {}), metas, (), torch.Size(()), plan)
        if strict and (plan.unexpected or plan.missing):
            raise RuntimeError(
                "Cannot load state-dict because the key sets don't match: got state_dict extra keys "
                f"{sorted(plan.unexpected)} and tensordict extra keys {sorted(plan.missing)}. "
                "strict=False loads the common keys, adds the others and keeps the TensorDict's own.")
        plan.apply()
        return self
