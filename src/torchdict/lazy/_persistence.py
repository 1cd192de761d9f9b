"""Saving a lazy stack to a folder and loading it back, in upstream tensordict 0.15.3's layout.

A saved lazy stack is a folder holding ``meta.json`` (the class, ``stack_dim`` and the stack dim's
name) and one sub-folder per member, ``0``, ``1``, ..., each a saved TensorDict (or, for a member
that is a lazy stack itself, the same layout again). So members keep their ragged leaves and
exclusive keys, and folders written by either library load in the other.

A path ending in ``.tdz`` (or ``archive=True``) writes that folder as one ``.tdz`` archive instead
(:func:`torchdict.formats.archive.save_archive`), and the lazy stack loaded from it is returned, unlocked, as
upstream does; ``load_memmap`` reads archives too.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, List, Optional

from .._meta_json import write_meta_atomic
from .._nofollow import read_in_folder

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object

_CLASS = "tensordict:LazyStackedTensorDict"


def _write_meta(folder: str, stack_dim: int, stack_name: Optional[str]) -> None:
    meta = {"_type": "<class 'tensordict._lazy.LazyStackedTensorDict'>", "_format_version": 1,
            "_class": _CLASS, "stack_dim": stack_dim, "stack_dim_name": stack_name}
    os.makedirs(folder, exist_ok=True)
    write_meta_atomic(folder, meta)  # absent, old or complete; never written through a symlink


def _read_meta(folder: str) -> Optional[dict]:
    """The stack's ``meta.json`` when ``folder`` holds a saved lazy stack, else None (a symlinked one is refused)."""
    try:
        meta = json.loads(read_in_folder(os.path.join(folder, "meta.json")))
    except (FileNotFoundError, NotADirectoryError, ValueError):  # NotADirectoryError: an archive file
        return None
    if isinstance(meta, dict) and (meta.get("_class") == _CLASS or "LazyStackedTensorDict" in str(meta.get("_type"))):
        return meta
    return None


def _member_folders(folder: str) -> List[str]:
    count = 0
    while os.path.isdir(os.path.join(folder, str(count))):
        count += 1
    return [os.path.join(folder, str(position)) for position in range(count)]


# The keywords of ``memmap`` / ``memmap_like`` that writing an archive takes (``archive`` already read).
_ARCHIVE_KEYWORDS = frozenset({"num_threads", "return_early", "share_non_tensor", "existsok", "robust_key",
                               "compression", "atomic", "allow_pickle"})


def _archive_requested(prefix: Any, archive: Any) -> bool:
    if archive:
        return True
    if archive is None and prefix is not None:
        from ..saving import is_archive_path

        return is_archive_path(prefix)
    return False


class LazyPersistenceMixin(LazyHost):
    """The class using it provides ``tensordicts``, ``stack_dim``, ``_stack_name``, ``lock_`` and
    ``_restack``."""

    __slots__ = ()

    def _save_members(self, method: str, prefix: Any, kwargs: dict) -> list:
        folder = None if prefix is None else os.path.abspath(os.fspath(prefix))
        results = [getattr(td, method)(None if folder is None else os.path.join(folder, str(position)), **kwargs)
                   for position, td in enumerate(self.tensordicts)]
        if folder is not None:
            _write_meta(folder, self.stack_dim, self._stack_name)
        return results

    def _saved_stack(self, members: list) -> Any:
        result = self._restack(members, self.stack_dim)
        result._stack_name = self._stack_name
        return result.lock_()

    def _to_archive(self, prefix: Any, like: bool, copy_existing: bool, kwargs: dict) -> Any:
        """The stack written to the ``.tdz`` archive ``prefix`` and loaded back (a lazy stack, as upstream)."""
        from ..formats.archive import save_archive
        from ..saving import _in_background, check_save_keywords

        check_save_keywords(kwargs.get("robust_key", True), kwargs.get("share_non_tensor", False), archive=True)
        unknown = set(kwargs) - _ARCHIVE_KEYWORDS
        if unknown:
            raise TypeError(f"memmap() got an unexpected keyword argument {sorted(unknown)[0]!r}")

        def write() -> Any:
            return save_archive(self, prefix, like=like, copy_existing=copy_existing,
                                num_threads=kwargs.get("num_threads", 0), compression=kwargs.get("compression"),
                                existsok=kwargs.get("existsok", True), allow_pickle=kwargs.get("allow_pickle", False))

        return _in_background(write) if kwargs.get("return_early") else write()

    def memmap(self, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> Any:
        """A new, locked lazy stack of the members' ``memmap`` copies, written to ``prefix/<i>``
        (anonymous shared memory when ``prefix`` is None); to a ``.tdz`` path (or with ``archive=True``),
        the archive's lazy stack."""
        if _archive_requested(prefix, kwargs.pop("archive", None)):
            return self._to_archive(prefix, False, copy_existing, kwargs)
        if kwargs.get("compression") is not None:
            raise ValueError("compression is only supported when writing a memmap archive (pass archive=True or "
                             "use a '.tdz' prefix).")
        kwargs.pop("compression", None)
        return self._saved_stack(self._save_members("memmap", prefix, {"copy_existing": copy_existing, **kwargs}))

    def save(self, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> Any:
        """Alias of :meth:`memmap`."""
        return self.memmap(prefix, copy_existing, **kwargs)

    dumps = save

    def memmap_(self, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> Any:
        """Memory-map every member in place (``prefix/<i>``); returns self, locked."""
        self._save_members("memmap_", prefix, {"copy_existing": copy_existing, **kwargs})
        return self.lock_()

    def memmap_like(self, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> Any:
        """A locked lazy stack of the members' ``memmap_like`` (zero-filled files, same shapes); to a ``.tdz``
        path (or with ``archive=True``), a zero-filled archive's lazy stack, writable."""
        if _archive_requested(prefix, kwargs.pop("archive", None)):
            return self._to_archive(prefix, True, copy_existing, kwargs)
        return self._saved_stack(self._save_members("memmap_like", prefix,
                                                    {"copy_existing": copy_existing, **kwargs}))

    def pack(self, dim: int = -1, *, layout: Any = None) -> tuple:
        """All the leaves in one tensor of features and its :class:`~torchdict.PackLayout`, as ``TensorDict.pack``:
        the stack packs like its dense form when its members share their keys and feature shapes (members with
        other keys raise ``RuntimeError``, as upstream)."""
        from ..formats.pack import pack

        return pack(self, dim, layout=layout)

    @property
    def saved_path(self) -> str:
        """A lazy stack is saved as one folder per member: it has no path of its own (AttributeError, as
        upstream; each member's ``saved_path`` is its folder)."""
        raise AttributeError(f"The tensordict has no saved path (memmap={self.is_memmap()}, path=None).")

    @classmethod
    def load_memmap(cls, prefix: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        """Load a folder written by :meth:`memmap` (by either library): a lazy stack of the members'
        folders; a folder holding a plain TensorDict loads as that TensorDict."""
        from ..tensordict import TensorDict

        folder = os.path.abspath(os.fspath(prefix))
        meta = _read_meta(folder)
        if meta is None:
            return TensorDict.load_memmap(folder, device, non_blocking, **kwargs)
        members = [cls.load_memmap(member, device, non_blocking, **kwargs) for member in _member_folders(folder)]
        if not members:
            raise RuntimeError(f"The lazy stack saved in {folder!r} has no member folder (0/, 1/, ...).")
        result = cls(*members, stack_dim=meta.get("stack_dim", 0))
        result._stack_name = meta.get("stack_dim_name")
        return result

    @classmethod
    def load(cls, prefix: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        """Alias of :meth:`load_memmap`."""
        return cls.load_memmap(prefix, device, non_blocking, **kwargs)
