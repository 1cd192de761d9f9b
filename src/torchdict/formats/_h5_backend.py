"""The h5py side of :class:`~torchdict.formats.h5.PersistentTensorDict`: HDF5 nodes in upstream's layout.

See ``formats/_storage.py`` for the layout and the role of a backend. h5py is imported when a backend is
made, never at module import.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import torch

from ._require import require
from ._storage import (DATA, GROUP, STACK, STACK_ATTR, TENSOR, ReadOnlyStorageError, all_of_type, native,
                       python_value, torch_dtype_of)

__all__ = ["H5Backend", "H5_STR_ATTR"]

# Marks the string datasets tensordict wrote, so they read back as str (others read as bytes, as h5py gives).
H5_STR_ATTR = "__tensordict_str__"
_STACK_ATTR_NAME = STACK_ATTR.encode("utf-8")

_MODES = ("r", "r+", "w", "w-", "x", "a")


class H5Backend:
    """HDF5 nodes for a PersistentTensorDict (one instance per open file, shared by its nested levels)."""

    name = "h5"
    format_name = "HDF5"
    extra = "h5"

    def __init__(self, what: str = "PersistentTensorDict", locking: Any = None) -> None:
        self.h5py = require("h5py", "h5", what)
        self.locking = locking
        self.allow_pickle: Optional[bool] = None  # unused: HDF5 entries are never pickles
        self._read_only: Optional[bool] = None  # asked once: a backend serves one open file

    # ------------------------------------------------------------------ files
    def open(self, filename: Any, mode: str) -> Any:
        if mode not in _MODES:
            raise ValueError(f"Invalid mode {mode!r} for an HDF5 file: use one of {list(_MODES)}.")
        if mode in ("r", "r+") and not os.path.exists(os.fspath(filename)):
            raise FileNotFoundError(f"No HDF5 file at {os.fspath(filename)!r} (mode={mode!r} opens an existing "
                                    "file; 'w', 'x' or 'a' create one).")
        self._read_only = None
        try:
            return self.h5py.File(filename, mode, locking=self.locking)
        except OSError as err:
            if mode in ("r", "r+", "a"):
                kind = "not an HDF5 file" if not self.h5py.is_hdf5(os.fspath(filename)) else "a damaged HDF5 file"
                raise OSError(f"Can't open {os.fspath(filename)!r}: it is {kind} (truncated or of another "
                              f"format?): {err}") from err
            raise

    def close(self, group: Any) -> None:
        file = group.file
        if file:
            file.close()

    def is_open(self, group: Any) -> bool:
        return bool(group.id.valid)

    def is_read_only(self, group: Any) -> bool:
        if self._read_only is None:
            self._read_only = group.file.mode == "r"  # ``group.file`` builds a File object: not per write
        return self._read_only

    def check_writable(self, group: Any) -> None:
        if not self.is_open(group):
            raise ReadOnlyStorageError("Cannot write to a closed HDF5 file.")
        if self.is_read_only(group):
            raise ReadOnlyStorageError(
                f"Cannot write to the HDF5 file {group.file.filename!r}: it is open read-only (mode='r'; no write "
                "intent on file). Open it with mode='r+' or 'a' to write.")

    def location(self, group: Any) -> tuple:
        return group.file.filename, group.name

    def reopen(self, filename: str, path: str, mode: str) -> Any:
        file = self.open(filename, mode)
        return file if path == "/" else file[path]

    def finish(self, group: Any) -> None:
        group.file.flush()

    def describe(self, group: Any) -> str:
        if not self.is_open(group):
            return "closed HDF5 file"
        filename, path = self.location(group)
        return f"{filename!r}" + ("" if path == "/" else f" group {path!r}")

    # ------------------------------------------------------------------ structure
    def members(self, group: Any) -> list:
        return list(group.keys())

    def child(self, group: Any, name: str, known: Optional[dict] = None) -> Any:
        """The node ``name`` of ``group``, or None (reads nothing but the link and the object header).

        ``known`` is the caller's memo of the nodes it opened before, ``{name: (address, node)}``: a node is
        reused while the link still points at the same object (one link lookup, no new h5py object; h5py
        keeps a read-only dataset's reader and shape on the object). A node held open keeps its address, so
        an entry replaced since (even through another handle) has another address and is opened afresh.
        Soft and external links are followed afresh each time.
        """
        encoded = name.encode("utf-8")
        if known is not None:
            try:
                link = group.id.links.get_info(encoded)
            except (KeyError, RuntimeError):  # no such link (or one h5o.open reports better)
                known.pop(name, None)
                return self._open_child(group, encoded)
            if link.type == self.h5py.h5l.TYPE_HARD:
                memo = known.get(name)
                if memo is not None and memo[0] == link.u and memo[1].id.valid:
                    return memo[1]
                node = self._open_child(group, encoded)
                if node is not None:
                    known[name] = (link.u, node)
                return node
        return self._open_child(group, encoded)

    def _open_child(self, group: Any, encoded: bytes) -> Any:
        # What ``group.get(name)`` returns, built from h5py's low-level calls: ``get`` asks the file for its
        # mode on every call (a new ``File`` object each time), which costs more than opening the node.
        h5py = self.h5py
        try:
            oid = h5py.h5o.open(group.id, encoded)
        except KeyError:
            return None
        object_type = h5py.h5i.get_type(oid)
        if object_type == h5py.h5i.DATASET:
            return h5py.Dataset(oid, readonly=self.is_read_only(group))
        if object_type == h5py.h5i.GROUP:
            return h5py.Group(oid)
        return h5py.Datatype(oid)

    def contains(self, group: Any, name: str) -> bool:
        return name in group

    def kind(self, node: Any) -> str:
        h5py = self.h5py
        if isinstance(node, h5py.Group):
            return GROUP
        if h5py.h5a.exists(node.id, _STACK_ATTR_NAME):  # ``in node.attrs``, without its AttributeManager
            return STACK
        dtype = node.dtype
        if dtype.metadata is None:
            # h5py tags its string, vlen, enum, opaque and reference dtypes with metadata: a plain dtype is a
            # tensor's exactly when torch has it (fixed-length strings and compounds have none)
            return TENSOR if torch_dtype_of(dtype) is not None else DATA
        if (h5py.check_string_dtype(dtype) or h5py.check_vlen_dtype(dtype) or h5py.check_enum_dtype(dtype)
                or h5py.check_opaque_dtype(dtype) or torch_dtype_of(dtype) is None):
            return DATA
        return TENSOR

    def holds_rows(self, node: Any) -> bool:
        """Whether an unmarked non-tensor dataset may read as one element per row (not a value tensordict wrote)."""
        return H5_STR_ATTR not in node.attrs and not self.h5py.check_opaque_dtype(node.dtype)

    def shape(self, node: Any) -> tuple:
        return tuple(node.shape)

    def dtype(self, node: Any) -> Optional[torch.dtype]:
        return torch_dtype_of(node.dtype)

    def stack_shape(self, node: Any) -> torch.Size:
        return torch.Size(int(size) for size in node.attrs[STACK_ATTR])

    # ------------------------------------------------------------------ reads
    def read_all(self, node: Any) -> np.ndarray:
        return native(node[()])

    def read_at(self, node: Any, index: tuple) -> np.ndarray:
        return native(node[index])

    def read_value(self, node: Any) -> Any:
        value = node[()]
        if H5_STR_ATTR in node.attrs and isinstance(value, bytes):
            return value.decode("utf-8")
        return python_value(value)

    def read_stack(self, node: Any) -> list:
        info = self.h5py.check_string_dtype(node.dtype)
        if info is not None and info.length is None:
            return node.asstr()[()].tolist()
        return node[()].tolist()

    def read_rows(self, node: Any) -> list:
        """An unmarked non-tensor dataset's elements, one per row (``non_tensor_as_stack``)."""
        return node[()].tolist()

    # ------------------------------------------------------------------ writes
    def write_at(self, node: Any, index: tuple, array: np.ndarray) -> None:
        node[index] = array

    def write_all(self, node: Any, array: np.ndarray) -> None:
        node[()] = array

    def create_tensor(self, group: Any, name: str, array: np.ndarray, options: dict) -> None:
        group.create_dataset(name, data=array, **options)

    def check_value(self, value: Any, key: Any, what: str) -> Any:
        """The numpy form of a non-tensor ``value`` as HDF5 stores it; raises before any write if it can't."""
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError(f"{what} can't store the str at key {key!r}: it holds a NUL character, which HDF5 "
                                 "strings can't. Use bytes, zarr or memmap.")
            return value
        array = np.array(value)
        if array.dtype.kind in ("O", "V"):
            raise TypeError(
                f"{what} can't store the non-tensor value at key {key!r} (a {type(value).__name__}): HDF5 holds "
                "str, bytes, bool, int, float and arrays of them. Use zarr or memmap for other values.")
        return array.astype(self.h5py.opaque_dtype(array.dtype))

    def create_value(self, group: Any, name: str, encoded: Any) -> None:
        node = group.create_dataset(name, data=encoded)
        if isinstance(encoded, str):
            node.attrs[H5_STR_ATTR] = True

    def check_stack(self, values: list, shape: torch.Size, key: Any, what: str) -> Any:
        ndim = len(shape)
        if all_of_type(values, ndim, str):
            array = np.array(values, dtype=self.h5py.string_dtype())
            if any("\x00" in value for value in array.ravel()):
                raise ValueError(f"{what} can't store the NonTensorStack at key {key!r}: a str holds a NUL "
                                 "character, which HDF5 strings can't. Use bytes, zarr or memmap.")
            return array.reshape(tuple(shape))
        if any(all_of_type(values, ndim, cls) for cls in (bytes, bool, int, float)):
            array = np.array(values)
            return array.astype(self.h5py.opaque_dtype(array.dtype))
        raise TypeError(
            f"{what} can't store the NonTensorStack at key {key!r}: HDF5 holds a stack whose elements are all str, "
            "all bytes, all bool, all int or all float. Use zarr or memmap for other values.")

    def create_stack(self, group: Any, name: str, encoded: Any, shape: torch.Size) -> None:
        node = group.create_dataset(name, data=encoded)
        node.attrs[STACK_ATTR] = list(shape)

    def create_group(self, group: Any, name: str, metadata: Optional[dict]) -> Any:
        return group.create_group(name)

    def delete(self, group: Any, name: str) -> None:
        del group[name]

    def move(self, group: Any, old: str, new: str) -> None:
        group.move(old, new)

    def group_metadata(self, group: Any) -> Optional[dict]:
        return None  # upstream's HDF5 files carry no batch size: it is inferred on open

    def write_group_metadata(self, group: Any, metadata: dict) -> None:
        return None

    def copy_file(self, group: Any, filename: str) -> Any:
        """A new file at ``filename`` holding a copy of ``group`` (HDF5's own copy: no round trip through memory)."""
        dest = self.h5py.File(filename, "w", locking=self.locking)
        for name in group.keys():
            group.copy(group[name], dest, name=name)
        return dest
