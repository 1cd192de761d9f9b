"""``memmap(..., atomic=True)``: the whole save is written into a new folder beside ``prefix``, then renamed
into place, so that ``prefix`` holds its old content or the complete new save, whatever happens during the write.

A save over an existing save is already swapped in this way (:mod:`torchdict._folder_swap`). ``atomic=True``
also covers a new folder, an empty one, and, as upstream tensordict does, a saved folder holding other files:
the folder is then replaced as a whole (the user asked for it). A folder that holds no save at all is refused.
"""
from __future__ import annotations

import os
import shutil
import stat
from typing import Any, Callable

import torch

from ._folder_swap import _discard, _exchange, sibling
from ._meta_json import META_FILE

__all__ = ["make_fresh_folder", "save_atomically"]


def _check_target(prefix: Any, target: str, existsok: bool) -> bool:
    """True when ``target`` exists (and may be replaced); refuses what upstream refuses."""
    if not os.path.lexists(target):
        return False
    if not os.path.isdir(target):
        raise NotADirectoryError(f"{prefix} exists and is not a directory.")
    if os.listdir(target):
        if not existsok:
            raise RuntimeError(f"{prefix} is not empty and existsok=False.")
        if not os.path.isfile(os.path.join(target, META_FILE)):
            raise RuntimeError(f"Refusing to replace {prefix} with atomic=True: it is not empty and holds no saved "
                               "tensordict (no meta.json).")
    return True


def _rebase(value: Any, old: str, new: str, seen: set) -> None:
    """Point the files and folders recorded in ``value`` (a save's result) under ``old`` to ``new``."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        mapped = getattr(value, "_mapped_file", None)
        if mapped is not None and (mapped.path == old or mapped.path.startswith(old + os.sep)):
            mapped.path = new + mapped.path[len(old):]
        return
    from ._loading import _as_td, _is_collection

    if not _is_collection(value):
        from .nontensor import is_non_tensor

        if is_non_tensor(value):  # a shared leaf (share_non_tensor) names its folder too
            from .nontensor._shared import rebase_shared

            rebase_shared(value, old, new)
        return
    td = _as_td(value)
    path = getattr(td, "_saved_path", None)
    if path is not None and (path == old or path.startswith(old + os.sep)):
        td._saved_path = new + path[len(old):]
    storage = getattr(td, "_tensordict", None)
    if isinstance(storage, dict):
        for child in storage.values():
            _rebase(child, old, new, seen)


def save_atomically(source: Any, prefix: Any, existsok: bool, write: Callable[[str], Any]) -> Any:
    """``write(folder)`` into a new sibling of ``prefix``, then swap it in; returns its result, rebased on ``prefix``."""
    if prefix is None:
        raise ValueError("atomic=True needs a prefix to write the directory to.")
    shown = os.path.abspath(os.fspath(prefix))
    target = os.path.realpath(shown)  # a symlink is followed: the folder it names is replaced
    exists = _check_target(prefix, target, existsok)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    work = make_fresh_folder(parent, f".{os.path.basename(target)[:100]}.torchdict-atomic-")
    try:
        result = write(work)
        if exists:
            os.chmod(work, stat.S_IMODE(os.stat(target).st_mode))
            if _exchange(work, target):
                replaced = work
            else:
                replaced = sibling(target, "old")
                _discard(replaced)
                os.rename(target, replaced)
                try:
                    os.rename(work, target)
                except BaseException:
                    os.rename(replaced, target)
                    raise
            shutil.rmtree(replaced, ignore_errors=True)
        else:
            os.rename(work, target)
    except BaseException:
        if os.path.isdir(work):
            shutil.rmtree(work, ignore_errors=True)
        raise
    _rebase(result, work, shown, set())
    return result


def make_fresh_folder(parent: str, stem: str) -> str:
    """A new, empty folder ``parent/<stem><random>``, with the permissions ``mkdir`` gives (the umask's)."""
    import secrets

    for _ in range(100):
        path = os.path.join(parent, stem + secrets.token_hex(6))
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"Could not create a new folder in {parent}.")
