"""``share_non_tensor=True``: the non-tensor values of a memory-mapped TensorDict, shared by the processes
that hold it.

A shared value lives in the saved folder, where the save put it: the entry of its key in the folder's
``meta.json`` (inline JSON, or the ``<key>.pickle`` file the entry names), or, for a lone
``NonTensorData`` / ``NonTensorStack`` saved on its own, that folder's ``meta.json`` in upstream's layout.
So the folder always holds the current value, and ``load_memmap`` reads it too.

A shared leaf is a plain ``NonTensorData`` / ``NonTensorStack`` whose value slots are left empty and whose
``_shared`` slot holds a :class:`SharedValue` (where the value lives):

- **Reads.** Reading an empty slot fails, and the ``__getattr__`` this module installs on the two classes
  answers with the value read from the folder: ``td["key"]``, ``leaf.data``, ``leaf.tolist()`` and every
  internal use of the value see what the last writer wrote, in any process. A read costs one ``stat`` of
  ``meta.json`` when the file has not been replaced since the last read (the parsed file is kept, with an open
  descriptor on it, so that the inode it was read from can't be reused by a newer file while compared).
- **Writes.** ``set_`` / ``update_`` / ``set(..., inplace=True)`` on the TensorDict, ``td[index] = ...`` and
  ``update_at_`` (a stack's elements), and ``leaf.update_`` / ``leaf.copy_`` / ``leaf.data = ...`` write the
  folder rather than the leaf: under an ``flock`` on the folder, ``meta.json`` is read, its entry replaced and
  the file written again atomically (a temporary file, then ``os.replace``). A value JSON can't hold needs the
  ``allow_pickle=True`` the save was given; it is refused before anything is written.
- **Processes.** Pickling a shared leaf (``multiprocessing``, spawn included) sends where the value lives, not
  the value: the other process reads and writes the same folder.

The ``__getattr__`` (and the pickling hooks) are installed on the classes by the first shared leaf a process
makes or receives: a class with ``__getattr__`` pays for it on every attribute lookup (``td["key"]`` on a
non-tensor entry gets ~10 ns slower), so a process that never shares doesn't get it.

Copies are not shared, as upstream's: ``clone()``, ``copy.deepcopy``, ``to(device)``, and the leaves of
``td[index]``, ``td.reshape(...)`` and the like hold the value the entry had when they were made.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional

import torch

from .. import nontensor as _core
from ._io import shared_handle

__all__ = [
    "SharedValue",
    "anonymous_folder",
    "check_whole",
    "check_write_at",
    "install",
    "rebase_shared",
    "share_leaf",
    "write_at",
    "write_values",
    "write_whole",
]

_META = "meta.json"
_DATA_PICKLE = "other.pickle"  # a lone NonTensorData's pickled value ({"data": value}), upstream's name
_STACK_PICKLE = "pickle.pkl"  # a lone NonTensorStack's pickled nested list, upstream's name

_MISMATCH = (
    "You're attempting to update a leaf in-place with a shared tensordict, but the new value does not match the "
    "previous. A shared NonTensorData holds one value for its whole batch: write the entry as a whole (set_, "
    "update_), or save a NonTensorStack to write values per element."
)


# ---------------------------------------------------------------------- reading files, kept while unchanged
# path -> (fd, st_dev, st_ino, parsed content). The descriptor pins the inode: while it is open, no newer file
# can get the same inode number, so "same (dev, ino) as the path now" means "the file that was parsed".
_PINNED: dict = {}
_PIN_LIMIT = 64  # open descriptors at most; past it, the least recently pinned file is read again when next used
_pin_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _pin_lock
    _pin_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _read_fd(fd: int) -> bytes:
    chunks: list = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _current(path: str, parse: Callable[[bytes], Any]) -> Any:
    """``parse`` of the file at ``path`` now; parsed again only when the file was replaced since the last call."""
    from .._nofollow import open_in_folder

    pinned = _PINNED.get(path)
    if pinned is not None:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            info = None
        if info is not None and info.st_ino == pinned[2] and info.st_dev == pinned[1]:
            return pinned[3]
    try:
        fd = open_in_folder(path, os.O_RDONLY, writing=False)
    except FileNotFoundError:
        if pinned is not None:
            # Replaced by a save that writes in place (it removes meta.json first): the last value read stands.
            return pinned[3]
        raise RuntimeError(f"Cannot read the shared non-tensor value: {path} is missing (the folder was "
                           "deleted or moved, or the process that made it exited).") from None
    try:
        info = os.fstat(fd)
        parsed = parse(_read_fd(fd))
    except BaseException:
        os.close(fd)
        raise
    with _pin_lock:
        old = _PINNED.pop(path, None)
        evicted = []
        while len(_PINNED) >= _PIN_LIMIT:
            evicted.append(_PINNED.pop(next(iter(_PINNED))))
        _PINNED[path] = (fd, info.st_dev, info.st_ino, parsed)
    for item in ([old] if old is not None else []) + evicted:
        os.close(item[0])
    return parsed


def _locked_folder(folder: str) -> Any:
    """A context holding an exclusive ``flock`` on ``folder`` (the folder the path names once the lock is held:
    a save swapping a new folder in takes the same lock)."""
    from contextlib import contextmanager

    @contextmanager
    def hold() -> Any:
        try:
            import fcntl
        except ImportError:  # Windows: writers of one folder must not overlap
            yield
            return
        flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
        for _ in range(64):
            fd = os.open(folder, flags)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held, named = os.fstat(fd), os.stat(folder)
                if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                    yield
                    return
            finally:
                os.close(fd)  # releases the lock
        raise RuntimeError(f"Could not lock {folder} to write a shared non-tensor value: it keeps being replaced.")

    return hold()


# ---------------------------------------------------------------------- where a value lives
class SharedValue:
    """Where a shared leaf's value lives: ``folder``'s ``meta.json`` entry ``key``, or, with ``key`` None, the
    folder of a lone leaf (upstream's layout, where a stack's values are nested lists: ``stack_shape`` is its
    batch size).

    ``allow_pickle``: the save's permission, which reading and writing a value JSON can't hold need.
    """

    __slots__ = ("folder", "key", "allow_pickle", "stack_shape")

    def __init__(self, folder: str, key: Optional[str], allow_pickle: bool,
                 stack_shape: Optional[tuple] = None) -> None:
        self.folder = folder
        self.key = key
        self.allow_pickle = allow_pickle
        self.stack_shape = stack_shape

    def __getstate__(self) -> tuple:
        return (self.folder, self.key, self.allow_pickle, self.stack_shape)

    def __setstate__(self, state: tuple) -> None:
        self.folder, self.key, self.allow_pickle, self.stack_shape = state

    def __repr__(self) -> str:
        where = f"{self.folder}/{_META}" + ("" if self.key is None else f" entry {self.key!r}")
        return f"SharedValue({where})"

    # reading
    def _meta_path(self) -> str:
        return self.folder + os.sep + _META

    def _unpickle(self, name: str) -> Any:
        if not self.allow_pickle:
            raise RuntimeError(f"Refusing to load pickled non-tensor data from {os.path.join(self.folder, name)}: "
                               "the save that shared it was not given allow_pickle=True.")
        import pickle

        from .._meta_json import entry_path

        return _current(entry_path(self.folder, name), pickle.loads)

    def _parse_meta(self, text: bytes) -> dict:
        from .._meta_json import parse_meta

        return parse_meta(self.folder, text)

    def read(self) -> Any:
        """The value now: a NonTensorData's value, or a stack's values, flat."""
        meta = _current(self._meta_path(), self._parse_meta)
        if self.key is None:
            return self._lone_value(meta)
        entry = _entry_of(meta, self.folder, self.key)
        if "pickle" in entry:
            return self._unpickle(entry["pickle"])
        if "value" in entry:
            return entry["value"]
        from .._meta_json import corrupt_meta

        raise corrupt_meta(self.folder, f"entry {self.key!r} has no value")

    def _lone_value(self, meta: dict) -> Any:
        if self.stack_shape is None:
            return meta["data"] if "data" in meta else self._unpickle(_DATA_PICKLE)["data"]
        data = meta.get("data")
        if data == _STACK_PICKLE:
            data = self._unpickle(_STACK_PICKLE)
        return _flatten(data, len(self.stack_shape))

    # writing
    def prepare(self, value: Any) -> tuple:
        """``value`` as it will be written: ``("json", value)`` or ``("pickle", bytes)``; a value JSON can't hold
        without ``allow_pickle`` raises ``TypeError`` (nothing written)."""
        from ..saving import _is_plain_json

        if _is_plain_json(value):
            return ("json", value)
        if not self.allow_pickle:
            where = "a lone non-tensor leaf" if self.key is None else f"the non-tensor entry {self.key!r}"
            raise TypeError(
                f"Cannot write a value of type {type(value).__name__} into {where} shared in {self.folder}: "
                "without pickling, only JSON values are stored (None, bool, int, float, str, and lists or "
                "str-keyed dicts of them). Save with allow_pickle=True to share such values."
            )
        import pickle

        return ("pickle", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def write(self, value: Any) -> None:
        """Replace the value (checked first, then written under the folder's lock)."""
        prepared = self.prepare(value)
        with _locked_folder(self.folder):
            self._store(prepared, value)

    def update(self, change: Callable[[Any], Any]) -> None:
        """``value = change(value)`` under the folder's lock (no other writer in between)."""
        with _locked_folder(self.folder):
            meta = self._fresh_meta()
            current = self._lone_value(meta) if self.key is None else self._entry_value(meta)
            new = change(current)
            self._store(self.prepare(new), new)

    def _fresh_meta(self) -> dict:
        from .._meta_json import read_meta

        return read_meta(self.folder)

    def _entry_value(self, meta: dict) -> Any:
        entry = _entry_of(meta, self.folder, self.key)
        if "pickle" in entry:
            return self._unpickle(entry["pickle"])
        return entry.get("value")

    def _store(self, prepared: tuple, value: Any) -> None:
        if self.key is None:
            self._store_lone(value)
            return
        from .._filenames import key_to_filename
        from .._meta_json import entry_path, write_file_atomic, write_meta_atomic

        meta = self._fresh_meta()
        entry = _entry_of(meta, self.folder, self.key)
        old_pickle = entry.get("pickle")
        new_entry = {name: item for name, item in entry.items() if name not in ("value", "pickle")}
        kind, payload = prepared
        if kind == "json":
            new_entry["value"] = payload
        else:
            name = key_to_filename(self.key) + ".pickle"
            write_file_atomic(self.folder, name, payload)
            new_entry["pickle"] = name
        meta["entries"][self.key] = new_entry  # the key exists: its place in the order is kept
        write_meta_atomic(self.folder, meta)
        if old_pickle is not None and kind == "json":
            try:
                os.unlink(entry_path(self.folder, old_pickle))
            except FileNotFoundError:
                pass

    def _store_lone(self, value: Any) -> None:
        from ._io import _save

        leaf: _core.NonTensorData | _core.NonTensorStack
        if self.stack_shape is None:
            leaf = _core.NonTensorData._make(value, torch.Size(()), None)
        else:
            device = self._fresh_meta().get("device")
            leaf = _core.NonTensorStack._from_flat(value, torch.Size(self.stack_shape), device)
        _save(leaf, self.folder, True, self.allow_pickle)

    def rebase(self, old: str, new: str) -> None:
        if self.folder == old or self.folder.startswith(old + os.sep):
            self.folder = new + self.folder[len(old):]


def _entry_of(meta: dict, folder: str, key: Any) -> dict:
    entries = meta.get("entries")
    entry = entries.get(key) if type(entries) is dict else None
    if type(entry) is not dict or entry.get("kind") not in ("non_tensor", "non_tensor_stack"):
        raise RuntimeError(f"The shared non-tensor entry {key!r} is no longer in {folder}/{_META}: the folder was "
                           "saved again without it.")
    return entry


def _flatten(data: Any, dims: int) -> list:
    if dims == 0:
        return [data]
    if type(data) is not list:
        raise RuntimeError("The shared NonTensorStack's folder no longer holds a list of values.")
    if dims == 1:
        return list(data)
    return [value for item in data for value in _flatten(item, dims - 1)]


# ---------------------------------------------------------------------- shared leaves
def share_leaf(leaf: Any, handle: SharedValue) -> Any:
    """A new leaf like ``leaf`` (batch size, device, names) whose value is the one ``handle`` points to."""
    install()
    shared: _core.NonTensorData | _core.NonTensorStack
    if type(leaf) is _core.NonTensorData:
        shared = _core.NonTensorData._make(None, leaf._batch_size, leaf._device, leaf._names)
        del shared._data
    else:
        shared = _core.NonTensorStack._from_flat([None] * leaf._batch_size.numel(), leaf._batch_size, leaf._device)
        shared._names = leaf._names
        _empty_stack(shared)
    shared._shared = handle
    return shared


def make_shared_in_place(leaf: Any, handle: SharedValue) -> None:
    """Turn ``leaf`` itself into a shared leaf (``memmap_`` of a lone leaf)."""
    install()
    if type(leaf) is _core.NonTensorData:
        del leaf._data
    else:
        _empty_stack(leaf)
    leaf._shared = handle


def _empty_stack(stack: Any) -> None:
    for name in ("_palette", "_palette_origins", "_codes"):
        try:
            delattr(stack, name)
        except AttributeError:
            pass


_STACK_NONE = frozenset({"_codes", "_palette_origins"})


def _shared_getattr(self: Any, name: str) -> Any:
    # Reached only when the normal lookup failed: a shared leaf's value slots are empty on purpose.
    if type(self) is _core.NonTensorData:
        if name == "_data" or name == "data":
            handle = shared_handle(self)
            if handle is not None:
                return handle.read()
    elif name == "_palette" or name in _STACK_NONE:
        handle = shared_handle(self)
        if handle is not None:
            if name != "_palette":
                return None  # the flat form: element i is _palette[i], each a value of its own
            values = handle.read()
            if type(values) is not list or len(values) != self._batch_size.numel():
                raise RuntimeError(f"The shared NonTensorStack in {handle!r} no longer holds one value per element "
                                   f"of its batch {list(self._batch_size)}.")
            return values
    raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")


def _reduce_ex(self: Any, protocol: int) -> Any:
    handle = shared_handle(self)
    if handle is None:
        return object.__reduce_ex__(self, protocol)
    return (_rebuild, (type(self), handle, self._batch_size, self._device, self._names, self._saved_path,
                       self._locked))


def _rebuild(cls: type, handle: SharedValue, batch_size: torch.Size, device: Any, names: Any, saved_path: Any,
             locked: bool) -> Any:
    """A shared leaf unpickled in another process: the same folder, read and written from here too."""
    install()
    leaf: _core.NonTensorData | _core.NonTensorStack
    if cls is _core.NonTensorData:
        leaf = _core.NonTensorData._make(None, batch_size, device, names)
        del leaf._data
    else:
        leaf = _core.NonTensorStack._from_flat([None] * batch_size.numel(), batch_size, device)
        leaf._names = names
        _empty_stack(leaf)
    leaf._shared = handle
    leaf._saved_path = saved_path
    leaf._locked = locked
    return leaf


def _deepcopy(self: Any, memo: dict) -> Any:
    if shared_handle(self) is not None:
        return self.clone()  # a copy is not shared (as upstream's): the value now, deep-copied
    import copy

    # What deepcopy does without this hook (copy._reconstruct, which typeshed does not declare).
    return getattr(copy, "_reconstruct")(self, memo, *object.__reduce_ex__(self, 4))


_INSTALLED = False


def install() -> None:
    """Give ``NonTensorData`` / ``NonTensorStack`` the hooks shared leaves need (once per process)."""
    global _INSTALLED
    if _INSTALLED:
        return
    for cls in (_core.NonTensorData, _core.NonTensorStack):
        setattr(cls, "__getattr__", _shared_getattr)
        setattr(cls, "__reduce_ex__", _reduce_ex)
        setattr(cls, "__deepcopy__", _deepcopy)
    _INSTALLED = True


def rebase_shared(leaf: Any, old: str, new: str) -> None:
    """After a save written in ``old`` was renamed to ``new`` (``atomic=True``): point the leaf there."""
    handle = shared_handle(leaf)
    if handle is not None:
        handle.rebase(old, new)


# ---------------------------------------------------------------------- writes into shared leaves
def _whole_value(existing: Any, value: Any) -> Any:
    """What writing the non-tensor leaf ``value`` over the whole shared leaf ``existing`` stores."""
    from .._indexing import same_value
    from ._members import values_over

    if type(existing) is _core.NonTensorData:
        if type(value) is _core.NonTensorData:
            return value.data
        values = value._flat_values()
        if values and all(same_value(item, values[0]) for item in values[1:]):
            return values[0]
        raise RuntimeError(_MISMATCH)
    if value._batch_size == existing._batch_size:
        return value._flat_values()
    try:
        return values_over(value, existing._batch_size)
    except RuntimeError:
        raise RuntimeError("the batch size of the source does not match the stack's.") from None


def check_whole(existing: Any, value: Any) -> None:
    """Refuse now what :func:`write_whole` would refuse (a write planned among others, checked first)."""
    handle = shared_handle(existing)
    if handle is not None:
        handle.prepare(_whole_value(existing, value))


def write_whole(existing: Any, value: Any) -> bool:
    """Write the non-tensor leaf ``value`` into ``existing`` when it is shared (True); False for any other leaf."""
    handle = shared_handle(existing)
    if handle is None:
        return False
    handle.write(_whole_value(existing, value))
    return True


def write_values(leaf: Any, value: Any) -> bool:
    """``leaf.data = value`` (a NonTensorData) or a stack's new flat values, when ``leaf`` is shared."""
    handle = shared_handle(leaf)
    if handle is None:
        return False
    handle.write(list(value) if type(leaf) is _core.NonTensorStack else value)
    return True


def check_write_at(existing: Any, value: Any) -> None:
    """``td[index] = ...`` into a shared NonTensorData: only its own value can be written (as upstream)."""
    if type(existing) is not _core.NonTensorData or shared_handle(existing) is None:
        return
    from .._indexing import same_value

    current = existing.data
    values = [value.data] if type(value) is _core.NonTensorData else value._flat_values()
    if not all(same_value(item, current) for item in values):
        raise RuntimeError(_MISMATCH)


def write_at(existing: Any, value: Any, index: Any) -> bool:
    """``existing[index] = value`` for a shared leaf (True), as one locked read-modify-write of its values."""
    handle = shared_handle(existing)
    if handle is None:
        return False
    if type(existing) is _core.NonTensorData:
        check_write_at(existing, value)  # its own value: nothing changes
        return True
    batch_size, device = existing._batch_size, existing._device

    def change(values: list) -> list:
        stack = _core.NonTensorStack._from_flat(values, batch_size, device)
        stack._set_at(index, value)
        return stack._flat_values()

    handle.update(change)
    return True


# ---------------------------------------------------------------------- a folder for saves without one
def anonymous_folder() -> str:
    """A new private folder for the shared values of a save without a prefix (in ``/dev/shm`` when there is
    one), removed when this process exits: processes it was handed to read it until then."""
    import atexit
    import shutil
    import tempfile

    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    folder = tempfile.mkdtemp(prefix="torchdict-shared-", dir=base)
    atexit.register(shutil.rmtree, folder, True)
    return folder
