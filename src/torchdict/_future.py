"""``TensorDictFuture``: what ``memmap`` / ``memmap_`` / ``memmap_like`` / ``save`` / ``consolidate`` return
with ``return_early=True`` (upstream's ``tensordict.utils.TensorDictFuture``).

It holds the background writes (``futures``) and the collection they fill (``resulting_td``);
``result()`` waits for every write, raises the first error, and returns the collection. It is also a
``concurrent.futures.Future`` (done once every write is), so ``done()``, ``exception()``,
``add_done_callback`` and ``concurrent.futures.wait`` work on it too.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, wait
from typing import Any, Optional, Sequence


class TensorDictFuture(Future):
    """A collection that background threads are still writing: ``result()`` waits and returns it.

    ``futures``: the ``concurrent.futures.Future`` of each write. ``resulting_td``: the collection
    ``result()`` returns (None: the result of the last write, for a write that makes the collection).

    >>> import tempfile, torch
    >>> from torchdict import TensorDict
    >>> td = TensorDict(a=torch.zeros(3), b=torch.ones(3), batch_size=[3])
    >>> with tempfile.TemporaryDirectory() as path:
    ...     future = td.memmap(path, num_threads=2, return_early=True)
    ...     print(type(future).__name__, future.result()["b"].tolist())
    TensorDictFuture [1.0, 1.0, 1.0]
    """

    def __init__(self, futures: Sequence[Future], resulting_td: Any) -> None:
        super().__init__()
        self.futures = list(futures)
        self.resulting_td = resulting_td
        self._pending = len(self.futures)
        self._count_lock = threading.Lock()
        if not self.futures:
            self.set_result(resulting_td)
        for future in self.futures:
            future.add_done_callback(self._one_done)

    def _one_done(self, _: Future) -> None:
        with self._count_lock:
            self._pending -= 1
            last = self._pending == 0
        if not last:
            return
        for future in self.futures:  # the first error, in the order of the writes (as result() raises it)
            error = future.exception()
            if error is not None:
                self.set_exception(error)
                return
        self.set_result(self.resulting_td if self.resulting_td is not None else self.futures[-1].result())

    def result(self, timeout: Optional[float] = None) -> Any:
        """Wait for every write; raise the first one's error, else return the collection."""
        wait(self.futures, timeout)
        return super().result(timeout)


TensorDictFuture.__module__ = "torchdict.utils"  # its public home (as upstream's tensordict.utils)
