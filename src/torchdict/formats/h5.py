"""``PersistentTensorDict``: a collection whose entries live in an HDF5 file (or a zarr store).

Upstream's ``tensordict.PersistentTensorDict``, over the ``TensorDictBase`` primitives (``base.py``):

- nothing is read on open but the file's structure; an entry is read when it is asked for, and every read
  gives a new tensor (changing it in place does not reach the file);
- ``td[index]`` reads only the selected rows of each dataset (``formats/_rows.py``) and returns an
  in-memory ``TensorDict``; ``td[index] = value`` writes only those rows;
- writes go through to the file: ``td["a"] = x`` writes into the existing dataset when the shapes agree
  (keeping its dtype) and replaces it otherwise; ``set`` replaces; in-place ops (``add_``, ``update_``,
  ``zero_``...) write every dataset they change in place;
- a nested group is a nested ``PersistentTensorDict`` with its own batch size (HDF5 files store none:
  without ``batch_size`` each group gets the largest batch its entries share, as upstream);
- every other member of the TensorDict API works on an in-memory copy (``to_tensordict()``) and returns
  an in-memory result, or writes the difference back.

The storage library is reached through a backend (``formats/_h5_backend.py``, ``formats/_zarr_backend.py``),
imported when a file is opened; a missing library raises an ImportError naming the extra to install.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch

from .._base import TensorCollection
from .._convert import parse_device, to_leaf
from .._errors import MessageKeyError, locked_error, missing_key_error, through_leaf_error
from .._keys import key_to_tuple
from .._update import entries_to_update
from ..base import TensorDictBase
from ..nontensor import NonTensorData, NonTensorStack
from ._h5_copies import PersistentCopiesMixin
from ._h5_rows import _NON_TENSOR, PersistentRowsMixin, _as_collection
from ._storage import DATA, GROUP, STACK, TENSOR, check_storable, make_backend, numpy_of

__all__ = ["PersistentTensorDict", "from_h5", "to_h5"]

_MISSING: Any = object()


def _nest(flat: list, shape: Sequence[int]) -> Any:
    if not shape:
        return flat[0]
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _flatten(values: Any, ndim: int) -> list:
    if ndim == 0:
        return [values]
    return [item for value in values for item in _flatten(value, ndim - 1)]


def _common_prefix(shapes: Sequence[Sequence[int]], limit: Optional[int]) -> torch.Size:
    common: list = []
    if shapes:
        for dims in zip(*shapes):
            if any(dim != dims[0] for dim in dims) or (limit is not None and len(common) >= limit):
                break
            common.append(dims[0])
    return torch.Size(common)


class PersistentTensorDict(PersistentRowsMixin, PersistentCopiesMixin, TensorDictBase):
    """A collection kept in an HDF5 file (``backend="h5"``, needs h5py) or a zarr store (``backend="zarr"``).

    Open one with :func:`from_h5` / :func:`~torchdict.formats.zarr.from_zarr` (or ``TensorDict.from_h5``),
    write one with ``td.to_h5(path)`` / :meth:`from_dict`, or build one over a path or an open group::

        PersistentTensorDict(filename=path, batch_size=[3], mode="w")

    Keyword arguments as upstream: ``batch_size``, ``filename`` or ``group`` (exactly one), ``mode``
    (h5py's: ``"r"``, ``"r+"``, ``"w"``, ``"w-"``/``"x"``, ``"a"``), ``backend``, ``device`` (entries are
    read onto it), ``validate_batch_size``, ``non_tensor_as_stack`` (a non-tensor dataset another tool wrote
    reads as one value per row when its leading dims are the batch), ``allow_pickle`` (zarr only: pickled
    non-tensor values are refused unless it is True), and dataset options (``compression="gzip"``,
    ``chunks=...``) passed to the library when a dataset is created.

    ``with`` closes the file at the end of the block (``with td.lock_():`` / ``td.unlock_()`` blocks restore
    the lock instead, as on a TensorDict).

    >>> import os, tempfile, torch
    >>> from torchdict import TensorDict
    >>> path = os.path.join(tempfile.mkdtemp(), "data.h5")
    >>> with TensorDict(obs=torch.arange(6).view(3, 2), batch_size=[3]).to_h5(path) as td:
    ...     td[1:]["obs"].tolist()
    [[2, 3], [4, 5]]
    """

    LOCKING = None  # h5py's file locking, for every file this class opens (upstream's class attribute)

    def __init__(self, *, batch_size: Any = None, filename: Any = None, group: Any = None, mode: str = "r",
                 backend: str = "h5", device: Any = None, validate_batch_size: bool = True,
                 non_tensor_as_stack: bool = False, allow_pickle: Optional[bool] = None, **kwargs: Any) -> None:
        if allow_pickle is not None and not isinstance(allow_pickle, bool):
            raise TypeError("allow_pickle must be a bool or None.")
        if (filename is None) == (group is None):
            raise RuntimeError("Either group or filename must be provided, and not both. "
                               f"Got group={group} and filename={filename}.")
        storage = make_backend(backend, "PersistentTensorDict", type(self).LOCKING)
        storage.allow_pickle = allow_pickle
        self._storage = storage
        self._group = storage.open(filename, mode) if filename is not None else group
        self.backend = backend
        self.filename = filename
        self.mode = mode
        self._batch_size = torch.Size(() if batch_size is None else batch_size)
        self._device = parse_device(device)
        self._names: Optional[list] = None
        self._locked = False
        self._children: dict = {}
        self._nodes: dict = {}  # the nodes opened so far, see the backend's child()
        self._non_tensor_as_stack = non_tensor_as_stack
        self._options = kwargs
        self._exit_actions: list = []
        self._pending_exit: Any = _MISSING
        if validate_batch_size:
            self._check_batch_size(self._batch_size)

    @classmethod
    def _over(cls, storage: Any, group: Any, batch_size: torch.Size, device: Optional[torch.device],
              non_tensor_as_stack: bool, options: dict, filename: Any = None, mode: str = "r") -> "PersistentTensorDict":
        """A tensordict over the open ``group`` with a backend already made (no checks)."""
        self = cls.__new__(cls)
        self._storage = storage
        self._group = group
        self.backend = storage.name
        self.filename = filename
        self.mode = mode
        self._batch_size = torch.Size(batch_size)
        self._device = device
        self._names = None
        self._locked = False
        self._children = {}
        self._nodes = {}  # the nodes opened so far, see the backend's child()
        self._non_tensor_as_stack = non_tensor_as_stack
        self._options = options
        self._exit_actions = []
        self._pending_exit = _MISSING
        return self

    # ------------------------------------------------------------------ the file
    @property
    def file(self) -> Any:
        """The open h5py group / file (or zarr group) this tensordict reads and writes."""
        return self._group

    def close(self) -> None:
        """Close the file. Reads then raise a KeyError and writes an error, as upstream."""
        self._storage.close(self._group)
        self._forget_nodes()

    def _forget_nodes(self) -> None:
        self._nodes.clear()
        for child in self._children.values():
            child._forget_nodes()

    def __enter__(self) -> "PersistentTensorDict":
        pending = self._pending_exit
        self._pending_exit = _MISSING
        self._exit_actions.append(pending)
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        action = self._exit_actions.pop() if self._exit_actions else _MISSING
        if action is _MISSING:
            self.close()
        elif action is not None:
            action()

    def _check_writable(self) -> None:
        self._storage.check_writable(self._group)

    def _check_open(self, key: Any) -> None:
        if not self._storage.is_open(self._group):
            raise MessageKeyError(f"key {key!r} not found in PersistentTensorDict: the file is closed.")

    # ------------------------------------------------------------------ nodes
    def _node(self, key: str) -> Any:
        self._check_open(key)
        if "/" in key or key in ("", ".", ".."):
            return None  # a path, not an entry name: never one of this level's entries
        return self._storage.child(self._group, key, self._nodes)

    def _kind(self, node: Any) -> str:
        return self._storage.kind(node)

    def _child(self, key: str, node: Any, check: bool = True) -> "PersistentTensorDict":
        """The nested tensordict over the group ``node`` (made once, then kept with its batch size).

        ``check=False`` skips reading the shapes of the group's datasets to check the batch size: for a
        group just created (empty), or just written from a collection with that batch size.
        """
        child = self._children.get(key)
        if child is not None:
            return child  # every replacement or deletion through this tensordict drops it first
        storage = self._storage
        metadata = storage.group_metadata(node)
        stored = metadata.get("batch_size") if metadata else None
        batch = torch.Size(stored) if stored is not None and torch.Size(stored)[:self.batch_dims] == \
            self._batch_size else self._batch_size
        child = PersistentTensorDict._over(storage, node, batch, self._device, self._non_tensor_as_stack,
                                           self._options)
        if stored is None and check:
            child._check_batch_size(batch)
        names = metadata.get("names") if metadata else None
        if names and len(names) == len(batch):
            child._names = list(names)
        elif self._names is not None:
            child._names = list(self._names) + [None] * (len(batch) - self.batch_dims)
        child._locked = self._locked
        self._children[key] = child
        return child

    def _entry_shape(self, key: str, node: Any) -> Optional[torch.Size]:
        """The shape an entry counts with for batch sizes (None: a value shared by the batch)."""
        kind = self._kind(node)
        if kind == TENSOR:
            return torch.Size(self._storage.shape(node))
        if kind == STACK:
            return self._storage.stack_shape(node)
        if kind == GROUP:
            return self._child(key, node).batch_size
        return None

    def _check_batch_size(self, batch_size: torch.Size) -> None:
        """Raise a ValueError (upstream's) when a dataset's shape doesn't start with ``batch_size``."""
        if not batch_size:
            return
        for _, node in self._tensor_nodes():
            shape = tuple(self._storage.shape(node))
            if torch.Size(shape[:len(batch_size)]) != batch_size:
                raise ValueError(
                    f"batch size and array size mismatch: array.shape={shape}, batch_size={batch_size}.")

    def _tensor_nodes(self, prefix: tuple = ()) -> Iterator[tuple]:
        """(key, node) of every tensor dataset, nested ones included (metadata only)."""
        storage = self._storage
        stack = [(prefix, self._group)]
        while stack:
            path, group = stack.pop()
            for name in storage.members(group):
                node = storage.child(group, name)
                kind = storage.kind(node)
                if kind == TENSOR:
                    yield path + (name,), node
                elif kind == GROUP:
                    stack.append((path + (name,), node))

    # ------------------------------------------------------------------ primitives
    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        new = torch.Size(value)
        try:
            self._check_batch_size(new)
        except ValueError as err:
            raise RuntimeError(str(err)) from err
        self._batch_size = new
        if self._names is not None:
            self._names = None if len(self._names) != len(new) else self._names
        for child in self._children.values():
            if child._batch_size[:len(new)] != new:
                child.batch_size = new

    @property
    def device(self) -> Optional[torch.device]:
        return self._device

    @property
    def names(self) -> list:
        return list(self._names) if self._names is not None else [None] * self.batch_dims

    @names.setter
    def names(self, value: Any) -> None:
        if value is None:
            self._names = None
        else:
            value = list(value)
            if len(value) != self.batch_dims:
                raise ValueError(f"the number of names ({len(value)}) must match the number of batch dims "
                                 f"({self.batch_dims}).")
            if len(set(name for name in value if name is not None)) != len([n for n in value if n is not None]):
                raise ValueError(f"Some dimension names are non-unique: {value}.")
            self._names = value if any(name is not None for name in value) else None
        for child in self._children.values():
            extra = child.names[self.batch_dims:]
            child._names = None if self._names is None and not any(extra) else self.names + extra

    def _has_names(self) -> bool:
        return self._names is not None

    @property
    def is_locked(self) -> bool:
        return self._locked

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        self._set_locked(bool(value))

    def _set_locked(self, value: bool) -> None:
        self._locked = value
        for child in self._children.values():
            child._set_locked(value)

    def lock_(self) -> "PersistentTensorDict":
        """Refuse new keys and deletions (writes into existing datasets stay allowed), recursively."""
        was = self._locked
        self._set_locked(True)
        self._pending_exit = None if was else (lambda: self._set_locked(False))
        return self

    def unlock_(self) -> "PersistentTensorDict":
        was = self._locked
        self._set_locked(False)
        self._pending_exit = (lambda: self._set_locked(True)) if was else None
        return self

    def _keys_str(self) -> Iterator[str]:
        self._check_open("")
        return iter(self._storage.members(self._group))

    def _get_str(self, key: str, default: Any) -> Any:
        node = self._node(key)
        if node is None:
            return default
        return self._read_node(key, node)

    def _read_node(self, key: str, node: Any) -> Any:
        storage = self._storage
        kind = self._kind(node)
        if kind == TENSOR:
            return self._to_device(torch.as_tensor(storage.read_all(node)))
        if kind == GROUP:
            return self._child(key, node)
        if kind == STACK:
            shape = storage.stack_shape(node)
            values = _flatten(storage.read_stack(node), len(shape))
            return NonTensorStack._from_flat(values, shape, self._device)
        rows = self._rows_of(node)
        if rows is not None:
            values = _flatten(storage.read_rows(node), len(rows))
            return NonTensorStack._from_flat(values, rows, self._device)
        return NonTensorData(storage.read_value(node), batch_size=self._batch_size, device=self._device)

    def _rows_of(self, node: Any) -> Optional[torch.Size]:
        """With ``non_tensor_as_stack``: the batch an unmarked non-tensor dataset has one element per row of."""
        if not self._non_tensor_as_stack or not self._batch_size or not self._storage.holds_rows(node):
            return None
        shape = tuple(self._storage.shape(node))
        return self._batch_size if torch.Size(shape[:self.batch_dims]) == self._batch_size else None

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self._device is None else tensor.to(self._device)

    def _set_str(self, key: str, value: Any, inplace: bool) -> None:
        self._write_entry(key, value, inplace, check=True)

    def _write_entry(self, key: str, value: Any, inplace: bool, check: bool, fresh: bool = False) -> None:
        """Write one entry at this level (``check``: refuse an unstorable nested leaf before any write;
        ``fresh``: this level was just created, nothing is there to replace or write into)."""
        self._check_writable()
        storage = self._storage
        node = None if fresh else self._node(key)
        what = f"{type(self).__name__}"
        if isinstance(value, torch.Tensor):
            if inplace and node is not None and self._kind(node) == TENSOR and \
                    tuple(storage.shape(node)) == tuple(value.shape):
                array = numpy_of(value.to(storage.dtype(node)), what, key, storage.format_name)
                storage.write_all(node, array)
                return
            array = numpy_of(value, what, key, storage.format_name)
            self._replace(key, node)
            storage.create_tensor(self._group, key, array, self._options)
        elif type(value) is NonTensorData:
            encoded = storage.check_value(value.data, key, what)
            self._replace(key, node)
            storage.create_value(self._group, key, encoded)
        elif type(value) is NonTensorStack:
            encoded = storage.check_stack(value.tolist(), value.batch_size, key, what)
            self._replace(key, node)
            storage.create_stack(self._group, key, encoded, value.batch_size)
        elif isinstance(value, TensorCollection):
            source = _as_collection(value)
            if isinstance(source, PersistentTensorDict) and node is not None and source._group == node:
                return  # the entry set to itself (replacing it first would delete what is to be written)
            if check:
                _check_tree(storage, source, what, key)
            if node is not None and self._kind(node) == GROUP and inplace:
                self._child(key, node)._write_tree(source)
                return
            self._replace(key, node)
            group = storage.create_group(self._group, key, _group_metadata(source))
            child = self._child(key, group, check=False)
            child._batch_size = source.batch_size
            child._write_tree(source, fresh=True)
        else:
            raise TypeError(f"Cannot set values of type {type(value).__name__} in a PersistentTensorDict.")

    def _replace(self, key: str, node: Any) -> None:
        if node is not None:
            self._storage.delete(self._group, key)
            self._children.pop(key, None)
            self._nodes.pop(key, None)

    def _del_str(self, key: str) -> None:
        self._check_writable()
        self._storage.delete(self._group, key)
        self._children.pop(key, None)
        self._nodes.pop(key, None)

    def _write_tree(self, source: Any, fresh: bool = False) -> None:
        """Write every entry of the collection ``source`` here, leaf by leaf (``source`` already checked;
        ``fresh``: this level is empty, just created)."""
        for key in source.keys():
            value = source.get(key)
            value = _as_collection(value)
            self._write_entry(key, value, isinstance(value, TensorDictBase), check=False, fresh=fresh)
        self._storage.write_group_metadata(self._group, _group_metadata(source, self._batch_size))

    # ------------------------------------------------------------------ the dict API without reading data
    def keys(self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Optional[Callable] = None,
             *, sort: bool = False) -> List[Any]:
        """The keys, read from the file's structure (no dataset is read); nested groups before their entries."""
        keys = list(self._walk_keys((), include_nested, leaves_only, is_leaf))
        return sorted(keys, key=lambda key: key if isinstance(key, str) else ".".join(key)) if sort else keys

    def _walk_keys(self, prefix: tuple, include_nested: bool, leaves_only: bool,
                   is_leaf: Optional[Callable]) -> Iterator[Any]:
        for key in self._keys_str():
            node = self._node(key)
            kind = self._kind(node)
            full = prefix + (key,) if prefix else key
            cls = self._entry_class(key, node, kind)
            leaf = is_leaf(cls) if is_leaf is not None else cls is torch.Tensor
            if not leaves_only or leaf:
                yield full
            if kind == GROUP and include_nested and not leaf:
                yield from self._child(key, node)._walk_keys(key_to_tuple(full), include_nested, leaves_only,
                                                             is_leaf)

    def _entry_class(self, key: str, node: Any, kind: str) -> type:
        if kind == TENSOR:
            return torch.Tensor
        if kind == GROUP:
            return PersistentTensorDict
        if kind == STACK or self._rows_of(node) is not None:
            return NonTensorStack
        return NonTensorData

    def entry_class(self, key: Any) -> type:
        """The class of the entry at ``key``, from the file's structure (nothing is read)."""
        parent, node = self._locate(key_to_tuple(key))
        return parent._entry_class(key_to_tuple(key)[-1], node, parent._kind(node))

    def _locate(self, keys: tuple) -> tuple:
        """(the tensordict holding the last part of ``keys``, its node); KeyError when missing."""
        node: Any = self
        for position, key in enumerate(keys[:-1]):
            child = node._node(key)
            if child is None:
                raise missing_key_error(keys, self.keys(include_nested=True))
            if node._kind(child) != GROUP:
                raise through_leaf_error(key, node._read_node(key, child), keys[position + 1])
            node = node._child(key, child)
        leaf = node._node(keys[-1])
        if leaf is None:
            raise missing_key_error(keys if len(keys) > 1 else keys[0], self.keys(include_nested=True))
        return node, leaf

    def __contains__(self, key: Any) -> bool:
        if isinstance(key, list):
            raise TypeError("a list is not a key: use a tuple for a nested key")
        keys = key_to_tuple(key)
        node: Any = self
        for key_part in keys[:-1]:
            child = node._node(key_part)
            if child is None or node._kind(child) != GROUP:
                return False
            node = node._child(key_part, child)
        return node._node(keys[-1]) is not None

    def get_item_shape(self, key: Any) -> torch.Size:
        """The shape of the entry at ``key`` (a nested tensordict's batch size), from the metadata."""
        parent, node = self._locate(key_to_tuple(key))
        shape = parent._entry_shape(key_to_tuple(key)[-1], node)
        return shape if shape is not None else parent.batch_size

    def is_empty(self) -> bool:
        return not any(True for _ in self._tensor_nodes())

    def __iter__(self) -> Iterator[Any]:
        # row by row, each read when reached (the base would read the whole file first)
        for index in range(self.batch_size[0] if self.batch_size else 0):
            yield self[index]

    # ------------------------------------------------------------------ writes
    def _parent_for_write(self, keys: tuple) -> "PersistentTensorDict":
        """The tensordict that holds the last part of ``keys``, its missing groups created."""
        node: Any = self
        for position, key in enumerate(keys[:-1]):
            child = node._node(key)
            if child is None:
                if node._locked:
                    raise locked_error()
                node._check_writable()
                group = node._storage.create_group(node._group, key, _group_metadata(None, node._batch_size))
                child_td = node._child(key, group)
            elif node._kind(child) != GROUP:
                raise through_leaf_error(key, node._read_node(key, child), keys[position + 1])
            else:
                child_td = node._child(key, child)
            node = child_td
        return node

    def set(self, key: Any, item: Any, inplace: bool = False, *, non_blocking: bool = False,
            **kwargs: Any) -> "PersistentTensorDict":
        """Write ``item`` at ``key``: a new dataset (an existing one is replaced), or, with ``inplace=True``,
        into the existing dataset when the shapes agree (``non_blocking``: file writes are synchronous)."""
        keys = key_to_tuple(key)
        parent = self._parent_for_write(keys)
        name = keys[-1]
        node = parent._node(name)
        if parent._locked and (node is None or not inplace):
            raise locked_error()
        leaf = to_leaf(item, name, parent.batch_size, parent.device)
        write_in_place = bool(inplace) and node is not None and (
            (parent._kind(node) == TENSOR and isinstance(leaf, torch.Tensor)
             and tuple(parent._storage.shape(node)) == tuple(leaf.shape))
            or (parent._kind(node) == GROUP and isinstance(leaf, TensorCollection)))
        parent._set_str(name, leaf, write_in_place)
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, str) or (isinstance(index, tuple) and index and all(isinstance(i, str) for i in index)):
            # as upstream: into the existing dataset when it can take the value (its dtype is kept)
            self.set(index, value, inplace=True)
        else:
            self._set_at(index, value)

    def set_(self, key: Any, item: Any, *, non_blocking: bool = False) -> "PersistentTensorDict":
        """Write ``item`` into the existing entry at ``key`` (the dataset keeps its dtype)."""
        keys = key_to_tuple(key)
        parent, node = self._locate(keys)
        kind = parent._kind(node)
        if kind == TENSOR:
            parent._check_writable()
            shape = torch.Size(parent._storage.shape(node))
            value = item if isinstance(item, torch.Tensor) else torch.as_tensor(item)
            value = value.to(parent._storage.dtype(node)).expand(shape)
            parent._storage.write_all(node, numpy_of(value, "set_", keys, parent._storage.format_name))
        elif kind == GROUP:
            parent._child(keys[-1], node).update_(item)
        else:
            parent._set_str(keys[-1], to_leaf(item, keys[-1], parent.batch_size, parent.device), False)
        return self

    def update(self, input_dict_or_td: Any = None, clone: bool = False, inplace: bool = False, *,
               non_blocking: bool = False, keys_to_update: Optional[Sequence[Any]] = None,
               is_leaf: Optional[Callable] = None, update_batch_size: bool = False, ignore_lock: bool = False,
               **kwargs: Any) -> "PersistentTensorDict":
        """Write every entry of ``input_dict_or_td`` (checked first, so a refused entry writes nothing).

        As upstream's file-backed collection: sub-collections are merged whatever ``is_leaf`` says, the
        batch size stays (``update_batch_size``), a lock is kept (``ignore_lock``), and file writes are
        synchronous (``non_blocking``). Entries may also come as keywords."""
        source = self._as_source(entries_to_update(input_dict_or_td, kwargs), keys_to_update)
        self._check_writable()
        _check_tree(self._storage, source, "update", ())
        if self._locked and any(key not in self for key in source.keys(True)):
            raise locked_error()
        self._update_from(source, inplace)
        return self

    def _as_source(self, value: Any, keys_to_update: Optional[Sequence[Any]]) -> Any:
        from ..tensordict import TensorDict

        value = _as_collection(value)
        if not isinstance(value, TensorDictBase):
            value = TensorDict(value, batch_size=self.batch_size)
        elif value.batch_size[:self.batch_dims] != self.batch_size:
            value = TensorDict({key: value.get(key) for key in value.keys()}, batch_size=self.batch_size)
        if keys_to_update is not None:
            value = value.select(*keys_to_update, strict=False)
        return value

    def _update_from(self, source: Any, inplace: bool) -> None:
        for key in source.keys():
            value = source.get(key)
            value = _as_collection(value)
            node = self._node(key)
            if node is not None and isinstance(value, TensorDictBase) and self._kind(node) == GROUP:
                self._child(key, node)._update_from(value, inplace)
            else:
                self.set(key, value, inplace=inplace)

    def update_(self, input_dict_or_td: Any = None, clone: bool = False, *, non_blocking: bool = False,
                keys_to_update: Optional[Sequence[Any]] = None, **kwargs: Any) -> "PersistentTensorDict":
        """Write every entry of ``input_dict_or_td`` (and the keyword entries) into the existing datasets
        (every key must exist)."""
        source = self._as_source(entries_to_update(input_dict_or_td, kwargs), keys_to_update)
        missing = [key for key in source.keys(True, True) if key not in self]
        if missing:
            raise missing_key_error(missing[0], self.keys(include_nested=True))
        self._check_writable()
        for key in source.keys(True, True):
            self.set_(key, source.get(key))
        return self

    # ------------------------------------------------------------------ whole-collection reads
    def _dense(self) -> Any:
        from ..tensordict import TensorDict

        entries = {}
        for key in self._keys_str():
            value = self._read_node(key, self._node(key))
            entries[key] = value._dense() if isinstance(value, PersistentTensorDict) else value
        out = TensorDict(entries, batch_size=self.batch_size, device=self._device)
        if self._names is not None:
            out.names = self._names
        return out

    def _dense_is_copy(self) -> bool:
        return True

    def to_tensordict(self, *, retain_none: Optional[bool] = None) -> Any:
        """Every entry read into memory, as a ``TensorDict``."""
        return self._dense()

    def _assign_from(self, source: Any, inplace: bool) -> None:
        # As the base's, without reading the current values: the file's structure says what to write.
        own = list(self._keys_str())
        theirs = list(source.keys())
        if self._locked and set(own) != set(theirs):
            raise locked_error()
        if set(own) != set(theirs) or not inplace:
            self._check_writable()
        for key in own:
            if key not in theirs:
                self._del_str(key)
        for key in theirs:
            value = source._get_str(key, None) if isinstance(source, TensorDictBase) else source.get(key)
            node = self._node(key)
            kind = self._kind(node) if node is not None else None
            if kind == GROUP and isinstance(value, TensorDictBase):
                self._child(key, node)._assign_from(value, inplace)
            elif inplace and kind == TENSOR and isinstance(value, torch.Tensor) and \
                    tuple(self._storage.shape(node)) == tuple(value.shape) and self._storage.dtype(node) == value.dtype:
                self._set_str(key, value, True)
            elif kind in (DATA, STACK) and isinstance(value, _NON_TENSOR) and _same_non_tensor(
                    self._read_node(key, node), value):
                continue
            else:
                self._set_str(key, value, False)

    def empty(self, recurse: bool = False, *, batch_size: Any = None, device: Any = _MISSING,
              names: Any = None) -> Any:
        """An in-memory ``TensorDict`` with no leaves (the nested groups too with ``recurse``); reads nothing."""
        from ..tensordict import TensorDict

        out = TensorDict({}, batch_size=self.batch_size if batch_size is None else batch_size,
                         device=self._device if device is _MISSING else device)
        if recurse:
            for key in self._keys_str():
                node = self._node(key)
                if self._kind(node) == GROUP:
                    out.set(key, self._child(key, node).empty(True, batch_size=batch_size,
                                                             device=out.device))
        return out

    def auto_batch_size_(self, batch_dims: Optional[int] = None,
                         keep_compliant_size: bool = False) -> "PersistentTensorDict":
        """Each level's batch size becomes the leading dims its entries share (at most ``batch_dims``)."""
        for key in self._keys_str():
            node = self._node(key)
            if self._kind(node) == GROUP:
                self._child(key, node).auto_batch_size_(batch_dims)
        shapes = [shape for key in self._keys_str()
                  if (shape := self._entry_shape(key, self._node(key))) is not None]
        self._batch_size = _common_prefix(shapes, batch_dims)
        self._names = None
        return self

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_dict(cls, input_dict: Any, filename: Any, *, auto_batch_size: bool = False, batch_size: Any = None,
                  device: Any = None, backend: str = "h5", batch_dims: Optional[int] = None,
                  allow_pickle: Optional[bool] = None, **kwargs: Any) -> "PersistentTensorDict":
        """Write a dict or a collection to a new file at ``filename`` (replaced if it exists) and open it.

        The batch size is ``batch_size``, else the collection's, else the leading dims a dict's entries share
        (at most ``batch_dims``). ``kwargs`` go to the library's dataset creation.
        """
        from ..tensordict import TensorDict

        if allow_pickle is not None and not isinstance(allow_pickle, bool):
            raise TypeError("allow_pickle must be a bool or None.")
        if batch_size is not None and batch_dims is not None:
            raise ValueError("Cannot pass both batch_size and batch_dims to from_dict.")
        source = input_dict
        source = _as_collection(source)
        infer = False
        if not isinstance(source, TensorDictBase):
            source = TensorDict(source, batch_size=batch_size if batch_size is not None else [])
            infer = batch_size is None
        elif batch_size is not None:
            # a new structure over the same leaves (``clone`` is a generic member, set on the class at import)
            source = source.to_tensordict() if isinstance(source, PersistentTensorDict) else \
                source.clone(False)
            source.batch_size = batch_size
        from ._h5_files import write_file  # _h5_files builds on this module

        out = write_file(source, filename, backend, "from_dict", allow_pickle, kwargs)
        if device is not None:
            out._set_device(parse_device(device))
        if infer:
            out.auto_batch_size_(batch_dims)
            out._record_layout()
        return out

    def _record_layout(self) -> None:
        """Store each level's batch size and names where the format keeps them (zarr; HDF5 keeps none)."""
        if self._storage.is_read_only(self._group):
            return
        self._storage.write_group_metadata(self._group, _group_metadata(self, self._batch_size))
        for key in self._keys_str():
            node = self._node(key)
            if self._kind(node) == GROUP:
                self._child(key, node)._record_layout()

    # ------------------------------------------------------------------ printing
    def __repr__(self) -> str:
        try:
            fields = ", ".join(self._field_repr(key) for key in self._keys_str())
        except KeyError:
            fields = "<closed>"
        return (f"PersistentTensorDict(batch_size={self.batch_size}, device={self.device}, "
                f"file={self._storage.describe(self._group)}, fields={{{fields}}})")

    def _field_repr(self, key: str) -> str:
        node = self._node(key)
        kind = self._kind(node)
        if kind == TENSOR:
            return f"{key}: Tensor(shape={tuple(self._storage.shape(node))}, dtype={self._storage.dtype(node)})"
        if kind == GROUP:
            return f"{key}: PersistentTensorDict(batch_size={self._child(key, node).batch_size})"
        return f"{key}: {self._entry_class(key, node, kind).__name__}"


def _same_non_tensor(first: Any, second: Any) -> bool:
    from .._indexing import same_value

    if type(first) is not type(second) or first.batch_size != second.batch_size:
        return False
    if type(first) is NonTensorData:
        return same_value(first.data, second.data)
    return all(same_value(a, b) for a, b in zip(first._flat_values(), second._flat_values()))


def _group_metadata(source: Any, batch_size: Optional[torch.Size] = None) -> dict:
    """What a zarr group records about its level (upstream's ``__tensordict__`` attribute)."""
    batch = batch_size if batch_size is not None else getattr(source, "batch_size", torch.Size())
    metadata: dict = {"batch_size": list(batch), "version": 1}
    names = _names_of(source)
    if names is not None and len(names) == len(batch):
        metadata["names"] = names
    return metadata


def _names_of(collection: Any) -> Optional[list]:
    """The dim names of ``collection`` when any is set, else None."""
    if collection is None:
        return None
    if isinstance(collection, PersistentTensorDict):
        return None if collection._names is None else list(collection._names)
    try:
        names = list(collection.names)
    except (AttributeError, RuntimeError):
        return None
    return names if any(name is not None for name in names) else None


def _check_tree(storage: Any, source: Any, what: str, prefix: Any) -> None:
    """Raise, before anything is written, for a leaf of ``source`` the format can't hold."""
    if isinstance(source, PersistentTensorDict):
        return  # read from a file: every dtype is one a file holds
    source = _as_collection(source)
    base = key_to_tuple(prefix) if prefix not in ((), None) else ()
    for key in source.keys():
        value = source.get(key)
        full = base + (key,)
        shown = full if len(full) > 1 else full[0]
        if isinstance(value, torch.Tensor):
            check_storable(value, what, shown, storage.format_name)
        elif type(value) is NonTensorData:
            storage.check_value(value.data, shown, what)
        elif type(value) is NonTensorStack:
            storage.check_stack(value.tolist(), value.batch_size, shown, what)
        elif isinstance(value, TensorCollection):
            _check_tree(storage, value, what, full)


# ---------------------------------------------------------------------- the files (written and opened by _h5_files.py)
def to_h5(collection: Any, filename: Any, **kwargs: Any) -> PersistentTensorDict:
    """Write ``collection`` to a new HDF5 file (replacing one at ``filename`` only once complete)."""
    from ._h5_files import write_file  # _h5_files builds on this module

    source = _as_collection(collection)
    return write_file(source, filename, "h5", "to_h5", None, kwargs)


def from_h5(h5_file: Any, *, mode: str = "r", auto_batch_size: bool = False, batch_dims: Optional[int] = None,
            batch_size: Any = None, non_tensor_as_stack: bool = False) -> PersistentTensorDict:
    """Open an HDF5 file as a :class:`PersistentTensorDict` (entries are read when asked for).

    Without ``batch_size``, each group's batch size is the largest its datasets share (HDF5 files store
    none); ``auto_batch_size=True`` does the same with at most ``batch_dims`` dims.
    """
    from ._h5_files import open_file  # _h5_files builds on this module

    return open_file(h5_file, "h5", "from_h5", mode, auto_batch_size, batch_dims, batch_size,
                     non_tensor_as_stack, None)
