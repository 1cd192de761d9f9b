"""Reading ``.tdz`` archives: the index of entries, the loader's tree over one mapping, and the checksums.

:mod:`torchdict.formats.archive` writes archives and documents their layout and safety rules; this module
is the read side: where each entry's payload starts, which entries this process already verified (by the
archive's device, inode, size and modification time), the tree :mod:`torchdict._loading` walks, and
:func:`refresh_archive_checksums` for an archive written in place.
"""
from __future__ import annotations

import os
import struct
import threading
import zlib
import zipfile
from pathlib import Path
from typing import Any, Iterable

import torch

from .._bounded_cache import BoundedCache

__all__ = ["ArchiveTree", "UNSEALED_COMMENT", "forget_verified", "is_memmap_archive", "open_archive_tree",
           "refresh_archive_checksums"]

_META = "meta.json"
_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # signature ... file name length, extra field length
_LOCAL_SIGNATURE = b"PK\x03\x04"
_CENTRAL_SIGNATURE = b"PK\x01\x02"
_CHUNK = 16 << 20  # bytes read at a time when checksumming a payload
# The zip comment of an archive written in place since its checksums were last computed.
UNSEALED_COMMENT = b"torchdict: written in place, CRC-32 checksums not updated"


def is_memmap_archive(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file holding a saved TensorDict archive (a zip with a top-level ``meta.json``).

    A folder, a missing path or any other file gives ``False``.

    >>> import tempfile, os
    >>> from torchdict import TensorDict
    >>> folder = tempfile.mkdtemp()
    >>> _ = TensorDict(a=torch.zeros(3)).save(os.path.join(folder, "td.tdz"))
    >>> is_memmap_archive(os.path.join(folder, "td.tdz")), is_memmap_archive(folder)
    (True, False)
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            return any(info.filename == _META for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return False



# ---------------------------------------------------------------------- the index of an archive
class _Member:
    __slots__ = ("offset", "size", "compress_type", "crc")

    def __init__(self, offset: int, size: int, compress_type: int, crc: int) -> None:
        self.offset = offset  # where the (stored) payload starts in the file
        self.size = size
        self.compress_type = compress_type
        self.crc = crc


def _payload_offset(handle: Any, info: zipfile.ZipInfo, path: str, file_size: int) -> int:
    handle.seek(info.header_offset)
    header = handle.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
        raise zipfile.BadZipFile(f"The archive {path} is corrupted: bad local header for the entry "
                                 f"{info.filename!r}.")
    name_length, extra_length = struct.unpack_from("<2H", header, 26)
    flags = struct.unpack_from("<H", header, 6)[0]
    local_name = handle.read(name_length).decode("utf-8" if flags & 0x800 else "cp437")
    if local_name != info.orig_filename:
        raise zipfile.BadZipFile(f"The archive {path} is corrupted: the entry {info.orig_filename!r} is named "
                                 f"{local_name!r} in its local header.")
    offset = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if offset + info.compress_size > file_size:
        raise zipfile.BadZipFile(f"The archive {path} is truncated: the entry {info.filename!r} ends past the "
                                 "end of the file.")
    return offset


def _index(path: str) -> tuple:
    """({name: _Member}, {folder names}, comment, central directory offset) of the archive at ``path``."""
    members: dict = {}
    folders = {""}
    file_size = os.path.getsize(path)
    with zipfile.ZipFile(path) as archive, open(path, "rb") as handle:
        for info in archive.infolist():
            name = info.filename
            if info.flag_bits & 0x1:
                raise RuntimeError(f"Cannot load the encrypted entry {name!r} of {path}.")
            if name in members:
                raise zipfile.BadZipFile(f"The archive {path} holds the entry {name!r} twice.")
            parts = name.rstrip("/").split("/")
            for depth in range(1, len(parts) + (1 if name.endswith("/") else 0)):
                folders.add("/".join(parts[:depth]))
            if name.endswith("/"):
                continue
            offset = _payload_offset(handle, info, path, file_size)
            members[name] = _Member(offset, info.file_size, info.compress_type, info.CRC)
        return members, folders, archive.comment, archive.start_dir


# Archives whose entries were checked in this process: real path -> (stat signature, names checked).
_VERIFIED: BoundedCache = BoundedCache(1024)
_VERIFIED_LOCK = threading.Lock()


def _signature(path: str) -> tuple | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _remember_verified(path: str, names: Iterable[str] | None) -> None:
    """Record that ``names`` (None: every entry) of the archive as it is now passed their checksums."""
    real = os.path.realpath(path)
    signature = _signature(real)
    if signature is None:
        return
    with _VERIFIED_LOCK:
        known = _VERIFIED.get(real)
        if names is None:
            checked: Any = None
        elif known is not None and known[0] == signature and known[1] is not None:
            checked = known[1] | set(names)
        else:
            checked = set(names)
        _VERIFIED.put(real, (signature, checked))


def _already_verified(path: str, name: str) -> bool:
    real = os.path.realpath(path)
    known = _VERIFIED.get(real)
    return known is not None and known[0] == _signature(real) and (known[1] is None or name in known[1])


def forget_verified(path: str) -> None:
    with _VERIFIED_LOCK:
        _VERIFIED.pop(os.path.realpath(path), None)


def _mark_unsealed(path: str) -> None:
    """Note in the zip comment that the archive is about to be written in place (its CRC-32s go stale)."""
    with zipfile.ZipFile(path, "a") as archive:
        if archive.comment != UNSEALED_COMMENT:
            archive.comment = UNSEALED_COMMENT
    forget_verified(path)


def _checksum_error(path: str, name: str, stored: int, computed: int) -> zipfile.BadZipFile:
    return zipfile.BadZipFile(
        f"The archive {path} is corrupted: the entry {name!r} does not match its CRC-32 checksum "
        f"(stored {stored:08x}, computed {computed:08x}), so it was changed after the archive was written. If "
        f"you changed it on purpose with a tool that does not update checksums, call "
        f"torchdict.refresh_archive_checksums({path!r}) to accept its current content."
    )


# ---------------------------------------------------------------------- the loader's tree over an archive
class ArchiveTree:
    """The saved folders inside an archive, for :class:`torchdict._loading.FolderLoader`.

    Paths are ``"<archive>::<entry>"`` strings (readable in error messages); the whole file is mapped
    once, and each stored leaf is a view of that mapping.
    """

    __slots__ = ("path", "base", "members", "folders", "writable", "sealed", "_storage", "_pending", "_zip", "_lock")

    def __init__(self, path: str, writable: bool) -> None:
        self.path = path
        self.base = path + "::"
        self.members, self.folders, comment, _ = _index(path)
        self.writable = writable
        self.sealed = comment != UNSEALED_COMMENT
        self._storage: torch.Tensor | None = None
        self._pending: list = []  # (name, member) of the stored payloads mapped by this load
        self._zip: zipfile.ZipFile | None = None
        self._lock = threading.Lock()  # the loader maps leaves from several threads with num_threads

    # paths
    def root(self) -> str:
        return self.base

    def _inner(self, path: str) -> str:
        return path[len(self.base):]

    def join(self, folder: str, name: str) -> str:
        return folder + name if folder == self.base else f"{folder}/{name}"

    def lexists(self, path: str) -> bool:
        inner = self._inner(path)
        return inner in self.members or inner in self.folders

    def is_folder(self, path: str) -> bool:
        return self._inner(path) in self.folders

    def check_folder(self, path: str) -> None:
        if self._inner(path) not in self.folders:
            raise NotADirectoryError(f"{path} is not a folder of the archive, so it is not a saved TensorDict.")

    # reading
    @property
    def storage(self) -> torch.Tensor:
        if self._storage is None:
            with self._lock:
                if self._storage is None:
                    size = os.path.getsize(self.path)
                    self._storage = torch.from_file(self.path, shared=self.writable, size=size, dtype=torch.uint8)
        return self._storage

    def _member(self, path: str) -> tuple:
        inner = self._inner(path)
        member = self.members.get(inner)
        if member is None:
            raise FileNotFoundError(2, f"No such entry in the archive {self.path}", path)
        return inner, member

    def read(self, path: str) -> bytes:
        """A small entry's bytes (meta.json, a pickle), always checked against its CRC-32."""
        inner, member = self._member(path)
        if member.compress_type != zipfile.ZIP_STORED:
            return self._decompress(inner)
        data = self.storage[member.offset: member.offset + member.size].numpy().tobytes()
        computed = zlib.crc32(data)
        if computed != member.crc:  # in-place writes reach tensor payloads only: this holds even unsealed
            raise _checksum_error(self.path, inner, member.crc, computed)
        return data

    def read_meta(self, folder: str) -> dict:
        from .._meta_json import parse_meta

        meta_path = self.join(folder, _META)
        if self._inner(meta_path) not in self.members:
            raise FileNotFoundError(2, f"No such file or directory: {folder} has no {_META} in the archive, so it "
                                       "is not a saved TensorDict", meta_path)
        return parse_meta(folder, self.read(meta_path))

    def _decompress(self, inner: str) -> bytes:
        with self._lock:
            if self._zip is None:
                self._zip = zipfile.ZipFile(self.path)
        try:
            return self._zip.read(inner)  # zipfile checks the CRC-32 (and reads under its own lock)
        except Exception as error:  # a damaged stream fails in the decompressor: zlib.error, EOFError, OSError...
            raise zipfile.BadZipFile(f"The archive {self.path} is corrupted: the entry {inner!r} can't be read "
                                     f"back ({type(error).__name__}: {error}).") from error

    def map(self, path: str, dtype: torch.dtype, shape: torch.Size, mode: str | None) -> torch.Tensor:
        inner, member = self._member(path)
        needed = shape.numel() * dtype.itemsize
        if member.size < needed:
            raise RuntimeError(f"The entry {path} holds {member.size} bytes but {dtype} data of shape {list(shape)} "
                               f"needs {needed} bytes: the entry is truncated.")
        if member.compress_type != zipfile.ZIP_STORED:
            if self.writable:
                raise RuntimeError(f"Cannot open {self.path} with mode='r+': entry {inner!r} is compressed, so "
                                   "in-place writes cannot reach the file. Save the archive without compression "
                                   "to make it writable.")
            data = self._decompress(inner)
            if not needed:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(bytearray(data[:needed]), dtype=dtype).view(shape)
        if self.sealed and not _already_verified(self.path, inner):
            self._pending.append((inner, member))
        if not needed:
            return torch.empty(shape, dtype=dtype)
        flat = self.storage[member.offset: member.offset + needed]
        if member.offset % dtype.itemsize:
            if self.writable:
                raise RuntimeError(f"Cannot open {self.path} with mode='r+': the payload of entry {inner!r} is not "
                                   "aligned (the archive was written by another zip tool), so it must be copied "
                                   "and in-place writes cannot reach the file. Save the archive again with "
                                   "torchdict to make it writable.")
            flat = flat.clone()
        return flat.view(dtype).view(shape)

    def finish(self, num_threads: int) -> None:
        """Check the CRC-32 of every stored payload this load mapped; then unseal a writable archive."""
        pending, self._pending = self._pending, []
        if pending:
            from .._progress import byte_progress

            storage = self.storage
            progress = byte_progress(sum(member.size for _, member in pending),
                                     f"checking {os.path.basename(self.path)}")

            def check(item: tuple) -> str:
                name, member = item
                data = storage[member.offset: member.offset + member.size].numpy()
                computed = zlib.crc32(data.data)  # releases the GIL on large buffers: threads help
                if computed != member.crc:
                    raise _checksum_error(self.path, name, member.crc, computed)
                if progress is not None:
                    progress.update(member.size)
                return name

            try:
                if num_threads and num_threads > 1 and len(pending) > 1:
                    from concurrent.futures import ThreadPoolExecutor

                    with ThreadPoolExecutor(max_workers=num_threads) as pool:
                        names = list(pool.map(check, pending))
                else:
                    names = [check(item) for item in pending]
            finally:
                if progress is not None:
                    progress.close()
            if not self.writable:
                _remember_verified(self.path, names)
        if self.writable and self.sealed:
            _mark_unsealed(self.path)
            self.sealed = False
        if self._zip is not None:
            self._zip.close()
            self._zip = None


def open_archive_tree(path: str, mode: str | None) -> tuple:
    """(tree, root path) for loading the archive at ``path``; ``mode="r+"`` maps it writable (shared)."""
    writable = mode == "r+"
    if writable and not os.access(path, os.W_OK):
        raise PermissionError(f"Cannot open {path} with mode='r+': the file is not writable.")
    tree = ArchiveTree(path, writable)
    return tree, tree.root()


# ---------------------------------------------------------------------- checksums
def refresh_archive_checksums(archive_path: str | os.PathLike) -> Path:
    """Recompute the CRC-32 of every stored entry of an archive written in place, and seal it again.

    ``load_memmap(archive, mode="r+")`` and ``memmap_like`` to an archive write into the file without
    updating the checksums the zip stores; torchdict marks such an archive *unsealed* and loads it without
    checking its tensor payloads. This rewrites the checksums (in the local headers and the central
    directory, in place) and removes the mark, so that ``unzip``, :mod:`zipfile`, :func:`unpack_memmap` and
    ``load_memmap`` accept the archive and check it again.

    Raises ``ValueError`` when ``archive_path`` is not an archive (see :func:`is_memmap_archive`).

    >>> import tempfile, os, zipfile
    >>> from torchdict import TensorDict
    >>> path = os.path.join(tempfile.mkdtemp(), "td.tdz")
    >>> _ = TensorDict(a=torch.zeros(3)).save(path)
    >>> TensorDict.load_memmap(path, mode="r+")["a"].add_(1).tolist()
    [1.0, 1.0, 1.0]
    >>> zipfile.ZipFile(path).testzip()  # the first entry whose checksum is wrong
    'a.memmap'
    >>> _ = refresh_archive_checksums(path)
    >>> zipfile.ZipFile(path).testzip() is None
    True
    """
    path = os.fspath(archive_path)
    if not is_memmap_archive(path):
        raise ValueError(f"{archive_path} is not a memory-mapped tensordict archive.")
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        central = archive.start_dir
    file_size = os.path.getsize(path)
    crcs: dict = {}
    with open(path, "r+b") as handle:
        for info in infos:
            if info.filename.endswith("/"):
                continue
            offset = _payload_offset(handle, info, path, file_size)
            if info.compress_type != zipfile.ZIP_STORED:
                continue  # a compressed entry cannot have been written in place
            handle.seek(offset)
            crc = 0
            remaining = info.file_size
            while remaining:
                chunk = handle.read(min(remaining, _CHUNK))
                if not chunk:
                    raise zipfile.BadZipFile(f"The archive {path} is truncated in the entry {info.filename!r}.")
                crc = zlib.crc32(chunk, crc)
                remaining -= len(chunk)
            crcs[info.filename] = crc
            if info.flag_bits & 0x8:  # the CRC lives in a data descriptor after the payload
                descriptor = offset + info.compress_size
                handle.seek(descriptor)
                if handle.read(4) == b"PK\x07\x08":
                    descriptor += 4
                handle.seek(descriptor)
            else:
                handle.seek(info.header_offset + 14)
            handle.write(struct.pack("<I", crc))
        position = central
        for _ in infos:
            handle.seek(position)
            record = handle.read(46)
            if record[:4] != _CENTRAL_SIGNATURE:
                raise zipfile.BadZipFile(f"The archive {path} is corrupted: bad central directory record.")
            flags = struct.unpack_from("<H", record, 8)[0]
            name_length, extra_length, comment_length = struct.unpack_from("<3H", record, 28)
            name = handle.read(name_length).decode("utf-8" if flags & 0x800 else "cp437")
            if name in crcs:
                handle.seek(position + 16)
                handle.write(struct.pack("<I", crcs[name]))
            position += 46 + name_length + extra_length + comment_length
    with zipfile.ZipFile(path, "a") as archive:
        if archive.comment == UNSEALED_COMMENT:
            archive.comment = b""
    forget_verified(path)
    return Path(archive_path)
