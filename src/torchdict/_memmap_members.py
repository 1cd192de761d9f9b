"""Members that change a memory-mapped TensorDict in place: ``load_memmap_`` / ``memmap_refresh_`` (read a save
into it) and ``make_memmap`` / ``make_memmap_from_tensor`` / ``make_memmap_from_storage`` (add an entry, with its
file and its ``meta.json`` record, to a locked memory-mapped TensorDict).

Each checks everything it can before the first change: a refused call leaves the TensorDict and its folder as
they were. A new entry's file is written before the ``meta.json`` that names it (atomically), so a crash leaves
at worst an unreferenced file.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from ._filenames import key_to_filename
from ._keys import key_to_tuple
from ._meta_json import FORMAT_NAME, folder_meta, read_meta, tensor_entry, write_meta_atomic
from .memmap import MemoryMappedTensor, allocate_file, map_file, write_tensor_file

__all__ = ["load_into", "make_memmap", "make_memmap_from_storage", "make_memmap_from_tensor"]


# ---------------------------------------------------------------------- load_memmap_ / memmap_refresh_
def _tree_nodes(td: Any) -> list:
    """``td`` and every TensorDict below it (tensorclass fields included)."""
    from ._loading import _as_td, _is_collection

    nodes = [td]
    for value in list(td._tensordict.values()):
        if _is_collection(value):
            nodes.extend(_tree_nodes(_as_td(value)))
    return nodes


def _mark_memmapped(td: Any) -> None:
    for node in _tree_nodes(td):
        node._is_memmap = True
    td._lock_tree()


def load_into(td: Any, prefix: Any, *, robust_key: bool | None, allow_pickle: bool | None, mode: str | None) -> Any:
    """``td.load_memmap_(prefix, ...)``: the save read into ``td``, which stays memory-mapped (and locked) when
    it was and the save is a folder mapped writable."""
    from ._loading import load_memmap

    was_memmap = td._is_memmap
    state = [(node, node._is_memmap, node._saved_path) for node in _tree_nodes(td)] if was_memmap else []
    if was_memmap:
        td.unlock_()
    try:
        load_memmap(prefix, td.device, out=td, robust_key=robust_key, allow_pickle=allow_pickle, mode=mode,
                    cls=type(td))
    except BaseException:
        if was_memmap:  # nothing changed: put the lock and the memmap flags back
            for node, flag, path in state:
                node._is_memmap, node._saved_path = flag, path
            td._lock_tree()
        raise
    if was_memmap and td._saved_path is not None:
        _mark_memmapped(td)
    return td


# ---------------------------------------------------------------------- make_memmap*
def _check_memmapped(td: Any) -> None:
    if not td._is_memmap:
        raise RuntimeError("Can only make a memmap tensor within a memory-mapped tensordict.")


def _plan_parents(td: Any, path: tuple) -> tuple:
    """(the deepest existing TensorDict on ``path[:-1]``, the keys below it to create, the batch size the new
    entry must start with). Refuses an existing key and a leaf in the way."""
    from ._loading import _as_td, _is_collection

    node = td
    depth = 0
    for key in path[:-1]:
        value = node._tensordict.get(key)
        if value is None:
            break
        if not _is_collection(value):
            raise RuntimeError(f"The key {key!r} holds a leaf, so no entry can be added below it.")
        node = _as_td(value)
        depth += 1
    missing = path[depth:-1]
    if not missing and path[-1] in node._tensordict:
        raise RuntimeError(f"The key {path[-1]} already exists within the target tensordict. Delete that entry "
                           "before overwriting it.")
    return node, missing


def _check_shape(td_batch: torch.Size, shape: torch.Size, key: tuple) -> None:
    if shape[: len(td_batch)] != td_batch:
        raise RuntimeError(
            f"batch dimension mismatch, got self.batch_size={td_batch} and value.shape={shape} for key "
            f"{key[0] if len(key) == 1 else key!r}. The leading dimensions of a value must match the batch size."
        )


def _as_size(shape: Any) -> torch.Size:
    if isinstance(shape, torch.Tensor) and not isinstance(shape, torch.Size):
        if shape.dim() > 1:
            raise TypeError("Nested shapes (a 2-d tensor of shapes) are not supported: torchdict stores strided "
                            "tensors only.")
        return torch.Size(shape.tolist())
    if isinstance(shape, int):
        return torch.Size([shape])
    return torch.Size(shape)


def _folder_of(node: Any) -> str | None:
    return node._saved_path


def _add_to_meta(folder: str, key: str, entry: dict) -> None:
    meta = read_meta(folder)
    if meta.get("format") != FORMAT_NAME or type(meta.get("entries")) is not dict:
        raise RuntimeError(f"The folder {folder} was not written by torchdict, so no entry can be added to it.")
    meta["entries"][key] = entry
    write_meta_atomic(folder, meta)


def _attach(parent: Any, key: str, value: Any) -> None:
    """Put ``value`` at ``key`` in the locked ``parent`` (as a locked parent holds it)."""
    parent._tensordict[key] = value
    if not isinstance(value, torch.Tensor) and parent._is_locked:
        from ._apply import unwrap

        child = unwrap(value)
        child._lock_parents += 1
        child._lock_tree()


def _create_parents(node: Any, missing: tuple) -> Any:
    """Create the nested TensorDicts ``missing`` below ``node`` (memory-mapped in sub-folders); the last one."""
    from .saving import save_collection
    from .tensordict import TensorDict

    for key in missing:
        folder = _folder_of(node)
        name = key_to_filename(key, directory=True)
        child_folder = None if folder is None else folder + os.sep + name
        child = save_collection(TensorDict({}, batch_size=node.batch_size), child_folder)
        if folder is not None:
            _add_to_meta(folder, key, {"kind": "collection", "dir": name})
        _attach(node, key, child)
        node = child
    return node


def _add_leaf(td: Any, key: Any, shape: torch.Size, dtype: torch.dtype, store: Any) -> MemoryMappedTensor:
    """The common path of make_memmap*: check, create the parents, ``store(path or None)`` the leaf, record it."""
    _check_memmapped(td)
    path = key_to_tuple(key)
    node, missing = _plan_parents(td, path)
    _check_shape(node.batch_size, shape, path)
    node = _create_parents(node, missing)
    folder = _folder_of(node)
    name = path[-1]
    file_name = key_to_filename(name) + ".memmap"
    tensor = store(None if folder is None else folder + os.sep + file_name)
    if folder is not None:
        _add_to_meta(folder, name, tensor_entry(file_name, tensor))
    _attach(node, name, tensor)
    return tensor


def make_memmap(td: Any, key: Any, shape: Any, *, dtype: torch.dtype | None, robust_key: bool | None) -> Any:
    """See :meth:`torchdict._persistence_mixin.PersistenceMixin.make_memmap`."""
    size = _as_size(shape)
    dtype = torch.get_default_dtype() if dtype is None else dtype

    def store(file_path: str | None) -> MemoryMappedTensor:
        if file_path is None:
            return MemoryMappedTensor.empty(size, dtype=dtype)
        written = allocate_file(file_path, size.numel() * dtype.itemsize)
        return map_file(file_path, dtype, size, written=written)

    return _add_leaf(td, key, size, dtype, store)


def make_memmap_from_tensor(td: Any, key: Any, tensor: torch.Tensor, *, copy_data: bool, existsok: bool,
                            robust_key: bool | None) -> Any:
    """See :meth:`torchdict._persistence_mixin.PersistenceMixin.make_memmap_from_tensor`."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"make_memmap_from_tensor expects a torch.Tensor, got {type(tensor).__name__}.")

    def store(file_path: str | None) -> MemoryMappedTensor:
        if file_path is None:
            return MemoryMappedTensor.from_tensor(tensor.detach(), copy_data=copy_data)
        if copy_data:
            written = write_tensor_file(file_path, tensor, existsok=existsok)
        else:
            written = allocate_file(file_path, tensor.numel() * tensor.element_size(), existsok=existsok)
        return map_file(file_path, tensor.dtype, tensor.shape, written=written)

    return _add_leaf(td, key, tensor.shape, tensor.dtype, store)


def make_memmap_from_storage(td: Any, key: Any, storage: Any, shape: Any, *, dtype: torch.dtype | None,
                             robust_key: bool | None) -> Any:
    """See :meth:`torchdict._persistence_mixin.PersistenceMixin.make_memmap_from_storage`."""
    size = _as_size(shape)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    untyped = storage.untyped() if isinstance(storage, torch.TypedStorage) else storage
    if untyped.nbytes() < size.numel() * dtype.itemsize:
        raise RuntimeError(f"The storage holds {untyped.nbytes()} bytes, fewer than the {size.numel() * dtype.itemsize} "
                           f"that {dtype} data of shape {list(size)} needs.")

    def store(file_path: str | None) -> MemoryMappedTensor:
        own_file = getattr(untyped, "filename", None)
        if file_path is not None:
            if own_file is None:
                raise RuntimeError(
                    "The storage has no file, so the new entry could not be read back from the folder of the "
                    "TensorDict (load_memmap and memmap_refresh_ would drop it). Use make_memmap_from_tensor to "
                    "copy the data into the folder."
                )
            if os.path.realpath(own_file) != os.path.realpath(file_path):
                raise RuntimeError(f"The storage is mapped from {own_file}, not from {file_path}, the file of the "
                                   "new entry in the folder of the TensorDict.")
        flat = MemoryMappedTensor.from_storage(untyped, dtype=dtype, filename=own_file)
        assert isinstance(flat, MemoryMappedTensor)  # no index: the storage itself, mapped
        if flat.shape == size:
            return flat
        view = torch.Tensor.view(torch.Tensor.__getitem__(flat, slice(0, size.numel())), size)
        return MemoryMappedTensor._wrap(view, flat._mapped_file)

    return _add_leaf(td, key, size, dtype, store)
