"""The temporary folders behind ``map``'s memory-mapped outputs.

When the source is memory-mapped, ``map`` writes its output into files under a
fresh folder of ``tempfile.gettempdir()``. A folder tied to its result goes
when the result is garbage collected (or at interpreter exit); a call that
fails, is interrupted or is terminated removes every folder it made at once,
since no result will ever hold them.
"""
from __future__ import annotations

import shutil
import tempfile
import weakref
from typing import Any, Optional

_PREFIX = "torchdict-map-"


class ScratchFolders:
    """The folders one ``map`` call creates; :meth:`remove_all` when the call fails."""

    def __init__(self) -> None:
        self._loose: list = []  # made, not tied to a result yet
        self._tied: list = []  # weakref.finalize objects: calling one removes its folder, once

    def make(self) -> str:
        folder = tempfile.mkdtemp(prefix=_PREFIX)
        self._loose.append(folder)
        return folder

    def tie(self, result: Any, folder: Optional[str]) -> Any:
        """Remove ``folder`` once ``result`` is garbage collected; returns ``result``."""
        if folder is None:
            return result
        self._loose.remove(folder)
        if result is None:  # nothing was written there
            shutil.rmtree(folder, ignore_errors=True)
        else:
            self._tied.append(weakref.finalize(result, shutil.rmtree, folder, True))
        return result

    def remove_all(self) -> None:
        """Remove every folder made so far, tied or not (the results using them are abandoned)."""
        loose, self._loose = self._loose, []
        for folder in loose:
            shutil.rmtree(folder, ignore_errors=True)
        tied, self._tied = self._tied, []
        for finalizer in tied:
            finalizer()
