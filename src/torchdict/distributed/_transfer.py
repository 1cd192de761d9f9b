"""What every transfer of :mod:`torchdict.distributed` is built from, whatever its protocol.

- the two public names, :class:`StructureMismatchError` and :class:`TransferHandle`
  (re-exported by :mod:`torchdict.distributed`, where users import them from);
- :func:`dist`, the one place ``torch.distributed`` is imported (lazily), and
  :func:`comm_device`, where the wire buffers live for a process group;
- :class:`Channel`: messages with one peer on one tag (point-to-point);
- :class:`LocalPreparation`: the local survey of the leaves, and the error that
  stops this side from taking part, kept until it can be reported to the peers
  (raising at once would leave them waiting for messages that never come).

``threading`` is imported lazily, by the first asynchronous transfer.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from . import _wire

_Tensor = torch.Tensor


class StructureMismatchError(RuntimeError):
    """Two ranks tried to exchange TensorDicts whose keys, shapes or dtypes differ."""


# Users import it from torchdict.distributed: show that name in tracebacks and reprs.
StructureMismatchError.__module__ = "torchdict.distributed"


class TransferHandle:
    """A pending transfer or collective, returned (in a one-element list) by the asynchronous calls.

    ``wait()`` blocks until it is done, re-raises any error of the transfer (a
    structure mismatch, a timeout), and then finishes the job on the calling thread
    (for a receive: copies the packed leaves and non-tensor values into the
    TensorDict). Don't read a receiving TensorDict, or write a sending one's large
    leaves, before ``wait()`` returns.

    Example (a handle with nothing left to wait for, only a finishing step)::

        >>> handle = TransferHandle(finish=lambda: print("unpacked"))
        >>> handle.is_completed()
        True
        >>> handle.wait()
        unpacked
        True
        >>> handle.wait()  # the finishing step runs once
        True
    """

    __slots__ = ("_thread", "_works", "_error", "_finish", "_finished")

    def __init__(self, run: Optional[Callable[[], None]] = None, works: Sequence[Any] = (),
                 finish: Optional[Callable[[], None]] = None) -> None:
        self._works = list(works)
        self._error: Optional[BaseException] = None
        self._finish = finish
        self._finished = False
        self._thread = None
        if run is not None:
            import threading

            def target() -> None:
                try:
                    run()
                except BaseException as error:  # handed to the thread that calls wait()
                    self._error = error

            self._thread = threading.Thread(target=target, name="torchdict-transfer", daemon=True)
            self._thread.start()

    def is_completed(self) -> bool:
        """True once the communication is over (``wait()`` may still have unpacking to do)."""
        if self._thread is not None and self._thread.is_alive():
            return False
        return all(work.is_completed() for work in self._works)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until done; raise the transfer's error if it failed. Returns True."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"The TensorDict transfer is still running after {timeout} s.")
        if self._error is not None:
            raise self._error
        if not self._finished:
            for work in self._works:
                work.wait()
            if self._finish is not None:
                self._finish()
            self._finished = True
        return True


TransferHandle.__module__ = "torchdict.distributed"


# --------------------------------------------------------------------- the process group
def dist() -> Any:
    """``torch.distributed``, imported on first use; a clear error on builds without it."""
    import torch.distributed as distributed

    if not distributed.is_available():
        raise RuntimeError("torch.distributed is not available in this build of PyTorch.")
    return distributed


def _backend_name(dist: Any, group: Any) -> str:
    try:
        return str(dist.get_backend(group)).lower()
    except Exception:  # an unregistered ProcessGroup object
        name = getattr(group, "name", None)
        return str(name() if callable(name) else name or "").lower()


def comm_device(dist: Any, group: Any, leaves: list, td: Any) -> torch.device:
    """Where the wire buffers live: the CPU for gloo, else the leaves' accelerator."""
    backend = _backend_name(dist, group)
    hint = next((value.device for _, value, _, _ in leaves if isinstance(value, _Tensor)), td._device)
    if backend == "gloo":
        return torch.device("cpu")
    if hint is not None and hint.type != "cpu":
        return hint
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Channel:
    """Point-to-point messages with one peer, on one tag."""

    __slots__ = ("dist", "peer", "group_peer", "group", "tag", "device", "name")

    def __init__(self, dist: Any, peer: Optional[int], group_peer: Optional[int], group: Any, tag: int,
                 device: torch.device) -> None:
        self.dist, self.peer, self.group_peer, self.group, self.tag, self.device = (
            dist, peer, group_peer, group, tag, device)
        self.name = f"rank {peer}" if group_peer is None else f"group rank {group_peer}"

    def isend(self, tensor: _Tensor) -> Any:
        if self.group_peer is not None:  # the backend itself: works for unregistered groups too
            return self.group.send([tensor], self.group_peer, self.tag)
        return self.dist.isend(tensor, dst=self.peer, group=self.group, tag=self.tag)

    def irecv(self, tensor: _Tensor) -> Any:
        if self.group_peer is not None:
            return self.group.recv([tensor], self.group_peer, self.tag)
        return self.dist.irecv(tensor, src=self.peer, group=self.group, tag=self.tag)

    def send_ints(self, values: list) -> None:
        self.isend(torch.tensor(values, dtype=torch.int64, device=self.device)).wait()

    def recv_ints(self, count: int) -> list:
        received = torch.empty(count, dtype=torch.int64, device=self.device)
        self.irecv(received).wait()
        return received.tolist()

    def send_bytes(self, data: bytes) -> None:
        if data:
            self.isend(_wire.bytes_to_tensor(data, self.device)).wait()

    def recv_bytes(self, count: int) -> bytes:
        if count <= 0:
            return b""
        received = torch.empty(count, dtype=torch.uint8, device=self.device)
        self.irecv(received).wait()
        return _wire.tensor_to_bytes(received)


# --------------------------------------------------------------------- local preparation
class LocalPreparation:
    """This side's leaves, their survey, and the first error that stops this side from taking part.

    Errors of the preparation steps are kept in ``problem``, not raised: the caller
    first tells its peers (so they raise too instead of waiting), then raises it.

    Example::

        >>> from torchdict import TensorDict
        >>> local = LocalPreparation(_wire.walk(TensorDict(a=torch.zeros(3, 1).expand(3, 2))))
        >>> local.problem is None
        True
        >>> local.check_writable()  # an expanded leaf can't receive in place
        >>> print(local.problem)  # doctest: +ELLIPSIS
        Cannot write into 'a': it is expanded (stride 0), ...
    """

    def __init__(self, leaves: list) -> None:
        self.leaves = leaves
        self.problem: Optional[BaseException] = None
        self.survey: Optional[_wire.Survey] = self.check(lambda: _wire.Survey(leaves))

    @property
    def surveyed(self) -> _wire.Survey:
        """The survey; it exists whenever ``problem`` is None, which callers checked."""
        assert self.survey is not None
        return self.survey

    def check(self, step: Callable[[], Any]) -> Any:
        """Run a preparation step (unless one failed already), keeping rather than raising its error."""
        if self.problem is None:
            try:
                return step()
            except Exception as error:
                self.problem = error
        return None

    def check_writable(self) -> None:
        """Note a problem if a leaf can't be written in place (an expanded one): this side receives."""
        self.check(lambda: raise_if(_wire.expanded_leaf(self.leaves, self.surveyed.strided)))


def failure_text(error: BaseException) -> bytes:
    """How an error is reported to the peers: its type and message."""
    return f"{type(error).__name__}: {error}".encode()


def raise_if(complaint: Optional[str]) -> None:
    if complaint:
        raise RuntimeError(complaint)


def copy_no_grad(target: _Tensor, source: _Tensor) -> None:
    with torch.no_grad():
        target.copy_(source)
