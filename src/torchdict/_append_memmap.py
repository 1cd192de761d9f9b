"""``append_memmap``: grow a saved folder along its first batch dimension, without rewriting what it holds.

Each leaf file gets the new rows' bytes at its end (a loader of the old ``meta.json`` ignores them: a file may
be longer than its entry). Then the ``meta.json`` files are rewritten with the new row count. When the folder
holds only a save, the new version is a sibling folder of hard links to the same files plus the new
``meta.json`` files, swapped in at once (:mod:`torchdict._folder_swap`): the path loads as the old rows or all
the new ones, whenever the append stops. Otherwise the ``meta.json`` files are replaced one by one, children
first; a kill between two of them leaves levels with different row counts, which ``load_memmap`` refuses.

Everything (keys, classes, dtypes, trailing shapes, non-tensor values) is checked before the first byte is
written; an error while writing truncates the files back.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from ._meta_json import FORMAT_NAME, META_FILE, read_meta, write_meta_atomic
from .memmap import tensor_byte_chunks
from .nontensor import NonTensorData, NonTensorStack

__all__ = ["append_memmap"]


def _values(value: Any) -> list:
    if isinstance(value, NonTensorData):
        return [value.data]
    return list(value._flat_values()) if hasattr(value, "_flat_values") else list(value.tolist())


def _same(left: Any, right: Any) -> bool:
    try:
        return bool(left == right)
    except Exception:
        return False


def _show(key: tuple) -> str:
    return repr(key[0] if len(key) == 1 else key)


def _check(saved: Any, rows: Any, key: tuple, leaves: list, folders: list) -> None:
    """Check that ``rows`` can extend ``saved`` (a loaded level); collect its leaves and folders."""
    from ._loading import _as_td, _is_collection
    from .tensorclass import is_tensorclass

    where = f"the entry {_show(key)}" if key else "the saved tensordict"
    if tuple(rows.batch_size[1:]) != tuple(saved.batch_size[1:]):
        raise ValueError(f"Cannot append rows of batch size {rows.batch_size} to {where}, of batch size "
                         f"{saved.batch_size}: they differ beyond the first dimension.")
    if is_tensorclass(saved) or is_tensorclass(rows):
        if type(rows) is not type(saved):
            raise ValueError(f"Cannot append a {type(rows).__name__} to {where}, a {type(saved).__name__}.")
        saved, rows = _as_td(saved), _as_td(rows)
    if getattr(saved, "tensordicts", None) is not None:
        raise ValueError(f"Cannot append to {where}: a lazy stack cannot grow.")
    saved_keys, row_keys = list(saved.keys()), list(rows.keys())
    if set(saved_keys) != set(row_keys):
        raise ValueError(f"Cannot append rows with the keys {sorted(row_keys)} to {where}, which has the keys "
                         f"{sorted(saved_keys)}.")
    folders.append(saved._saved_path)
    for name in saved_keys:
        entry_key = key + (name,)
        where = f"the entry {_show(entry_key)}"
        old = saved._get_str(name, None)
        new = rows._get_str(name, None)
        if isinstance(old, NonTensorStack):
            raise ValueError(f"Cannot append to {where}, a NonTensorStack: a stack of non-tensor values cannot grow.")
        if isinstance(old, NonTensorData):
            if not isinstance(new, (NonTensorData, NonTensorStack)) or not all(
                    _same(value, old.data) for value in _values(new)):
                raise ValueError(f"Cannot append to {where}: the saved non-tensor value {old.data!r} stays as it is, "
                                 "so the rows must hold the same value.")
        elif _is_collection(old):
            if not _is_collection(new):
                raise ValueError(f"Cannot append a {type(new).__name__} to {where}, a {type(old).__name__}.")
            _check(old, new, entry_key, leaves, folders)
        elif not isinstance(new, torch.Tensor):
            raise ValueError(f"Cannot append a {type(new).__name__} to {where}, a tensor.")
        elif new.is_nested or old.is_nested:
            raise ValueError(f"Cannot append to {where}: a nested tensor cannot grow.")
        elif new.dtype != old.dtype or new.shape[1:] != old.shape[1:]:
            raise ValueError(f"Cannot append rows of dtype {new.dtype} and shape {tuple(new.shape)} to {where}, of "
                             f"dtype {old.dtype} and shape {tuple(old.shape)}.")
        else:
            leaves.append((old.filename, old.numel() * old.element_size(), new))


def _grown_meta(folder: str, rows: int) -> dict:
    """``folder``'s meta.json with ``rows`` as the first batch dimension (either format)."""
    meta = read_meta(folder)
    if meta.get("format") == FORMAT_NAME:
        meta["batch_size"][0] = rows
        for entry in meta["entries"].values():
            if entry.get("kind") == "tensor":
                entry["shape"][0] = rows
            elif entry.get("kind") == "non_tensor" and entry.get("batch_size"):
                entry["batch_size"][0] = rows
        return meta
    meta["shape"][0] = rows  # upstream's layout
    for entry in meta.values():
        if isinstance(entry, dict) and "dtype" in entry and "shape" in entry:
            entry["shape"][0] = rows
    return meta


def _layout(folder: str) -> dict:
    from ._folder_swap import _is_sibling_name

    layout: dict = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if not _is_sibling_name(entry.name):
                    layout[entry.name] = _layout(entry.path)
            elif entry.is_file(follow_symlinks=False) and not entry.name.endswith(".tmp"):
                layout[entry.name] = None
    return layout


def _link_tree(swap: Any, folder: str, work: str, layout: dict) -> None:
    for name, sub in layout.items():
        if sub is None:
            if name != META_FILE and not swap.link(os.path.join(folder, name), os.path.join(work, name)):
                raise OSError(f"Could not hard-link {os.path.join(folder, name)}: appending needs hard links.")
        else:
            _link_tree(swap, os.path.join(folder, name), os.path.join(work, name), sub)


def _write_rows(leaves: list) -> dict:
    """Append each leaf's new rows to its file; the old sizes (None: the file was created) for a rollback."""
    from ._nofollow import open_in_folder

    old_sizes: dict = {}
    for path, old_nbytes, value in leaves:
        if value.numel() == 0:
            continue
        exists = os.path.lexists(path)
        old_sizes[path] = os.lstat(path).st_size if exists else None
        fd = open_in_folder(path, os.O_WRONLY | os.O_CREAT, 0o666, writing=True)
        try:
            os.lseek(fd, old_nbytes, os.SEEK_SET)  # a file left longer by a failed append is overwritten
            for chunk in tensor_byte_chunks(value):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    return old_sizes


def _roll_back(old_sizes: dict) -> None:
    for path, size in old_sizes.items():
        try:
            if size is None:
                os.unlink(path)
            else:
                os.truncate(path, size)
        except OSError:
            pass


def append_memmap(prefix: str | os.PathLike, rows: Any, *, allow_pickle: bool | None = None) -> None:
    """Append ``rows`` to the TensorDict saved in the folder ``prefix``, along its first batch dimension.

    ``rows`` must have the saved keys, classes, dtypes and trailing shapes; its batch size may differ from the
    saved one in its first dimension only. A non-tensor entry keeps its saved value, which ``rows`` must hold
    too. A saved ``NonTensorStack``, lazy stack or nested tensor, and an archive, cannot grow. Everything is
    checked before anything is written. ``allow_pickle`` lets pickled non-tensor values of the save be read
    to compare them.

    >>> import tempfile, torch, torchdict
    >>> folder = tempfile.mkdtemp()
    >>> _ = torchdict.save(torchdict.TensorDict(a=torch.zeros(3, 2), batch_size=[3]), folder)
    >>> torchdict.append_memmap(folder, torchdict.TensorDict(a=torch.ones(2, 2), batch_size=[2]))
    >>> torchdict.load_memmap(folder)["a"].sum(-1).tolist()
    [0.0, 0.0, 0.0, 2.0, 2.0]
    """
    from ._base import is_tensor_collection
    from ._folder_swap import begin_swap, holds_only_a_save
    from ._loading import load_memmap

    folder = os.path.abspath(os.fspath(prefix))
    if not os.path.isdir(folder):
        raise ValueError(f"append_memmap appends to a directory written by save or memmap, and {prefix} is not one. "
                         "An archive cannot grow: unpack it with unpack_memmap first.")
    if not is_tensor_collection(rows):
        raise TypeError(f"rows must be a tensordict or a tensorclass, got {type(rows)}.")
    saved = load_memmap(folder, allow_pickle=allow_pickle)  # mode None: records each folder (_saved_path)
    if not saved.batch_size or not rows.batch_size:
        raise ValueError("append_memmap appends along the first batch dimension, which the saved tensordict "
                         f"(batch size {saved.batch_size}) and the rows (batch size {rows.batch_size}) must both "
                         "have.")
    leaves: list = []
    folders: list = []
    _check(saved, rows, (), leaves, folders)
    count = saved.batch_size[0] + rows.batch_size[0]
    del saved
    metas = [(path, _grown_meta(path, count)) for path in folders]
    target = os.path.realpath(folder)
    swap = begin_swap(target, folder) if holds_only_a_save(target) else None
    old_sizes: dict = {}
    try:
        old_sizes = _write_rows(leaves)
        if swap is not None:
            layout = _layout(target)
            swap.prepare(layout)
            _link_tree(swap, folder, swap.work, layout)
            for path, meta in reversed(metas):  # children first, the root last
                write_meta_atomic(swap.relocate(path), meta)
            swap.commit()
        else:
            for path, meta in reversed(metas):
                write_meta_atomic(path, meta)
    except BaseException:
        if swap is not None:
            swap.abandon()
        _roll_back(old_sizes)
        raise
