"""Opening the files of a saved folder without following symlinks.

A saved folder holds only regular files and real sub-folders. A symlink planted inside it (by
whoever could write there) would otherwise make a save write, or a load map writable, a file
outside the folder. So every file torchdict opens inside a saved folder is opened with
``O_NOFOLLOW`` (or checked with ``lstat`` where a path is handed to torch), and sub-folders are
checked with ``lstat`` before use. The folder given by the caller may itself be a symlink: only
what lies inside it is checked.

A refusal is a ``RuntimeError`` that names the path, the error type the save has always used for
a symlinked sub-folder. The checks cover a folder tampered with before the call, not a race with
a process rewriting the folder during it.
"""
from __future__ import annotations

import errno
import os
import stat

__all__ = ["check_file", "check_folder", "link_refused", "open_in_folder", "read_in_folder"]

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# A FIFO opened for reading would block until some writer shows up; O_NONBLOCK makes the open
# return, and the fstat check then refuses it. It changes nothing for regular files.
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# What open(O_NOFOLLOW) reports for a symlink: ELOOP on Linux and macOS, EMLINK on FreeBSD.
_LINK_ERRNOS = (errno.ELOOP, errno.EMLINK)


def link_refused(path: str, writing: bool) -> RuntimeError:
    """The error for a symlink found where a saved folder holds a file or sub-folder."""
    if writing:
        return RuntimeError(f"Refusing to write the memory-mapped TensorDict through the symlink {path}.")
    return RuntimeError(
        f"Refusing to follow the symlink {path} inside a saved TensorDict: a saved folder holds no links, "
        "and following one could read or write files outside the folder."
    )


def _not_regular(path: str) -> RuntimeError:
    return RuntimeError(f"{path} is not a regular file, so it is not part of a saved TensorDict.")


def open_in_folder(path: str, flags: int, mode: int = 0o666, *, writing: bool) -> int:
    """``os.open`` that refuses a symlink (and anything but a regular file) at ``path``."""
    if not NOFOLLOW and os.path.islink(path):  # no O_NOFOLLOW on this platform (Windows)
        raise link_refused(path, writing)
    try:
        fd = os.open(path, flags | NOFOLLOW | _CLOEXEC | _NONBLOCK, mode)
    except OSError as error:
        if error.errno in _LINK_ERRNOS and os.path.islink(path):
            raise link_refused(path, writing) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_regular(path)
    return fd


def read_in_folder(path: str) -> bytes:
    """The bytes of the file at ``path``, refusing a symlink."""
    fd = open_in_folder(path, os.O_RDONLY, writing=False)
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def check_file(path: str, *, writing: bool) -> os.stat_result:
    """``lstat(path)``, refusing a symlink or a non-regular file (for paths handed to torch to open)."""
    info = os.lstat(path)
    if stat.S_ISREG(info.st_mode):
        return info
    if stat.S_ISLNK(info.st_mode):
        raise link_refused(path, writing)
    raise _not_regular(path)


def check_folder(path: str, *, writing: bool) -> None:
    """Refuse a sub-folder of a saved folder that is a symlink or not a folder."""
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        return
    if stat.S_ISLNK(info.st_mode):
        raise link_refused(path, writing)
    raise NotADirectoryError(errno.ENOTDIR, "Not a directory: it is not a saved TensorDict", path)
