"""The zarr side of :class:`~torchdict.formats.h5.PersistentTensorDict`: zarr 3 nodes in upstream's layout.

See ``formats/_storage.py`` for the layout. Differences from the HDF5 backend: a non-tensor value is stored
as the bytes of its JSON (or, when JSON can't hold it, its pickle), and a pickle is read back only with
``allow_pickle=True``; each group records its batch size; a store written in one go carries consolidated
metadata (one read lists the whole tree), kept up to date after later changes to its structure.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile
import uuid
import warnings
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from ._require import require
from ._storage import (DATA, GROUP, STACK, STACK_ATTR, TENSOR, ReadOnlyStorageError, all_of_type, native,
                       python_value, torch_dtype_of)

__all__ = ["ZarrBackend", "write_store", "NON_TENSOR_ATTR", "METADATA_ATTR"]

NON_TENSOR_ATTR = "__tensordict_non_tensor__"  # {"encoding": "json" | "pickle"} on a non-tensor payload
METADATA_ATTR = "__tensordict__"  # {"batch_size": [...], "names": [...], "version": 1} on a group

_MODES = {"r": "r", "r+": "r+", "w": "w", "w-": "w-", "x": "w-", "a": "a"}


class _Payload:
    """A non-tensor value encoded for zarr: its bytes and how to decode them."""

    __slots__ = ("data", "encoding")

    def __init__(self, data: bytes, encoding: str) -> None:
        self.data = data
        self.encoding = encoding


def _is_path(target: Any) -> bool:
    return isinstance(target, (str, os.PathLike))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """zarr warns that consolidated metadata and variable-length strings are not in the v3 spec yet: known."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class ZarrBackend:
    """zarr nodes for a PersistentTensorDict (one instance per open store, shared by its nested levels)."""

    name = "zarr"
    format_name = "zarr"
    extra = "zarr"

    def __init__(self, what: str = "PersistentTensorDict") -> None:
        zarr = require("zarr", "zarr", what)
        if int(zarr.__version__.split(".")[0]) < 3:
            raise ImportError(f"{what} needs zarr>=3 (found {zarr.__version__}): pip install torchdict[zarr]")
        self.zarr = zarr
        self.allow_pickle: Optional[bool] = None
        self.path: Optional[str] = None  # the store's folder, when it is one
        self.closed = False
        self.consolidated: Optional[bool] = None  # whether the store carries consolidated metadata

    # ------------------------------------------------------------------ stores
    def open(self, filename: Any, mode: str) -> Any:
        zarr_mode = _MODES.get(mode)
        if zarr_mode is None:
            raise ValueError(f"Invalid mode {mode!r} for a zarr store: use one of {list(_MODES)}.")
        if _is_path(filename):
            filename = os.fspath(filename)
            if zarr_mode in ("r", "r+") and not os.path.isdir(filename):
                if os.path.exists(filename):
                    raise OSError(f"{filename!r} is not a zarr store (a zarr store is a folder).")
                raise FileNotFoundError(f"No zarr store at {filename!r} (mode={mode!r} opens an existing store; "
                                        "'w', 'x' or 'a' create one).")
            self.path = os.path.abspath(filename)
        try:
            with _quiet():
                if zarr_mode == "r":
                    group = self.zarr.open_group(filename, mode="r")
                else:
                    group = self.zarr.open_group(filename, mode=zarr_mode, use_consolidated=False)
        except FileNotFoundError as err:  # zarr's GroupNotFoundError is one
            raise FileNotFoundError(f"No zarr group at {filename!r}: {err}") from err
        self.closed = False
        return group

    def close(self, group: Any) -> None:
        self.closed = True
        close = getattr(group.store, "close", None)
        if close is not None:
            close()

    def is_open(self, group: Any) -> bool:
        return not self.closed

    def is_read_only(self, group: Any) -> bool:
        return bool(group.read_only)

    def check_writable(self, group: Any) -> None:
        if self.closed:
            raise ReadOnlyStorageError("Cannot write to a closed zarr store.")
        if group.read_only:
            raise ReadOnlyStorageError(f"Cannot write to the zarr store {self.describe(group)}: it is open "
                                       "read-only (mode='r'). Open it with mode='r+' or 'a' to write.")

    def location(self, group: Any) -> tuple:
        return self.path, group.path

    def reopen(self, filename: str, path: str, mode: str) -> Any:
        group = self.open(filename, mode)
        return group[path] if path else group

    def finish(self, group: Any) -> None:
        """Consolidate the store's metadata after a bulk write (not on an append-only store, e.g. a zip)."""
        if not getattr(group.store, "supports_deletes", True):
            return
        with _quiet():
            self.zarr.consolidate_metadata(group.store)
        self.consolidated = True

    def _changed(self, group: Any) -> None:
        """After a change of structure: keep consolidated metadata, if the store has it, in step."""
        if self.consolidated is None:
            try:
                with _quiet():
                    root = self.zarr.open_group(group.store, mode="r")
                self.consolidated = root.metadata.consolidated_metadata is not None
            except Exception:  # noqa: BLE001 - a store that can't say has none to keep in step
                self.consolidated = False
        if self.consolidated:
            self.finish(group)

    def describe(self, group: Any) -> str:
        where = repr(self.path) if self.path is not None else repr(group.store)
        return where + (f" group {group.path!r}" if group.path else "") + (" (closed)" if self.closed else "")

    # ------------------------------------------------------------------ structure
    def members(self, group: Any) -> list:
        return list(group.keys())

    def child(self, group: Any, name: str, known: Optional[dict] = None) -> Any:
        # ``known`` (the HDF5 backend's memo of open nodes) is not used: a zarr node is a cheap handle
        return group.get(name)

    def contains(self, group: Any, name: str) -> bool:
        return name in group

    def kind(self, node: Any) -> str:
        if isinstance(node, self.zarr.Group):
            return GROUP
        attrs = node.attrs
        if STACK_ATTR in attrs:
            return STACK
        if NON_TENSOR_ATTR in attrs or torch_dtype_of(node.dtype) is None:
            return DATA
        return TENSOR

    def holds_rows(self, node: Any) -> bool:
        return NON_TENSOR_ATTR not in node.attrs

    def shape(self, node: Any) -> tuple:
        return tuple(node.shape)

    def dtype(self, node: Any) -> Optional[torch.dtype]:
        return torch_dtype_of(node.dtype)

    def stack_shape(self, node: Any) -> torch.Size:
        return torch.Size(int(size) for size in node.attrs[STACK_ATTR])

    # ------------------------------------------------------------------ reads
    def read_all(self, node: Any) -> np.ndarray:
        return native(node[...])

    def read_at(self, node: Any, index: tuple) -> np.ndarray:
        if not index:
            return native(node[...])
        if any(isinstance(item, np.ndarray) for item in index):
            return native(node.oindex[index])
        return native(node[index])

    def _decode(self, node: Any) -> Any:
        encoding = node.attrs[NON_TENSOR_ATTR].get("encoding")
        payload = node[...].tobytes()
        if encoding == "json":
            return json.loads(payload.decode("utf-8"))
        if encoding != "pickle":
            raise ValueError(f"Unknown encoding {encoding!r} of the non-tensor entry {node.path!r} in the zarr store "
                             f"{self.path!r}.")
        if self.allow_pickle is not True:
            raise RuntimeError(
                f"Refusing to unpickle the non-tensor entry {node.path!r} of the zarr store {self.path!r}: a pickle "
                "can run arbitrary code. Pass allow_pickle=True (to from_zarr or PersistentTensorDict) only for a "
                "store you trust.")
        return pickle.loads(payload)

    def read_value(self, node: Any) -> Any:
        if NON_TENSOR_ATTR in node.attrs:
            return self._decode(node)
        return python_value(node[()])  # a foreign array of a non-tensor dtype: its values as they are

    def read_stack(self, node: Any) -> list:
        if NON_TENSOR_ATTR in node.attrs:
            return self._decode(node)
        return node[...].tolist()

    def read_rows(self, node: Any) -> list:
        return node[...].tolist()

    # ------------------------------------------------------------------ writes
    def write_at(self, node: Any, index: tuple, array: np.ndarray) -> None:
        if not index:
            node[...] = array
        elif any(isinstance(item, np.ndarray) for item in index):
            node.oindex[index] = array
        else:
            node[index] = array

    def write_all(self, node: Any, array: np.ndarray) -> None:
        node[...] = array

    @staticmethod
    def _array_options(shape: tuple, options: dict) -> dict:
        """Upstream's defaults: one chunk per array, no compression; ``chunks`` sets the leading dims only."""
        options = dict(options)
        options.setdefault("compressors", None)
        chunks = options.pop("chunks", None)
        if shape:
            if chunks is None:
                chunks = shape
            else:
                chunks = (chunks,) if isinstance(chunks, int) else tuple(chunks)
                chunks = chunks[:len(shape)] + tuple(shape[len(chunks):])
            options["chunks"] = tuple(max(1, int(size)) for size in chunks)
        return options

    def create_tensor(self, group: Any, name: str, array: np.ndarray, options: dict) -> None:
        node = group.create_array(name, shape=array.shape, dtype=array.dtype,
                                  **self._array_options(array.shape, options))
        if array.size:
            node[...] = array
        self._changed(group)

    def _encode(self, value: Any, key: Any, what: str) -> _Payload:
        try:
            text = json.dumps(value)
            if json.loads(text) == value:
                return _Payload(text.encode("utf-8"), "json")
        except (TypeError, ValueError):
            pass
        try:
            return _Payload(pickle.dumps(value), "pickle")
        except Exception as err:  # noqa: BLE001 - pickle raises many types for an unpicklable value
            raise TypeError(f"{what} can't store the non-tensor value at key {key!r} (a {type(value).__name__}): "
                            f"it is neither JSON nor picklable ({err}).") from err

    def check_value(self, value: Any, key: Any, what: str) -> Any:
        return self._encode(value, key, what)

    def _create_payload(self, group: Any, name: str, payload: _Payload, attributes: dict) -> None:
        data = np.frombuffer(payload.data, dtype=np.uint8)
        attributes = {**attributes, NON_TENSOR_ATTR: {"encoding": payload.encoding}}
        node = group.create_array(name, shape=data.shape, dtype=data.dtype, compressors=None,
                                  chunks=data.shape if data.size else None, attributes=attributes)
        if data.size:
            node[...] = data
        self._changed(group)

    def create_value(self, group: Any, name: str, encoded: Any) -> None:
        self._create_payload(group, name, encoded, {})

    def check_stack(self, values: list, shape: torch.Size, key: Any, what: str) -> Any:
        if all_of_type(values, len(shape), str):
            return np.array(values, dtype=str).reshape(tuple(shape))
        return self._encode(values, key, what)

    def create_stack(self, group: Any, name: str, encoded: Any, shape: torch.Size) -> None:
        attributes = {STACK_ATTR: list(shape)}
        if isinstance(encoded, _Payload):
            self._create_payload(group, name, encoded, attributes)
            return
        with _quiet():
            node = group.create_array(name, shape=encoded.shape, dtype=str, compressors=None,
                                      chunks=encoded.shape if encoded.size else None, attributes=attributes)
        if encoded.size:
            node[...] = encoded
        self._changed(group)

    def create_group(self, group: Any, name: str, metadata: Optional[dict]) -> Any:
        attributes = {METADATA_ATTR: metadata} if metadata is not None else None
        child = group.create_group(name, attributes=attributes)
        self._changed(group)
        return child

    def delete(self, group: Any, name: str) -> None:
        del group[name]
        self._changed(group)

    def group_metadata(self, group: Any) -> Optional[dict]:
        metadata = group.attrs.get(METADATA_ATTR)
        return dict(metadata) if isinstance(metadata, dict) else None

    def write_group_metadata(self, group: Any, metadata: dict) -> None:
        if group.read_only or self.group_metadata(group) == metadata:
            return
        group.attrs[METADATA_ATTR] = metadata
        self._changed(group)

    def copy_file(self, group: Any, filename: str) -> Any:
        """A new store at ``filename`` holding a copy of ``group``."""
        def fill(root: Any) -> None:
            self._copy_members(group, root)

        return write_store(self, filename, fill)

    def _copy_members(self, source: Any, dest: Any) -> None:
        for name in source.keys():
            node = source[name]
            if isinstance(node, self.zarr.Group):
                self._copy_members(node, dest.create_group(name, attributes=dict(node.attrs)))
                continue
            with _quiet():
                copy = dest.create_array(name, shape=node.shape, dtype=node.dtype, chunks=node.chunks,
                                         compressors=None, attributes=dict(node.attrs))
            if node.size:
                copy[...] = node[...]
        if source.attrs.get(METADATA_ATTR) is not None:
            dest.attrs[METADATA_ATTR] = dict(source.attrs[METADATA_ATTR])


def _is_store_folder(path: str) -> bool:
    """Whether the folder ``path`` holds a zarr store (or nothing), which a write may replace."""
    names = os.listdir(path)
    return not names or any(name in names for name in ("zarr.json", ".zgroup", ".zarray", ".zattrs"))


def write_store(backend: ZarrBackend, target: Any, fill: Callable[[Any], None]) -> Any:
    """Write a new store with ``fill(root_group)``; at a path, nothing is there until it is complete.

    The store is written in a hidden sibling folder, then renamed onto ``target`` (a previous store there is
    moved aside first, then removed). A folder that holds other files than a zarr store is never replaced:
    it raises before anything is written. A ``zarr`` store object is written in place.
    """
    zarr = backend.zarr
    if not _is_path(target):
        root = zarr.open_group(target, mode="w", use_consolidated=False)
        fill(root)
        backend.finish(root)
        backend.closed = False
        return root
    target = os.path.abspath(os.fspath(target))
    if os.path.exists(target):
        if not os.path.isdir(target):
            raise FileExistsError(f"Cannot write a zarr store at {target!r}: a file is there (a zarr store is a "
                                  "folder). Remove it or choose another path.")
        if not _is_store_folder(target):
            raise FileExistsError(f"Cannot write a zarr store at {target!r}: the folder holds files that are not "
                                  "a zarr store, which writing would delete. Remove them or choose another path.")
    folder, name = os.path.split(target)
    partial = tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=folder)
    try:
        with _quiet():
            root = zarr.open_group(partial, mode="w", use_consolidated=False)
        backend.consolidated = False  # nothing to keep in step while the store is being written
        fill(root)
        backend.finish(root)
        if os.path.exists(target):
            old = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.old")
            os.rename(target, old)
            os.rename(partial, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    group = backend.open(target, "r+")
    backend.consolidated = True
    return group
