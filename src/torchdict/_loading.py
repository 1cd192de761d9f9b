"""Loading a saved folder (``load_memmap``): map every file, read and copy nothing.

A folder's ``meta.json`` says which format wrote it: torchdict's own (``"format":
"torchdict"``, read here) or upstream tensordict 0.15.x's flat layout (read by
:mod:`torchdict._upstream_format`). Both go through one :class:`FolderLoader`, which holds
the options of the call and loads sub-folders recursively, whatever their format.

Nothing inside the folder is followed through a symlink (``meta.json``, data files, pickles,
sub-folders; see :mod:`torchdict._nofollow`): with ``mode="r+"`` a followed link would let
writes to the loaded tensors land outside the folder. A folder missing because a save was
killed in the middle of swapping it in is first put back (:func:`torchdict._folder_swap.recover`).
"""
from __future__ import annotations

import os
from typing import Any

import torch

from ._meta_json import (
    FORMAT_NAME,
    FORMAT_VERSION,
    TENSORDICT_CLASS,
    check_fits,
    corrupt_meta,
    entry_path,
    parse_dtype,
    parse_shape,
    read_meta,
)
from ._folder_swap import recover
from ._nofollow import check_folder, read_in_folder
from ._saved_classes import find_saved_class, names_a_tensordict
from ._upstream_format import load_upstream_folder
from .memmap import map_file
from .nontensor import NonTensorData, NonTensorStack

__all__ = ["FolderLoader", "load_memmap"]

_CPU = torch.device("cpu")


class FolderLoader:
    """One ``load_memmap`` call: its options, and the loading of a folder of either format."""

    __slots__ = ("cls", "mode", "allow_pickle", "pool")

    def __init__(self, cls: type, mode: str, allow_pickle: bool, pool: Any) -> None:
        self.cls = cls  # the TensorDict class to build
        self.mode = mode  # "r+" (shared) or "r" (copy-on-write) mappings
        self.allow_pickle = allow_pickle
        self.pool = pool  # a ThreadPoolExecutor mapping the files, or None

    def load(self, folder: str, parent_batch: torch.Size | None = None, *, nested: bool = True) -> Any:
        """The TensorDict (or registered collection) saved in ``folder``.

        A ``nested`` folder (inside the one the caller named) must be a real folder, not a symlink.
        """
        if nested:
            check_folder(folder, writing=False)
        meta = read_meta(folder)
        if meta.get("format") == FORMAT_NAME:
            return _load_torchdict_folder(self, folder, meta, parent_batch)
        return load_upstream_folder(self, folder, meta, parent_batch)

    def map(self, path: str, dtype: torch.dtype, shape: torch.Size) -> Any:
        """The file mapped as a MemoryMappedTensor, or a Future of it when a thread pool maps."""
        if self.pool is None:
            return map_file(path, dtype, shape, mode=self.mode, in_saved_folder=True)
        return self.pool.submit(map_file, path, dtype, shape, mode=self.mode, in_saved_folder=True)

    def unpickle(self, path: str) -> Any:
        """The object pickled in ``path``, only when the caller opted in with ``allow_pickle=True``."""
        if not self.allow_pickle:
            raise RuntimeError(
                f"Refusing to load pickled non-tensor data from {path}: unpickling can run arbitrary code. "
                "Pass allow_pickle=True if you trust this folder."
            )
        import pickle

        return pickle.loads(read_in_folder(path))

    def build(self, storage: dict, batch_size: torch.Size, device: Any, names: Any, class_name: Any,
              folder: str) -> Any:
        """The loaded TensorDict, wrapped in its registered collection class when it has one."""
        if self.pool is not None:
            from concurrent.futures import Future

            for key, value in storage.items():
                if type(value) is Future:
                    storage[key] = value.result()  # a mapping done by the thread pool
        device = None if device in (None, "None") else torch.device(device)
        td = self.cls._new_unsafe(storage, batch_size, device, names)
        if class_name is None or class_name == TENSORDICT_CLASS or names_a_tensordict(class_name):
            return td
        return find_saved_class(class_name, class_name, folder).from_tensordict(td)


def _load_torchdict_folder(loader: FolderLoader, folder: str, meta: dict, parent_batch: torch.Size | None) -> Any:
    version = meta.get("version")
    if type(version) is not int or version > FORMAT_VERSION:
        raise corrupt_meta(folder, f"format version {version!r} is newer than this torchdict reads "
                                   f"({FORMAT_VERSION}); upgrade torchdict")
    batch_size = parse_shape(folder, meta.get("batch_size"))
    if parent_batch is not None and batch_size[: len(parent_batch)] != parent_batch:
        raise corrupt_meta(folder, f"batch size {list(batch_size)} does not extend the parent's {list(parent_batch)}")
    entries = meta.get("entries")
    if type(entries) is not dict:
        raise corrupt_meta(folder, "missing 'entries'")
    storage: dict = {}
    for key, entry in entries.items():
        kind = entry.get("kind") if type(entry) is dict else None
        if kind == "tensor":
            shape = parse_shape(folder, entry.get("shape"))
            check_fits(folder, key, shape, batch_size)
            dtype = parse_dtype(folder, entry.get("dtype"))
            storage[key] = loader.map(entry_path(folder, entry.get("file")), dtype, shape)
        elif kind == "collection":
            storage[key] = loader.load(entry_path(folder, entry.get("dir")), batch_size)
        elif kind in ("non_tensor", "non_tensor_stack"):
            storage[key] = _non_tensor_leaf(loader, folder, key, entry, kind, batch_size)
        else:
            raise corrupt_meta(folder, f"entry {key!r} has an unknown kind {kind!r}")
    names = meta.get("names")
    if names is not None and (type(names) is not list or len(names) != len(batch_size)):
        raise corrupt_meta(folder, f"invalid names {names!r}")
    return loader.build(storage, batch_size, meta.get("device"), names, meta.get("class"), folder)


def _non_tensor_leaf(loader: FolderLoader, folder: str, key: str, entry: dict, kind: str,
                     batch_size: torch.Size) -> Any:
    leaf_batch = parse_shape(folder, entry.get("batch_size"))
    check_fits(folder, key, leaf_batch, batch_size)
    if "pickle" in entry:
        value = loader.unpickle(entry_path(folder, entry["pickle"]))
    elif "value" in entry:
        value = entry["value"]
    else:
        raise corrupt_meta(folder, f"entry {key!r} has no value")
    if kind == "non_tensor":
        return NonTensorData(value, leaf_batch, _CPU)
    if type(value) is not list or len(value) != leaf_batch.numel():
        raise corrupt_meta(folder, f"entry {key!r} does not hold one value per batch element")
    return NonTensorStack(value, leaf_batch, _CPU)


def load_memmap(prefix: Any, device: Any = None, non_blocking: bool = False, *, num_threads: int = 0,
                allow_pickle: bool = False, mode: str = "r+", cls: type | None = None) -> Any:
    """Load a folder written by ``memmap`` (or by upstream tensordict 0.15.x), mapping its files.

    See :meth:`torchdict.saving.PersistenceMixin.load_memmap`.

    >>> import tempfile
    >>> from torchdict import TensorDict
    >>> folder = tempfile.mkdtemp()
    >>> _ = TensorDict(a=torch.arange(2)).memmap(folder)
    >>> load_memmap(folder)["a"].tolist()
    [0, 1]
    """
    if cls is None:
        from .tensordict import TensorDict as cls
    if mode not in ("r", "r+"):
        raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}.")
    folder = os.path.abspath(os.fspath(prefix))
    pool = None
    if num_threads and num_threads > 0:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=num_threads)
    try:
        loader = FolderLoader(cls, mode, allow_pickle, pool)
        try:
            result = loader.load(folder, nested=False)
        except FileNotFoundError:
            if os.path.exists(folder):
                raise
            found = recover(os.path.realpath(folder))
            if not os.path.exists(found):
                raise
            result = loader.load(found, nested=False)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    if device is not None:
        device = torch.device(device)
        if device != _CPU:
            result = result.to(device, non_blocking=non_blocking)
    return result
