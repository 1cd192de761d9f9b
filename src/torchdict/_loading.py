"""Loading a save (``load_memmap``): map every file, read and copy nothing.

A folder's ``meta.json`` says which format wrote it: torchdict's own (``"format":
"torchdict"``, read here) or upstream tensordict 0.15.x's flat layout (read by
:mod:`torchdict._upstream_format`). Both go through one :class:`FolderLoader`, which holds
the options of the call and loads sub-folders recursively, whatever their format.

Where the folders live is the loader's *tree*: :class:`LocalTree` for folders on disk, or the
archive tree of :mod:`torchdict.formats.archive` for a ``.tdz`` zip file (same layout, one
mapping of the whole file). The readers only go through the tree, so every layout that loads
from a folder loads from an archive too.

Nothing inside a folder on disk is followed through a symlink (``meta.json``, data files,
pickles, sub-folders; see :mod:`torchdict._nofollow`): with ``mode="r+"`` a followed link would
let writes to the loaded tensors land outside the folder. A folder missing because a save was
killed in the middle of swapping it in is first put back (:func:`torchdict._folder_swap.recover`).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from ._meta_json import (
    FORMAT_NAME,
    FORMAT_VERSION,
    META_FILE,
    TENSORDICT_CLASS,
    check_fits,
    corrupt_meta,
    parse_dtype,
    parse_shape,
    read_meta,
)
from ._filenames import is_safe_name
from ._folder_swap import recover
from ._nofollow import check_folder, read_in_folder
from ._saved_classes import find_saved_class, names_a_tensordict
from ._upstream_format import load_upstream_folder, upstream_child
from .memmap import map_file
from .nontensor import NonTensorData, NonTensorStack
from .nontensor._metadata import one_value_class

if TYPE_CHECKING:
    from .tensordict import TensorDict

__all__ = ["FolderLoader", "LocalTree", "load_memmap", "normalize_subpath"]

_CPU = torch.device("cpu")


class LocalTree:
    """Saved folders on the local file system; ``mode=None`` maps each file ``"r+"`` if it is writable."""

    __slots__ = ()

    def join(self, folder: str, name: str) -> str:
        return folder + os.sep + name

    def read(self, path: str) -> bytes:
        return read_in_folder(path)

    def read_meta(self, folder: str) -> dict:
        return read_meta(folder)

    def lexists(self, path: str) -> bool:
        return os.path.lexists(path)

    def is_folder(self, path: str) -> bool:
        # a symlink counts, so that the loader finds it and then refuses it rather than skipping it
        return os.path.isdir(path) or os.path.islink(path)

    def check_folder(self, path: str) -> None:
        check_folder(path, writing=False)

    def map(self, path: str, dtype: torch.dtype, shape: torch.Size, mode: str | None) -> Any:
        if mode is None:
            mode = "r+" if os.access(path, os.W_OK) else "r"
        return map_file(path, dtype, shape, mode=mode, in_saved_folder=True)

    def finish(self, num_threads: int) -> None:
        """Nothing to check once a folder is loaded (an archive verifies its checksums here)."""


class FolderLoader:
    """One ``load_memmap`` call: its options, and the loading of a folder of either format."""

    __slots__ = ("cls", "mode", "allow_pickle", "pool", "tree", "progress")

    def __init__(self, cls: type[TensorDict], mode: str | None, allow_pickle: bool, pool: Any, tree: Any = None,
                 progress: Any = None) -> None:
        self.cls = cls  # the TensorDict class to build
        self.mode = mode  # "r+" (shared), "r" (copy-on-write) or None (per file, as upstream)
        self.allow_pickle = allow_pickle
        self.pool = pool  # a ThreadPoolExecutor mapping the files, or None
        self.tree = LocalTree() if tree is None else tree
        self.progress = progress  # a bar of the bytes mapped (torchdict.set_progress_bar), or None

    def load(self, folder: str, parent_batch: torch.Size | None = None, *, nested: bool = True) -> Any:
        """The TensorDict (or registered collection) saved in ``folder``.

        A ``nested`` folder (inside the one the caller named) must be a real folder, not a symlink.
        """
        if nested:
            self.tree.check_folder(folder)
        meta = self.tree.read_meta(folder)
        if meta.get("format") == FORMAT_NAME:
            return _load_torchdict_folder(self, folder, meta, parent_batch)
        return load_upstream_folder(self, folder, meta, parent_batch)

    def entry(self, folder: str, name: Any) -> str:
        """The path of the file or sub-folder ``name`` read from ``folder``'s meta.json, refusing unsafe names."""
        if not is_safe_name(name):
            raise corrupt_meta(folder, f"unsafe file name {name!r}")
        return self.tree.join(folder, name)

    def map(self, path: str, dtype: torch.dtype, shape: torch.Size) -> Any:
        """The file mapped as a tensor, or a Future of it when a thread pool maps."""
        if self.progress is not None:
            self.progress.update(shape.numel() * dtype.itemsize)
        if self.pool is None:
            return self.tree.map(path, dtype, shape, self.mode)
        return self.pool.submit(self.tree.map, path, dtype, shape, self.mode)

    def unpickle(self, path: str) -> Any:
        """The object pickled in ``path``, only when the caller opted in with ``allow_pickle=True``."""
        if not self.allow_pickle:
            raise RuntimeError(
                f"Refusing to load pickled non-tensor data from {path}: unpickling can run arbitrary code. "
                "Pass allow_pickle=True if you trust this folder."
            )
        import pickle

        return pickle.loads(self.tree.read(path))

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
        if self.mode != "r" and type(self.tree) is LocalTree:
            td._saved_path = folder  # memmap() / memmap_() without a prefix write back here, as upstream
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
            storage[key] = loader.map(loader.entry(folder, entry.get("file")), dtype, shape)
        elif kind == "collection":
            storage[key] = loader.load(loader.entry(folder, entry.get("dir")), batch_size)
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
        value = loader.unpickle(loader.entry(folder, entry["pickle"]))
    elif "value" in entry:
        value = entry["value"]
    else:
        raise corrupt_meta(folder, f"entry {key!r} has no value")
    if kind == "non_tensor":
        return one_value_class(entry.get("class"))(value, leaf_batch, _CPU)  # a MetaData saved as one
    if type(value) is not list or len(value) != leaf_batch.numel():
        raise corrupt_meta(folder, f"entry {key!r} does not hold one value per batch element")
    return NonTensorStack(value, leaf_batch, _CPU)


# ---------------------------------------------------------------------- subpath
def normalize_subpath(subpath: Any) -> tuple:
    """``"a/b"`` or ``("a", ("b",))`` as ``("a", "b")``, as upstream reads ``subpath``.

    >>> normalize_subpath("module//0/"), normalize_subpath(("module", ("0", "w")))
    (('module', '0'), ('module', '0', 'w'))
    """
    if isinstance(subpath, str):
        return tuple(part for part in subpath.split("/") if part)
    parts: list = []

    def flatten(item: Any) -> None:
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, tuple):
            for inner in item:
                flatten(inner)
        else:
            raise ValueError("subpath must be a string path or a (nested) tuple of strings.")

    flatten(subpath)
    if not parts:
        raise ValueError("subpath must be a string path or a (nested) tuple of strings.")
    return tuple(parts)


def _resolve_subpath(loader: FolderLoader, folder: str, parts: tuple) -> str:
    """The folder holding the nested TensorDict at ``parts`` below ``folder``, read from each meta.json."""
    tree = loader.tree

    def missing(where: str) -> ValueError:
        return ValueError(f"No tensordict found under subpath {'/'.join(parts)!r} "
                          f"(missing {META_FILE} in {where}).")

    for position, part in enumerate(parts):
        if position:
            tree.check_folder(folder)
        try:
            meta = tree.read_meta(folder)
        except FileNotFoundError:
            raise missing(folder) from None
        if meta.get("format") == FORMAT_NAME:
            entries = meta.get("entries")
            entry = entries.get(part) if type(entries) is dict else None
            if type(entry) is not dict or entry.get("kind") != "collection":
                raise missing(tree.join(folder, part))
            folder = loader.entry(folder, entry.get("dir"))
        else:
            child = upstream_child(loader, folder, part, "")
            inner = tree.join(folder, "_tensordict")
            if not tree.lexists(tree.join(child, META_FILE)) and tree.lexists(tree.join(inner, META_FILE)):
                # a saved tensorclass keeps its fields in _tensordict, as ``obj.get(key)`` reaches them
                child = upstream_child(loader, inner, part, "")
            folder = child
    if not tree.lexists(tree.join(folder, META_FILE)):
        raise missing(folder)
    tree.check_folder(folder)
    return folder


# ---------------------------------------------------------------------- out=
def _fill_out(out: Any, loaded: Any) -> Any:
    """Put ``loaded``'s entries into ``out`` (upstream's ``out=``): nested collections are reused, leaves
    replaced, keys that were not saved removed. Everything is checked before ``out`` changes."""
    target, source = _as_td(out), _as_td(loaded)
    _check_fill(target, source, ())
    _apply_fill(target, source)
    return out


def _as_td(collection: Any) -> Any:
    """A TensorDictBase itself; a tensorclass instance's TensorDict."""
    from .base import TensorDictBase

    return collection if isinstance(collection, TensorDictBase) else collection._tensordict


def _is_collection(value: Any) -> bool:
    from ._base import is_tensor_collection

    return is_tensor_collection(value) and not isinstance(value, (NonTensorData, NonTensorStack))


def _check_fill(target: Any, source: Any, where: tuple) -> None:
    if target.is_locked:
        raise RuntimeError(
            "Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` method "
            "and make sure the key is present."
        )
    batch = target.batch_size
    for key in source.keys():
        value = source._get_str(key, None)
        current = target._get_str(key, None)
        if _is_collection(value) and current is not None and _is_collection(current):
            _check_fill(_as_td(current), _as_td(value), where + (key,))
            continue
        shape = value.batch_size if hasattr(value, "batch_size") else value.shape
        if tuple(shape[: len(batch)]) != tuple(batch):
            name = key if not where else where + (key,)
            raise RuntimeError(
                f"the entry {name!r} has shape {torch.Size(shape)} which is incompatible with the batch-size "
                f"{batch}."
            )


def _apply_fill(target: Any, source: Any) -> None:
    if hasattr(target, "_saved_path"):
        target._saved_path = getattr(source, "_saved_path", None)
    saved = list(source.keys())
    for key in list(target.keys()):
        if key not in saved:
            del target[key]
    for key in saved:
        value = source._get_str(key, None)
        current = target._get_str(key, None)
        if _is_collection(value) and current is not None and _is_collection(current):
            _apply_fill(_as_td(current), _as_td(value))
        else:
            target.set(key, value)


# ---------------------------------------------------------------------- the call
def _open_tree(folder: str, mode: str | None) -> tuple:
    """(tree, root) for ``folder``: the local tree, or an archive's when ``folder`` is a file."""
    if os.path.isfile(folder):
        from .formats.archive import is_memmap_archive, open_archive_tree

        if not is_memmap_archive(folder):
            raise ValueError(
                f"{folder} is a file but not a memory-mapped tensordict archive (expected a zip file with a "
                f"top-level {META_FILE} entry)."
            )
        return open_archive_tree(folder, mode)
    return LocalTree(), folder


def load_memmap(prefix: Any, device: Any = None, non_blocking: bool = False, *, out: Any = None,
                robust_key: bool | None = True, subpath: Any = None, mode: str | None = None,
                num_threads: int = 0, allow_pickle: bool | None = None, cls: type[TensorDict] | None = None) -> Any:
    """Load a folder or ``.tdz`` archive written by ``memmap`` (or by upstream tensordict 0.15.x), mapping its files.

    See :meth:`torchdict._persistence_mixin.PersistenceMixin.load_memmap`. ``robust_key`` is accepted for upstream's
    signature: both the escaped and the legacy file names of upstream folders are looked up, and
    torchdict folders record every file name, so it changes nothing.

    >>> import tempfile
    >>> from torchdict import TensorDict
    >>> folder = tempfile.mkdtemp()
    >>> _ = TensorDict(a=torch.arange(2)).memmap(folder)
    >>> load_memmap(folder)["a"].tolist()
    [0, 1]
    """
    if cls is None:
        from .tensordict import TensorDict

        cls = TensorDict
    if mode not in (None, "r", "r+"):
        raise ValueError(f"mode must be 'r', 'r+' or None, got {mode!r}.")
    if allow_pickle is not None and not isinstance(allow_pickle, bool):
        raise TypeError("allow_pickle must be a bool or None.")
    parts = None if subpath is None else normalize_subpath(subpath)
    if device is not None:
        device = torch.device(device)
    if out is not None and getattr(out, "device", None) is not None:
        out_device = out.device
        if device is not None and (device.type != out_device.type or (
                device.index is not None and out_device.index is not None and device.index != out_device.index)):
            raise ValueError(f"Cannot load a tensordict on device {device} into a tensordict on device {out_device}.")
        device = out_device
    folder = os.path.abspath(os.fspath(prefix))
    if not os.path.lexists(folder):
        folder = recover(os.path.realpath(folder))
    tree, root = _open_tree(folder, mode)
    pool = None
    if num_threads and num_threads > 0:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=num_threads)
    from ._progress import byte_progress

    progress = byte_progress(None, f"load_memmap {os.path.basename(folder)}")
    try:
        loader = FolderLoader(cls, mode, bool(allow_pickle), pool, tree, progress)
        start = root if parts is None else _resolve_subpath(loader, root, parts)
        result = loader.load(start, nested=False)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        if progress is not None:
            progress.close()
    if device is None or device.type != "meta":
        tree.finish(num_threads)  # an archive's checksums, before anything is returned
    if device is not None and device != _CPU:
        result = result.to(device, non_blocking=non_blocking)
    if out is not None:
        return _fill_out(out, result)
    return result
