"""Write a file so that a failed write leaves nothing at the target path.

The writer writes a hidden sibling of the target, which replaces the target in one ``os.replace`` once the
write succeeded; a failure removes the sibling. The sibling lives in the target's folder, so the replace is
a rename on one file system (atomic on POSIX and Windows).
"""
from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any, Iterator

__all__ = ["atomic_target", "is_path"]


def is_path(target: Any) -> bool:
    """Whether ``target`` names a file (``str`` / ``os.PathLike``), rather than a buffer or a URL-like object."""
    return isinstance(target, (str, os.PathLike))


@contextlib.contextmanager
def atomic_target(path: Any) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it becomes ``path``, on failure it is removed.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_target(folder / "out.txt") as tmp:
    ...     _ = pathlib.Path(tmp).write_text("done")
    >>> (folder / "out.txt").read_text(), len(list(folder.iterdir()))
    ('done', 1)
    """
    target = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(target))
    temporary = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.partial")
    try:
        yield temporary
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
