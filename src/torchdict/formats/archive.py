"""``.tdz`` archives: a saved TensorDict folder as one zip file, mapped once and read without copies.

An archive is a plain zip file whose entries are the files of a saved folder, at the same relative
paths (``meta.json`` per level, ``<key>.memmap`` per tensor). ``unzip`` gives back the folder, and
``zip -0 -r`` of a folder gives a loadable archive. Upstream tensordict 0.15 writes the same kind of file:
its archives load here, and ``td.save("x.tdz")`` writes its folder layout whenever that layout can hold the
data (see :mod:`._upstream_layout`), so that tensordict opens torchdict's archives too.

Tensor entries are stored uncompressed by default, with their payload aligned to 64 bytes (a padding
block in the local header's extra field), so loading maps the whole file once and every leaf is a view
into that mapping. A compressed entry is decompressed in memory instead.

Safety, beyond what the folder loader checks:

- **Checksums are verified on load.** Every entry a load reads is checked against the CRC-32 the zip
  stores for it (meta.json and pickles as they are read, tensor payloads before ``load_memmap``
  returns), so an archive altered after it was written is refused with ``zipfile.BadZipFile``. A
  verified archive is remembered by its (device, inode, size, mtime) for the rest of the process.
- **Writes in place unseal an archive.** ``load_memmap(archive, mode="r+")`` and ``memmap_like`` to an
  archive write into the file without updating the checksums. They first mark the archive *unsealed*
  (the zip comment says so); an unsealed archive loads without checking its tensor payloads.
  :func:`refresh_archive_checksums` recomputes the checksums and seals it again.
- **Writes are atomic.** An archive is written to a hidden temporary file beside the target, which
  then replaces it with one ``os.replace``: a failed or killed write leaves the old file, or nothing.
- **Unpacking never writes outside the target** (names with ``..``, absolute names and the like are
  refused before anything is written) and never follows a symlink inside it.
"""
from __future__ import annotations

import os
import stat
import struct
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from ._archive_reading import (
    _CHUNK, _LOCAL_HEADER, _META, _remember_verified, forget_verified,
    is_memmap_archive, open_archive_tree, refresh_archive_checksums,
)

__all__ = [
    "ARCHIVE_SUFFIX",
    "is_memmap_archive",
    "open_archive_tree",
    "pack_memmap",
    "refresh_archive_checksums",
    "save_archive",
    "unpack_memmap",
]

ARCHIVE_SUFFIX = ".tdz"
# Payload alignment of stored tensor entries: a multiple of every dtype's size (and torch.save's).
_ALIGNMENT = 64
# Header id of the padding block in the local extra field (the id zipalign-style tools use for padding).
_PADDING_ID = 0xD935
# zipfile adds a zip64 block of this size to the local header of an entry opened with force_zip64.
_ZIP64_LOCAL_EXTRA = 20
# Entries carry a fixed date, so that saving the same data twice gives the same bytes.
_ENTRY_DATE = (1980, 1, 1, 0, 0, 0)
_COMPRESSIONS = {
    None: zipfile.ZIP_STORED,
    "stored": zipfile.ZIP_STORED,
    "deflate": zipfile.ZIP_DEFLATED,
    "deflated": zipfile.ZIP_DEFLATED,
    "bzip2": zipfile.ZIP_BZIP2,
    "lzma": zipfile.ZIP_LZMA,
}
_SKIPPED_SUFFIXES = (".torchdict-new", ".torchdict-spare", ".torchdict-old")


# ---------------------------------------------------------------------- small helpers
def _compression(compression: Any) -> int:
    if isinstance(compression, bool):
        raise ValueError(f"Unknown compression {compression!r}.")
    if isinstance(compression, int):
        if compression not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
            raise ValueError(f"Unknown compression {compression!r}: not a zipfile compression constant.")
        return compression
    key = compression.lower() if isinstance(compression, str) else compression
    try:
        return _COMPRESSIONS[key]
    except (KeyError, TypeError):
        names = sorted(name for name in _COMPRESSIONS if isinstance(name, str))
        raise ValueError(f"Unknown compression {compression!r}. Expected one of {names} or a zipfile "
                         "compression constant.") from None


def _set_level(info: zipfile.ZipInfo, level: int | None) -> None:
    if level is None:
        return
    # (setattr: the attribute of each Python version is missing from the other versions' stubs)
    try:
        setattr(info, "compress_level", level)  # Python 3.13+
    except AttributeError:
        setattr(info, "_compresslevel", level)  # earlier versions: the attribute ZipFile.open(info, "w") reads


def _padding(header_offset: int, name: str) -> bytes:
    """The extra field that puts the payload of an entry whose local header starts at ``header_offset`` on
    an ``_ALIGNMENT`` boundary (zipfile writes it, then its own zip64 block, before the payload)."""
    start = header_offset + _LOCAL_HEADER.size + len(name.encode("utf-8")) + 4 + _ZIP64_LOCAL_EXTRA
    pad = -start % _ALIGNMENT
    return struct.pack("<HH", _PADDING_ID, pad) + bytes(pad)


def _file_chunks(path: str) -> Iterator[bytes]:
    from .._nofollow import open_in_folder

    fd = open_in_folder(path, os.O_RDONLY, writing=False)
    try:
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                return
            yield chunk
    finally:
        os.close(fd)


def _resolved_target(path: Any) -> str:
    """The file an archive write replaces: a symlink at ``path`` is followed, as for a saved folder."""
    return os.path.realpath(os.path.abspath(os.fspath(path)))


# ---------------------------------------------------------------------- writing
class _Entry:
    """One file of the archive to write: its name, size, and where its bytes come from."""

    __slots__ = ("name", "size", "chunks", "payload")

    def __init__(self, name: str, size: int, chunks: Callable[[], Iterable[Any]], payload: bool) -> None:
        self.name = name
        self.size = size
        self.chunks = chunks
        self.payload = payload  # a tensor's bytes: aligned, and compressed if asked


def _write_archive(entries: Iterable[_Entry], target: str, compression: Any, compresslevel: int | None) -> None:
    """Write ``entries`` as a zip at ``target``: a temporary file beside it, renamed over it once complete."""
    from .._progress import byte_progress, progress_bar_enabled

    compress_type = _compression(compression)
    progress = None
    if progress_bar_enabled():  # the bar needs the total: the entries are listed first (they hold no data)
        entries = list(entries)
        progress = byte_progress(sum(entry.size for entry in entries), f"archive {os.path.basename(target)}")
    temporary, handle = _new_file_beside(target)
    try:
        with os.fdopen(handle, "w+b") as raw:
            with zipfile.ZipFile(raw, "w", allowZip64=True) as archive:
                for entry in entries:
                    _write_entry(archive, raw, entry, compress_type, compresslevel, progress)
        try:
            os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))  # replacing a file keeps its permissions
        except FileNotFoundError:
            pass
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    finally:
        if progress is not None:
            progress.close()
    forget_verified(target)


def _new_file_beside(target: str) -> tuple:
    """(path, fd) of a new hidden file next to ``target``, created with the umask's permissions."""
    import secrets

    folder, name = os.path.split(target)
    for _ in range(100):
        path = os.path.join(folder, f".{name[:100]}.{secrets.token_hex(6)}.partial")
        try:
            return path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"Could not create a temporary file beside {target}.")


def _write_entry(archive: zipfile.ZipFile, raw: Any, entry: _Entry, compress_type: int,
                 compresslevel: int | None, progress: Any = None) -> None:
    info = zipfile.ZipInfo(entry.name, date_time=_ENTRY_DATE)
    info.file_size = entry.size
    info.external_attr = 0o644 << 16
    info.compress_type = compress_type if entry.payload else zipfile.ZIP_STORED
    if info.compress_type != zipfile.ZIP_STORED:
        _set_level(info, compresslevel)
    elif entry.payload:
        info.extra = _padding(raw.tell(), entry.name)
    written = 0
    with archive.open(info, "w", force_zip64=True) as sink:
        for chunk in entry.chunks():
            sink.write(chunk)
            written += len(chunk)
            if progress is not None:
                progress.update(len(chunk))
    if written != entry.size:
        raise RuntimeError(f"The archive entry {entry.name!r} changed size while it was written "
                           f"({written} bytes instead of {entry.size}).")


def _folder_entries(folder: str, at: str = "", sources: dict | None = None) -> Iterator[_Entry]:
    """The files of a saved folder, in archive order: ``meta.json`` first at every level, then the other
    files, then the sub-folders, each sorted by name. A symlink or special file is refused.

    ``sources`` maps the real path of a (sparse, staged) ``.memmap`` file to the tensor whose bytes the
    entry holds instead of the file's.
    """
    from .._nofollow import link_refused

    files: list = []
    folders: list = []
    with os.scandir(folder) as listing:
        for item in listing:
            if item.is_symlink():
                raise link_refused(item.path, writing=False)
            if item.is_dir(follow_symlinks=False):
                if not item.name.endswith(_SKIPPED_SUFFIXES):  # a nested save's swap siblings
                    folders.append(item.name)
            elif item.is_file(follow_symlinks=False):
                if not (item.name.startswith("%") and item.name.endswith(".tmp")):  # an unfinished meta.json
                    files.append(item.name)
            else:
                raise RuntimeError(f"{item.path} is not a regular file, so it is not part of a saved TensorDict.")
    files.sort(key=lambda name: (name != _META, name))
    for name in files:
        yield _file_entry(os.path.join(folder, name), at + name, sources)
    for name in sorted(folders):
        yield from _folder_entries(os.path.join(folder, name), f"{at}{name}/", sources)


def _file_entry(path: str, name: str, sources: dict | None) -> _Entry:
    """The entry ``name`` holding the file at ``path``, or the bytes of the tensor ``sources`` maps it to."""
    source = None if sources is None else sources.get(os.path.realpath(path))
    if source is not None:
        size = source.numel() * source.element_size()
        return _Entry(name, size, lambda: _tensor_chunks(source), True)
    return _Entry(name, os.lstat(path).st_size, lambda: _file_chunks(path), name.endswith(".memmap"))


def _tensor_chunks(tensor: torch.Tensor) -> Iterator[memoryview]:
    from ..memmap import tensor_byte_chunks

    return tensor_byte_chunks(tensor, _CHUNK)


def pack_memmap(prefix: str | os.PathLike, archive_path: str | os.PathLike, *, compression: str | int | None = None,
                compresslevel: int | None = None) -> Path:
    """Pack the saved folder ``prefix`` into the single-file archive ``archive_path``; returns its path.

    The archive holds the folder's files at the same relative paths (:func:`unpack_memmap` or ``unzip``
    gives the folder back). Tensor files are stored uncompressed and aligned, so that ``load_memmap`` maps
    the archive and reads nothing until used; ``compression`` (``"stored"``, ``"deflate"``, ``"bzip2"``,
    ``"lzma"`` or a ``zipfile`` constant) makes a smaller file whose leaves are decompressed in memory on
    load. ``compresslevel`` goes to :mod:`zipfile`. An existing archive is replaced atomically.

    Raises ``ValueError`` when ``prefix`` has no ``meta.json`` or ``archive_path`` lies inside it.

    >>> import tempfile, os
    >>> from torchdict import TensorDict
    >>> folder = tempfile.mkdtemp()
    >>> _ = TensorDict(a=torch.zeros(3), b={"c": torch.ones(3, 2)}).memmap(os.path.join(folder, "saved"))
    >>> archive = pack_memmap(os.path.join(folder, "saved"), os.path.join(folder, "saved.tdz"))
    >>> TensorDict.load_memmap(archive)["b", "c"].shape
    torch.Size([3, 2])
    """
    folder = os.path.abspath(os.fspath(prefix))
    if not os.path.isfile(os.path.join(folder, _META)):
        raise ValueError(f"{prefix} does not look like a memory-mapped tensordict directory (no meta.json found).")
    target = _resolved_target(archive_path)
    real_folder = os.path.realpath(folder)
    if target == real_folder or target.startswith(real_folder + os.sep):
        raise ValueError(f"The archive path {archive_path} must be outside the source directory {prefix} and must "
                         "not alias a source file.")
    _compression(compression)  # a bad value fails before anything is written
    _write_archive(_folder_entries(folder), target, compression, compresslevel)
    return Path(archive_path)


# ---------------------------------------------------------------------- saving a collection as an archive
def _pair_leaves(source: Any, staged: Any, sources: dict) -> None:
    """Map each staged (sparse) file to the tensor of ``source`` whose bytes it stands for."""
    from ..nontensor import NonTensorData, NonTensorStack

    if isinstance(staged, torch.Tensor):
        sources[os.path.realpath(getattr(staged, "filename"))] = source  # a MemoryMappedTensor's file
        return
    if isinstance(staged, (NonTensorData, NonTensorStack)):
        return
    members = getattr(staged, "tensordicts", None)
    if members is not None:  # a lazy stack: one folder per member
        for source_member, staged_member in zip(source.tensordicts, members):
            _pair_leaves(source_member, staged_member, sources)
        return
    from .._loading import _as_td

    source_td, staged_td = _as_td(source), _as_td(staged)
    for key in staged_td.keys():
        _pair_leaves(source_td._get_str(key, None), staged_td._get_str(key, None), sources)


def save_archive(data: Any, prefix: Any, *, like: bool = False, copy_existing: bool = False, num_threads: int = 0,
                 compression: str | int | None = None, existsok: bool = True, allow_pickle: bool = False,
                 loader: Callable[..., Any] | None = None) -> Any:
    """Write ``data`` (any saved collection) to the archive ``prefix``; returns it loaded from the archive.

    The layout is staged first as a folder of sparse files beside the target (``memmap_like``: the
    ``meta.json`` files, no data), then streamed into the zip with each tensor's bytes read straight from
    ``data``: one pass over the data, no second copy in memory or on disk. The archive takes upstream
    tensordict's layout whenever that layout can hold the save (:mod:`._upstream_layout`), torchdict's
    otherwise. With ``like=True`` the archive
    holds zeros and is loaded writable (``mode="r+"``, see :func:`refresh_archive_checksums`).
    """
    import shutil
    import tempfile

    if prefix is None:
        raise ValueError("A path is required to write a memmap archive.")
    target = _resolved_target(prefix)
    if os.path.isdir(target):
        raise ValueError(f"Cannot write an archive at {prefix}: it is an existing directory.")
    if os.path.lexists(target) and not existsok:
        raise RuntimeError(f"A file already exists at {prefix}, cannot save the tensordict there. Set "
                           "existsok=True to overwrite.")
    _compression(compression)
    if like and compression not in (None, "stored", zipfile.ZIP_STORED):
        raise ValueError("memmap_like writes a writable archive, whose entries cannot be compressed.")
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)[:100]}.stage-", dir=parent)  # private: 0o700
    try:
        staged = data.memmap_like(os.path.join(staging, "td"), allow_pickle=allow_pickle)
        sources: dict = {}
        if not like:
            _pair_leaves(data, staged, sources)
        del staged
        from ._upstream_layout import upstream_entries

        folder = os.path.join(staging, "td")
        entries = upstream_entries(folder, sources)  # upstream tensordict opens it too, when it can say it all
        _write_archive(_folder_entries(folder, "", sources) if entries is None else entries, target, compression,
                       None)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _remember_verified(target, None)  # just written from memory: nothing to check on the reload
    if loader is None:
        from .._loading import load_memmap

        loader = load_memmap
    return loader(target, mode="r+" if like else None, allow_pickle=True)


# ---------------------------------------------------------------------- unpacking
def _checked_names(infos: list, archive_path: str) -> dict:
    """The layout of the archive's files ({name: None for a file, or a sub-layout}), refusing unsafe names."""
    from .._filenames import is_safe_name

    layout: dict = {}
    seen = set()
    for info in infos:
        name = info.filename
        if info.flag_bits & 0x1:
            raise RuntimeError(f"Cannot unpack the encrypted entry {name!r} of {archive_path}.")
        is_dir = name.endswith("/")
        parts = name.rstrip("/").split("/")
        if not all(is_safe_name(part) for part in parts):
            raise ValueError(f"Refusing to unpack {archive_path}: the entry {name!r} would be written outside the "
                             "target folder.")
        if name in seen:
            raise ValueError(f"Refusing to unpack {archive_path}: it holds the entry {name!r} twice.")
        seen.add(name)
        level = layout
        for part in parts[:-1]:
            level = level.setdefault(part, {})
            if level is None:
                raise ValueError(f"Refusing to unpack {archive_path}: {name!r} is inside a file.")
        last = parts[-1]
        if is_dir:
            if level.setdefault(last, {}) is None:
                raise ValueError(f"Refusing to unpack {archive_path}: {name!r} is both a file and a folder.")
        elif last in level:
            raise ValueError(f"Refusing to unpack {archive_path}: {name!r} is both a file and a folder.")
        else:
            level[last] = None
    return layout


def _extract(archive: zipfile.ZipFile, infos: list, folder: str, layout: dict) -> None:
    from .._nofollow import check_folder
    from ..memmap import _open_for_write

    def make_folders(path: str, level: dict) -> None:
        for name, sub in level.items():
            if sub is not None:
                child = os.path.join(path, name)
                try:
                    os.mkdir(child)
                except FileExistsError:
                    check_folder(child, writing=True)
                make_folders(child, sub)

    make_folders(folder, layout)
    for info in infos:
        if info.filename.endswith("/"):
            continue
        path = os.path.join(folder, *info.filename.split("/"))
        fd = _open_for_write(path, True)
        try:
            with archive.open(info) as stream:  # zipfile checks the CRC-32 at the end of the entry
                while True:
                    try:
                        chunk = stream.read(_CHUNK)
                    except Exception as error:  # zipfile.BadZipFile, or the decompressor's own error
                        raise zipfile.BadZipFile(f"The archive {archive.filename} is corrupted: the entry "
                                                 f"{info.filename!r} can't be read back ({error}).") from error
                    if not chunk:
                        break
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
            os.ftruncate(fd, info.file_size)
        finally:
            os.close(fd)


def unpack_memmap(archive_path: str | os.PathLike, prefix: str | os.PathLike) -> Path:
    """Extract the archive ``archive_path`` into the folder ``prefix`` (the inverse of :func:`pack_memmap`).

    The folder is written beside ``prefix`` and moved into place once complete, so ``prefix`` holds the
    old content or the whole new one, never half of it. ``prefix`` may be missing, empty, or hold an earlier
    save (which is replaced, as a save replaces one); a folder holding other files is refused. Every entry
    name is checked first: none may reach outside ``prefix``. Each entry's CRC-32 is checked as it is read.

    Raises ``ValueError`` when ``archive_path`` is not an archive (see :func:`is_memmap_archive`).

    >>> import tempfile, os
    >>> from torchdict import TensorDict
    >>> folder = tempfile.mkdtemp()
    >>> _ = TensorDict(a=torch.zeros(3)).save(os.path.join(folder, "td.tdz"))
    >>> out = unpack_memmap(os.path.join(folder, "td.tdz"), os.path.join(folder, "td"))
    >>> sorted(os.listdir(out))
    ['a.memmap', 'meta.json']
    """
    import shutil

    from .._atomic_save import make_fresh_folder
    from .._folder_swap import begin_swap, holds_only_a_save

    source = os.fspath(archive_path)
    if not is_memmap_archive(source):
        raise ValueError(f"{archive_path} is not a memory-mapped tensordict archive.")
    shown = os.path.abspath(os.fspath(prefix))
    target = os.path.realpath(shown)
    with zipfile.ZipFile(source) as archive:
        infos = archive.infolist()
        layout = _checked_names(infos, source)
        if os.path.lexists(target) and not os.path.isdir(target):
            raise NotADirectoryError(f"Cannot unpack into {prefix}: it exists and is not a folder.")
        if os.path.isdir(target) and os.listdir(target):
            if not holds_only_a_save(target):
                raise RuntimeError(f"Cannot unpack into {prefix}: it holds files that are not part of a saved "
                                   "TensorDict. Choose a new or empty folder.")
            swap = begin_swap(target, shown)
            if swap is None:
                raise RuntimeError(f"Cannot replace the folder {prefix} (a mount point, or the working "
                                   "directory): unpack into a new folder.")
            try:
                swap.prepare(layout)
                _extract(archive, infos, swap.work, layout)
                swap.commit()
            except BaseException:
                swap.abandon()
                raise
            return Path(prefix)
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        work = make_fresh_folder(parent, f".{os.path.basename(target)[:100]}.unpack-")
        try:
            _extract(archive, infos, work, layout)
            os.rename(work, target)  # replaces an empty folder; fails if someone filled it meanwhile
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return Path(prefix)
