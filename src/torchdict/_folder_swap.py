"""Crash-safe overwrite: a save over an existing saved folder is written beside it, then swapped in.

For a target folder ``D/N`` the save uses three hidden siblings in ``D``:

- ``.N.torchdict-new``: the only folder the save writes to, until it is complete (its root
  ``meta.json`` is written last);
- ``.N.torchdict-spare``: the version replaced by the previous save, without its ``meta.json``.
  The next save starts from it and rewrites its files in place, which is 2-3x faster than
  writing new files (the page cache and the disk blocks are reused), so an overwrite costs what
  it cost before the swap existed. It holds a second copy of the data until then; deleting it is
  always safe (outside a save);
- ``.N.torchdict-old``: the old version while it is moved aside (only without ``renameat2``).

The swap itself is ``renameat2(RENAME_EXCHANGE)`` on Linux: ``D/N`` names the complete old
folder, then the complete new one, never nothing. Elsewhere (or on a filesystem without it) it
is ``rename(N, old)`` then ``rename(new, N)``; a kill between the two leaves ``D/N`` missing and
a complete ``new``, and :func:`recover` (called by the next load or save) finishes the swap. At
any kill moment ``D/N`` therefore loads as the complete old or the complete new save.

Files of the new folder never share data with the target: an unchanged leaf already stored in
the target is hard-linked (no copy), and a file with other links is replaced rather than
rewritten in place (:func:`torchdict.memmap._open_for_write`). Saves to one path from several
threads or processes run one after the other: the save holds an ``flock`` on the folder it
writes, and every change of the siblings' names happens under an ``flock`` on their parent. The folder whose save is replaced must hold nothing but a save (:func:`holds_only_a_save`):
otherwise it is written in place, as before, so that no file of the user's is ever deleted.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
from typing import Any

from ._meta_json import META_FILE

__all__ = ["FolderSwap", "begin_swap", "holds_only_a_save", "recover", "sibling"]

_KINDS = ("new", "spare", "old")
# A sibling name must stay under the 255-byte limit of a file name.
_MAX_STEM_BYTES = 200
_SAVED_SUFFIXES = (".memmap", ".pickle")


def sibling(path: str, kind: str) -> str:
    """The hidden sibling of folder ``path`` used by a swap (``kind``: new, spare or old).

    >>> sibling("/ckpt/model", "new")
    '/ckpt/.model.torchdict-new'
    """
    parent, name = os.path.split(path)
    if len(name.encode("utf-8", "surrogateescape")) > _MAX_STEM_BYTES:
        import hashlib

        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        name = f"{name[:40]}~{digest}"  # at most 4 bytes a character
    return os.path.join(parent, f".{name}.torchdict-{kind}")


_SIBLING_SUFFIXES = tuple(f".torchdict-{kind}" for kind in _KINDS)


def _is_sibling_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(_SIBLING_SUFFIXES)


def _is_real_folder(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_complete(folder: str) -> bool:
    """A real folder with a root ``meta.json``: a save writes that file last."""
    try:
        return _is_real_folder(folder) and stat.S_ISREG(os.lstat(folder + os.sep + META_FILE).st_mode)
    except OSError:
        return False


# ---------------------------------------------------------------------- recovery
def recover(path: str) -> str:
    """Where the save at ``path`` is: ``path``, after finishing a swap that a kill interrupted.

    Only a missing ``path`` is looked at. A complete ``new`` sibling (the kill came between
    the two renames of a swap) is moved into place; otherwise an ``old`` one is moved back.
    When that rename is not possible (a read-only filesystem) the sibling's path is returned,
    to be loaded where it is. A missing parent is recovered first, so a sub-folder of an
    interrupted swap loads too.
    """
    if os.path.lexists(path):
        return path
    parent, name = os.path.split(path)
    if not name or parent == path:
        return path
    found_parent = recover(parent)
    here = os.path.join(found_parent, name)
    if found_parent != parent or os.path.lexists(here):
        return here
    for kind in ("new", "old"):
        candidate = sibling(here, kind)
        if _is_complete(candidate):
            try:
                os.rename(candidate, here)
            except OSError:
                return here if os.path.lexists(here) else candidate  # finished by another process
            return here
    return path


# ---------------------------------------------------------------------- what may be replaced
def holds_only_a_save(folder: str) -> bool:
    """True when ``folder`` is a complete save and holds nothing else, so it may be replaced whole.

    Allowed: ``meta.json``, ``*.memmap`` and ``*.pickle`` files, the temporary files of an
    interrupted ``meta.json`` write, swap siblings left by a sub-folder's save, and
    sub-folders holding the same. Anything else (a log file, a symlink) belongs to someone
    else: the folder is then written in place and that entry is left alone.
    """
    return _is_complete(folder) and _only_saved_entries(folder)


def _only_saved_entries(folder: str) -> bool:
    with os.scandir(folder) as entries:
        for entry in entries:
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                if not (_is_sibling_name(name) or _only_saved_entries(entry.path)):
                    return False
            elif entry.is_file(follow_symlinks=False):
                if not (name == META_FILE or name.endswith(_SAVED_SUFFIXES)
                        or (name.startswith("%meta-") and name.endswith(".tmp"))):
                    return False
            else:  # a symlink, a FIFO, a socket, a device
                return False
    return True


def _discard(path: str) -> None:
    """Delete a sibling left by an earlier save (a folder, or whatever else sits at its name)."""
    if _is_real_folder(path):
        _unmark(path)
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _unmark(folder: str) -> None:
    """Remove a folder's root ``meta.json``, so that it never again passes for a complete save."""
    try:
        os.unlink(folder + os.sep + META_FILE)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------------- the exchange
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2: Any = None  # libc's renameat2, looked up on first use; False where there is none


def _exchange(first: str, second: str) -> bool:
    """Atomically swap the names of two folders; False where the system cannot."""
    global _renameat2
    if _renameat2 is None:
        _renameat2 = False
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                function = ctypes.CDLL(None, use_errno=True).renameat2
            except (AttributeError, OSError):  # glibc < 2.28, or another libc
                pass
            else:
                function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
                function.restype = ctypes.c_int
                _renameat2 = function
    if _renameat2 is False:
        return False
    import ctypes

    if _renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):  # e.g. a filesystem without it
        return False
    raise OSError(code, os.strerror(code), first, None, second)


def _lock(fd: int) -> None:
    """Wait for, then hold, an exclusive ``flock`` on an open folder (released on close or death)."""
    try:
        import fcntl
    except ImportError:  # Windows: saves to one path must not overlap
        return
    fcntl.flock(fd, fcntl.LOCK_EX)


class _ParentLock:
    """An exclusive ``flock`` on the folder holding the siblings, around each change of their names.

    The lock on a work folder serializes whole saves, but a folder is only locked once it
    exists: taking or making the work folder, and retiring the replaced one, must not
    interleave between savers (a fresh empty work folder could otherwise be replaced by
    another saver's ``rename(spare, new)`` after its maker checked it). Held briefly, never
    while waiting for a work folder's lock, so it cannot deadlock with them.
    """

    __slots__ = ("fd",)

    def __init__(self, folder: str) -> None:
        try:
            self.fd = _open_folder(folder)
        except OSError:  # an unreadable parent: saves to it are not serialized here
            self.fd = -1

    def __enter__(self) -> _ParentLock:
        if self.fd >= 0:
            _lock(self.fd)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the only descriptor releases the lock
            self.fd = -1


def _open_folder(path: str) -> int:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags)


def _same_folder(fd: int, path: str) -> bool:
    held = os.fstat(fd)
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


# ---------------------------------------------------------------------- a swap
class FolderSwap:
    """One save written into ``work`` (the ``new`` sibling of ``target``), then swapped in."""

    __slots__ = ("target", "shown", "work", "work_fd")

    def __init__(self, target: str, shown: str, work: str, work_fd: int) -> None:
        self.target = target  # the real path (symlinks resolved) of the folder being replaced
        self.shown = shown  # the same folder as the caller named it: the paths the save reports
        self.work = work
        self.work_fd = work_fd  # holds the lock

    def relocate(self, path: str) -> str:
        """Where the save writes ``path``, a path under the folder as the caller named it."""
        return self.work + path[len(self.shown):]

    def prepare(self, layout: dict) -> None:
        """Make the work folder hold exactly ``layout``'s folders; files it will write may stay.

        ``layout`` maps each name of a folder to None (a file the save writes) or to the
        layout of a sub-folder. Everything else left from the spare is deleted, so the new
        save holds no file it does not describe.
        """
        _shape_folder(self.work, layout)

    def link(self, source: str, path: str) -> bool:
        """Hard-link the unchanged file ``source`` (in the target) to ``path`` in the work folder."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        try:
            os.link(source, path, follow_symlinks=False)
        except OSError:  # links not supported here, or too many: the caller copies the data
            return False
        return True

    def commit(self) -> None:
        """Swap the complete work folder in; the replaced folder becomes the spare."""
        target_fd = _open_folder(self.target)
        try:
            # Hold the replaced folder too: a save arriving now waits until it is the spare.
            _lock(target_fd)
            with _ParentLock(os.path.dirname(self.target)):
                replaced = self._swap_in()
                self.close()  # the work folder is the save now: abandon() leaves it alone
                try:
                    _unmark(replaced)
                    spare = sibling(self.target, "spare")
                    _discard(spare)
                    os.rename(replaced, spare)
                except OSError:
                    pass  # the replaced folder stays under its name; the next save reuses or removes it
        finally:
            os.close(target_fd)

    def _swap_in(self) -> str:
        """Put the work folder at the target; returns where the replaced folder now is."""
        if _exchange(self.work, self.target):
            return self.work
        replaced = sibling(self.target, "old")
        _discard(replaced)
        os.rename(self.target, replaced)
        # A kill here leaves no target: recover() moves the complete work folder into place.
        try:
            os.rename(self.work, self.target)
        except FileNotFoundError:
            if not os.path.isdir(self.target):
                os.rename(replaced, self.target)
                raise
            # else a load did it already (recover)
        except BaseException:
            os.rename(replaced, self.target)
            raise
        return replaced

    def abandon(self) -> None:
        """After a failed save: the target was not touched; the work folder is kept as the spare."""
        if self.work_fd < 0:
            return  # committed
        try:
            with _ParentLock(os.path.dirname(self.target)):
                if _same_folder(self.work_fd, self.work):
                    _unmark(self.work)
                    spare = sibling(self.target, "spare")
                    if os.path.lexists(spare):
                        _discard(self.work)
                    else:
                        os.rename(self.work, spare)
        except OSError:
            pass  # junk at worst; the next save removes it
        finally:
            self.close()

    def close(self) -> None:
        if self.work_fd >= 0:
            os.close(self.work_fd)
            self.work_fd = -1


def _shape_folder(folder: str, layout: dict) -> None:
    with os.scandir(folder) as entries:
        # "folder", "file" (regular) or None (a symlink or anything else: always removed)
        present = {entry.name: "folder" if entry.is_dir(follow_symlinks=False)
                   else "file" if entry.is_file(follow_symlinks=False) else None for entry in entries}
    kept = set()
    for name, kind in present.items():
        wanted = layout.get(name, False)
        if wanted is not False and kind == ("file" if wanted is None else "folder"):
            kept.add(name)
        else:  # not part of this save, or of the wrong kind
            _discard(folder + os.sep + name)
    for name, sub_layout in layout.items():
        if sub_layout is not None:
            path = folder + os.sep + name
            if name not in kept:
                os.mkdir(path)
            _shape_folder(path, sub_layout)


def begin_swap(target: str, shown: str) -> FolderSwap | None:
    """Take the work folder beside ``target`` (a real folder holding only a save), locked.

    ``shown`` is ``target`` as the caller named it (maybe through a symlink).

    The work folder is the spare when there is one (its files get rewritten in place), else a
    new folder. Returns None when ``target`` cannot be swapped (no permission in its parent, a
    mount point, the working directory or a folder above it): the caller then saves in place.
    """
    parent = os.path.dirname(target)
    info = os.stat(target)
    try:
        if os.stat(parent).st_dev != info.st_dev:
            return None  # a mount point cannot be renamed
        cwd = os.getcwd()
    except OSError:
        return None
    if cwd == target or cwd.startswith(target + os.sep):
        return None  # the working directory would move along with the replaced folder
    work = sibling(target, "new")
    for _ in range(64):
        with _ParentLock(parent):
            if not _take_work_folder(target, work):
                return None
            try:
                fd = _open_folder(work)
            except OSError:
                continue  # replaced meanwhile
        _lock(fd)  # waits while another save to this path runs
        with _ParentLock(parent):
            if _same_folder(fd, work):
                try:
                    _unmark(work)
                    for kind in ("spare", "old"):
                        _discard(sibling(target, kind))  # leftovers: this save holds the only lock
                    os.chmod(work, stat.S_IMODE(info.st_mode))  # the new folder is as private as the old one
                except BaseException:
                    os.close(fd)
                    raise
                return FolderSwap(target, shown, work, fd)
        os.close(fd)  # the folder we waited for was swapped in or retired: look again
    raise RuntimeError(f"Could not take the folder {work} to save beside {target}: it keeps changing.")


def _take_work_folder(target: str, work: str) -> bool:
    """Make ``work`` a real folder: the spare (or an interrupted swap's old folder) or a new one.

    Called under the parent's lock. False when no folder can be made there (no permission).
    """
    if os.path.lexists(work):
        if _is_real_folder(work):
            return True
        _discard(work)  # a file or a symlink at that name is never followed
    for kind in ("spare", "old"):
        candidate = sibling(target, kind)
        if _is_real_folder(candidate):
            try:
                os.rename(candidate, work)
                return True
            except OSError:
                pass
    try:
        os.mkdir(work, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    return True
