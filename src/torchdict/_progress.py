"""Progress bars on long writes and reads (tqdm), shown only when asked for.

Upstream tensordict has no progress bar, so none of its calls takes a keyword for one, and torchdict adds none:
a program written for upstream keeps its exact calls. The bar is a process-wide opt-in instead:

- ``torchdict.set_progress_bar(True)``: a context manager (``with set_progress_bar(True): td.memmap(path)``), a
  decorator, or ``set_progress_bar(True).set()`` for the rest of the program;
- or the environment variable ``TORCHDICT_PROGRESS=1`` (read at each save or load, so a worker started with it
  shows bars too). ``set_progress_bar`` wins over the variable while it applies.

When on, these show one bar counting bytes, updated leaf by leaf (entry by entry for archives):

- ``memmap`` / ``memmap_`` / ``save`` to a folder: the bytes of each tensor written (``memmap_like`` writes no
  data and shows none);
- ``load_memmap`` / ``load``: the bytes of each leaf mapped (a folder load reads nothing until used, so this bar is
  quick), then, for a ``.tdz`` archive, the bytes whose CRC-32 is checked;
- the archive writer (``memmap`` / ``save`` to ``.tdz``, ``pack_memmap``): the bytes of each entry written.

The bars use ``tqdm`` (``pip install torchdict[progress]``); turning them on without it raises ``ImportError``
naming the extra. Nothing here imports tqdm while the bars are off.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Optional

from torch.utils._contextlib import _DecoratorContextManager

__all__ = ["ENV_VAR", "ByteProgress", "byte_progress", "progress_bar_enabled", "set_progress_bar"]

ENV_VAR = "TORCHDICT_PROGRESS"
_MODE: Optional[bool] = None  # set by set_progress_bar; None: the environment variable decides


def progress_bar_enabled() -> bool:
    """Whether saves and loads show a progress bar now.

    >>> with set_progress_bar(False):
    ...     progress_bar_enabled()
    False
    """
    if _MODE is not None:
        return _MODE
    text = os.environ.get(ENV_VAR)
    return text is not None and text.strip().lower() in ("1", "y", "yes", "t", "true", "on")


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError as error:
        raise ImportError("The progress bar (torchdict.set_progress_bar / TORCHDICT_PROGRESS) needs tqdm: "
                          "pip install torchdict[progress]") from error
    return tqdm


class set_progress_bar(_DecoratorContextManager):
    """Show a progress bar (tqdm) on long saves and loads: ``True`` turns it on, ``False`` off.

    A context manager, a decorator, or ``.set()`` for the rest of the program (see this module's doc). Turning it
    on without tqdm installed raises ``ImportError`` naming the extra to install.

    >>> import tempfile, torch
    >>> from torchdict import TensorDict
    >>> with set_progress_bar(False):
    ...     TensorDict(a=torch.zeros(3)).memmap(tempfile.mkdtemp())["a"].shape
    torch.Size([3])
    """

    def __init__(self, mode: bool = True) -> None:
        super().__init__()
        self.mode = bool(mode)
        if self.mode:
            _tqdm()  # the missing library is reported where the bar is asked for

    def clone(self) -> "set_progress_bar":
        # each call of a decorated function gets its own copy
        copy = type(self).__new__(type(self))
        copy.mode = self.mode
        return copy

    def set(self) -> None:
        """Apply the mode for the rest of the program."""
        global _MODE
        self._previous = _MODE
        _MODE = self.mode

    def __enter__(self) -> None:
        self.set()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        global _MODE
        _MODE = self._previous


class ByteProgress:
    """A tqdm bar counting bytes; :meth:`update` may be called from several threads."""

    __slots__ = ("_bar", "_lock")

    def __init__(self, total: Optional[int], desc: str) -> None:
        self._bar = _tqdm()(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, dynamic_ncols=True)
        self._lock = threading.Lock()

    def update(self, nbytes: int) -> None:
        with self._lock:
            self._bar.update(nbytes)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> "ByteProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def byte_progress(total: Optional[int], desc: str) -> Optional[ByteProgress]:
    """A new bar of ``total`` bytes (None: unknown) when progress bars are on, else None."""
    if not progress_bar_enabled():
        return None
    return ByteProgress(total, desc)
