"""Key -> file name: the one escaping function of the saved format, and the safe-name check.

A key becomes a file or folder name only through :func:`key_to_filename`, which can
never produce a path separator, ``.`` or ``..``: no key can write outside its folder.
There is no inverse: ``meta.json`` stores every key verbatim beside its file name, so
loading never has to decode a name (and a cut, hashed long name could not be decoded).
Names read back from ``meta.json`` go through :func:`is_safe_name` before use.
"""
from __future__ import annotations

from ._bounded_cache import BoundedCache

__all__ = ["escape_key", "is_safe_name", "key_to_filename"]

# Characters upstream tensordict escapes as %XX (kept identical so its folders load):
# path separators, characters Windows forbids, space, '%' itself and control characters.
_ESCAPED_CHARS = frozenset('/<>:"|?*\\ %') | frozenset(map(chr, range(32))) | {chr(127)}
# Folder names must not look like the files that sit beside them.
_FILE_SUFFIXES = (".memmap", ".pickle", ".json")
# Filesystems cap a name at 255 bytes; leave room for the ".memmap"/".pickle" suffix.
_MAX_NAME_BYTES = 200
# (key, directory) -> name; saving the same structure again skips the escaping loop.
_filename_cache: BoundedCache = BoundedCache(65536)


def escape_key(key: str) -> str:
    """``key`` with every unsafe character as ``%XX``, exactly as upstream tensordict names files.

    Not cut to a maximum length: upstream folders are looked up with it (see
    :mod:`torchdict._upstream_format`); new files are named by :func:`key_to_filename`.

    >>> escape_key("a/b c"), escape_key(".."), escape_key("")
    ('a%2Fb%20c', '%2E%2E', '%')
    """
    if key == "":
        return "%"
    if key == ".":
        return "%2E"
    if key == "..":
        return "%2E%2E"
    parts = []
    for char in key:
        if char in _ESCAPED_CHARS:
            parts.append(f"%{ord(char):02X}")
        elif "\ud800" <= char <= "\udfff":
            # A lone surrogate has no UTF-8 form; escape its surrogatepass bytes.
            parts.extend(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
        else:
            parts.append(char)
    return "".join(parts)


def key_to_filename(key: str, directory: bool = False) -> str:
    """The file (or folder) name that stores ``key``: the one escaping function of the format.

    Unsafe characters become ``%XX`` as in upstream tensordict (``"a/b"`` -> ``"a%2Fb"``,
    ``".."`` -> ``"%2E%2E"``, ``""`` -> ``"%"``); other characters, non-ASCII included, are kept.
    A name longer than 200 bytes is cut and suffixed with ``%~`` and a hash of the full key
    (a plain escaped name never holds ``%~``, so this cannot collide); ``meta.json`` records
    every key with its name, so nothing is lost. Folder names ending like a stored file
    (``.memmap``, ``.pickle``, ``.json``) get their last dot escaped.

    >>> key_to_filename("key 1"), key_to_filename("../x"), key_to_filename("meta.json", directory=True)
    ('key%201', '..%2Fx', 'meta%2Ejson')
    """
    cache_key = (key, directory)
    name = _filename_cache.get(cache_key)
    if name is not None:
        return name
    name = escape_key(key)
    if directory and name.endswith(_FILE_SUFFIXES):
        dot = name.rfind(".")
        name = f"{name[:dot]}%2E{name[dot + 1:]}"
    if len(name.encode("utf-8")) > _MAX_NAME_BYTES:
        import hashlib

        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        head = name.encode("utf-8")[: _MAX_NAME_BYTES - 18].decode("utf-8", "ignore")
        name = f"{head}%~{digest}"
    return _filename_cache.put(cache_key, name)


def is_safe_name(name: object) -> bool:
    """True when ``name`` (read from a ``meta.json``) can only designate an entry of its own folder.

    >>> is_safe_name("w.memmap"), is_safe_name("../w.memmap"), is_safe_name(".."), is_safe_name(3)
    (True, False, False, False)
    """
    return (
        type(name) is str
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        # at most 4 bytes per character: only long names need encoding to be measured
        and (len(name) <= 63 or len(name.encode("utf-8", "surrogatepass")) <= 255)
    )
