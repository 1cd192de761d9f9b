"""``meta.json``: the description of one saved folder, and how it is written and read safely.

Writing: :func:`write_meta_atomic` goes through a temporary file and ``os.replace``, so a
folder's ``meta.json`` is absent, old or complete, never partial; a save removes it first
(:func:`remove_meta`) and writes it last, which is how an unfinished save is detected.

Reading: :func:`read_meta` and the ``parse_*`` / ``check_*`` helpers validate every value
before it is used (dtypes from a table of torch dtypes, shapes as lists of non-negative
ints, names that stay inside the folder) and raise :func:`corrupt_meta`'s ``ValueError``.
``json`` is imported only when a file is actually read or written.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from ._bounded_cache import BoundedCache
from ._filenames import is_safe_name
from ._nofollow import open_in_folder, read_in_folder

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "META_FILE",
    "TENSORDICT_CLASS",
    "check_fits",
    "corrupt_meta",
    "entry_path",
    "folder_meta",
    "meta_unchanged",
    "parse_dtype",
    "parse_meta",
    "parse_shape",
    "read_meta",
    "remove_meta",
    "tensor_entry",
    "write_meta_atomic",
]

META_FILE = "meta.json"
FORMAT_NAME = "torchdict"
FORMAT_VERSION = 1
# The "class" of a folder holding a plain TensorDict.
TENSORDICT_CLASS = "torchdict:TensorDict"


# ---------------------------------------------------------------------- the description
def tensor_entry(file_name: str, tensor: torch.Tensor) -> dict:
    """The ``meta.json`` entry of a tensor leaf stored in ``file_name``.

    >>> tensor_entry("w.memmap", torch.zeros(2, 3))
    {'kind': 'tensor', 'file': 'w.memmap', 'dtype': 'torch.float32', 'shape': [2, 3]}
    """
    dtype = tensor.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)  # str(dtype) builds a new string each call
    return {"kind": "tensor", "file": file_name, "dtype": name, "shape": list(tensor.shape)}


_DTYPE_NAMES: dict = {}  # torch.float32 -> "torch.float32"


def folder_meta(batch_size: torch.Size, names: Any, class_name: str | None, entries: dict) -> dict:
    """The whole ``meta.json`` of a folder: format, class, batch size, names and its entries.

    >>> folder_meta(torch.Size([2]), None, None, {})["class"]
    'torchdict:TensorDict'
    """
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "class": class_name or TENSORDICT_CLASS,
        "batch_size": list(batch_size),
        "device": "cpu",
        "names": None if names is None else list(names),
        "entries": entries,
    }


# ---------------------------------------------------------------------- writing
# meta.json files this process wrote or verified: path -> ((inode, mtime_ns, size), meta dict).
# Lets a repeated memmap_like see "same layout" with one stat instead of reading the file.
_KNOWN_METAS: BoundedCache = BoundedCache(4096)


def _stat_signature(path: str) -> tuple | None:
    try:
        stat = os.lstat(path)
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def _remember_meta(path: str, meta: dict) -> None:
    signature = _stat_signature(path)
    if signature is not None:
        _KNOWN_METAS.put(path, (signature, meta))


def write_meta_atomic(folder: str, meta: dict) -> None:
    """Write ``folder/meta.json`` so that it is either absent, old or complete, never partial.

    ``os.replace`` swaps the name itself, so a symlink at ``meta.json`` is replaced, not followed.
    """
    import json

    write_file_atomic(folder, META_FILE, json.dumps(meta).encode("utf-8"))
    _remember_meta(folder + os.sep + META_FILE, meta)


def write_file_atomic(folder: str, name: str, data: bytes) -> None:
    """``folder/name`` holds ``data`` or what it held before, never a partial file.

    Written to a temporary name starting with ``%`` (which no escaped key produces), created exclusively
    and never through a symlink (a leftover or planted file there is removed), then renamed over ``name``.
    """
    import threading

    stem = os.path.splitext(name)[0]
    temporary = f"{folder}{os.sep}%{stem}-{os.getpid()}-{threading.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = open_in_folder(temporary, flags, writing=True)
    except FileExistsError:
        os.unlink(temporary)
        fd = open_in_folder(temporary, flags, writing=True)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)
    os.replace(temporary, folder + os.sep + name)


def _same_meta(left: dict, right: dict) -> bool:
    # dict equality ignores order; the order of the entries is the order of the keys.
    return left == right and list(left["entries"]) == list(right["entries"])


def meta_unchanged(folder: str, meta: dict) -> bool:
    """True when ``folder/meta.json`` already holds exactly ``meta``."""
    path = folder + os.sep + META_FILE
    signature = _stat_signature(path)
    if signature is None:
        return False
    known = _KNOWN_METAS.get(path)
    if known is not None and known[0] == signature:
        return _same_meta(known[1], meta)
    import json

    try:
        existing = json.loads(read_in_folder(path))
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink, which the save refuses
        return False
    if type(existing) is not dict or type(existing.get("entries")) is not dict or not _same_meta(existing, meta):
        return False
    _KNOWN_METAS.put(path, (signature, meta))
    return True


def remove_meta(folder: str) -> None:
    """Delete ``folder/meta.json`` if present: the folder is marked as not (yet) a complete save."""
    path = folder + os.sep + META_FILE
    _KNOWN_METAS.pop(path, None)
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------------- reading
def corrupt_meta(folder: str, detail: str) -> ValueError:
    """The error for a ``meta.json`` that does not describe a valid save."""
    return ValueError(f"The saved TensorDict in {folder} has an invalid {META_FILE}: {detail}")


def read_meta(folder: str) -> dict:
    """The parsed ``folder/meta.json``, of any format (torchdict or upstream), as a dict.

    A missing file raises ``FileNotFoundError``; when the folder exists, the message says the
    save that wrote it may not have finished.
    """
    import json

    meta_path = os.path.join(folder, META_FILE)
    try:
        text = read_in_folder(meta_path)
    except FileNotFoundError:
        if not os.path.isdir(folder):
            raise FileNotFoundError(2, "No such file or directory", meta_path) from None
        raise FileNotFoundError(
            2,
            f"No such file or directory: {folder} has no {META_FILE}, so it is not a saved TensorDict, or the "
            "save that wrote it did not finish (meta.json is written last)",
            meta_path,
        ) from None
    return parse_meta(folder, text)


def parse_meta(folder: str, text: bytes) -> dict:
    """``text``, the content of ``folder``'s ``meta.json``, parsed (a ``ValueError`` unless a JSON object).

    >>> parse_meta("ckpt", b'{"format": "torchdict"}')
    {'format': 'torchdict'}
    """
    import json

    try:
        meta = json.loads(text)  # bytes: json detects the UTF-8 encoding
    except ValueError as error:
        raise corrupt_meta(folder, f"not valid JSON ({error})") from None
    if type(meta) is not dict:
        raise corrupt_meta(folder, "expected a JSON object")
    return meta


_DTYPES: dict = {}  # "torch.float32" -> torch.float32, filled on first load


def parse_dtype(folder: str, name: Any) -> torch.dtype:
    """The torch dtype written as ``name`` (``str(dtype)``); only real torch dtypes are accepted.

    >>> parse_dtype("ckpt", "torch.int64")
    torch.int64
    """
    if not _DTYPES:
        _DTYPES.update({str(value): value for value in vars(torch).values() if isinstance(value, torch.dtype)})
    dtype = _DTYPES.get(name) if type(name) is str else None
    if dtype is None:
        raise corrupt_meta(folder, f"unknown dtype {name!r}")
    return dtype


def parse_shape(folder: str, shape: Any) -> torch.Size:
    """``shape`` as a ``torch.Size``, when it is a list of non-negative ints.

    >>> parse_shape("ckpt", [2, 3])
    torch.Size([2, 3])
    """
    if type(shape) is not list:
        raise corrupt_meta(folder, f"invalid shape {shape!r}")
    numel = 1
    for size in shape:
        if type(size) is not int or size < 0:
            raise corrupt_meta(folder, f"invalid shape {shape!r}")
        numel *= size
    if numel > _MAX_NUMEL or max(shape, default=0) > _MAX_NUMEL:
        # torch would overflow computing the size (its message names neither the file nor the shape).
        from ._errors import SavedShapeError

        raise SavedShapeError(str(corrupt_meta(folder, f"shape {shape!r} holds {numel} elements, more than any "
                                                       "tensor can")))
    return torch.Size(shape)


# The most elements a tensor's byte size can count in int64 whatever its dtype (16 bytes at most).
_MAX_NUMEL = (2**63 - 1) // 16


def entry_path(folder: str, name: Any) -> str:
    """The path of the file or sub-folder ``name`` read from ``folder``'s meta.json, refusing unsafe names."""
    if not is_safe_name(name):
        raise corrupt_meta(folder, f"unsafe file name {name!r}")
    return folder + os.sep + name


def check_fits(folder: str, key: str, shape: torch.Size, batch_size: torch.Size) -> None:
    """Refuse an entry whose shape does not start with its folder's batch size."""
    if shape[: len(batch_size)] != batch_size:
        raise corrupt_meta(folder, f"entry {key!r} has shape {list(shape)}, which does not start with the "
                                   f"batch size {list(batch_size)}")
