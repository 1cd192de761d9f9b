"""Saving TensorDicts as folders of raw tensor files (memmap, memmap_, memmap_like), and the top-level
``torchdict.save`` / ``load`` / ``memmap`` / ``load_memmap``.

On-disk format (``"format": "torchdict"``, version 1): one folder per TensorDict, holding

- ``<name>.memmap`` per tensor leaf: the raw elements, C order, little-endian, no header;
- ``<name>/`` per nested TensorDict (or tensorclass): a folder of the same format, which loads
  on its own with ``TensorDict.load_memmap(folder / name)``;
- ``<name>.pickle`` per non-tensor value that is not plain JSON, only when the caller passed
  ``allow_pickle=True``;
- ``meta.json``: batch size, device, names, class, and one entry per key (dtype, shape and
  file name of tensors; JSON non-tensor values inline). It is written last, atomically, so a
  folder whose save did not finish has no ``meta.json`` and refuses to load.

A save is planned first (every refusal happens before the first byte is written), then run.
Over an existing save it is written beside it and swapped in (:mod:`torchdict._folder_swap`),
so the path always holds a complete save; into a new folder (or one holding other files, or
with ``memmap_like``) it is written in place: ``meta.json`` files removed root first, tensor
files written (from ``num_threads`` threads with ``num_threads > 1``), ``meta.json`` files
written children first, the root last. No file is written, or sub-folder entered, through a
symlink (:mod:`torchdict._nofollow`).

The other concerns live in their own modules:

- :mod:`torchdict._filenames`: key -> file name (:func:`key_to_filename`, re-exported here);
- :mod:`torchdict._meta_json`: writing, reading and validating ``meta.json``;
- :mod:`torchdict._saved_classes`: the class registry (:func:`register_saved_class`, re-exported);
- :mod:`torchdict._loading`: ``load_memmap``;
- :mod:`torchdict._persistence_mixin`: the persistence members of TensorDict (``td.memmap()``, ``td.save()``, ...);
- :mod:`torchdict.formats.archive`: ``.tdz`` archives (``memmap(archive=True)``, ``pack_memmap``, ...);
- :mod:`torchdict._atomic_save`: ``atomic=True``;
- :mod:`torchdict._memmap_members`: ``load_memmap_``, ``memmap_refresh_``, ``make_memmap*``;
- :mod:`torchdict._upstream_format`: folders written by upstream tensordict 0.15.x;
- :mod:`torchdict._folder_swap`: the crash-safe replacement of an existing save;
- :mod:`torchdict._nofollow`: opening files inside a saved folder without following symlinks;
- :mod:`torchdict.memmap`: ``MemoryMappedTensor`` and the raw file writes and mappings.
"""
from __future__ import annotations

import os
import stat
from typing import Any

import torch

from ._base import TensorCollection, tensordict_class
from ._filenames import key_to_filename
from ._folder_swap import FolderSwap, begin_swap, holds_only_a_save, recover
from ._meta_json import META_FILE, folder_meta, meta_unchanged, remove_meta, tensor_entry, write_meta_atomic
from ._nofollow import link_refused
from ._saved_classes import register_saved_class, saved_class_name
from .memmap import (
    MemoryMappedTensor,
    _anonymous,
    _check_storable,
    allocate_file,
    map_file,
    write_bytes_file,
    write_tensor_file,
)
from .nontensor import NON_TENSOR_TYPES, NonTensorStack
from .nontensor._metadata import metadata_class_name
from ._unbatched import UnbatchedTensor, unbatched_memmap_error


def _load_memmap(*args: Any, **kwargs: Any) -> Any:
    # The loader is imported on first load: ``import torchdict`` doesn't pay for it.
    from ._loading import load_memmap

    return load_memmap(*args, **kwargs)

__all__ = [
    "key_to_filename",
    "load",
    "load_memmap",
    "memmap",
    "register_saved_class",
    "save",
]

_CPU = torch.device("cpu")

# ---------------------------------------------------------------------- JSON values
_JSON_SCALARS = (type(None), bool, int, float, str)


def _is_plain_json(value: Any) -> bool:
    """True when ``json.loads(json.dumps(value)) == value`` with the same types."""
    kind = type(value)
    if kind in _JSON_SCALARS:
        return True
    try:
        if kind is list:
            return all(_is_plain_json(item) for item in value)
        if kind is dict:
            return all(type(k) is str and _is_plain_json(v) for k, v in value.items())
    except RecursionError:  # a self-referencing container
        return False
    return False


def _non_json_error(key_path: tuple, value: Any) -> TypeError:
    return TypeError(
        f"Cannot save the non-tensor entry {_show_key(key_path)} of type {type(value).__name__}: "
        "without pickling, only JSON values are stored (None, bool, int, float, str, and lists or "
        "str-keyed dicts of them). Pass allow_pickle=True to pickle it; loading it back will then "
        "need allow_pickle=True too."
    )


def _show_key(key_path: tuple) -> str:
    return repr(key_path[0] if len(key_path) == 1 else key_path)


def _is_tensordict(value: Any) -> bool:
    return isinstance(value, tensordict_class())


# ---------------------------------------------------------------------- saving: plan
class _Node:
    """One folder of a save: what to write there, computed before anything touches the disk."""

    __slots__ = ("source", "td", "path", "key_path", "entries", "leaves", "children", "non_tensors",
                 "pickles", "class_name")

    def __init__(self, source: Any, td: Any, path: str | None, key_path: tuple) -> None:
        self.source = source  # the TensorDict or tensorclass instance being saved
        self.td = td  # its TensorDict
        self.path = path
        self.key_path = key_path
        self.entries: dict = {}  # key -> its meta.json entry, in insertion order
        self.leaves: list = []  # (key, tensor, file path or None)
        self.children: list = []  # (key, _Node)
        self.non_tensors: list = []  # (key, leaf) copied into the result
        self.pickles: list = []  # (file path, bytes)
        self.class_name = None if _is_tensordict(source) else saved_class_name(type(source))


class _Options:
    __slots__ = ("like", "copy_existing", "existsok", "allow_pickle", "share")

    def __init__(self, like: bool, copy_existing: bool, existsok: bool, allow_pickle: bool,
                 share: bool = False) -> None:
        self.like = like
        self.copy_existing = copy_existing
        self.existsok = existsok
        self.allow_pickle = allow_pickle
        self.share = share  # share_non_tensor: the result's non-tensor leaves read and write the folder


def _collection_td(value: Any) -> Any:
    return value if _is_tensordict(value) else value._tensordict


def _plan(source: Any, path: str | None, key_path: tuple, options: _Options) -> _Node:
    td = _collection_td(source)
    node = _Node(source, td, path, key_path)
    for key, value in td._tensordict.items():
        full_key = key_path + (key,)
        if isinstance(value, torch.Tensor):
            if type(value) is not torch.Tensor and isinstance(value, UnbatchedTensor):
                raise unbatched_memmap_error(key)  # upstream's refusal, before anything is written
            _check_storable(value, full_key[0] if len(full_key) == 1 else full_key)
            file_path = None
            if path is not None:
                file_name = key_to_filename(key) + ".memmap"
                file_path = path + os.sep + file_name
                _check_target(value, file_path, options)
                node.entries[key] = tensor_entry(file_name, value)
            node.leaves.append((key, value, file_path))
        elif isinstance(value, TensorCollection):
            if not _is_tensordict(value) and not isinstance(getattr(value, "_tensordict", None), tensordict_class()):
                # (a lazy stack held as an entry: no storage dict of its own to save at this level)
                raise TypeError(f"Cannot save the entry {_show_key(full_key)}: a {type(value).__name__} held in a "
                                "TensorDict is not supported by memmap/save; save it on its own (it has its own "
                                "memmap) or call to_tensordict() on it first.")
            child_path = None
            if path is not None:
                dir_name = key_to_filename(key, directory=True)
                child_path = path + os.sep + dir_name
                node.entries[key] = {"kind": "collection", "dir": dir_name}
            node.children.append((key, _plan(value, child_path, full_key, options)))
        elif type(value) in NON_TENSOR_TYPES:  # (a MetaData too)
            node.non_tensors.append((key, value))
            if path is not None:
                node.entries[key] = _non_tensor_entry(key, value, path, full_key, node, options)
        else:
            raise TypeError(f"Cannot save the entry {_show_key(full_key)} of type {type(value).__name__}.")
    return node


def _check_target(tensor: torch.Tensor, file_path: str, options: _Options) -> None:
    source_file = getattr(tensor, "_mapped_file", None)
    if source_file is not None and not options.like:
        same = os.path.abspath(source_file.path) == os.path.abspath(file_path)
        if not same and not options.copy_existing:
            raise RuntimeError(
                f"A filename was provided ({file_path}) but the tensor already has a file associated "
                f"({source_file.path}). To copy the tensor onto the new location, pass copy_existing=True."
            )
        if same:
            return
    if not options.existsok and os.path.lexists(file_path):
        raise RuntimeError(f"The file {file_path} already exists.")


def _non_tensor_entry(key: str, leaf: Any, path: str, key_path: tuple, node: _Node,
                      options: _Options) -> dict:
    is_stack = type(leaf) is NonTensorStack
    entry: dict = {
        "kind": "non_tensor_stack" if is_stack else "non_tensor",
        "batch_size": list(leaf.batch_size),
    }
    class_name = None if is_stack else metadata_class_name(leaf)
    if class_name is not None:
        entry["class"] = class_name  # a MetaData loads back as one
    value = leaf._flat_values() if is_stack else leaf.data
    if _is_plain_json(value):
        entry["value"] = value
        return entry
    if not options.allow_pickle:
        bad = next((item for item in value if not _is_plain_json(item)), value) if is_stack else value
        raise _non_json_error(key_path, bad)
    import pickle

    file_name = key_to_filename(key) + ".pickle"
    node.pickles.append((os.path.join(path, file_name), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)))
    entry["pickle"] = file_name
    return entry


def _walk(node: _Node):
    yield node
    for _, child in node.children:
        yield from _walk(child)


def _refuse_links(node: _Node) -> None:
    """Refuse a symlink at any path this in-place save would write or enter, before writing anything."""
    if node.path is None:
        return  # anonymous shared memory: no folder
    try:
        with os.scandir(node.path) as entries:
            links = {entry.name for entry in entries if entry.is_symlink()}
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there yet, so nothing below either
    if links:
        names = [META_FILE]
        names += [os.path.basename(file_path) for _, _, file_path in node.leaves]
        names += [os.path.basename(file_path) for file_path, _ in node.pickles]
        names += [os.path.basename(child.path) for _, child in node.children]
        for name in names:
            if name in links:
                raise link_refused(node.path + os.sep + name, writing=True)
    for _, child in node.children:
        _refuse_links(child)


def _layout(node: _Node) -> dict:
    """The names a save writes in ``node``'s folder: None for a file, the layout of a sub-folder."""
    layout: dict = {os.path.basename(file_path): None for _, _, file_path in node.leaves}
    layout.update((os.path.basename(file_path), None) for file_path, _ in node.pickles)
    layout.update((os.path.basename(child.path), _layout(child)) for _, child in node.children)
    return layout


def _replaced_save(path: str, options: _Options) -> str | None:
    """The real path of the save this one replaces whole (swapped), or None to write in place.

    ``memmap_like`` keeps the bytes of files that exist, so it always works in place; so does
    a save into a new folder, or into one holding anything but a save (see holds_only_a_save).
    """
    if options.like:
        return None
    try:
        if not stat.S_ISDIR(os.stat(path).st_mode):
            return None
    except FileNotFoundError:
        return None
    real = os.path.realpath(path)  # the folder is swapped where it lies; a symlink to it stays
    return real if holds_only_a_save(real) else None


# ---------------------------------------------------------------------- saving: execute
def _store_leaf(tensor: torch.Tensor, file_path: str | None, like: bool, swap: FolderSwap | None) -> torch.Tensor:
    """Write (or allocate) one leaf and return it mapped (a MemoryMappedTensor, or the tensor given when it
    already maps the file: a plain alias of one can, see memmap.PLAIN_ALIAS).

    ``file_path`` is the leaf's final path; with a swap the file is written in the work
    folder (under its final name once swapped in), so the tensor reports the final path.
    """
    if file_path is None:
        if like:
            return _anonymous(tensor.dtype, tensor.shape)
        return MemoryMappedTensor.from_tensor(tensor.detach())
    write_path = file_path if swap is None else swap.relocate(file_path)
    mapped = getattr(tensor, "_mapped_file", None)
    if (
        mapped is not None
        and mapped.writable
        and os.path.abspath(mapped.path) == os.path.abspath(file_path)
        and tensor.storage_offset() == 0
        and tensor.is_contiguous()
        and tensor.untyped_storage().nbytes() == tensor.nbytes
        and _still_named(mapped, file_path)
    ):
        # Already this very file, whole and in order: nothing to write. A swap links it into
        # the new folder, so the file (and every mapping of it) stays the saved one.
        if swap is None or swap.link(file_path, write_path):
            return tensor
    if like:
        written = allocate_file(write_path, tensor.numel() * tensor.element_size())
    else:
        written = write_tensor_file(write_path, tensor)
    return map_file(write_path, tensor.dtype, tensor.shape, written=written, shown_path=file_path)


def _still_named(mapped: Any, path: str) -> bool:
    """True when ``path`` still names the file ``mapped`` maps (a later save may have replaced it)."""
    if mapped.identity is None:
        return True  # mapped without knowing the file: trust the path, as the name is all there is
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return (info.st_dev, info.st_ino) == mapped.identity


def _make_folder(path: str, is_root: bool) -> bool:
    """Create ``path`` (its parents too for the root); True when it did not exist before.

    Only the root may be a symlink (to the folder the caller chose); a sub-folder may not.
    """
    try:
        mode = os.stat(path).st_mode if is_root else os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            return False  # the common case when saving again: one stat, no failing mkdir
        if stat.S_ISLNK(mode):
            raise link_refused(path, writing=True)
        raise NotADirectoryError(f"Cannot save into {path}: it exists and is not a folder.")
    except FileNotFoundError:
        pass
    try:
        os.mkdir(path)
    except FileNotFoundError:
        if not is_root:
            raise
        os.makedirs(path, exist_ok=True)
    except FileExistsError:  # created meanwhile by someone else
        if not os.path.isdir(path):
            raise NotADirectoryError(f"Cannot save into {path}: it exists and is not a folder.") from None
        return False
    return True


def _run_in_threads(run: Any, jobs: list, num_threads: int) -> list:
    """``[run(job) for job in jobs]`` from ``num_threads`` threads (this one included), largest leaf first.

    The workers pull jobs from one shared iterator (``next`` on a list iterator is atomic
    under the GIL) rather than through a ThreadPoolExecutor: one future, lock and GIL
    hand-off per file cost milliseconds per save of a large state dict. The first error
    stops the other workers from taking new jobs and is raised here.
    """
    import threading

    order = iter(sorted(range(len(jobs)), key=lambda i: -jobs[i][2].nbytes))
    results: list = [None] * len(jobs)
    errors: list = []

    def work() -> None:
        try:
            for index in order:
                if errors:
                    return
                results[index] = run(jobs[index])
        except BaseException as error:  # re-raised by the calling thread
            errors.append(error)

    helpers = [threading.Thread(target=work, daemon=True) for _ in range(min(num_threads, len(jobs)) - 1)]
    for helper in helpers:
        helper.start()
    work()
    for helper in helpers:
        helper.join()
    if errors:
        raise errors[0]
    return results


def _execute(root: _Node, options: _Options, num_threads: int, inplace: bool, replaced: str | None) -> Any:
    # Before the data: without a folder, the shared values' own folder is written (and its refusals made) first.
    shared = _shared_values(root, options) if options.share else None
    swap = None if replaced is None or root.path is None else begin_swap(replaced, root.path)
    try:
        mapped = _write(root, options, num_threads, swap)
        if swap is not None:
            swap.commit()
    except BaseException:
        if swap is not None:
            swap.abandon()
        raise
    result = _assemble(root, mapped, inplace, shared)
    result_td = _collection_td(result)
    result_td._lock_tree()
    return result


def _write(root: _Node, options: _Options, num_threads: int, swap: FolderSwap | None) -> dict:
    """Write every file of the save (into the work folder with a swap); the stored leaves by (node, key)."""
    nodes = list(_walk(root))
    jobs = [(node, key, tensor, file_path) for node in nodes for key, tensor, file_path in node.leaves]
    # Made first: a missing tqdm is reported before anything on disk changes.
    progress = None if options.like else _progress_bar(jobs, root.path)
    try:
        return _write_files(root, nodes, jobs, options, num_threads, swap, progress)
    finally:
        if progress is not None:
            progress.close()


def _write_files(root: _Node, nodes: list, jobs: list, options: _Options, num_threads: int,
                 swap: FolderSwap | None, progress: Any) -> dict:
    metas: dict = {}

    def where(path: str) -> str:
        return path if swap is None else swap.relocate(path)

    if root.path is not None:
        metas = {id(node): folder_meta(node.td._batch_size, node.td._names, node.class_name, node.entries)
                 for node in nodes}
        if swap is not None:
            swap.prepare(_layout(root))  # the work folder is not the save until swapped in
        else:
            stale = []
            for node in nodes:  # root first, so that parents exist before their children
                if options.like and meta_unchanged(node.path, metas[id(node)]):
                    # memmap_like writes no data: files only get (re)sized to what this very
                    # meta.json already describes, so the folder stays consistent throughout.
                    # (Its meta.json exists, so the folder does: no second stat.)
                    metas[id(node)] = None
                elif not _make_folder(node.path, node is root):
                    stale.append(node)
            for node in stale:
                # Mark the folder incomplete before touching a file: a save killed from here on
                # leaves no meta.json that would describe half-written data.
                remove_meta(node.path)
    stored: list

    def run(job: tuple) -> torch.Tensor:
        leaf = _store_leaf(job[2], job[3], options.like, swap)
        if progress is not None:
            progress.update(job[2].numel() * job[2].element_size())
        return leaf

    if num_threads and num_threads > 1 and len(jobs) > 1:
        stored = _run_in_threads(run, jobs, num_threads)
    else:
        stored = [run(job) for job in jobs]
    mapped = {(id(job[0]), job[1]): result for job, result in zip(jobs, stored)}
    if root.path is not None:
        for node in nodes:
            for file_path, payload in node.pickles:
                write_bytes_file(where(file_path), payload)
        # Children before parents, the root last: the root's meta.json marks the save complete.
        for node in reversed(nodes):
            if metas[id(node)] is not None:
                write_meta_atomic(where(node.path), metas[id(node)])
    return mapped


def _shared_values(root: _Node, options: _Options) -> dict:
    """Where each non-tensor leaf's shared value lives, by (node, key): its entry in the saved folder, or, for a
    save without a folder, in a private folder holding only the non-tensor entries (see _shared_nontensor)."""
    from .nontensor._shared import SharedValue, anonymous_folder

    holders = _walk(root)
    if root.path is None:
        shadow = _plan(root.source, anonymous_folder(), (), _Options(True, False, True, options.allow_pickle))
        for node in _walk(shadow):
            os.makedirs(node.path, exist_ok=True)
            for file_path, payload in node.pickles:
                write_bytes_file(file_path, payload)
            entries = {key: entry for key, entry in node.entries.items() if entry["kind"] != "tensor"}
            write_meta_atomic(node.path, folder_meta(node.td._batch_size, node.td._names, node.class_name, entries))
        holders = _walk(shadow)
    return {(id(node), key): SharedValue(holder.path, key, options.allow_pickle)
            for node, holder in zip(_walk(root), holders) for key, _ in node.non_tensors}


def _progress_bar(jobs: list, path: str | None) -> Any:
    """A bar of the bytes this save writes, when progress bars are on (``torchdict.set_progress_bar``)."""
    from ._progress import byte_progress, progress_bar_enabled

    if not progress_bar_enabled():
        return None
    total = sum(job[2].numel() * job[2].element_size() for job in jobs)
    return byte_progress(total, f"memmap {os.path.basename(path) if path else '(shared memory)'}")


def _assemble(node: _Node, mapped: dict, inplace: bool, shared: dict | None = None) -> Any:
    """Build the memory-mapped result (or update the source in place) from the stored leaves."""
    children = {key: _assemble(child, mapped, inplace, shared) for key, child in node.children}
    non_tensors = {key: leaf._to_device(_CPU) for key, leaf in node.non_tensors}
    if shared is not None and non_tensors:
        from .nontensor._shared import share_leaf

        non_tensors = {key: share_leaf(leaf, shared[(id(node), key)]) for key, leaf in non_tensors.items()}
    td = node.td
    node_id = id(node)
    if inplace:
        storage = td._tensordict
        for key in list(storage):
            if key in children:
                continue  # updated in place by the recursion
            storage[key] = mapped[(node_id, key)] if (node_id, key) in mapped else non_tensors[key]
        td._device = _CPU
        target = td
        result = node.source
    else:
        storage = {}
        for key in td._tensordict:
            if key in children:
                storage[key] = children[key]
            elif (node_id, key) in mapped:
                storage[key] = mapped[(node_id, key)]
            else:
                storage[key] = non_tensors[key]
        target = type(td)._new_unsafe(storage, td._batch_size, _CPU,
                                      None if td._names is None else list(td._names))
        result = target if node.class_name is None else node.source._rewrap(target)
    target._is_memmap = True
    target._saved_path = node.path
    return result


def save_collection(source: Any, prefix: Any = None, *, copy_existing: bool = False, num_threads: int = 0,
                    return_early: bool = False, existsok: bool = True, allow_pickle: bool = False,
                    like: bool = False, inplace: bool = False, share_non_tensor: bool = False,
                    robust_key: bool | None = True, archive: bool | None = None,
                    compression: str | int | None = None, atomic: bool = False) -> Any:
    """Memory-map a TensorDict or tensorclass instance (the engine behind ``memmap*``).

    Everything that can be refused (bad keys, non-JSON values, existing files, symlinks)
    is refused before the first byte is written. Over an existing save, the new one is
    written beside it and swapped in (see :mod:`torchdict._folder_swap`). ``archive`` (or a
    ``prefix`` ending in ``.tdz``) writes one zip file instead (:mod:`torchdict.formats.archive`);
    ``atomic=True`` writes a new folder beside ``prefix`` and renames it into place
    (:mod:`torchdict._atomic_save`).
    """
    if archive is None:
        archive = not inplace and prefix is not None and is_archive_path(prefix)
    check_save_keywords(robust_key, share_non_tensor, archive=bool(archive))
    if archive:
        if inplace:
            raise ValueError("memmap_ cannot write an archive: use memmap(...) or save(...) with a '.tdz' path.")
        from .formats.archive import save_archive

        def write() -> Any:
            return save_archive(source, prefix, like=like, copy_existing=copy_existing, num_threads=num_threads,
                                compression=compression, existsok=existsok, allow_pickle=allow_pickle)

        return _in_background(write) if return_early else write()
    if compression is not None:
        raise ValueError("compression is only supported when writing a memmap archive (pass archive=True or use a "
                         "'.tdz' prefix).")
    if atomic:
        from ._atomic_save import save_atomically

        def write_atomically() -> Any:
            return save_atomically(source, prefix, existsok, lambda folder: save_collection(
                source, folder, copy_existing=copy_existing, num_threads=num_threads, existsok=True,
                allow_pickle=allow_pickle, like=like, inplace=inplace, share_non_tensor=share_non_tensor))

        return _in_background(write_atomically) if return_early else write_atomically()
    path = None if prefix is None else os.path.abspath(os.fspath(prefix))
    if path is not None and not os.path.exists(path):
        recover(os.path.realpath(path))  # a swap killed between its two renames: finish it first
    options = _Options(like, copy_existing, existsok, allow_pickle, bool(share_non_tensor))
    root = _plan(source, path, (), options)
    replaced = None
    if path is not None:
        replaced = _replaced_save(path, options)
        if replaced is None:
            _refuse_links(root)  # a swap writes a new folder: nothing in the old one is written
        for node in _walk(root):
            if node.class_name is not None:
                register_saved_class(type(node.source))
    if not return_early:
        return _execute(root, options, num_threads, inplace, replaced)
    return _in_background(lambda: _execute(root, options, num_threads, inplace, replaced))


def _in_background(work: Any) -> Any:
    """A ``TensorDictFuture`` (a ``concurrent.futures.Future`` too) of ``work()``, run in a thread of its own:
    ``result()`` returns what ``work()`` returns (the saved collection)."""
    from concurrent.futures import ThreadPoolExecutor

    from ._future import TensorDictFuture

    executor = ThreadPoolExecutor(max_workers=1)
    future = executor.submit(work)
    executor.shutdown(wait=False)
    return TensorDictFuture([future], None)


def is_archive_path(prefix: Any) -> bool:
    """True when ``prefix`` names a ``.tdz`` file: where ``memmap`` writes an archive by default.

    >>> is_archive_path("ckpt/model.tdz"), is_archive_path("ckpt/model")
    (True, False)
    """
    import pathlib

    return pathlib.PurePath(os.fspath(prefix)).suffix == ".tdz"


def check_save_keywords(robust_key: Any, share_non_tensor: Any, *, archive: bool = False) -> None:
    """Refuse the values of upstream's keywords that torchdict can't honour (before anything is written).

    ``robust_key``: keys are always escaped into file names (the legacy raw names could escape the
    folder), so ``False`` writes the same names as ``True``; only its type is checked.
    ``share_non_tensor=True`` shares the non-tensor values through the saved folder's files
    (:mod:`torchdict.nontensor._shared`), which an archive, one zip file, can't rewrite in place.
    """
    if robust_key is not None and not isinstance(robust_key, bool):
        raise TypeError(f"robust_key must be a bool or None, got {type(robust_key).__name__}.")
    if share_non_tensor and archive:
        raise ValueError(
            "share_non_tensor=True needs a folder: the non-tensor values of a '.tdz' archive can't be rewritten "
            "in place, so they can't be shared. Save to a folder (a prefix without '.tdz', archive=False) to "
            "share them."
        )


# ---------------------------------------------------------------------- top-level functions (torchdict.save, ...)
def memmap(data: Any, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
           return_early: bool = False, share_non_tensor: bool = False, existsok: bool = True,
           robust_key: bool | None = True, archive: bool | None = None, compression: str | int | None = None,
           atomic: bool = False) -> Any:
    """``data.memmap(...)``: a locked, memory-mapped copy of ``data`` written to ``prefix`` (a ``.tdz`` path
    writes an archive). See :meth:`torchdict.TensorDict.memmap`.

    >>> import torch, torchdict
    >>> mapped = torchdict.memmap(torchdict.TensorDict(a=torch.zeros(3), batch_size=[3]))
    >>> type(mapped["a"]).__name__, mapped.is_locked
    ('MemoryMappedTensor', True)
    """
    if archive or (archive is None and prefix is not None and is_archive_path(prefix)):
        return _save_any_archive(data, prefix, copy_existing, num_threads, return_early, share_non_tensor,
                                 robust_key, compression)
    return data.memmap(prefix, copy_existing, num_threads=num_threads, return_early=return_early,
                       share_non_tensor=share_non_tensor, existsok=existsok, robust_key=robust_key, archive=False,
                       compression=compression, atomic=atomic)


def save(data: Any, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
         return_early: bool = False, share_non_tensor: bool = False, robust_key: bool | None = True,
         archive: bool | None = None, compression: str | int | None = None, atomic: bool = False) -> Any:
    """Save ``data`` to ``prefix`` (a folder, or a ``.tdz`` archive) and return its memory-mapped copy:
    :func:`memmap` with ``existsok=True``. Read it back with :func:`load`.

    >>> import tempfile, torch, torchdict
    >>> folder = tempfile.mkdtemp()
    >>> _ = torchdict.save(torchdict.TensorDict(a=torch.zeros(3), b={"c": torch.ones(3, 2)}, batch_size=[3]), folder)
    >>> torchdict.load(folder)["b", "c"].shape
    torch.Size([3, 2])
    """
    return memmap(data, prefix, copy_existing, num_threads=num_threads, return_early=return_early,
                  share_non_tensor=share_non_tensor, existsok=True, robust_key=robust_key, archive=archive,
                  compression=compression, atomic=atomic)


def _save_any_archive(data: Any, prefix: Any, copy_existing: bool, num_threads: int, return_early: bool,
                      share_non_tensor: bool, robust_key: Any, compression: Any) -> Any:
    """An archive of any collection (a lazy stack or a lone non-tensor leaf too): their own ``memmap`` methods
    write folders only."""
    check_save_keywords(robust_key, share_non_tensor, archive=True)
    from .formats.archive import save_archive

    def write() -> Any:
        return save_archive(data, prefix, copy_existing=copy_existing, num_threads=num_threads,
                            compression=compression, existsok=True)

    return _in_background(write) if return_early else write()


def load(prefix: Any, device: Any = None, non_blocking: bool = False, *, out: Any = None,
         robust_key: bool | None = True, subpath: Any = None, mode: str | None = None, num_threads: int = 0,
         allow_pickle: bool | None = None) -> Any:
    """Load what :func:`save` wrote to ``prefix`` (a folder or a ``.tdz`` archive), of the class it was
    saved from; the same as :func:`load_memmap`. See :meth:`torchdict.TensorDict.load_memmap`.

    >>> import tempfile, torch, torchdict
    >>> folder = tempfile.mkdtemp()
    >>> _ = torchdict.save(torchdict.TensorDict(a=torch.arange(3), batch_size=[3]), folder)
    >>> torchdict.load(folder)["a"].tolist()
    [0, 1, 2]
    """
    return load_memmap(prefix, device, non_blocking, out=out, robust_key=robust_key, subpath=subpath, mode=mode,
                       num_threads=num_threads, allow_pickle=allow_pickle)


def load_memmap(prefix: Any, device: Any = None, non_blocking: bool = False, *, out: Any = None,
                         robust_key: bool | None = True, subpath: Any = None, mode: str | None = None,
                         num_threads: int = 0, allow_pickle: bool | None = None) -> Any:
    """``torchdict.load_memmap``: load a folder or archive written by :func:`memmap` / :func:`save`.

    >>> import tempfile, torch, torchdict
    >>> folder = tempfile.mkdtemp()
    >>> _ = torchdict.memmap(torchdict.TensorDict(a=torch.zeros(3), batch_size=[3]), folder)
    >>> type(torchdict.load_memmap(folder)["a"]).__name__
    'MemoryMappedTensor'
    """
    return _load_memmap(prefix, device, non_blocking, out=out, robust_key=robust_key, subpath=subpath, mode=mode,
                        num_threads=num_threads, allow_pickle=allow_pickle)

