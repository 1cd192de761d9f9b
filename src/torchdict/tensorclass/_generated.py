"""Running generated source (a tensorclass's ``__init__`` and ``__getitem__``) so that it can be read back.

The source is compiled under a file name of its own and registered with :mod:`linecache`, so tracebacks,
``inspect.getsource`` and debuggers show the generated lines instead of nothing.
"""
from __future__ import annotations

import linecache
from itertools import count

_serial = count().__next__


def exec_generated(source: str, what: str, namespace: dict) -> None:
    """``exec(source, namespace)`` under the file name ``<torchdict-generated what #n>``, kept in linecache."""
    filename = f"<torchdict-generated {what} #{_serial()}>"
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    # mtime None: linecache.checkcache never drops an entry it can't find on disk.
    linecache.cache[filename] = (len(source), None, lines, filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - generated from field names only
