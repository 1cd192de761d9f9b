"""Saving a lone non-tensor leaf (``memmap`` / ``memmap_`` / ``save``) and loading it (``load_memmap``).

The folder is upstream's layout for a lone leaf, so each library loads what the other wrote:

- ``NonTensorData``: ``meta.json`` = ``{"_type": "<class 'tensordict.tensorclass.NonTensorData'>",
  "data": <value>, "_metadata": null, "_is_non_tensor": true}``; a value JSON can't hold goes to
  ``other.pickle`` (the pickle of ``{"data": value}``) and ``meta.json`` has no ``data``.
- ``NonTensorStack``: ``meta.json`` = ``{"_type": "<class 'tensordict.tensorclass.NonTensorStack'>",
  "_format_version": 1, "_class": "tensordict:NonTensorStack", "stack_dim": 0, "device": ...,
  "data": <nested list>}`` (compact separators, as upstream); pickled values go to ``pickle.pkl``
  and ``data`` names that file.

Neither records the batch size: a loaded ``NonTensorData`` has an empty batch, a stack the nesting of
its list (lists of equal length nest, as upstream reads them). Pickles are written and read only with
``allow_pickle=True`` (torchdict's rule for every save: unpickling can run code). Files are written
through a temporary name and ``os.replace``, never through a symlink (``_nofollow``).

``share_non_tensor=True`` makes the result a shared leaf (:mod:`torchdict.nontensor._shared`): its value is the
one the folder holds, read again when read and written there when written, by any process holding it. A path
ending in ``.tdz`` (or ``archive=True``) writes a ``.tdz`` archive instead (:mod:`torchdict.formats.archive`).
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Optional

import torch

from .. import nontensor as _core
from .._meta_json import write_file_atomic

if TYPE_CHECKING:
    from ._host import NonTensorHost
else:
    NonTensorHost = object

__all__ = ["NonTensorPersistenceMixin", "shared_handle"]

_DATA_TYPE = "<class 'tensordict.tensorclass.NonTensorData'>"
_STACK_TYPE = "<class 'tensordict.tensorclass.NonTensorStack'>"
_STACK_PICKLE = "pickle.pkl"
_DATA_PICKLE = "other.pickle"
_NO_FOLDER = ""  # ``_saved_path`` of a leaf memory-mapped without a folder (``memmap()``)


def _remove(folder: str, name: str) -> None:
    path = os.path.join(folder, name)
    if os.path.lexists(path):
        os.unlink(path)  # unlink removes a link itself, never its target


def _files_of(leaf: Any, allow_pickle: bool) -> tuple:
    """``(meta, pickle_name, pickle_bytes)`` describing ``leaf`` in upstream's layout (checked before writing)."""
    import pickle

    from ..saving import _is_plain_json

    if isinstance(leaf, _core.NonTensorData):
        # (a MetaData records its class, as upstream's: "<class 'tensordict.tensorclass.MetaData[str]'>")
        data_type = _DATA_TYPE if type(leaf) is _core.NonTensorData else _DATA_TYPE.replace(
            "NonTensorData", type(leaf).__name__)
        meta: dict = {"_type": data_type, "data": leaf._data, "_metadata": None, "_is_non_tensor": True}
        if _is_plain_json(leaf._data):
            return meta, None, None
        _refuse_pickle(leaf._data, allow_pickle)
        del meta["data"]
        return meta, _DATA_PICKLE, pickle.dumps({"data": leaf._data}, protocol=pickle.HIGHEST_PROTOCOL)
    data = leaf.tolist()
    meta = {"_type": _STACK_TYPE, "_format_version": 1, "_class": "tensordict:NonTensorStack", "stack_dim": 0,
            "device": None if leaf._device is None else str(leaf._device), "data": data}
    if _is_plain_json(data):
        return meta, None, None
    _refuse_pickle(next(value for value in leaf._values if not _is_plain_json(value)), allow_pickle)
    meta["data"] = _STACK_PICKLE
    return meta, _STACK_PICKLE, pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)


def _refuse_pickle(value: Any, allow_pickle: bool) -> None:
    if not allow_pickle:
        raise TypeError(
            f"Cannot save a non-tensor value of type {type(value).__name__}: without pickling, only JSON values "
            "are stored (None, bool, int, float, str, and lists or str-keyed dicts of them). Pass "
            "allow_pickle=True to pickle it; loading it back will then need allow_pickle=True too."
        )


def _save(leaf: Any, prefix: Any, existsok: bool, allow_pickle: bool) -> Optional[str]:
    """Write ``leaf`` to folder ``prefix`` (nothing when None); the folder's absolute path."""
    if prefix is None:
        return None
    meta, pickle_name, pickled = _files_of(leaf, allow_pickle)
    compact = type(leaf) is _core.NonTensorStack  # upstream writes a stack's meta.json without spaces
    text = json.dumps(meta, separators=(",", ":") if compact else None).encode("utf-8")
    folder = os.path.abspath(os.fspath(prefix))
    if not existsok and os.path.lexists(os.path.join(folder, "meta.json")):
        raise RuntimeError(f"The file {os.path.join(folder, 'meta.json')} already exists.")
    os.makedirs(folder, exist_ok=True)
    stale = _DATA_PICKLE if isinstance(leaf, _core.NonTensorData) else _STACK_PICKLE
    if pickled is not None:
        write_file_atomic(folder, pickle_name, pickled)
    write_file_atomic(folder, "meta.json", text)  # last: its presence means the save is complete
    if pickled is None:
        _remove(folder, stale)
    return folder


def _from_saved_list(data: list, device: Optional[torch.device]) -> Any:
    """The stack of a saved nested list: lists all of one length nest one level deeper (upstream's reading)."""
    if data and all(type(item) is list for item in data) and all(len(item) == len(data[0]) for item in data):
        inner = [_from_saved_list(item, device) for item in data]
        return _core.NonTensorStack(*inner)._to_device(device)
    if not data:
        return _core.NonTensorStack._from_flat([], (0,), device)
    return _core.NonTensorStack._from_flat(list(data), (len(data),), device, [None] * len(data))


def _load(prefix: Any, device: Any, non_blocking: bool, allow_pickle: bool, kwargs: dict) -> Any:
    from .._meta_json import read_meta
    from .._nofollow import read_in_folder

    folder = os.path.abspath(os.fspath(prefix))
    if os.path.isfile(folder):  # a .tdz archive: the general loader reads archives (and lone leaves in them)
        from .._loading import load_memmap

        return load_memmap(folder, device, non_blocking, allow_pickle=allow_pickle, **kwargs)
    meta = read_meta(folder)
    kind = meta.get("_class") if meta.get("_class") == "tensordict:NonTensorStack" else meta.get("_type")
    if kind not in (_DATA_TYPE, _STACK_TYPE, "tensordict:NonTensorStack"):
        from .._loading import load_memmap

        return load_memmap(folder, device, non_blocking, allow_pickle=allow_pickle, **kwargs)
    import pickle

    def unpickle(name: str) -> Any:
        if not allow_pickle:
            raise RuntimeError(
                f"Refusing to load pickled non-tensor data from {os.path.join(folder, name)}: unpickling can run "
                "arbitrary code. Pass allow_pickle=True if you trust this folder."
            )
        return pickle.loads(read_in_folder(os.path.join(folder, name)))

    if kind == _DATA_TYPE:
        value = meta["data"] if "data" in meta else unpickle(_DATA_PICKLE)["data"]
        # No batch size nor device is saved for a NonTensorData: upstream loads it on the CPU, batch [].
        result: Any = _core.NonTensorData._make(value, torch.Size(()), torch.device("cpu"))
    else:
        data = meta.get("data")
        if data == _STACK_PICKLE:
            data = unpickle(_STACK_PICKLE)
        if type(data) is not list:
            raise ValueError(f"The saved NonTensorStack in {folder} has no list of values.")
        saved_device = meta.get("device")
        result = _from_saved_list(data, None if saved_device is None else torch.device(saved_device))
    return result if device is None else result._to_device(device)


class NonTensorPersistenceMixin(NonTensorHost):
    """``memmap`` / ``memmap_`` / ``memmap_like`` / ``save`` / ``load_memmap`` / ``load`` of a lone leaf."""

    # Where a shared leaf's value lives (see torchdict.nontensor._shared); left empty on every other leaf.
    __slots__ = ("_shared",)

    def memmap(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
               return_early: bool = False, existsok: bool = True, allow_pickle: bool = False,
               share_non_tensor: bool = False, archive: Optional[bool] = None, compression: Any = None,
               **kwargs: Any) -> Any:
        """A locked copy saved to folder ``prefix`` (upstream's layout); nothing is written when None.

        Values JSON can't hold need ``allow_pickle=True``. ``share_non_tensor=True`` shares the value between
        the processes holding the result (see ``torchdict.nontensor._shared``). A ``prefix`` ending in ``.tdz``
        (or ``archive=True``) writes an archive and returns the leaf loaded from it, as upstream. Upstream's
        other keyword arguments (``robust_key``, ...) are accepted and change nothing here.
        """
        if _archive_requested(prefix, archive):
            return self._save_archive(prefix, False, existsok, allow_pickle, compression, share_non_tensor,
                                      return_early)
        _check_plain_save(compression)
        if share_non_tensor:
            path, handle = _save_shared(self, prefix, existsok, allow_pickle)
            from ._shared import share_leaf

            result = share_leaf(self, handle)
        else:
            path = _save(self, prefix, existsok, allow_pickle)
            result = self._shallow()
        result._saved_path = _NO_FOLDER if path is None else path
        result._locked = True
        return _maybe_future(result, return_early)

    def memmap_(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
                return_early: bool = False, existsok: bool = True, allow_pickle: bool = False,
                share_non_tensor: bool = False, **kwargs: Any) -> Any:
        """Save to ``prefix`` and mark this leaf memory-mapped (and locked); returns self.

        Later in-place writes (``stack[i] = v``, ``update_``) write the folder again, as upstream. With
        ``share_non_tensor=True`` this leaf becomes shared: its value is the folder's, in every process."""
        if "archive" in kwargs:  # as TensorDict.memmap_ (and upstream): an archive is not memory-mapped in place
            raise TypeError("memmap_() got an unexpected keyword argument 'archive'")
        if share_non_tensor:
            path, handle = _save_shared(self, prefix, existsok, allow_pickle)
            from ._shared import make_shared_in_place

            make_shared_in_place(self, handle)
        else:
            path = _save(self, prefix, existsok, allow_pickle)
        self._saved_path = _NO_FOLDER if path is None else path
        self._locked = True
        return _maybe_future(self, return_early)

    def memmap_like(self, prefix: Any = None, copy_existing: bool = False, *, existsok: bool = True,
                    num_threads: int = 0, return_early: bool = False, allow_pickle: bool = False,
                    share_non_tensor: bool = False, archive: Optional[bool] = None, **kwargs: Any) -> Any:
        """As :meth:`memmap`: a value has no "empty" form, so the like-copy holds it (as upstream)."""
        if _archive_requested(prefix, archive):
            return self._save_archive(prefix, True, existsok, allow_pickle, None, share_non_tensor, return_early)
        return self.memmap(prefix, copy_existing, return_early=return_early, existsok=existsok,
                           allow_pickle=allow_pickle, share_non_tensor=share_non_tensor, archive=False)

    save = dumps = memmap

    def _save_archive(self, prefix: Any, like: bool, existsok: bool, allow_pickle: bool, compression: Any,
                      share_non_tensor: bool, return_early: bool) -> Any:
        """The leaf written to the ``.tdz`` archive ``prefix``, returned loaded from it (unlocked, as upstream)."""
        from ..saving import _in_background, check_save_keywords

        check_save_keywords(None, share_non_tensor, archive=True)
        from ..formats.archive import save_archive

        def write() -> Any:
            return save_archive(self, prefix, like=like, compression=compression, existsok=existsok,
                                allow_pickle=allow_pickle)

        return _in_background(write) if return_early else write()

    @staticmethod
    def load_memmap(prefix: Any, device: Any = None, non_blocking: bool = False, *,
                    allow_pickle: Optional[bool] = None, **kwargs: Any) -> Any:
        """The leaf (or TensorDict) saved in folder ``prefix``, by torchdict or upstream.

        Pickled values load only with ``allow_pickle=True`` (upstream 0.15 warns and loads them).
        """
        return _load(prefix, device, non_blocking, bool(allow_pickle), kwargs)

    load = load_memmap

    def is_memmap(self) -> bool:
        return self._saved_path is not None

    @property
    def saved_path(self) -> str:
        if not self._saved_path:
            raise AttributeError(f"The {type(self).__name__} has no saved path (memmap={self.is_memmap()}).")
        return self._saved_path

    def _rewrite_saved(self) -> None:
        """After an in-place write: a leaf saved by ``memmap_`` writes its folder again (as upstream); a shared
        leaf's write went to its folder already."""
        if self._saved_path and shared_handle(self) is None:
            _save(self, self._saved_path, True, True)

    # The hooks through which the TensorDict's in-place writes reach a shared leaf's folder: each answers False
    # (and does nothing) for an ordinary leaf, which the caller then replaces or writes as before.
    def _write_shared_leaf(self, value: Any) -> bool:
        """``set_`` / ``update_`` of the entry with the non-tensor leaf ``value``."""
        if shared_handle(self) is None:
            return False
        from ._shared import write_whole

        return write_whole(self, value)

    def _check_shared_leaf(self, value: Any) -> None:
        """Raise now what ``_write_shared_leaf(value)`` would (a write planned among others)."""
        if shared_handle(self) is not None:
            from ._shared import check_whole

            check_whole(self, value)

    def _write_shared_at(self, value: Any, index: Any) -> bool:
        """``td[index] = ...``: ``value`` written at ``index`` of the entry."""
        if shared_handle(self) is None:
            return False
        from ._shared import write_at

        return write_at(self, value, index)

    def _check_shared_at(self, value: Any) -> None:
        if shared_handle(self) is not None:
            from ._shared import check_write_at

            check_write_at(self, value)

    def _is_shared(self) -> bool:
        return shared_handle(self) is not None

    def _write_shared(self, value: Any) -> bool:
        """Write ``value`` (a NonTensorData's value, or a stack's flat values) to the folder of a shared leaf
        and return True; False (nothing done) for an ordinary leaf."""
        if shared_handle(self) is None:
            return False
        from ._shared import write_values

        return write_values(self, value)


_HANDLE_SLOT = NonTensorPersistenceMixin.__dict__["_shared"]


def _check_plain_save(compression: Any) -> None:
    if compression is not None:
        raise ValueError("compression is only supported when writing a memmap archive (pass archive=True or use a "
                         "'.tdz' prefix).")


def shared_handle(leaf: Any) -> Any:
    """Where a shared leaf's value lives (a ``SharedValue``), or None for an ordinary leaf.

    Read through the slot's descriptor: an empty slot raises AttributeError there, never reaching the
    ``__getattr__`` that shared leaves install.
    """
    try:
        return _HANDLE_SLOT.__get__(leaf, None)
    except AttributeError:
        return None


def _archive_requested(prefix: Any, archive: Any) -> bool:
    if archive:
        return True
    if archive is None and prefix is not None:
        from ..saving import is_archive_path

        return is_archive_path(prefix)
    return False


def _save_shared(leaf: Any, prefix: Any, existsok: bool, allow_pickle: bool) -> tuple:
    """Save ``leaf`` for ``share_non_tensor=True`` (a private folder when ``prefix`` is None): ``(path, handle)``."""
    from ._shared import SharedValue, anonymous_folder

    folder = _save(leaf, prefix if prefix is not None else anonymous_folder(), existsok, allow_pickle)
    assert folder is not None  # a folder was given: _save wrote it
    shape = None if isinstance(leaf, _core.NonTensorData) else tuple(leaf._batch_size)
    return (folder if prefix is not None else _NO_FOLDER), SharedValue(folder, None, allow_pickle, shape)


def _maybe_future(result: Any, return_early: bool) -> Any:
    if not return_early:
        return result
    from concurrent.futures import Future

    future: Future = Future()
    future.set_result(result)
    return future
