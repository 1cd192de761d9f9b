"""Messages between the parent and its ``map`` workers, with tensors passed as shared memory.

``send(conn, obj)`` pickles ``obj``; every CPU tensor in it that is not backed
by a file travels as a file descriptor of a shared-memory segment, passed
with ``SCM_RIGHTS`` over the same Unix socket right after the bytes, and the
receiver maps the same pages. A tensor that is not yet in shared memory (a
result computed by ``fn``) is copied into a fresh segment first: one copy,
the only one on the way. File-backed tensors (MemoryMappedTensor) pickle as
their file name, as usual.

Compared with torch's own reductions (which ``DataLoader`` uses), there is
no per-tensor connection to a ``resource_sharer`` thread (a socket connect
and an HMAC handshake each): one ``sendmsg`` carries all the descriptors of a
message. Segments are unlinked as soon as they are created (torch's
``file_descriptor`` strategy), so none can leak, whoever dies.
"""
from __future__ import annotations

import io
import os
import pickle
import struct
from typing import Any

import torch

from .memmap import MemoryMappedTensor

_HEADER = struct.Struct("<I")  # the number of descriptors following the bytes


def _shareable_fd(storage: torch.UntypedStorage) -> Any:
    """``(fd, nbytes)`` of a shared-memory storage, or None if it is not one we can pass."""
    try:
        return storage._share_fd_cpu_()
    except RuntimeError:  # e.g. shared with the file_system strategy: leave it to torch
        return None


class _Pickler:
    """Collects shared-memory storages as descriptors while pickling."""

    def __init__(self) -> None:
        from multiprocessing.reduction import ForkingPickler

        self.buffer = io.BytesIO()
        self.pickler = ForkingPickler(self.buffer, pickle.HIGHEST_PROTOCOL)
        self.pickler.persistent_id = self.persistent_id  # type: ignore[method-assign]
        self.fds: list = []
        self.slots: dict = {}  # storage data_ptr -> index in fds
        # The storages must live until their descriptors are sent (and their
        # addresses must not be reused by a later copy, which would alias a slot).
        self.keep_alive: list = []

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor) or isinstance(obj, MemoryMappedTensor) or obj.device.type != "cpu":
            return None
        if obj.untyped_storage().filename is not None:
            return None  # a view of a mapped file: relabelled as MemoryMappedTensor by the sender
        tensor = obj.detach()
        if not tensor.is_shared():
            from ._sharing import shared_empty

            copy = shared_empty(tensor.shape, tensor.dtype)
            copy.copy_(tensor)
            tensor = copy
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0:
            return ("empty", tensor.dtype, tuple(tensor.shape), obj.requires_grad)
        key = storage.data_ptr()
        slot = self.slots.get(key)
        if slot is None:
            handle = _shareable_fd(storage)
            if handle is None:
                return None
            slot = self.slots[key] = len(self.fds)
            self.fds.append(handle)
            self.keep_alive.append(storage)
        return ("shm", slot, tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.storage_offset(),
                obj.requires_grad)

    def dumps(self, obj: Any) -> bytes:
        self.pickler.dump(obj)
        return self.buffer.getvalue()


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream: Any, storages: list) -> None:
        super().__init__(stream)
        self.storages = storages

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "empty":
            _, dtype, shape, requires_grad = pid
            return torch.empty(shape, dtype=dtype).requires_grad_(requires_grad)
        _, slot, dtype, shape, stride, offset, requires_grad = pid
        tensor = torch.empty(0, dtype=dtype).set_(self.storages[slot], offset, shape, stride)
        return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def send(conn: Any, obj: Any) -> None:
    """Send ``obj`` over a duplex ``multiprocessing`` Pipe (a Unix socket)."""
    pickler = _Pickler()
    data = pickler.dumps(obj)
    conn.send_bytes(_HEADER.pack(len(pickler.fds)) + data)
    if pickler.fds:
        import socket
        from multiprocessing.reduction import sendfds

        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sendfds(sock, [fd for fd, _ in pickler.fds])
    del pickler  # now the copies made for sending may go


def receive(conn: Any) -> Any:
    """Receive what :func:`send` sent (mapping the shared-memory segments it carried)."""
    message = conn.recv_bytes()
    (count,) = _HEADER.unpack_from(message)
    storages = []
    if count:
        import socket
        from multiprocessing.reduction import recvfds

        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            fds = recvfds(sock, count)
        try:
            storages = [_map_fd(fd) for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
    stream = io.BytesIO(message)
    stream.seek(_HEADER.size)
    return _Unpickler(stream, storages).load()


def _map_fd(fd: int) -> torch.UntypedStorage:
    size = os.fstat(fd).st_size
    return torch.UntypedStorage._new_shared_fd_cpu(fd, size)
