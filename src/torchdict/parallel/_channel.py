"""Messages between the parent and its ``map`` workers, with tensors passed as shared memory.

A :class:`Link` wraps one end of a duplex ``multiprocessing`` Pipe (a Unix
socket). ``link.send(obj)`` pickles ``obj``; every CPU tensor in it that is not
backed by a file travels as the file descriptor of a shared-memory segment,
passed with ``SCM_RIGHTS`` right after the bytes (one ``sendmsg`` for all of a
message's descriptors), and the receiver maps the same pages. File-backed
tensors (MemoryMappedTensor) pickle as their file name, as usual.

A tensor that is not yet in shared memory (a result computed by ``fn``) is
copied into a *lent* segment. The receiver maps a lent segment through a
Python ``mmap`` whose finaliser records, once every tensor viewing it is gone,
that the segment may be reused; the next message back says so, and the sender
copies a later result into the same, already-mapped pages. Fresh shared
memory costs a page fault and a zeroed page per 4 KiB (more than the copy
itself: ~3x for a 12 MB batch), so recycling is what makes ``map_iter`` beat a
DataLoader, which allocates a new segment for every batch.

Compared with torch's own reductions there is also no per-tensor connection to
a ``resource_sharer`` thread. Segments are unlinked as soon as they are created
(torch's ``file_descriptor`` strategy), so none can leak, whoever dies.
"""
from __future__ import annotations

import io
import os
import pickle
import struct
from collections import deque
from typing import Any

import torch

from ..memmap import MemoryMappedTensor

_HEADER = struct.Struct("<I")  # the number of descriptors following the bytes
# Free lent segments kept for reuse, per link; beyond this they are dropped.
_MAX_FREE_SEGMENTS = 16


def _shareable_fd(storage: torch.UntypedStorage) -> Any:
    """The descriptor of a shared-memory storage, or None if it is not one we can pass."""
    try:
        return storage._share_fd_cpu_()[0]
    except RuntimeError:  # e.g. shared with the file_system strategy: leave it to torch
        return None


class Link:
    """One end of a worker's pipe: ``send`` / ``receive`` with shared-memory tensors."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        # Receiving side: ids of segments lent by the peer that we no longer use
        # (appended by mmap finalisers, at any time; sent back with our next message).
        # One deque for the link's life: finalisers hold it, and append/popleft are atomic.
        self.released: deque = deque()
        # Lending side.
        self.free: dict = {}  # nbytes -> [(segment id, storage)]
        self.lent: dict = {}  # segment id -> (nbytes, storage)
        self.next_segment = 0

    # ------------------------------------------------------------------ the pipe
    def fileno(self) -> int:
        return self.conn.fileno()

    def poll(self, timeout: float = 0.0) -> bool:
        return self.conn.poll(timeout)

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------ lending
    def _segment(self, nbytes: int) -> tuple:
        """A segment of ``nbytes`` to lend: a released one if any (its pages are already mapped)."""
        bucket = self.free.get(nbytes)
        if bucket:
            segment_id, storage = bucket.pop()
            if not bucket:
                del self.free[nbytes]
        else:
            segment_id = self.next_segment
            self.next_segment += 1
            storage = torch.UntypedStorage._new_shared(nbytes)
        self.lent[segment_id] = (nbytes, storage)
        return segment_id, storage

    def _take_back(self, segment_ids: list) -> None:
        kept = sum(len(bucket) for bucket in self.free.values())
        for segment_id in segment_ids:
            nbytes, storage = self.lent.pop(segment_id, (0, None))
            if storage is not None and kept < _MAX_FREE_SEGMENTS:
                self.free.setdefault(nbytes, []).append((segment_id, storage))
                kept += 1

    def drop_free_segments(self) -> None:
        """Forget the segments kept for reuse (at the end of a job)."""
        self.free.clear()

    # ------------------------------------------------------------------ messages
    def send(self, obj: Any) -> None:
        """Send ``obj``; a dead peer raises ``BrokenPipeError`` / ``ConnectionResetError``."""
        released = []
        while self.released:
            released.append(self.released.popleft())
        pickler = _Pickler(self)
        data = pickler.dumps((released, obj))
        self.conn.send_bytes(_HEADER.pack(len(pickler.fds)) + data)
        if pickler.fds:
            import socket
            from multiprocessing.reduction import sendfds

            with socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
                sendfds(sock, pickler.fds)

    def receive(self) -> Any:
        """Receive what the peer's :meth:`send` sent, mapping the segments it carried."""
        message = self.conn.recv_bytes()
        (count,) = _HEADER.unpack_from(message)
        fds: list = []
        if count:
            import socket
            from multiprocessing.reduction import recvfds

            with socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
                fds = recvfds(sock, count)
        try:
            stream = io.BytesIO(message)
            stream.seek(_HEADER.size)
            released, obj = _Unpickler(stream, fds, self.released).load()
        finally:
            for fd in fds:
                os.close(fd)
        if released:
            self._take_back(released)
        return obj


class _Pickler:
    """Pickles a message, collecting shared-memory storages as descriptors."""

    def __init__(self, link: Link) -> None:
        from multiprocessing.reduction import ForkingPickler

        self.link = link
        self.buffer = io.BytesIO()
        self.pickler = ForkingPickler(self.buffer, pickle.HIGHEST_PROTOCOL)
        setattr(self.pickler, "persistent_id", self.persistent_id)
        self.fds: list = []
        self.slots: dict = {}  # storage data_ptr -> index in fds
        # The storages must live until their descriptors are sent.
        self.keep_alive: list = []

    def _slot(self, storage: torch.UntypedStorage) -> Any:
        key = storage.data_ptr()
        slot = self.slots.get(key)
        if slot is None:
            fd = _shareable_fd(storage)
            if fd is None:
                return None
            slot = self.slots[key] = len(self.fds)
            self.fds.append(fd)
            self.keep_alive.append(storage)
        return slot

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor) or isinstance(obj, MemoryMappedTensor) or obj.device.type != "cpu":
            return None
        storage = obj.untyped_storage()
        if storage.filename is not None:
            return None  # a view of a mapped file: relabelled as MemoryMappedTensor by the caller
        requires_grad = obj.requires_grad
        nbytes = obj.numel() * obj.element_size()
        if nbytes == 0 or storage.nbytes() == 0:
            return ("empty", obj.dtype, tuple(obj.shape), requires_grad)
        if obj.is_shared():
            slot = self._slot(storage)
            if slot is None:
                return None
            return ("shm", slot, obj.dtype, tuple(obj.shape), obj.stride(), obj.storage_offset(), requires_grad)
        segment_id, segment = self.link._segment(nbytes)
        torch.empty(0, dtype=obj.dtype).set_(segment).view(obj.shape).copy_(obj.detach())
        slot = self._slot(segment)
        if slot is None:  # cannot happen for a segment we allocated; keep torch's path as a fallback
            return None
        return ("lent", slot, segment_id, nbytes, obj.dtype, tuple(obj.shape), requires_grad)

    def dumps(self, obj: Any) -> bytes:
        self.pickler.dump(obj)
        return self.buffer.getvalue()


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream: Any, fds: list, released: Any) -> None:
        super().__init__(stream)
        self.fds = fds
        self.released = released
        self.storages: dict = {}

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == "empty":
            _, dtype, shape, requires_grad = pid
            return torch.empty(shape, dtype=dtype).requires_grad_(requires_grad)
        if kind == "shm":
            _, slot, dtype, shape, stride, offset, requires_grad = pid
            storage = self.storages.get(slot)
            if storage is None:
                fd = self.fds[slot]
                new_shared = getattr(torch.UntypedStorage, "_new_shared_fd_cpu")  # not in torch's stubs
                storage = self.storages[slot] = new_shared(fd, os.fstat(fd).st_size)
            tensor = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
        else:
            _, slot, segment_id, nbytes, dtype, shape, requires_grad = pid
            tensor = _map_lent(self.fds[slot], segment_id, nbytes, self.released).view(dtype).view(shape)
        return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def _map_lent(fd: int, segment_id: int, nbytes: int, released: Any) -> torch.Tensor:
    """Bytes of a lent segment; ``segment_id`` goes to ``released`` once no tensor uses them."""
    import mmap
    import weakref

    mapping = mmap.mmap(fd, nbytes)
    # The tensor keeps ``mapping`` alive; when its last view goes, the mapping is
    # closed and the finaliser lets the sender reuse the segment.
    weakref.finalize(mapping, released.append, segment_id)
    return torch.frombuffer(mapping, dtype=torch.uint8)
