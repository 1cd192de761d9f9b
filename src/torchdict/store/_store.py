"""``TensorDictStore``: a TensorDict whose entries live on a Redis-protocol server (Redis, Valkey, KeyDB,
Dragonfly), shared by every process and machine that reaches it. See docs/store.md."""
from __future__ import annotations

import contextlib
import time
import uuid
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Sequence, Tuple

import torch

from .._errors import InplaceWriteError, MessageKeyError, locked_error, missing_key_error, through_leaf_error
from .. import _options
from .._keys import key_to_tuple
from .._update import entries_to_update
from ..base import TensorDictBase
from ..nontensor import NonTensorData, NonTensorStack
from . import _schema
from ._schema import JSON_STACK, JSON_VALUE, LAZY_STACK, NODE, TENSOR

STORE_BACKENDS = Literal["redis", "dragonfly"]

_MISSING: Any = object()
_WRITE_ATTEMPTS = 40  # a row write planned on shapes that keep changing gives up after ~1 s of tries

Path = Tuple[str, ...]


def as_device(device: Any) -> Optional[torch.device]:
    if device is None:
        return None
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def as_size(batch_size: Any) -> torch.Size:
    if batch_size is None:
        return torch.Size([])
    if isinstance(batch_size, int):
        return torch.Size([batch_size])
    return torch.Size(batch_size)


def open_connection(*, backend: str, host: str, port: int, db: int, unix_socket_path: Optional[str],
                    client: Any, cache_metadata: bool, redis_kwargs: Dict[str, Any]) -> Any:
    from ._client import Connection  # imports redis: only when a store is made

    return Connection(host=host, port=port, db=db, unix_socket_path=unix_socket_path, backend=backend,
                      cache_metadata=cache_metadata, client=client, redis_kwargs=redis_kwargs)


def claim_root(link: Any, meta: dict, what: str) -> bytes:
    """Write a new store's root metadata; an existing store under the same id must agree with it."""
    raw = _schema.encode_meta(meta)

    def build(pipe: Any) -> None:
        pipe.hsetnx(link.tree_key, _schema.ROOT_FIELD, raw)
        pipe.hget(link.tree_key, _schema.ROOT_FIELD)

    created, current = link.connection.transaction(build)
    if not created:
        held = _schema.decode_meta(current)
        shape_keys = ("kind", "batch_size", "count", "stack_dim", "inner_batch_size")
        if any(held.get(name) != meta.get(name) for name in shape_keys):
            raise ValueError(f"{what}: the server already holds a store with this td_id and another layout "
                             f"({ {name: held.get(name) for name in shape_keys if name in held} }); reconnect to it "
                             "with from_store, or pass a new td_id.")
        raw = current
    link.root_raw = raw
    return raw


def read_root(link: Any, td_id: str) -> dict:
    raw = link.connection.call("HGET", link.tree_key, _schema.ROOT_FIELD)
    meta = _schema.check_root(None if raw is None else _schema.decode_meta(raw), f"with td_id {td_id!r}")
    link.root_raw = raw
    return meta


def missing_entry(store: Any, key: Any, default: Any) -> Any:
    """What ``store.get(key, default)`` gives for a key the store lacks: ``default`` when one was given, else
    None or a KeyError (``set_get_defaults_to_none``), as ``TensorDict.get``."""
    if default is not _MISSING:
        return default
    if _options.GET_DEFAULTS_TO_NONE:
        return None
    raise missing_key_error(key, store.keys())


class TensorDictStore(TensorDictBase):
    """A TensorDict kept on a Redis-protocol server: every process that reaches the server shares it.

    ``store[key]`` reads one entry, ``store[idx]`` only the rows that ``idx`` picks (byte ranges of the
    stored tensors), ``store[idx] = value`` writes only those rows; the rest of the TensorDict API works on
    a local copy. Tensors are kept as raw bytes and their metadata as JSON (no pickle): docs/store.md.

    >>> import torch
    >>> from torchdict.store import TensorDictStore
    >>> store = TensorDictStore(batch_size=[100])  # doctest: +SKIP
    >>> store["obs"] = torch.zeros(100, 84)  # doctest: +SKIP
    >>> store[torch.tensor([3, 7])]["obs"].shape  # doctest: +SKIP
    torch.Size([2, 84])
    """

    def __init__(self, *, backend: STORE_BACKENDS = "redis", host: str = "localhost", port: int = 6379, db: int = 0,
                 unix_socket_path: Optional[str] = None, prefix: str = "tensordict", batch_size: Any = None,
                 device: Any = None, client: Any = None, td_id: Optional[str] = None, cache_metadata: bool = True,
                 **redis_kwargs: Any) -> None:
        from ._client import Link

        td_id = str(uuid.uuid4()) if td_id is None else td_id
        ns = _schema.namespace(prefix, td_id)
        batch, device = as_size(batch_size), as_device(device)
        connection = open_connection(backend=backend, host=host, port=port, db=db, unix_socket_path=unix_socket_path,
                                     client=client, cache_metadata=cache_metadata, redis_kwargs=redis_kwargs)
        link = Link(connection, ns)
        claim_root(link, _schema.root_meta(batch, device, backend), type(self).__name__)
        self._setup(link, (), batch, device, prefix, td_id)

    def _setup(self, link: Any, path: Path, batch: torch.Size, device: Optional[torch.device], prefix: str,
               td_id: str) -> None:
        self._link = link
        self._path = path
        self._batch = batch
        self._device = device
        self._prefix = prefix
        self._td_id = td_id

    def _view(self, path: Path, batch: torch.Size) -> "TensorDictStore":
        """The nested level at ``path``: another handle on the same stored tree."""
        view = object.__new__(TensorDictStore)
        view._setup(self._link, path, batch, self._device, self._prefix, self._td_id)
        return view

    @property
    def _connection(self) -> Any:
        return self._link.connection

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_tensordict(cls, td: TensorDictBase, *, backend: STORE_BACKENDS = "redis", host: str = "localhost",
                        port: int = 6379, db: int = 0, unix_socket_path: Optional[str] = None,
                        prefix: str = "tensordict", device: Any = None, **kwargs: Any) -> Any:
        """A new store holding a copy of ``td`` (a lazy stack gives a :class:`LazyStackedTensorDictStore`)."""
        from ..lazy import LazyStackedTensorDict

        if isinstance(td, LazyStackedTensorDict):
            from ._lazy import LazyStackedTensorDictStore

            return LazyStackedTensorDictStore.from_lazy_stack(
                td, backend=backend, host=host, port=port, db=db, unix_socket_path=unix_socket_path, prefix=prefix,
                device=device, **kwargs)
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"from_tensordict expects a TensorDict, got {type(td).__name__}.")
        store = cls(backend=backend, host=host, port=port, db=db, unix_socket_path=unix_socket_path, prefix=prefix,
                    batch_size=td.batch_size, device=td.device if device is None else device, **kwargs)
        store._assign_from(td if _is_tensordict(td) else td._dense(), False)
        return store

    @classmethod
    def from_dict(cls, input_dict: Any, *, backend: STORE_BACKENDS = "redis", host: str = "localhost",
                  port: int = 6379, db: int = 0, unix_socket_path: Optional[str] = None, prefix: str = "tensordict",
                  auto_batch_size: bool = False, batch_size: Any = None, device: Any = None,
                  batch_dims: Optional[int] = None, names: Optional[Sequence[str]] = None, **kwargs: Any) -> Any:
        """A new store holding the entries of a (nested) dict, with TensorDict.from_dict's batch-size rules."""
        from ..tensordict import TensorDict

        local = TensorDict.from_dict(input_dict, auto_batch_size=auto_batch_size, batch_size=batch_size,
                                     device=device, batch_dims=batch_dims, names=names)
        return cls.from_tensordict(local, backend=backend, host=host, port=port, db=db,
                                   unix_socket_path=unix_socket_path, prefix=prefix, device=device, **kwargs)

    @classmethod
    def from_schema(cls, schema: Dict[Any, Tuple[Sequence[int], torch.dtype]], *, batch_size: Any = None,
                    backend: STORE_BACKENDS = "redis", host: str = "localhost", port: int = 6379, db: int = 0,
                    unix_socket_path: Optional[str] = None, prefix: str = "tensordict", device: Any = None,
                    **kwargs: Any) -> "TensorDictStore":
        """A new store whose entries are zeros of the given ``(feature shape, dtype)``, allocated by the server
        (no bytes go through this process)."""
        store = cls(backend=backend, host=host, port=port, db=db, unix_socket_path=unix_socket_path, prefix=prefix,
                    batch_size=batch_size, device=device, **kwargs)
        from ._io import WritePlan

        plan = WritePlan(store._connection)
        for key, (feature_shape, dtype) in schema.items():
            keys = key_to_tuple(key)
            store._plan_parents(plan, keys, key)
            shape = store._batch + torch.Size(feature_shape)
            _schema.dtype_name(dtype)
            plan.allocate(store._link, keys, shape, dtype)
        plan.commit()
        return store

    @classmethod
    def from_store(cls, *, backend: STORE_BACKENDS = "redis", host: str = "localhost", port: int = 6379, db: int = 0,
                   unix_socket_path: Optional[str] = None, prefix: str = "tensordict", td_id: str,
                   device: Any = None, tensorclass_cls: Any = None, **kwargs: Any) -> Any:
        """Connect to a store that some process wrote, by its ``td_id``; batch size and device are read from
        the server. Raises KeyError when the server holds no store with that id under ``prefix``."""
        from ._client import Link

        if tensorclass_cls is not None:
            raise ValueError("torchdict's TensorDictStore does not wrap stores in tensorclasses: call "
                             "cls.from_tensordict(store.to_tensordict()) on the result instead.")
        client, cache_metadata = kwargs.pop("client", None), kwargs.pop("cache_metadata", True)
        connection = open_connection(backend=backend, host=host, port=port, db=db, unix_socket_path=unix_socket_path,
                                     client=client, cache_metadata=cache_metadata, redis_kwargs=kwargs)
        link = Link(connection, _schema.namespace(prefix, td_id))
        meta = read_root(link, td_id)
        stored_device = as_device(meta.get("device"))
        device = stored_device if device is None else as_device(device)
        if meta["kind"] == LAZY_STACK:
            from ._lazy import LazyStackedTensorDictStore

            return LazyStackedTensorDictStore._open(link, meta, device, prefix, td_id)
        store = object.__new__(TensorDictStore)
        store._setup(link, (), torch.Size(meta["batch_size"]), device, prefix, td_id)
        return store

    # ------------------------------------------------------------------ primitives
    @property
    def batch_size(self) -> torch.Size:
        return self._batch

    @property
    def device(self) -> Optional[torch.device]:
        return self._device

    @property
    def is_locked(self) -> bool:
        return self._link.locked

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        self._link.locked = bool(value)

    def lock_(self) -> "TensorDictStore":
        """Refuse new keys and replacements (in-place writes of existing entries stay allowed); the lock is
        this process's, shared by the handles on the same store."""
        self._link.locked = True
        return self

    def unlock_(self) -> "TensorDictStore":
        self._link.locked = False
        return self

    def _tree(self) -> Dict[str, tuple]:
        return self._link.fetch_tree()

    def _keys_str(self) -> Iterator[str]:
        from ._io import children

        return iter([key for key, _ in children(self._tree(), self._path)])

    def _keys_in(self, plan: Any) -> List[str]:
        """This level's keys in the tree snapshot of a write plan."""
        from ._io import children

        return [key for key, _ in children(plan.tree(self._link), self._path)]

    def _value(self, path: Path, meta: dict, data: Any) -> Any:
        kind = meta["kind"]
        if kind == NODE:
            return self._view(path, torch.Size(meta["batch_size"]))
        if kind == TENSOR:
            tensor = _schema.tensor_from_bytes(data or b"", _schema.DTYPES[meta["dtype"]], meta["shape"])
            return tensor if self._device is None else tensor.to(self._device)
        return _schema.non_tensor_from_meta(meta, self._device)

    def _get_str(self, key: str, default: Any) -> Any:
        return self._read_path((key,), default)

    def _read_path(self, keys: Path, default: Any, through_leaf_default: bool = False) -> Any:
        """The value at ``keys`` below this level: its metadata, and its bytes, in one transaction."""
        full = self._path + keys
        fields = [_schema.field_of(full[:depth]) for depth in range(len(self._path) + 1, len(full) + 1)]
        link = self._link

        def build(pipe: Any) -> None:
            pipe.hmget(link.tree_key, fields)
            pipe.get(link.data_key(fields[-1]))

        raws, data = self._connection.transaction(build)
        for depth, raw in enumerate(raws):
            if raw is None:
                return default
            meta = _schema.decode_meta(raw)
            if depth < len(keys) - 1 and meta["kind"] != NODE:
                if through_leaf_default:
                    return default
                held = torch.empty(0) if meta["kind"] == TENSOR else _schema.non_tensor_from_meta(meta, None)
                raise through_leaf_error(keys[depth], held, keys[depth + 1])
        return self._value(full, meta, data)

    def _set_str(self, key: str, value: Any, inplace: bool) -> None:
        from ._io import WritePlan

        plan = WritePlan(self._connection)
        self._plan_set(plan, (key,), value, inplace, key, converted=True)
        plan.commit()

    def _del_str(self, key: str) -> None:
        from ._io import WritePlan

        plan = WritePlan(self._connection)
        plan.delete(self._link, self._path + (key,))
        plan.commit()

    def _dense(self) -> Any:
        from ._io import assemble, read_trees

        ((tree, values),) = read_trees(self._connection, [(self._link, self._path)])
        return assemble(tree, self._path, values, self._batch, self._device)

    def _dense_is_copy(self) -> bool:
        return True

    def _index(self, index: Any) -> Any:
        from ._io import assemble, read_trees
        from ._ranges import select

        selection = select(self._batch, index)
        ((tree, values),) = read_trees(self._connection, [(self._link, self._path)], selection)
        return assemble(tree, self._path, values, selection.result_shape(self._batch), self._device, selection)

    def _set_at(self, index: Any, value: Any) -> None:
        from ._ranges import select

        write_rows_at(self, select(self._batch, index), value)

    # ------------------------------------------------------------------ dict API on the metadata
    def keys(self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Optional[Callable] = None,
             *, sort: bool = False) -> List[Any]:
        """This store's keys, read from the metadata on the server (no tensor bytes move)."""
        from ._io import children

        tree = self._tree()
        nested_type = TensorDictStore

        def walk(path: Path) -> List[Any]:
            found: List[Any] = []
            for key, meta in children(tree, path):
                full = path + (key,)
                shown = full[len(self._path):]
                shown_key = shown[0] if len(shown) == 1 else shown
                nested = meta["kind"] == NODE and not (is_leaf is not None and is_leaf(nested_type))
                if nested and include_nested:
                    found.extend(walk(full))
                if not nested or not leaves_only:
                    found.append(shown_key)
            return found

        keys = walk(self._path)
        return sorted(keys, key=lambda key: key if isinstance(key, str) else ".".join(key)) if sort else keys

    def values(self, include_nested: bool = False, leaves_only: bool = False,
               is_leaf: Optional[Callable] = None, *, sort: bool = False) -> List[Any]:
        return [value for _, value in self.items(include_nested, leaves_only, is_leaf, sort=sort)]

    def items(self, include_nested: bool = False, leaves_only: bool = False,
              is_leaf: Optional[Callable] = None, *, sort: bool = False) -> List[tuple]:
        """Keys and values: the leaves from one read of the whole store, nested levels as store handles."""
        dense = self._dense()
        result = []
        for key in self.keys(include_nested, leaves_only, is_leaf, sort=sort):
            value = dense.get(key)
            if isinstance(value, TensorDictBase):
                value = self._view(self._path + key_to_tuple(key), value.batch_size)
            result.append((key, value))
        return result

    def __contains__(self, key: Any) -> bool:
        if isinstance(key, list):
            raise TypeError("a list is not a key: use a tuple for a nested key")
        keys = key_to_tuple(key)
        full = self._path + keys
        fields = [_schema.field_of(full[:depth]) for depth in range(len(self._path) + 1, len(full) + 1)]
        raws = self._connection.call("HMGET", self._link.tree_key, *fields)
        for depth, raw in enumerate(raws):
            if raw is None:
                return False
            if depth < len(keys) - 1 and _schema.decode_meta(raw)["kind"] != NODE:
                return False
        return True

    def get(self, key: Any, default: Any = _MISSING) -> Any:
        """The entry at ``key`` (None, or ``default``, when missing, as TensorDict.get); a nested level is a
        store handle, a tensor a local copy."""
        value = self._read_path(key_to_tuple(key), _MISSING, through_leaf_default=default is not _MISSING)
        return value if value is not _MISSING else missing_entry(self, key, default)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str) or (isinstance(index, tuple) and index and all(isinstance(i, str) for i in index)):
            value = self._read_path(key_to_tuple(index), _MISSING)
            if value is _MISSING:
                raise missing_key_error(index, self.keys())
            return value._read() if type(value) in (NonTensorData, NonTensorStack) else value
        return self._index(index)

    def entry_class(self, key: Any) -> type:
        """The class of the value at ``key``, from the metadata (no tensor bytes move)."""
        raw = self._connection.call("HGET", self._link.tree_key, _schema.field_of(self._path + key_to_tuple(key)))
        if raw is None:
            raise missing_key_error(key, self.keys())
        kind = _schema.decode_meta(raw)["kind"]
        return {NODE: TensorDictStore, TENSOR: torch.Tensor, JSON_VALUE: NonTensorData,
                JSON_STACK: NonTensorStack}[kind]

    # ------------------------------------------------------------------ writes
    def _plan_parents(self, plan: Any, keys: Path, shown: Any, must_exist: bool = False) -> torch.Size:
        """Plan the missing levels above ``keys`` (refused through a leaf or under a lock); their batch size."""
        from ..tensordict import TensorDict

        batch = self._batch
        for depth in range(len(keys) - 1):
            path = self._path + keys[:depth + 1]
            meta = plan.meta(self._link, path)
            if meta is None:
                if must_exist:
                    raise missing_key_error(shown, self.keys(include_nested=True))
                if self.is_locked:
                    raise locked_error()
                plan.put_meta(self._link, path, _schema.node_meta(batch, plan.order(self._link, path)))
            elif meta["kind"] != NODE:
                held = torch.empty(0) if meta["kind"] == TENSOR else _schema.non_tensor_from_meta(meta, None)
                raise TensorDict._through_leaf(keys[depth], held, keys)
            else:
                batch = torch.Size(meta["batch_size"])
        return batch

    def _plan_set(self, plan: Any, keys: Path, item: Any, inplace: bool, shown: Any, *, must_exist: bool = False,
                  converted: bool = False) -> None:
        from .._convert import to_leaf

        batch = self._plan_parents(plan, keys, shown, must_exist)
        path = self._path + keys
        existing = plan.meta(self._link, path)
        if existing is None and must_exist:
            raise missing_key_error(shown, self.keys(include_nested=True))
        leaf = item if converted else to_leaf(item, shown, batch, None)
        if (inplace or must_exist) and existing is not None and existing["kind"] == TENSOR \
                and isinstance(leaf, torch.Tensor):
            leaf = _fit_in_place(self, existing, leaf, shown)
        elif (inplace or must_exist) and existing is not None and existing["kind"] == NODE \
                and isinstance(leaf, TensorDictBase):
            self._plan_update(plan, keys, leaf, True, None, must_exist)
            return
        elif self.is_locked:
            raise locked_error()
        plan.put(self._link, path, leaf)

    def _plan_update(self, plan: Any, prefix: Path, source: Any, inplace: bool, keys_to_update: Optional[list],
                     must_exist: bool) -> None:
        if isinstance(source, Mapping):
            entries = list(source.items())
        elif isinstance(source, TensorDictBase):
            dense = source if _is_tensordict(source) else source._dense()
            entries = [(key, dense._get_str(key, None)) for key in dense.keys()]
        else:
            raise TypeError(f"update expects a dict or a TensorDict, got {type(source).__name__}.")
        for key, value in entries:
            keys = prefix + key_to_tuple(key)
            if keys_to_update is not None:
                descend = any(wanted[:len(keys)] == keys for wanted in keys_to_update)
                chosen = any(keys[:len(wanted)] == wanted for wanted in keys_to_update)
                if not (descend or chosen):
                    continue
            else:
                chosen = True
            existing = plan.meta(self._link, self._path + keys)
            nested_value = isinstance(value, Mapping) or (isinstance(value, TensorDictBase)
                                                          and type(value) not in (NonTensorData, NonTensorStack))
            if nested_value and existing is not None and existing["kind"] == NODE:
                self._plan_update(plan, keys, value, inplace, None if chosen else keys_to_update, must_exist)
            elif chosen:
                self._plan_set(plan, keys, value, inplace, keys if len(keys) > 1 else keys[0], must_exist=must_exist)

    def set(self, key: Any, item: Any, inplace: bool = False, **kwargs: Any) -> "TensorDictStore":
        """Write ``item`` at ``key`` (levels created as needed): its metadata and bytes in one transaction."""
        from ._io import WritePlan

        plan = WritePlan(self._connection)
        self._plan_set(plan, key_to_tuple(key), item, inplace, key)
        plan.commit()
        return self

    def set_(self, key: Any, item: Any, *, non_blocking: bool = False) -> "TensorDictStore":
        """Write ``item`` into the existing entry at ``key``, keeping its shape and dtype (synchronously)."""
        from ._io import WritePlan

        plan = WritePlan(self._connection)
        self._plan_set(plan, key_to_tuple(key), item, True, key, must_exist=True)
        plan.commit()
        return self

    def update(self, input_dict_or_td: Any = None, clone: bool = False, inplace: bool = False, *,
               non_blocking: bool = False, keys_to_update: Optional[Sequence[Any]] = None,
               is_leaf: Optional[Callable] = None, update_batch_size: bool = False, ignore_lock: bool = False,
               **kwargs: Any) -> "TensorDictStore":
        """Write every entry of ``input_dict_or_td`` and the keyword entries (nested levels merged) in one
        transaction; every entry is checked first, so a refused update writes nothing.

        ``non_blocking`` and ``is_leaf`` change nothing (the writes are synchronous; nested levels are merged);
        ``update_batch_size=True`` is refused (the batch size is the store's); ``ignore_lock`` writes into a
        locked store.
        """
        from ._io import WritePlan

        if update_batch_size:
            raise RuntimeError("update(update_batch_size=True) can't change the batch size of a TensorDictStore.")
        source = entries_to_update(input_dict_or_td, kwargs)
        wanted = None if keys_to_update is None else [key_to_tuple(key) for key in keys_to_update]
        plan = WritePlan(self._connection)
        with _lock_ignored(self, ignore_lock):
            self._plan_update(plan, (), source, inplace, wanted, False)
        plan.commit()
        return self

    def update_(self, input_dict_or_td: Any = None, clone: bool = False, *, non_blocking: bool = False,
                keys_to_update: Optional[Sequence[Any]] = None, **kwargs: Any) -> "TensorDictStore":
        """Write every entry of ``input_dict_or_td`` and the keyword entries into the existing entries (KeyError
        for a new one; ``non_blocking`` changes nothing: the writes are synchronous)."""
        from ._io import WritePlan

        input_dict_or_td = entries_to_update(input_dict_or_td, kwargs)
        wanted = None if keys_to_update is None else [key_to_tuple(key) for key in keys_to_update]
        plan = WritePlan(self._connection)
        try:
            self._plan_update(plan, (), input_dict_or_td, True, wanted, True)
        except KeyError as error:
            shown = error.args[0] if error.args else ""
            raise MessageKeyError(f"The key {shown} was not found in the dest tensordict.") from None
        plan.commit()
        return self

    def del_(self, key: Any) -> "TensorDictStore":
        from ._io import WritePlan

        if key not in self:
            raise missing_key_error(key, self.keys(include_nested=True))
        if self.is_locked:
            raise locked_error()
        plan = WritePlan(self._connection)
        plan.delete(self._link, self._path + key_to_tuple(key))
        plan.commit()
        return self

    def _assign_from(self, source: Any, inplace: bool) -> None:
        """Make the stored level equal to the TensorDict ``source``, in one transaction."""
        from ._io import WritePlan

        own = list(self._keys_str())
        theirs = list(source.keys())
        if self.is_locked and set(own) != set(theirs):
            raise locked_error()
        plan = WritePlan(self._connection)
        for key in own:
            if key not in theirs:
                plan.delete(self._link, self._path + (key,))
        for key in theirs:
            plan.put(self._link, self._path + (key,), source._get_str(key, None))
        plan.commit()

    # ------------------------------------------------------------------ copies and lifetime
    def to_tensordict(self, *, retain_none: Optional[bool] = None) -> Any:
        """A TensorDict holding a copy of the store's entries (one consistent read)."""
        return self._dense()

    def to_local(self) -> Any:
        """Deprecated upstream name of :meth:`to_tensordict`."""
        warnings.warn(f"{type(self).__name__}.to_local() is deprecated: use to_tensordict() instead.",
                      DeprecationWarning, stacklevel=2)
        return self.to_tensordict()

    def clone(self, recurse: bool = True, **kwargs: Any) -> "TensorDictStore":
        """``recurse=True``: a new store (new ``td_id``, same server and prefix) holding a copy of the entries;
        ``recurse=False``: another handle on the same stored data."""
        if not recurse:
            return self._view(self._path, self._batch)
        from ._client import Link

        td_id = str(uuid.uuid4())
        link = Link(self._connection, _schema.namespace(self._prefix, td_id))
        claim_root(link, _schema.root_meta(self._batch, self._device, self._connection.backend), "clone")
        copy = object.__new__(TensorDictStore)
        copy._setup(link, (), self._batch, self._device, self._prefix, td_id)
        copy._assign_from(self._dense(), False)
        return copy

    def copy(self) -> "TensorDictStore":
        return self.clone(False)

    def clear_redis(self) -> None:
        """Delete this store's entries from the server (on a nested level, the entries under it). The
        connection stays open; :meth:`close` closes it."""
        from ._client import DELETE_SUBTREES

        field = _schema.field_of(self._path)
        connection, link = self._connection, self._link
        if self._path:
            connection.call("EVAL", DELETE_SUBTREES, 1, link.tree_key, link.data_key(""), "",
                            _schema.child_prefix(field))
        else:
            def build(pipe: Any) -> None:
                pipe.eval(DELETE_SUBTREES, 1, link.tree_key, link.data_key(""), field, _schema.child_prefix(field))
                pipe.delete(link.tree_key)

            connection.transaction(build)
        link.forget()

    def close(self) -> None:
        """Close the connection (shared with the handles opened from this one); the data stays on the server."""
        self._connection.close()

    def __reduce__(self) -> tuple:
        # A store travels to other processes as its address and id; the data stays on the server.
        return (_reopen_store, (self._connection.settings(), self._prefix, self._td_id, self._path,
                                list(self._batch), None if self._device is None else str(self._device)))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(\n    keys={list(self._keys_str())},\n    batch_size={self._batch},\n"
                f"    device={self._device},\n    backend={self._connection.backend!r},\n"
                f"    td_id={self._td_id!r})")


def _reopen_store(settings: Dict[str, Any], prefix: str, td_id: str, path: Path, batch: List[int],
                  device: Optional[str]) -> TensorDictStore:
    from ._client import Link, reopen

    link = Link(reopen(settings), _schema.namespace(prefix, td_id))
    store = object.__new__(TensorDictStore)
    store._setup(link, tuple(path), torch.Size(batch), as_device(device), prefix, td_id)
    return store


def _is_tensordict(value: Any) -> bool:
    from ..tensordict import TensorDict

    return isinstance(value, TensorDict)


def _fit_in_place(store: TensorDictStore, meta: dict, value: torch.Tensor, key: Any) -> torch.Tensor:
    """``value`` as the existing entry's shape and dtype (what an in-place copy would write)."""
    shape = torch.Size(meta["shape"])
    if value.shape != shape:
        try:
            value = value.expand(shape)
        except RuntimeError:
            raise InplaceWriteError(
                f"Failed to update {key!r} in {type(store).__name__}: the value of shape {value.shape} does not "
                f"fit the entry of shape {shape}") from None
    return value.to(_schema.DTYPES[meta["dtype"]])


# ---------------------------------------------------------------------- store[index] = value
def write_rows_at(store: TensorDictStore, selection: Any, value: Any) -> None:
    """Write ``value`` into the cells that ``selection`` picks, touching only their bytes.

    Every entry is converted and checked before anything is sent; the server writes all of them or none
    (a script that first checks each entry's metadata is the one planned with, so a concurrent change of
    shape is retried on the new metadata instead of overwriting it).
    """
    from ._io import WritePlan, write_rows

    link = store._link
    created = False
    for attempt in range(_WRITE_ATTEMPTS):
        if attempt > 1:  # another process keeps reshaping these entries: let its writes through
            time.sleep(min(0.001 * attempt, 0.05))
        tree = link.planning_tree() if attempt == 0 else link.fetch_tree()
        entries, missing = _row_entries(store, tree, selection, value)
        if missing:
            if created or store.is_locked:
                raise locked_error() if store.is_locked else RuntimeError(
                    "TensorDictStore: entries created for this write vanished before it ran.")
            plan = WritePlan(store._connection)
            for keys, shape, dtype in missing:
                store._plan_parents(plan, keys, keys)
                plan.allocate(link, store._path + keys, shape, dtype)
            plan.commit()
            created = True
            link.forget()
            continue
        if not entries or write_rows(store._connection, link, entries) == 0:
            return
        link.forget()
    raise RuntimeError(f"TensorDictStore: the entries kept changing shape during a row write ({_WRITE_ATTEMPTS} "
                       "tries); another process is rewriting them.")


def _value_leaves(store: TensorDictStore, value: Any, slot_batch: torch.Size) -> Optional[List[tuple]]:
    """``(key path, leaf)`` of a TensorDict-like value; None for a value written into every tensor."""
    from ..tensordict import TensorDict

    if isinstance(value, Mapping):
        value = TensorDict(value, batch_size=slot_batch)
    if isinstance(value, TensorDictBase) and type(value) not in (NonTensorData, NonTensorStack):
        if value.batch_size != slot_batch:
            raise RuntimeError(f"td[index] = value: the value has batch size {value.batch_size}, which does not "
                               f"match the indexed batch size {slot_batch}.")
        dense = value if _is_tensordict(value) else value._dense()
        return list(_leaves(dense, ()))
    return None


def _leaves(td: Any, prefix: Path) -> Any:
    """``(key path, leaf)`` of every tensor and non-tensor entry of ``td``."""
    for key in td.keys():
        value = td._get_str(key, None)
        if isinstance(value, TensorDictBase) and type(value) not in (NonTensorData, NonTensorStack):
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _row_entries(store: TensorDictStore, tree: Dict[str, tuple], selection: Any, value: Any) -> tuple:
    """The script entries of a row write, and the ``(keys, shape, dtype)`` of entries to create first."""
    from ._io import below

    slot_batch = selection.result_shape(store._batch)
    leaves = _value_leaves(store, value, slot_batch)
    if leaves is None:
        broadcast = value if isinstance(value, (NonTensorData, NonTensorStack)) else torch.as_tensor(value)
        leaves = [(entry_path[len(store._path):], broadcast) for entry_path, meta in below(tree, store._path)
                  if meta["kind"] == TENSOR]
    entries, missing = [], []
    for keys, leaf in leaves:
        field = _schema.field_of(store._path + keys)
        held = tree.get(field)
        shown = keys[0] if len(keys) == 1 else keys
        if held is None:
            if not isinstance(leaf, torch.Tensor):
                raise KeyError(f"td[index] = value: {shown!r} is not in the store; set the whole entry first to "
                               "write a non-tensor value.")
            feature = leaf.shape[len(slot_batch):]
            missing.append((keys, store._batch + feature, leaf.dtype))
            continue
        raw, meta = held
        if meta["kind"] == TENSOR:
            entries.append((field, raw, b"", _tensor_ranges(selection, meta, leaf, shown)))
        elif meta["kind"] in (JSON_VALUE, JSON_STACK):
            new = _non_tensor_cells(selection, meta, leaf, shown)
            if new is not None:
                entries.append((field, raw, _schema.encode_meta(new), []))
        else:
            raise RuntimeError(f"td[index] = value: {shown!r} is a nested level of the store, not a leaf.")
    return entries, missing


def _tensor_ranges(selection: Any, meta: dict, leaf: Any, shown: Any) -> list:
    shape = torch.Size(meta["shape"])
    slot = selection.result_shape(shape)
    if not isinstance(leaf, torch.Tensor):
        raise TypeError(f"td[index] = value: the value at {shown!r} is a {type(leaf).__name__}; the entry holds "
                        "tensors.")
    dtype = _schema.DTYPES[meta["dtype"]]
    try:
        cells = leaf.to(dtype).expand(slot)
    except RuntimeError:
        raise RuntimeError(f"td[index] = value: the value at key {shown!r} has shape {leaf.shape}, which does not fit "
                           f"the indexed slot of shape {slot} (the entry has shape {shape}).") from None
    return selection.write_ranges(shape, dtype.itemsize, _schema.tensor_bytes(cells))


def _non_tensor_cells(selection: Any, meta: dict, leaf: Any, shown: Any) -> Optional[dict]:
    """The new metadata of a non-tensor entry with ``leaf`` written into the picked cells (None: unchanged)."""
    if isinstance(leaf, torch.Tensor):
        raise TypeError(f"td[index] = value: the entry at {shown!r} holds non-tensor data, not tensors.")
    batch = torch.Size(meta["batch_size"])
    cell = selection.cell_elements(batch)
    if type(leaf) is NonTensorData:
        written = [_schema.json_text(leaf._read(), shown)] * (selection.count * cell)
        if meta["kind"] == JSON_VALUE and (not written or meta["value"] == written[0]):
            return None
    elif type(leaf) is NonTensorStack:
        written = [_schema.json_text(item, shown) for item in leaf._flat_values()]
    else:
        written = [_schema.json_text(leaf, shown)] * (selection.count * cell)
    if len(written) != selection.count * cell:
        raise RuntimeError(f"td[index] = value: {len(written)} non-tensor values for {selection.count * cell} "
                           f"positions at {shown!r}.")
    values = list(meta["values"]) if meta["kind"] == JSON_STACK else [meta["value"]] * batch.numel()
    for slot, position in enumerate(selection.positions()):
        values[position * cell:(position + 1) * cell] = written[slot * cell:(slot + 1) * cell]
    return {"kind": JSON_STACK, "batch_size": list(batch), "values": values, "n": meta.get("n", 0)}


@contextlib.contextmanager
def _lock_ignored(store: TensorDictStore, ignore: bool) -> Iterator[None]:
    """``update(ignore_lock=True)``: the store's lock lifted for the planning of one update (this process only)."""
    if not ignore or not store.is_locked:
        yield
        return
    store.is_locked = False
    try:
        yield
    finally:
        store.is_locked = True

