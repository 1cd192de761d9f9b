"""TensorDict (and tensorclass) as nodes of ``torch.utils._pytree``.

Registering through pytree's public ``register_pytree_node`` is all that
``torch.vmap``, ``torch.func.grad`` / ``jacrev`` / ``functional_call`` and
``tree_map`` need: they flatten their inputs to tensors, transform the
tensors, and rebuild the containers with ``tree_unflatten``. No torch
function is patched.

One collection is **one** pytree node, however deeply nested: its children
are all its tensors (nested TensorDicts and tensorclasses included, in
storage order); the context (:class:`_Node`) is everything else (keys,
nesting, batch size, device, names, non-tensor leaves). Rebuilding the whole
tree from one place lets the batch sizes be inferred consistently.

Why the batch size is *inferred* when rebuilding. ``torch.vmap`` rebuilds the
input TensorDict from leaves that lost the mapped dim (``in_dims``) and the
output TensorDict from leaves that gained one (``out_dims``); a chunked vmap
rebuilds it from slices. The context's batch size is stale in all these
cases, so ``unflatten`` measures how many dims the leaves gained or lost
(``delta``: the first tensor's ndim now minus its ndim when flattened) and
takes, at every level, the longest prefix shared by its tensors (and by its
sub-collections' batch sizes) of at most ``old batch dims + delta`` dims.

Pytree's own machinery also unflattens with placeholder leaves (vmap's
``in_dims`` broadcasting calls ``tree_unflatten([0, 0, ...], spec)`` and then
flattens the result again). Leaves that are not tensors are therefore kept
as they are, as children of the rebuilt TensorDict, so that it flattens back
to the same leaves; such a "shell" keeps the original batch sizes.
"""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple

import torch
from torch.utils import _pytree as pytree

from ._base import TensorCollection
from .nontensor import NON_TENSOR_TYPES, NonTensorData

__all__ = ["register_collection_class", "is_registered"]

_Tensor = torch.Tensor


class _ChildMarker:
    """Marks an entry whose value is a pytree child (a tensor, or a raw value in a shell)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "*"


_CHILD = _ChildMarker()


class _Constant:
    """A non-tensor leaf kept in the context; compared by its value."""

    __slots__ = ("leaf",)

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Constant):
            return NotImplemented
        mine, theirs = self.leaf, other.leaf
        if mine is theirs:
            return True
        if type(mine) is not type(theirs):
            return False
        try:
            if isinstance(mine, NonTensorData):
                return bool(mine.data == theirs.data)
            return bool(mine._flat_values() == theirs._flat_values())
        except Exception:  # values whose == is not a plain bool (arrays, ...)
            return False

    def __hash__(self) -> int:
        return hash(type(self.leaf))

    def __repr__(self) -> str:
        return f"{type(self.leaf).__name__}({self.leaf.data!r})"


class _Node:
    """The pytree context of one collection level: everything but its tensors.

    ``kinds`` is aligned with ``keys``: ``_CHILD``, a nested ``_Node`` or a
    ``_Constant``. The root also keeps ``probe``: ``(index, ndim)`` of its
    first tensor child when flattened, to measure how many dims a transform
    added or removed (None when there is no tensor). ``template`` is the
    tensorclass instance a tensorclass level is rebuilt from (None for
    TensorDicts).

    Two nodes are equal when they have the same classes, keys, nesting,
    number of batch dims, device, names and non-tensor values: like a
    tensor's shape, the batch *sizes* are not part of the structure.
    """

    __slots__ = ("cls", "td_cls", "keys", "kinds", "batch_size", "device", "names", "template", "probe", "flat")

    def __init__(self, cls: type, td_cls: Any, keys: tuple, kinds: tuple, batch_size: torch.Size,
                 device: Optional[torch.device], names: Optional[list], template: Any) -> None:
        self.cls = cls
        self.td_cls = td_cls
        self.keys = keys
        self.kinds = kinds
        self.batch_size = batch_size
        self.device = device
        self.names = names
        self.template = template
        self.probe: Optional[tuple] = None
        # Every entry a tensor child (no nesting, no constant): rebuilt by ``_unflatten_flat``.
        self.flat = all(kind is _CHILD for kind in kinds)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Node):
            return NotImplemented
        return (
            self.cls is other.cls
            and self.keys == other.keys
            and len(self.batch_size) == len(other.batch_size)
            and self.device == other.device
            and self.names == other.names
            and self.kinds == other.kinds
        )

    def __hash__(self) -> int:
        return hash((self.cls, self.keys, len(self.batch_size)))

    def __repr__(self) -> str:
        entries = ", ".join(f"{key!r}: {kind!r}" for key, kind in zip(self.keys, self.kinds))
        return f"{self.cls.__name__}({{{entries}}}, batch_dims={len(self.batch_size)})"


# ---------------------------------------------------------------------------------------- flatten


def _describe(collection: Any, children: list, probe: list) -> _Node:
    """Append the children of ``collection`` (depth first) and return its context.

    ``probe`` receives ``(index, ndim)`` of the first tensor child: enough to
    measure, when unflattening, how many dims a transform added or removed.
    """
    td = collection
    template = None
    inner = collection._tensordict
    if type(inner) is not dict:  # a tensorclass: its fields live in a TensorDict
        td, template = inner, collection
    kinds: list = []
    for leaf in td._tensordict.values():
        if isinstance(leaf, _Tensor):
            if not probe:
                probe.append((len(children), leaf.ndim))
            children.append(leaf)
            kinds.append(_CHILD)
        elif isinstance(leaf, TensorCollection):
            kinds.append(_describe(leaf, children, probe))
        elif type(leaf) in NON_TENSOR_TYPES:
            kinds.append(_Constant(leaf))
        else:  # a raw value held by a shell (see the module docstring)
            children.append(leaf)
            kinds.append(_CHILD)
    return _Node(type(collection), type(td), tuple(td._tensordict), tuple(kinds), td._batch_size, td._device,
                 td._names, template)


def _flatten(collection: Any) -> Tuple[List[Any], _Node]:
    children: list = []
    probe: list = []
    node = _describe(collection, children, probe)
    node.probe = probe[0] if probe else None
    return children, node


def _child_paths(node: _Node, prefix: tuple) -> Iterator[tuple]:
    for key, kind in zip(node.keys, node.kinds):
        if kind is _CHILD:
            yield prefix + (key,)
        elif type(kind) is _Node:
            yield from _child_paths(kind, prefix + (key,))


def _flatten_with_keys(collection: Any) -> Tuple[List[Tuple[Any, Any]], _Node]:
    children, node = _flatten(collection)
    paths = _child_paths(node, ())
    keyed: List[Tuple[Any, Any]] = [(pytree.MappingKey(path[0] if len(path) == 1 else path), child)
             for path, child in zip(paths, children)]
    return keyed, node


# -------------------------------------------------------------------------------------- unflatten


def _common_prefix(shapes: list, limit: int) -> torch.Size:
    """The longest prefix (at most ``limit`` dims) shared by every shape."""
    first = shapes[0]
    limit = min(limit, len(first))
    candidate = first[:limit]
    for shape in shapes:
        if shape[:limit] != candidate:
            break
    else:
        return candidate
    for dim in range(limit):
        size = first[dim]
        if any(len(other) <= dim or other[dim] != size for other in shapes):
            return first[:dim]
    return candidate


class _Builder:
    """Rebuilds a collection tree from children, inferring the batch sizes (see module docstring).

    ``delta`` is how many dims the tensors gained (> 0) or lost (< 0) since
    flattening; None when no tensor tells (a shell): the old batch sizes stay.
    """

    __slots__ = ("values", "position", "delta")

    def __init__(self, values: list, delta: Optional[int]) -> None:
        self.values = values
        self.position = 0
        self.delta = delta

    def build(self, node: _Node) -> Tuple[Any, bool]:
        """The rebuilt collection and whether its batch size was measured from tensors."""
        values = self.values
        old_batch = node.batch_size
        # At most this many batch dims; the sizes come from the tensors (none needed for 0 dims).
        limit = -1 if self.delta is None else max(0, len(old_batch) + self.delta)
        storage: dict = {}
        shapes: list = []
        measured = False
        unmeasured: list = []  # (key, node) of sub-collections with no tensor inside
        constants: list = []
        device = node.device
        for key, kind in zip(node.keys, node.kinds):
            if kind is _CHILD:
                value = values[self.position]
                self.position += 1
                storage[key] = value
                if isinstance(value, _Tensor):
                    measured = True
                    if limit > 0:
                        shapes.append(value.shape)
                    if device is not None and value.device != device:
                        device = None
            elif type(kind) is _Node:
                child, child_measured = self.build(kind)
                storage[key] = child
                if child_measured:
                    measured = True
                    if limit > 0:
                        shapes.append(child.batch_size)
                    if device is not None and child.device != device:
                        device = None
                else:
                    unmeasured.append((key, kind))
            else:
                storage[key] = kind.leaf
                constants.append(key)
        if not measured or limit < 0:
            batch_size = old_batch
        elif limit == 0:
            batch_size = _NO_BATCH
        else:
            batch_size = _common_prefix(shapes, limit)
        if batch_size != old_batch:
            old_dims = len(old_batch)
            for key, kind in unmeasured:
                storage[key] = _rebatch(storage[key], kind, batch_size + kind.batch_size[old_dims:])
            for key in constants:
                storage[key] = _rebatch_constant(storage[key], key, batch_size + storage[key].batch_size[old_dims:])
        names = node.names if len(batch_size) == len(old_batch) else None
        td = node.td_cls._new_unsafe(storage, batch_size, device, names)
        if node.template is not None:
            return node.template._rewrap(td), measured
        return td, measured


_NO_BATCH = torch.Size(())


def _rebatch_constant(leaf: Any, key: str, batch_size: torch.Size) -> Any:
    if leaf.batch_size == batch_size:
        return leaf
    if isinstance(leaf, NonTensorData):
        return leaf._with_batch_size(batch_size)
    raise ValueError(
        f"The NonTensorStack at key {key!r} holds one value per element of a batch of size "
        f"{list(leaf.batch_size)}; it cannot follow a transform (e.g. torch.vmap) that changes that batch to "
        f"{list(batch_size)}. Store a single value (NonTensorData) or remove the entry before the transform."
    )


def _rebatch(collection: Any, node: _Node, batch_size: torch.Size) -> Any:
    """Give a sub-collection with no tensor inside (only sub-collections and constants) a new batch."""
    td = collection if node.template is None else collection._tensordict
    old_dims = len(td._batch_size)
    storage = td._tensordict
    for key, kind in zip(node.keys, node.kinds):
        if type(kind) is _Node:
            storage[key] = _rebatch(storage[key], kind, batch_size + kind.batch_size[old_dims:])
        elif type(kind) is _Constant:
            storage[key] = _rebatch_constant(storage[key], key, batch_size + storage[key].batch_size[old_dims:])
    td._batch_size = batch_size
    td._batch_len = -1
    td._names = None
    return collection


def _unflatten(values: Any, node: _Node) -> Any:
    values = values if type(values) is list else list(values)
    delta = None
    probe = node.probe
    if probe is not None:
        index, ndim = probe
        value = values[index]
        if isinstance(value, _Tensor):
            delta = value.ndim - ndim
            if node.flat:
                flat = _unflatten_flat(values, node, delta)
                if flat is not None:
                    return flat
    collection, _ = _Builder(values, delta).build(node)
    return collection


def _unflatten_flat(values: list, node: _Node, delta: int) -> Any:
    """``_Builder.build`` for a level whose entries are all tensors (the usual input and output of a
    vmapped function), in one pass; None when a value is not a tensor (a shell: the general build)."""
    old_batch = node.batch_size
    limit = len(old_batch) + delta
    device = node.device
    if limit <= 0:
        for value in values:
            if not isinstance(value, _Tensor):
                return None
            if device is not None and value.device != device:
                device = None
        batch_size = _NO_BATCH
    else:
        shapes = []
        for value in values:
            if not isinstance(value, _Tensor):
                return None
            shapes.append(value.shape)
            if device is not None and value.device != device:
                device = None
        batch_size = _common_prefix(shapes, limit)
    names = node.names if len(batch_size) == len(old_batch) else None
    td = node.td_cls._new_unsafe(dict(zip(node.keys, values)), batch_size, device, names)
    return td if node.template is None else node.template._rewrap(td)


# ----------------------------------------------------------------------------------- registration

_REGISTERED: set = set()


def register_collection_class(cls: type) -> None:
    """Make ``cls`` (a TensorDict subclass or a tensorclass) a pytree node.

    pytree looks nodes up by exact type, so every class is registered on its
    own. Registering twice is a no-op. A tensorclass instance is rebuilt with
    ``template._rewrap(td)``, the template being the flattened instance (the
    tree spec keeps a reference to it).

    >>> import torch
    >>> from torch.utils._pytree import tree_map
    >>> from torchdict import TensorDict
    >>> tree_map(lambda t: t + 1, TensorDict(a=torch.zeros(2), batch_size=[2]))["a"]
    tensor([1., 1.])
    """
    if cls in _REGISTERED:
        return
    pytree.register_pytree_node(
        cls,
        _flatten,
        _unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=_flatten_with_keys,
    )
    _REGISTERED.add(cls)


def is_registered(cls: type) -> bool:
    """True when ``cls`` is a pytree node registered by torchdict."""
    return cls in _REGISTERED


def _register_core() -> None:
    from .tensordict import TensorDict

    register_collection_class(TensorDict)


_register_core()
