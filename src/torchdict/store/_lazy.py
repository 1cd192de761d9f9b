"""``LazyStackedTensorDictStore``: a lazy stack kept on a Redis-protocol server, one stored tree per member,
so members may hold entries of different shapes (and keys the others lack). See docs/store.md."""
from __future__ import annotations

import uuid
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch

from .._errors import locked_error, missing_key_error
from .._keys import key_to_tuple
from .._update import entries_to_update
from ..base import TensorDictBase
from . import _schema
from ._schema import LAZY_STACK, NODE
from ._store import (_MISSING, STORE_BACKENDS, TensorDictStore, as_device, as_size, claim_root, missing_entry,
                     open_connection, read_root)



def _lazy_root_meta(count: int, stack_dim: int, inner: torch.Size, device: Optional[torch.device],
                    backend: str) -> dict:
    return {"format": _schema.FORMAT, "kind": LAZY_STACK, "count": count, "stack_dim": stack_dim,
            "inner_batch_size": list(inner), "device": None if device is None else str(device), "backend": backend}


class LazyStackedTensorDictStore(TensorDictBase):
    """A stack of ``count`` stored TensorDicts of batch size ``inner_batch_size`` along ``stack_dim``.

    Each member is a stored tree of its own (a :class:`TensorDictStore`), so members may hold entries of
    different shapes. ``store[i]`` (``stack_dim`` 0) is member ``i``: a store that reads and writes on the
    server; ``store[key]`` stacks the members' entries; other operations run on a local lazy stack.
    """

    def __init__(self, *, backend: STORE_BACKENDS = "redis", host: str = "localhost", port: int = 6379, db: int = 0,
                 unix_socket_path: Optional[str] = None, prefix: str = "tensordict", count: int,
                 stack_dim: int = 0, inner_batch_size: Sequence[int], device: Any = None, client: Any = None,
                 td_id: Optional[str] = None, cache_metadata: bool = True, **redis_kwargs: Any) -> None:
        from ._client import Link

        inner = as_size(inner_batch_size)
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"LazyStackedTensorDictStore: count must be a positive int, got {count!r}.")
        if not -len(inner) - 1 <= stack_dim <= len(inner):
            raise RuntimeError(f"Stack dim {stack_dim} is too big for batch size {torch.Size((*inner, count))}.")
        stack_dim %= len(inner) + 1
        td_id = str(uuid.uuid4()) if td_id is None else td_id
        device = as_device(device)
        connection = open_connection(backend=backend, host=host, port=port, db=db, unix_socket_path=unix_socket_path,
                                     client=client, cache_metadata=cache_metadata, redis_kwargs=redis_kwargs)
        link = Link(connection, _schema.namespace(prefix, td_id))
        claim_root(link, _lazy_root_meta(count, stack_dim, inner, device, backend), type(self).__name__)
        members = _member_links(link, count)
        member_root = _schema.encode_meta(_schema.root_meta(inner, device, backend))

        def build(pipe: Any) -> None:
            for member in members:
                pipe.hsetnx(member.tree_key, _schema.ROOT_FIELD, member_root)

        connection.transaction(build)
        for member in members:
            member.root_raw = member_root
        self._setup(link, [_member_store(member, inner, device, prefix, td_id) for member in members], stack_dim,
                    device, prefix, td_id)

    @classmethod
    def _open(cls, link: Any, meta: dict, device: Optional[torch.device], prefix: str,
              td_id: str) -> "LazyStackedTensorDictStore":
        inner = torch.Size(meta["inner_batch_size"])
        members = _member_links(link, meta["count"])
        member_root = _schema.encode_meta(_schema.root_meta(inner, as_device(meta.get("device")),
                                                            meta.get("backend", "redis")))
        for member in members:
            member.root_raw = member_root
        store = object.__new__(cls)
        store._setup(link, [_member_store(member, inner, device, prefix, td_id) for member in members],
                     meta["stack_dim"], device, prefix, td_id)
        return store

    def _setup(self, link: Any, members: List[TensorDictStore], stack_dim: int, device: Optional[torch.device],
               prefix: str, td_id: str, path: tuple = ()) -> None:
        self._link = link
        self._members = members
        self._stack_dim = stack_dim
        self._device = device
        self._prefix = prefix
        self._td_id = td_id
        self._path = path

    def _view(self, members: List[TensorDictStore], path: tuple) -> "LazyStackedTensorDictStore":
        view = object.__new__(LazyStackedTensorDictStore)
        view._setup(self._link, members, self._stack_dim, self._device, self._prefix, self._td_id, path)
        return view

    @property
    def _connection(self) -> Any:
        return self._link.connection

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_lazy_stack(cls, lazy_td: Any, *, backend: STORE_BACKENDS = "redis", host: str = "localhost",
                        port: int = 6379, db: int = 0, unix_socket_path: Optional[str] = None,
                        prefix: str = "tensordict", device: Any = None, **kwargs: Any) -> "LazyStackedTensorDictStore":
        """A new stored stack holding a copy of the lazy stack ``lazy_td`` (members may be ragged)."""
        members = lazy_td.tensordicts
        store = cls(backend=backend, host=host, port=port, db=db, unix_socket_path=unix_socket_path, prefix=prefix,
                    count=len(members), stack_dim=lazy_td.stack_dim, inner_batch_size=members[0].batch_size,
                    device=lazy_td.device if device is None else device, **kwargs)
        store._assign_members(members)
        return store

    @classmethod
    def from_store(cls, *, backend: STORE_BACKENDS = "redis", host: str = "localhost", port: int = 6379, db: int = 0,
                   unix_socket_path: Optional[str] = None, prefix: str = "tensordict", td_id: str,
                   device: Any = None, **kwargs: Any) -> "LazyStackedTensorDictStore":
        """Connect to a stored stack by its ``td_id`` (KeyError when the server holds none)."""
        from ._client import Link

        client, cache_metadata = kwargs.pop("client", None), kwargs.pop("cache_metadata", True)
        connection = open_connection(backend=backend, host=host, port=port, db=db, unix_socket_path=unix_socket_path,
                                     client=client, cache_metadata=cache_metadata, redis_kwargs=kwargs)
        link = Link(connection, _schema.namespace(prefix, td_id))
        meta = read_root(link, td_id)
        if meta["kind"] != LAZY_STACK:
            raise ValueError(f"the store with td_id {td_id!r} is not a stacked store: open it with "
                             "TensorDictStore.from_store.")
        stored = as_device(meta.get("device"))
        return cls._open(link, meta, stored if device is None else as_device(device), prefix, td_id)

    @classmethod
    def from_dict(cls, input_dict: Any, *, auto_batch_size: bool = False, batch_size: Any = None, device: Any = None,
                  **kwargs: Any) -> "LazyStackedTensorDictStore":
        """A stored stack of the elements (along dim 0) of the TensorDict built from ``input_dict``."""
        from ..lazy import lazy_stack
        from ..tensordict import TensorDict

        local = TensorDict.from_dict(input_dict, auto_batch_size=auto_batch_size, batch_size=batch_size,
                                     device=device)
        if not local.batch_dims:
            raise RuntimeError("LazyStackedTensorDictStore.from_dict needs at least one batch dim to stack along.")
        return cls.from_lazy_stack(lazy_stack(list(local.unbind(0)), 0), device=device, **kwargs)

    # ------------------------------------------------------------------ shape and members
    @property
    def batch_size(self) -> torch.Size:
        inner = list(self._members[0].batch_size)
        inner.insert(self._stack_dim, len(self._members))
        return torch.Size(inner)

    @property
    def device(self) -> Optional[torch.device]:
        return self._device

    @property
    def stack_dim(self) -> int:
        return self._stack_dim

    @property
    def tensordicts(self) -> List[TensorDictStore]:
        """The members: stores that read and write on the server."""
        return list(self._members)

    @property
    def is_locked(self) -> bool:
        return self._link.locked

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        self._link.locked = bool(value)
        for member in self._members:
            member._link.locked = bool(value)

    def lock_(self) -> "LazyStackedTensorDictStore":
        self.is_locked = True
        return self

    def unlock_(self) -> "LazyStackedTensorDictStore":
        self.is_locked = False
        return self

    def _member_links(self) -> List[Any]:
        return [member._link for member in self._members]

    def _fresh_trees(self) -> List[Dict[str, tuple]]:
        from ._io import fetch_trees

        return fetch_trees(self._connection, self._member_links(), fresh=True)

    # ------------------------------------------------------------------ primitives
    def _keys_str(self) -> Iterator[str]:
        return iter([key for key in self.keys() if isinstance(key, str)])

    def keys(self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Optional[Callable] = None,
             *, sort: bool = False) -> List[Any]:
        """The keys every member holds (as a lazy stack shows them), read from the metadata."""
        from ._io import children

        trees = self._fresh_trees()
        paths = [member._path for member in self._members]

        def walk(relative: tuple) -> List[Any]:
            found: List[Any] = []
            listings = [dict(children(tree, path + relative)) for tree, path in zip(trees, paths)]
            for key, meta in children(trees[0], paths[0] + relative):
                metas = [listing[key] for listing in listings if key in listing]
                if len(metas) != len(listings):  # a member lacks it
                    continue
                is_node = [other["kind"] == NODE for other in metas]
                if any(is_node) and not all(is_node):
                    continue
                full = relative + (key,)
                shown = full[0] if len(full) == 1 else full
                nested = is_node[0] and not (is_leaf is not None and is_leaf(LazyStackedTensorDictStore))
                if nested and include_nested:
                    found.extend(walk(full))
                if not nested or not leaves_only:
                    found.append(shown)
            return found

        keys = walk(())
        return sorted(keys, key=lambda key: key if isinstance(key, str) else ".".join(key)) if sort else keys

    def _get_str(self, key: str, default: Any) -> Any:
        return self._read_key((key,), default)

    def get(self, key: Any, default: Any = _MISSING) -> Any:
        value = self._read_key(key_to_tuple(key), _MISSING)
        return value if value is not _MISSING else missing_entry(self, key, default)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str) or (isinstance(index, tuple) and index and all(isinstance(i, str) for i in index)):
            value = self._read_key(key_to_tuple(index), _MISSING)
            if value is _MISSING:
                raise missing_key_error(index, self.keys())
            return value._read() if hasattr(value, "_read") and not isinstance(value, torch.Tensor) else value
        return self._index(index)

    def _read_key(self, keys: tuple, default: Any) -> Any:
        """The members' entries at ``keys``, read in one transaction: a stacked store for nested levels,
        else the lazy stack's value (stacked tensors; ragged entries as a lazy stack gives them)."""
        from ..lazy import lazy_stack
        from ..tensordict import TensorDict
        from ._io import read_entries

        requests = [(member._link, member._path + keys) for member in self._members]
        read = read_entries(self._connection, requests)
        entries = [(meta, data) for meta, data in read if meta is not None]
        if len(entries) != len(read):
            return default
        kinds = {meta["kind"] for meta, _ in entries}
        if kinds == {NODE}:
            views = [member._view(member._path + keys, torch.Size(meta["batch_size"]))
                     for member, (meta, _) in zip(self._members, entries)]
            return self._view(views, self._path + keys)
        if NODE in kinds:
            return default
        values = [member._value(member._path + keys, meta, data)
                  for member, (meta, data) in zip(self._members, entries)]
        pieces = [TensorDict({keys[-1]: value}, batch_size=member.batch_size, device=self._device)
                  for member, value in zip(self._members, values)]
        return lazy_stack(pieces, self._stack_dim).get(keys[-1])

    def __contains__(self, key: Any) -> bool:
        if isinstance(key, list):
            raise TypeError("a list is not a key: use a tuple for a nested key")
        return all(key in member for member in self._members)

    def _pieces(self, value: Any, key: Any) -> List[Any]:
        """``value`` (fitted to this stack's batch size) cut into one piece per member."""
        from .._convert import to_leaf

        leaf = to_leaf(value, key, self.batch_size, None)
        return list(leaf.unbind(self._stack_dim))

    def _plan_each(self, plan_one: Callable[[Any, TensorDictStore, Any], None], pieces: List[Any]) -> None:
        from ._io import WritePlan

        plan = WritePlan(self._connection)
        plan.prefetch(self._member_links())
        for member, piece in zip(self._members, pieces):
            plan_one(plan, member, piece)
        plan.commit()

    def _set_str(self, key: str, value: Any, inplace: bool) -> None:
        self.set(key, value, inplace=inplace)

    def set(self, key: Any, item: Any, inplace: bool = False, **kwargs: Any) -> "LazyStackedTensorDictStore":
        """Write ``item`` (of this stack's batch size) at ``key``: each member gets its slice, in one
        transaction."""
        keys = key_to_tuple(key)
        self._plan_each(lambda plan, member, piece: member._plan_set(plan, keys, piece, inplace, key),
                        self._pieces(item, key))
        return self

    def set_(self, key: Any, item: Any, *, non_blocking: bool = False) -> "LazyStackedTensorDictStore":
        """Write ``item`` into the existing entries at ``key`` (synchronously: ``non_blocking`` changes nothing)."""
        keys = key_to_tuple(key)
        if key not in self:
            raise missing_key_error(key, self.keys(include_nested=True))
        self._plan_each(lambda plan, member, piece: member._plan_set(plan, keys, piece, True, key, must_exist=True),
                        self._pieces(item, key))
        return self

    def update(self, input_dict_or_td: Any = None, clone: bool = False, inplace: bool = False, *,
               non_blocking: bool = False, keys_to_update: Optional[Sequence[Any]] = None,
               is_leaf: Optional[Callable] = None, update_batch_size: bool = False, ignore_lock: bool = False,
               **kwargs: Any) -> "LazyStackedTensorDictStore":
        """Write every entry of ``input_dict_or_td`` and the keyword entries into the members, in one transaction
        (``non_blocking`` / ``is_leaf`` change nothing; ``update_batch_size=True`` is refused; ``ignore_lock`` is
        not needed: a lazy store has no lock of its own)."""
        from ..tensordict import TensorDict

        if update_batch_size:
            raise RuntimeError("update(update_batch_size=True) can't change the batch size of a "
                               "LazyStackedTensorDictStore.")
        wanted = None if keys_to_update is None else [key_to_tuple(key) for key in keys_to_update]
        source = entries_to_update(input_dict_or_td, kwargs)
        if isinstance(source, Mapping):
            source = TensorDict(source, batch_size=self.batch_size)
        if not isinstance(source, TensorDictBase):
            raise TypeError(f"update expects a dict or a TensorDict, got {type(source).__name__}.")
        pieces = list(source.unbind(self._stack_dim))
        self._plan_each(lambda plan, member, piece: member._plan_update(plan, (), piece, inplace, wanted, False),
                        pieces)
        return self

    def _del_str(self, key: str) -> None:
        self._plan_each(lambda plan, member, _: plan.delete(member._link, member._path + (key,)),
                        [None] * len(self._members))

    def del_(self, key: Any) -> "LazyStackedTensorDictStore":
        if key not in self:
            raise missing_key_error(key, self.keys(include_nested=True))
        if self.is_locked:
            raise locked_error()
        keys = key_to_tuple(key)
        self._plan_each(lambda plan, member, _: plan.delete(member._link, member._path + keys),
                        [None] * len(self._members))
        return self

    def _dense(self) -> Any:
        """The local lazy stack of the members, from one transaction."""
        from ..lazy import lazy_stack
        from ._io import assemble, read_trees

        read = read_trees(self._connection, [(member._link, member._path) for member in self._members])
        members = [assemble(tree, member._path, values, member.batch_size, self._device)
                   for member, (tree, values) in zip(self._members, read)]
        return lazy_stack(members, self._stack_dim)

    def _dense_is_copy(self) -> bool:
        return True

    def _index(self, index: Any) -> Any:
        if self._stack_dim == 0:
            first, rest = (index[0], index[1:]) if isinstance(index, tuple) and index else (index, ())
            if isinstance(first, int) and not isinstance(first, bool):
                count = len(self._members)
                if not -count <= first < count:
                    raise IndexError(f"index {first} is out of bounds for dimension 0 with size {count}")
                member = self._members[first]
                return member if not rest else member[rest]
        return self._dense()[index]

    def _set_at(self, index: Any, value: Any) -> None:
        if self._stack_dim == 0 and isinstance(index, int) and not isinstance(index, bool):
            member = self._index(index)
            if self.is_locked:
                member.update_(value)
            else:
                member.update(value)
            return
        scratch = self._dense()
        scratch[index] = value
        self._assign_from(scratch, True)

    def _assign_members(self, sources: Sequence[Any]) -> None:
        def plan_one(plan: Any, member: TensorDictStore, source: Any) -> None:
            for key in member._keys_in(plan):
                if key not in source.keys():
                    plan.delete(member._link, member._path + (key,))
            for key in source.keys():
                plan.put(member._link, member._path + (key,), source._get_str(key, None))

        self._plan_each(plan_one, list(sources))

    def _assign_from(self, source: Any, inplace: bool) -> None:
        pieces = list(source.unbind(self._stack_dim))
        if self.is_locked:
            own = set(self.keys())
            if any(set(piece.keys()) != own for piece in pieces):
                raise locked_error()
        self._assign_members(pieces)

    # ------------------------------------------------------------------ copies and lifetime
    def to_tensordict(self, *, retain_none: Optional[bool] = None) -> Any:
        """A local lazy stack holding a copy of the members (one consistent read)."""
        return self._dense()

    def to_local(self) -> Any:
        warnings.warn(f"{type(self).__name__}.to_local() is deprecated: use to_tensordict() instead.",
                      DeprecationWarning, stacklevel=2)
        return self.to_tensordict()

    def clone(self, recurse: bool = True, **kwargs: Any) -> "LazyStackedTensorDictStore":
        """``recurse=True``: a new stored stack (new ``td_id``) holding a copy; else another handle."""
        if not recurse:
            return self._view(list(self._members), self._path)
        from ._client import Link

        connection = self._connection

        td_id = str(uuid.uuid4())
        link = Link(connection, _schema.namespace(self._prefix, td_id))
        inner = self._members[0].batch_size
        claim_root(link, _lazy_root_meta(len(self._members), self._stack_dim, inner, self._device,
                                         connection.backend), "clone")
        assert link.root_raw is not None  # claim_root wrote it
        opened = LazyStackedTensorDictStore._open(link, _schema.decode_meta(link.root_raw), self._device,
                                                  self._prefix, td_id)
        opened._assign_members(self._dense().tensordicts)
        return opened

    def copy(self) -> "LazyStackedTensorDictStore":
        return self.clone(False)

    def clear_redis(self) -> None:
        """Delete the stack's members and metadata from the server (on a nested level: the entries under it)."""
        for member in self._members:
            member.clear_redis()
        if not self._path:
            self._connection.call("DEL", self._link.tree_key)

    def close(self) -> None:
        self._connection.close()

    def __reduce__(self) -> tuple:
        return (_reopen_lazy, (self._connection.settings(), self._prefix, self._td_id, self._path,
                               None if self._device is None else str(self._device)))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(\n    keys={list(self._keys_str())},\n    batch_size={self.batch_size},\n"
                f"    stack_dim={self._stack_dim},\n    device={self._device},\n"
                f"    backend={self._connection.backend!r},\n    td_id={self._td_id!r})")


def _member_links(link: Any, count: int) -> List[Any]:
    from ._client import Link

    return [Link(link.connection, _schema.element_namespace(link.ns, position)) for position in range(count)]


def _member_store(link: Any, inner: torch.Size, device: Optional[torch.device], prefix: str,
                  td_id: str) -> TensorDictStore:
    member = object.__new__(TensorDictStore)
    member._setup(link, (), inner, device, prefix, td_id)
    return member


def _reopen_lazy(settings: Dict[str, Any], prefix: str, td_id: str, path: tuple,
                 device: Optional[str]) -> LazyStackedTensorDictStore:
    from ._client import Link, reopen

    link = Link(reopen(settings), _schema.namespace(prefix, td_id))
    meta = read_root(link, td_id)
    store = LazyStackedTensorDictStore._open(link, meta, as_device(device), prefix, td_id)
    return store.get(path) if path else store
