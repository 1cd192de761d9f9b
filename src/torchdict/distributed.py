"""send / recv / isend / irecv and collectives of a whole TensorDict over ``torch.distributed``.

Default ("packed") point-to-point protocol, all messages on one tag:

1. sender -> receiver: a header of 8 int64 (magic, version, status, structure
   fingerprint, leaf count, JSON length, length of a failure message, 0);
2. receiver -> sender: an ack of 3 int64 (magic, status, length of what follows);
3. only when both fingerprints agree, the payload: the small leaves packed into
   one byte buffer (per dtype, with ``flatten_dense_tensors``), then each leaf of
   at least ``_DIRECT_MIN_BYTES`` as its own message straight from / into its memory
   (no copy), then the JSON of the non-tensor values.

On a mismatch both sides swap their structure descriptions and both raise
:class:`StructureMismatchError` naming the keys that differ; nothing is written.
A failure on either side before the payload (a value JSON can't encode, a leaf
that can't be written in place) is reported to the peer the same way. Every wait
is bounded by the process group's timeout.

The fingerprint (a 64-bit hash of every leaf's key path, dtype and shape) and the
message layout come from one pass over each side's own leaves (:class:`_Survey`);
equal fingerprints guarantee equal layouts. The readable description of the
structure is only built on a mismatch, to word the error.

``per_leaf=True`` speaks upstream tensordict's protocol instead: one message per
tensor leaf in sorted-key order, tags ``init_tag, init_tag + 1, ...``.

Collectives first all-gather each rank's fingerprint (plus JSON length and an
error flag), so a mismatch or a local failure raises on every rank instead of
hanging, then move the same packed buffers.

``torch.distributed``, ``json``, ``hashlib`` and ``threading`` are imported lazily.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import torch

from ._apply import rewrap, unwrap
from ._base import TensorCollection
from .nontensor import NonTensorData, NonTensorStack, combine_non_tensor

__all__ = ["DistributedMixin", "StructureMismatchError", "TransferHandle"]

_Tensor = torch.Tensor
_MAGIC = 0x74_64_2D_77_69_72_65  # "td-wire"
_VERSION = 1
_OK, _MISMATCH, _FAILED = 0, 1, 2
_HEADER_LEN = 8
_ACK_LEN = 3
# Leaves this large travel as their own message, from and into their own memory:
# packing them would cost a copy on each side (and page faults on a fresh buffer).
_DIRECT_MIN_BYTES = 1 << 20
# Small leaves are packed into buffers of at most this many bytes.
_PACK_MAX_BYTES = 64 << 20
# Each dtype group in a pack starts on this boundary so it can be viewed as its dtype.
_ALIGN = 64


class StructureMismatchError(RuntimeError):
    """Two ranks tried to exchange TensorDicts whose keys, shapes or dtypes differ."""


# --------------------------------------------------------------------- leaves and structure
def _walk(td: Any, prefix: tuple, out: list) -> list:
    """``(path, value, storage, key)`` for every leaf, sorted by key at each level (upstream's order)."""
    storage = td._tensordict
    for key in sorted(storage):
        value = storage[key]
        if isinstance(value, _Tensor):
            out.append((prefix + (key,), value, storage, key))
        elif isinstance(value, TensorCollection):
            _walk(unwrap(value), prefix + (key,), out)
        else:
            out.append((prefix + (key,), value, storage, key))
    return out


def _show_key(path: Sequence[str]) -> str:
    return repr(path[0]) if len(path) == 1 else repr(tuple(path))


def _refuse(path: tuple, value: _Tensor) -> None:
    kind = "nested" if value.is_nested else "quantized" if value.is_quantized else str(value.layout)
    raise TypeError(
        f"Cannot transfer {_show_key(path)}: only dense (strided) tensors can be sent, got a {kind} tensor."
    )


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)[6:]
    return name


def _describe(leaves: list) -> list:
    """The structure as JSON-ready entries ``[path, dtype or "non-tensor", shape]`` (for error messages)."""
    entries = []
    for path, value, _, _ in leaves:
        if isinstance(value, _Tensor):
            entries.append([list(path), _dtype_name(value.dtype), list(value.shape)])
        else:
            entries.append([list(path), "non-tensor", list(value.batch_size)])
    return entries


def _description_bytes(leaves: list) -> bytes:
    import json

    return json.dumps(_describe(leaves), separators=(",", ":")).encode()


def _difference(mine: list, theirs: list, my_name: str, their_name: str) -> str:
    """Which keys differ between two structure descriptions, in words."""
    mine_map = {tuple(path): (kind, shape) for path, kind, shape in mine}
    theirs_map = {tuple(path): (kind, shape) for path, kind, shape in theirs}

    def listing(paths: list) -> str:
        shown = ", ".join(_show_key(path) for path in paths[:10])
        return shown + (f" and {len(paths) - 10} more" if len(paths) > 10 else "")

    parts = []
    only_mine = [path for path in mine_map if path not in theirs_map]
    only_theirs = [path for path in theirs_map if path not in mine_map]
    if only_mine:
        parts.append(f"keys only on {my_name}: {listing(only_mine)}")
    if only_theirs:
        parts.append(f"keys only on {their_name}: {listing(only_theirs)}")
    changed = [path for path in mine_map if path in theirs_map and mine_map[path] != theirs_map[path]]
    for path in changed[:10]:
        (kind_a, shape_a), (kind_b, shape_b) = mine_map[path], theirs_map[path]
        parts.append(f"{_show_key(path)} is {kind_a}{shape_a} on {my_name} but {kind_b}{shape_b} on {their_name}")
    if len(changed) > 10:
        parts.append(f"{len(changed) - 10} more keys differ")
    return "; ".join(parts) or "the structures differ"


# --------------------------------------------------------------------- the survey: fingerprint + plan
def _lay_out(groups: dict, group_bytes: dict) -> tuple:
    """``(total bytes, [(dtype, leaf indices, byte offset, nbytes), ...])`` of one pack."""
    laid_out = []
    offset = 0
    for dtype, indices in groups.items():
        nbytes = group_bytes[dtype]
        laid_out.append((dtype, indices, offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return offset, laid_out


class _Survey:
    """One pass over the leaves: the structure fingerprint and how the leaves travel.

    ``packs`` holds ``(nbytes, groups)`` with ``groups`` a list of
    ``(dtype, leaf indices, byte offset, nbytes)``: the small leaves of one dtype,
    flattened one after the other. ``direct`` lists the leaves of at least
    ``_DIRECT_MIN_BYTES`` (one message each), ``non_tensor`` the non-tensor values.
    Raises TypeError for a tensor with no flat byte representation (sparse, nested,
    quantized).
    """

    __slots__ = ("leaves", "fingerprint", "packs", "direct", "non_tensor", "strided")

    def __init__(self, leaves: list) -> None:
        import hashlib
        import json
        from array import array

        self.leaves = leaves
        self.packs: list = []
        self.direct: list = []
        self.non_tensor: list = []
        self.strided: list = []  # non-contiguous tensor leaves (the only ones that can be expanded)
        kinds = []
        dims = array("q")
        groups: dict = {}
        group_bytes: dict = {}
        pack_bytes = 0
        strided = torch.strided
        for index, (path, value, _, _) in enumerate(leaves):
            if isinstance(value, _Tensor):
                if value.layout is not strided or value.is_quantized or value.is_nested:
                    _refuse(path, value)
                dtype = value.dtype
                shape = value.shape
                kinds.append(_dtype_name(dtype))
                if not value.is_contiguous():
                    self.strided.append(index)
                nbytes = value.numel() * dtype.itemsize
                if nbytes >= _DIRECT_MIN_BYTES:
                    self.direct.append(index)
                else:
                    if groups and pack_bytes + nbytes > _PACK_MAX_BYTES:
                        self.packs.append(_lay_out(groups, group_bytes))
                        groups, group_bytes, pack_bytes = {}, {}, 0
                    members = groups.get(dtype)
                    if members is None:
                        groups[dtype] = [index]
                        group_bytes[dtype] = nbytes
                    else:
                        members.append(index)
                        group_bytes[dtype] += nbytes
                    pack_bytes += nbytes
            else:
                shape = value.batch_size
                kinds.append("non-tensor")
                self.non_tensor.append(index)
            dims.append(len(shape))
            dims.extend(shape)
        if groups:
            self.packs.append(_lay_out(groups, group_bytes))
        # Keys are hashed through JSON (unambiguous for any string), shapes as raw int64s.
        digest = hashlib.blake2b(json.dumps([[leaf[0] for leaf in leaves], kinds]).encode(), digest_size=8)
        digest.update(dims.tobytes())
        self.fingerprint = int.from_bytes(digest.digest(), "little", signed=True)


def _flatten_group(tensors: list, device: torch.device) -> _Tensor:
    """One flat tensor holding ``tensors`` (same dtype) one after the other, on ``device``."""
    from torch._C._nn import flatten_dense_tensors

    if any(tensor.device != device for tensor in tensors):
        tensors = [tensor.to(device) for tensor in tensors]
    with torch.no_grad():
        flat = flatten_dense_tensors(tensors)
    # Several tensors are concatenated (materialising conj/neg views); a lone one comes back as a view.
    if flat.is_conj() or flat.is_neg():
        flat = flat.resolve_conj().resolve_neg()
    return flat


def _pack(pack: tuple, leaves: list, device: torch.device) -> _Tensor:
    """The byte buffer of one pack: each dtype group flattened and viewed as bytes, padded to ``_ALIGN``."""
    total, groups = pack
    parts = []
    for dtype, indices, offset, nbytes in groups:
        flat = _flatten_group([leaves[i][1] for i in indices], device)
        parts.append(flat.view(torch.uint8))
        pad = -(-nbytes // _ALIGN) * _ALIGN - nbytes
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8, device=device))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _unpack(pack: tuple, buffer: _Tensor, leaves: list) -> None:
    """Copy each leaf of a received pack into the receiver's leaf, in place."""
    from torch._C._nn import unflatten_dense_tensors

    with torch.no_grad():
        for dtype, indices, offset, nbytes in pack[1]:
            typed = buffer[offset:offset + nbytes].view(dtype)
            targets = [leaves[i][1] for i in indices]
            # One C++ call per group; foreach falls back to per-pair copies across devices.
            torch._foreach_copy_(targets, unflatten_dense_tensors(typed, targets))


def _send_view(value: _Tensor, device: torch.device) -> _Tensor:
    """A contiguous byte view of a leaf to send (a copy only when it must be)."""
    value = value.detach()
    if value.device != device:
        value = value.to(device)
    if value.is_conj():
        value = value.resolve_conj()
    if value.is_neg():
        value = value.resolve_neg()
    return value.contiguous().view(-1).view(torch.uint8)


def _shares_memory(a: _Tensor, b: _Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _writable_in_place(value: _Tensor, device: torch.device) -> bool:
    return value.device == device and value.is_contiguous() and not value.is_conj() and not value.is_neg()


def _recv_target(value: _Tensor, device: torch.device) -> tuple:
    """``(byte buffer to receive into, follow-up copy or None)`` for a direct leaf."""
    if _writable_in_place(value, device):
        return value.detach().view(-1).view(torch.uint8), None
    scratch = torch.empty(value.numel() * value.element_size(), dtype=torch.uint8, device=device)

    def copy_back() -> None:
        with torch.no_grad():
            value.copy_(scratch.view(value.dtype).view(value.shape))

    return scratch, copy_back


def _expanded_leaf(leaves: list, indices: Sequence[int]) -> Optional[str]:
    """A complaint about the first of ``indices`` that can't be written in place (an expanded tensor), if any.

    Only non-contiguous leaves can be expanded, so callers pass those.
    """
    for index in indices:
        path, value = leaves[index][0], leaves[index][1]
        if any(stride == 0 and size > 1 for stride, size in zip(value.stride(), value.shape)):
            return (
                f"Cannot write into {_show_key(path)}: it is expanded (stride 0), so values can't be written "
                "into it in place; clone it first."
            )
    return None


# --------------------------------------------------------------------- non-tensor values
def _encode_non_tensor(leaves: list, indices: list) -> bytes:
    if not indices:
        return b""
    import json

    values = []
    for index in indices:
        path, value = leaves[index][0], leaves[index][1]
        item = [0, value.data] if type(value) is NonTensorData else [1, value._flat_values()]
        try:
            json.dumps(item)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"The non-tensor value at {_show_key(path)} can't be sent: {error}. Only JSON values (str, "
                "int, float, bool, None, and lists and dicts of them) travel with send, recv and the "
                "collectives."
            ) from None
        values.append(item)
    return json.dumps(values, separators=(",", ":")).encode()


def _decode_non_tensor(raw: bytes) -> list:
    import json

    return json.loads(raw.decode("utf-8")) if raw else []


def _non_tensor_leaf(item: list, like: Any) -> Any:
    if item[0] == 0:
        return NonTensorData(item[1], like.batch_size, like.device)
    return NonTensorStack(item[1], like.batch_size, like.device)


def _set_non_tensor(leaves: list, indices: list, items: list) -> None:
    for index, item in zip(indices, items):
        _, old, storage, key = leaves[index]
        storage[key] = _non_tensor_leaf(item, old)


def _bytes_to_tensor(data: bytes, device: torch.device) -> _Tensor:
    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return tensor if device.type == "cpu" else tensor.to(device)


def _tensor_to_bytes(tensor: _Tensor) -> bytes:
    import ctypes

    tensor = tensor.detach().to("cpu").contiguous()
    return ctypes.string_at(tensor.data_ptr(), tensor.numel()) if tensor.numel() else b""


# --------------------------------------------------------------------- plumbing
def _dist() -> Any:
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of PyTorch.")
    return dist


def _check_peer(peer: Optional[int], group_peer: Optional[int], group: Any, name: str, group_name: str) -> None:
    if group_peer is not None:
        if group is None:
            raise ValueError(f"`{group_name}` is a rank inside `group`, so `group` must be passed too.")
        if peer is not None:
            raise ValueError(f"Pass either `{name}` or `{group_name}`, not both.")
    elif peer is None:
        raise ValueError(f"Exactly one of `{name}` and `{group_name}` must be given.")


def _backend_name(dist: Any, group: Any) -> str:
    try:
        return str(dist.get_backend(group)).lower()
    except Exception:  # an unregistered ProcessGroup object
        name = getattr(group, "name", None)
        return str(name() if callable(name) else name or "").lower()


def _comm_device(dist: Any, group: Any, leaves: list, td: Any) -> torch.device:
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


def _next_pseudo_tag(seed: int) -> int:
    """Upstream tensordict's pseudo-random tag chain (needs numpy), so ``pseudo_rand`` tags interoperate."""
    try:
        import numpy
    except ImportError:
        raise ImportError("pseudo_rand=True needs numpy (the tags follow upstream tensordict's generator).") from None
    return int.from_bytes(numpy.random.default_rng(seed).bytes(8), "big") % 10_000


def _tags(init_tag: int, pseudo_rand: bool, count: int) -> list:
    tags = []
    tag = init_tag - 1
    for _ in range(count):
        tag = _next_pseudo_tag(tag + 1) if pseudo_rand else tag + 1
        tags.append(tag)
    return tags


def _last_tag(init_tag: int, pseudo_rand: bool, count: int) -> int:
    if not pseudo_rand:
        return init_tag + count - 1
    tags = _tags(init_tag, True, count)
    return tags[-1] if tags else init_tag - 1


class _Channel:
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
            self.isend(_bytes_to_tensor(data, self.device)).wait()

    def recv_bytes(self, count: int) -> bytes:
        if count <= 0:
            return b""
        received = torch.empty(count, dtype=torch.uint8, device=self.device)
        self.irecv(received).wait()
        return _tensor_to_bytes(received)


class TransferHandle:
    """A pending transfer or collective, returned (in a one-element list) by the asynchronous calls.

    ``wait()`` blocks until it is done, re-raises any error of the transfer (a
    structure mismatch, a timeout), and then finishes the job on the calling thread
    (for a receive: copies the packed leaves and non-tensor values into the
    TensorDict). Don't read a receiving TensorDict, or write a sending one's large
    leaves, before ``wait()`` returns.
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


# --------------------------------------------------------------------- packed point-to-point
def _failure_text(error: BaseException) -> bytes:
    return f"{type(error).__name__}: {error}".encode()


def _payload(survey: _Survey, device: torch.device, snapshot: bool) -> tuple:
    """``(buffers to send in order, JSON bytes)``: packs, then direct leaves, then the JSON.

    With ``snapshot`` a pack that is a lone leaf (sent from its own memory otherwise)
    is copied, so the caller may modify small leaves while an asynchronous send runs.
    """
    leaves = survey.leaves
    json_bytes = _encode_non_tensor(leaves, survey.non_tensor)
    buffers = []
    for pack in survey.packs:
        buffer = _pack(pack, leaves, device)
        groups = pack[1]
        if snapshot and len(groups) == 1 and len(groups[0][1]) == 1 and _shares_memory(
                buffer, leaves[groups[0][1][0]][1]):
            buffer = buffer.clone()
        buffers.append(buffer)
    buffers += [_send_view(leaves[index][1], device) for index in survey.direct]
    if json_bytes:
        buffers.append(_bytes_to_tensor(json_bytes, device))
    return buffers, json_bytes


def _send_packed(leaves: list, channel: _Channel, early: bool) -> Optional[TransferHandle]:
    try:
        survey = _Survey(leaves)
        buffers, json_bytes = _payload(survey, channel.device, snapshot=early)
    except Exception as error:
        # Tell the receiver, so it raises too instead of waiting for data that never comes.
        message = _failure_text(error)
        try:
            channel.send_ints([_MAGIC, _VERSION, _FAILED, 0, 0, 0, len(message), 0])
            channel.send_bytes(message)
        except Exception:
            pass
        raise
    if early:
        return TransferHandle(lambda: _exchange_as_sender(channel, survey, buffers, len(json_bytes)))
    _exchange_as_sender(channel, survey, buffers, len(json_bytes))
    return None


def _exchange_as_sender(channel: _Channel, survey: _Survey, buffers: list, json_nbytes: int) -> None:
    channel.send_ints([_MAGIC, _VERSION, _OK, survey.fingerprint, len(survey.leaves), json_nbytes, 0, 0])
    magic, status, extra = channel.recv_ints(_ACK_LEN)
    if magic != _MAGIC:
        raise RuntimeError(f"send: {channel.name} answered with something that is not a torchdict ack.")
    if status == _OK:
        for work in [channel.isend(buffer) for buffer in buffers]:
            work.wait()
        return
    if status == _MISMATCH:
        import json

        description = _description_bytes(survey.leaves)
        channel.send_ints([len(description)])
        channel.send_bytes(description)
        theirs = json.loads(channel.recv_bytes(extra).decode())
        raise StructureMismatchError(
            f"send to {channel.name}: structure mismatch, nothing was sent: "
            f"{_difference(_describe(survey.leaves), theirs, 'the sender', 'the receiver')}. Both sides need "
            "the same keys, shapes and dtypes (non-tensor values may differ)."
        )
    reason = channel.recv_bytes(extra).decode(errors="replace")
    raise RuntimeError(f"send to {channel.name}: the receiver refused the TensorDict: {reason}")


class _Incoming:
    """The receiver's side: its survey, any reason it can't receive, and where the payload lands."""

    def __init__(self, leaves: list, device: torch.device) -> None:
        self.leaves = leaves
        self.device = device
        self.problem: Optional[BaseException] = None
        self.survey: Optional[_Survey] = None
        try:
            self.survey = _Survey(leaves)
            complaint = _expanded_leaf(leaves, self.survey.strided)
            if complaint:
                raise RuntimeError(complaint)
        except Exception as error:
            self.problem = error
        self.pack_buffers: list = []
        self.copy_backs: list = []
        self.json = b""

    def receive(self, channel: _Channel, json_nbytes: int) -> None:
        """Post every receive of the payload (direct leaves land in place) and wait for them."""
        device, survey = self.device, self.survey
        targets = []
        for total, _ in survey.packs:
            buffer = torch.empty(total, dtype=torch.uint8, device=device)
            self.pack_buffers.append(buffer)
            targets.append(buffer)
        for index in survey.direct:
            target, copy_back = _recv_target(self.leaves[index][1], device)
            targets.append(target)
            if copy_back is not None:
                self.copy_backs.append(copy_back)
        json_buffer = None
        if json_nbytes:
            json_buffer = torch.empty(json_nbytes, dtype=torch.uint8, device=device)
            targets.append(json_buffer)
        for work in [channel.irecv(target) for target in targets]:
            work.wait()
        if json_buffer is not None:
            self.json = _tensor_to_bytes(json_buffer)

    def finish(self) -> None:
        """Write what arrived into the TensorDict (packed leaves, copied-back leaves, non-tensor values)."""
        for pack, buffer in zip(self.survey.packs, self.pack_buffers):
            _unpack(pack, buffer, self.leaves)
        for copy_back in self.copy_backs:
            copy_back()
        if self.survey.non_tensor:
            _set_non_tensor(self.leaves, self.survey.non_tensor, _decode_non_tensor(self.json))


def _recv_packed(leaves: list, channel: _Channel, premature: bool) -> Optional[TransferHandle]:
    incoming = _Incoming(leaves, channel.device)
    if premature:
        return TransferHandle(lambda: _exchange_as_receiver(channel, incoming), finish=incoming.finish)
    _exchange_as_receiver(channel, incoming)
    incoming.finish()
    return None


def _exchange_as_receiver(channel: _Channel, incoming: _Incoming) -> None:
    magic, version, status, fingerprint, _, json_nbytes, extra, _ = channel.recv_ints(_HEADER_LEN)
    if magic != _MAGIC:
        raise RuntimeError(
            f"recv from {channel.name}: the first message is not a torchdict header. Both sides must use the "
            "same mode (the default packed mode, or per_leaf=True on both) and the same tag."
        )
    if status == _FAILED:
        reason = channel.recv_bytes(extra).decode(errors="replace")
        raise RuntimeError(f"recv from {channel.name}: the sender failed before sending: {reason}")
    if version != _VERSION and incoming.problem is None:
        incoming.problem = RuntimeError(
            f"protocol version {version} from the sender, this torchdict speaks version {_VERSION}")
    if incoming.problem is not None:
        message = _failure_text(incoming.problem)
        channel.send_ints([_MAGIC, _FAILED, len(message)])
        channel.send_bytes(message)
        raise incoming.problem
    if fingerprint != incoming.survey.fingerprint:
        import json

        description = _description_bytes(incoming.leaves)
        channel.send_ints([_MAGIC, _MISMATCH, len(description)])
        (their_length,) = channel.recv_ints(1)
        theirs = json.loads(channel.recv_bytes(their_length).decode())
        channel.send_bytes(description)
        raise StructureMismatchError(
            f"recv from {channel.name}: structure mismatch, nothing was received and the TensorDict is "
            f"unchanged: {_difference(_describe(incoming.leaves), theirs, 'the receiver', 'the sender')}. "
            "Both sides need the same keys, shapes and dtypes (non-tensor values may differ)."
        )
    channel.send_ints([_MAGIC, _OK, 0])
    incoming.receive(channel, json_nbytes)


# --------------------------------------------------------------------- per-leaf point-to-point
def _tensor_leaves(td: Any) -> list:
    leaves = _walk(td, (), [])
    for _, value, _, _ in leaves:
        if not isinstance(value, _Tensor):
            raise NotImplementedError(
                f"Type {type(value)} is not supported. Non-tensor values travel only in the default packed "
                "mode (per_leaf=False)."
            )
    return leaves


def _send_per_leaf(td: Any, dist: Any, dst: Optional[int], group_dst: Optional[int], group: Any,
                   init_tag: int, pseudo_rand: bool) -> tuple:
    """Post one isend per tensor leaf; returns ``(works, last tag)``."""
    leaves = _tensor_leaves(td)
    tags = _tags(init_tag, pseudo_rand, len(leaves))
    works = []
    for (_, value, _, _), tag in zip(leaves, tags):
        channel = _Channel(dist, dst, group_dst, group, tag, value.device)
        payload = value.detach()
        if payload.is_conj() or payload.is_neg():
            payload = payload.resolve_conj().resolve_neg()
        works.append(channel.isend(payload.contiguous()))
    return works, tags[-1] if tags else init_tag - 1


def _recv_per_leaf(td: Any, dist: Any, src: Optional[int], group_src: Optional[int], group: Any,
                   init_tag: int, pseudo_rand: bool) -> tuple:
    """Post one irecv per tensor leaf (into the leaf when it is contiguous); returns ``(works, last tag)``."""
    leaves = _tensor_leaves(td)
    complaint = _expanded_leaf(leaves, [i for i, leaf in enumerate(leaves) if not leaf[1].is_contiguous()])
    if complaint:
        raise RuntimeError(complaint)
    tags = _tags(init_tag, pseudo_rand, len(leaves))
    works = []
    for (_, value, _, _), tag in zip(leaves, tags):
        channel = _Channel(dist, src, group_src, group, tag, value.device)
        if _writable_in_place(value, value.device):
            works.append(channel.irecv(value.detach()))
        else:
            scratch = torch.empty(value.shape, dtype=value.dtype, device=value.device)
            works.append(TransferHandle(works=[channel.irecv(scratch)],
                                        finish=lambda value=value, scratch=scratch: _copy_no_grad(value, scratch)))
    return works, tags[-1] if tags else init_tag - 1


def _copy_no_grad(target: _Tensor, source: _Tensor) -> None:
    with torch.no_grad():
        target.copy_(source)


def _mode(per_leaf: bool, consolidated: Optional[bool]) -> bool:
    """True for the per-leaf protocol. ``consolidated=True`` (upstream's one-message switch) means packed."""
    if per_leaf and consolidated:
        raise ValueError("per_leaf=True and consolidated=True ask for opposite protocols; pass one of them.")
    return bool(per_leaf)


def _p2p_channel(td: Any, peer: Optional[int], group_peer: Optional[int], group: Any, init_tag: int,
                 pseudo_rand: bool) -> tuple:
    """``(channel, leaves)`` for a packed transfer with ``peer``."""
    dist = _dist()
    leaves = _walk(td, (), [])
    tag = _next_pseudo_tag(init_tag) if pseudo_rand else init_tag
    return _Channel(dist, peer, group_peer, group, tag, _comm_device(dist, group, leaves, td)), leaves


# --------------------------------------------------------------------- collectives
def _rank_name(dist: Any, group: Any, group_rank: int) -> str:
    if group is None:
        return f"rank {group_rank}"
    try:
        return f"rank {dist.get_global_rank(group, group_rank)}"
    except Exception:
        return f"group rank {group_rank}"


def _gather_bytes(dist: Any, group: Any, data: bytes, lengths: list, device: torch.device) -> list:
    """Every rank's ``data`` (of the given per-rank lengths), on every rank."""
    longest = max(lengths)
    if longest == 0:
        return [b""] * len(lengths)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    if data:
        padded[: len(data)] = _bytes_to_tensor(data, device)
    gathered = torch.empty(len(lengths), longest, dtype=torch.uint8, device=device)
    dist.all_gather(list(gathered.unbind(0)), padded, group=group)
    return [_tensor_to_bytes(row[:length]) for row, length in zip(gathered, lengths)]


def _gather_ints(dist: Any, group: Any, values: list, device: torch.device) -> list:
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    gathered = torch.empty(dist.get_world_size(group), len(values), dtype=torch.int64, device=device)
    dist.all_gather(list(gathered.unbind(0)), mine, group=group)
    return gathered.tolist()


class _Collective:
    """What every collective does first: survey the local leaves, then agree with every rank.

    :meth:`agree` all-gathers ``[fingerprint, payload length, failed]``; if a rank
    failed (or its structure differs from the ``reference`` rank's), the reasons (or
    structure descriptions) are all-gathered too and every rank raises: nobody is
    left waiting in a collective the others skipped.
    """

    def __init__(self, td: Any, group: Any, op_name: str, tensors_only: bool = False) -> None:
        self.dist = _dist()
        self.group = group
        self.op_name = op_name
        leaves = _walk(td, (), [])
        if tensors_only:
            leaves = [leaf for leaf in leaves if isinstance(leaf[1], _Tensor)]
        self.leaves = leaves
        self.device = _comm_device(self.dist, group, leaves, td)
        self.problem: Optional[BaseException] = None
        self.survey: Optional[_Survey] = None
        try:
            self.survey = _Survey(leaves)
        except Exception as error:
            self.problem = error

    def check(self, step: Callable[[], Any]) -> Any:
        """Run a local preparation step, remembering (not raising) its error until :meth:`agree`."""
        if self.problem is None:
            try:
                return step()
            except Exception as error:
                self.problem = error
        return None

    def agree(self, payload_len: int, reference: int) -> list:
        dist, group = self.dist, self.group
        fingerprint = self.survey.fingerprint if self.survey is not None else 0
        rows = _gather_ints(dist, group, [fingerprint, payload_len, int(self.problem is not None)], self.device)
        failed = [rank for rank, row in enumerate(rows) if row[2]]
        differing = [rank for rank, row in enumerate(rows) if row[0] != rows[reference][0]]
        if not failed and not differing:
            return rows
        report = _failure_text(self.problem) if self.problem is not None else _description_bytes(self.leaves)
        lengths = [row[0] for row in _gather_ints(dist, group, [len(report)], self.device)]
        reports = _gather_bytes(dist, group, report, lengths, self.device)
        if self.problem is not None:
            raise self.problem
        if failed:
            reasons = "; ".join(f"{_rank_name(dist, group, rank)}: {reports[rank].decode(errors='replace')}"
                                for rank in failed)
            raise RuntimeError(f"{self.op_name}: nothing was exchanged because a rank failed first ({reasons}).")
        import json

        me = dist.get_rank(group)
        other = reference if me != reference else differing[0]
        detail = _difference(_describe(self.leaves), json.loads(reports[other].decode()), "this rank",
                             _rank_name(dist, group, other))
        names = ", ".join(_rank_name(dist, group, rank) for rank in differing)
        raise StructureMismatchError(
            f"{self.op_name}: structure mismatch, nothing was exchanged: {names} differ from "
            f"{_rank_name(dist, group, reference)}; {detail}. Every rank needs the same keys, shapes and dtypes."
        )


def _broadcast(td: Any, src: int, group: Any) -> Any:
    collective = _Collective(td, group, "broadcast")
    dist, device, leaves = collective.dist, collective.device, collective.leaves
    is_src = dist.get_rank() == src
    reference = src if group is None else dist.get_group_rank(group, src)
    payload, json_bytes = [], b""
    if is_src:
        prepared = collective.check(lambda: _payload(collective.survey, device, snapshot=False))
        if prepared is not None:
            payload, json_bytes = prepared
    else:
        collective.check(lambda: _raise_if(_expanded_leaf(leaves, collective.survey.strided)))
    rows = collective.agree(len(json_bytes), reference)
    survey = collective.survey
    json_nbytes = rows[reference][1]
    copy_backs = []
    if not is_src:
        payload = [torch.empty(total, dtype=torch.uint8, device=device) for total, _ in survey.packs]
        for index in survey.direct:
            target, copy_back = _recv_target(leaves[index][1], device)
            payload.append(target)
            if copy_back is not None:
                copy_backs.append(copy_back)
        if json_nbytes:
            payload.append(torch.empty(json_nbytes, dtype=torch.uint8, device=device))
    for work in [dist.broadcast(buffer, src=src, group=group, async_op=True) for buffer in payload]:
        work.wait()
    if not is_src:
        for pack, buffer in zip(survey.packs, payload):
            _unpack(pack, buffer, leaves)
        for copy_back in copy_backs:
            copy_back()
        if json_nbytes:
            _set_non_tensor(leaves, survey.non_tensor, _decode_non_tensor(_tensor_to_bytes(payload[-1])))
    return td


def _raise_if(complaint: Optional[str]) -> None:
    if complaint:
        raise RuntimeError(complaint)


def _all_reduce(td: Any, op: Any, group: Any, async_op: bool) -> Optional[List[TransferHandle]]:
    collective = _Collective(td, group, "all_reduce", tensors_only=True)
    dist, device, leaves = collective.dist, collective.device, collective.leaves
    collective.check(lambda: _raise_if(_expanded_leaf(leaves, collective.survey.strided)))
    collective.agree(0, 0)
    if op is None:
        op = dist.ReduceOp.SUM
    from torch._C._nn import unflatten_dense_tensors

    works, finishers = [], []
    for _, groups in collective.survey.packs:
        for _, indices, _, _ in groups:
            targets = [leaves[i][1] for i in indices]
            flat = _flatten_group(targets, device)
            works.append(dist.all_reduce(flat, op=op, group=group, async_op=True))
            if len(targets) == 1 and _shares_memory(flat, targets[0]):
                continue  # a lone contiguous leaf is flattened as a view: it was reduced in place

            def write_back(flat: _Tensor = flat, targets: list = targets) -> None:
                with torch.no_grad():
                    torch._foreach_copy_(targets, unflatten_dense_tensors(flat, targets))

            finishers.append(write_back)
    for index in collective.survey.direct:
        value = leaves[index][1]
        if _writable_in_place(value, device):
            works.append(dist.all_reduce(value.detach(), op=op, group=group, async_op=True))
        else:
            scratch = value.detach().to(device).contiguous()
            works.append(dist.all_reduce(scratch, op=op, group=group, async_op=True))
            finishers.append(lambda value=value, scratch=scratch: _copy_no_grad(value, scratch))

    def finish() -> None:
        for finisher in finishers:
            finisher()

    handle = TransferHandle(works=works, finish=finish)
    if async_op:
        return [handle]
    handle.wait()
    return None


def _all_gather(td: Any, group: Any) -> Any:
    collective = _Collective(td, group, "all_gather")
    dist, device, leaves = collective.dist, collective.device, collective.leaves
    json_bytes = collective.check(lambda: _encode_non_tensor(leaves, collective.survey.non_tensor)) or b""
    rows = collective.agree(len(json_bytes), 0)
    survey = collective.survey
    world = len(rows)
    results: dict = {}
    pending = []
    gathered_packs = []
    for pack in survey.packs:
        local = _pack(pack, leaves, device)
        gathered = torch.empty(world, pack[0], dtype=torch.uint8, device=device)
        pending.append(dist.all_gather(list(gathered.unbind(0)), local, group=group, async_op=True))
        gathered_packs.append((pack, gathered))
    for index in survey.direct:
        value = leaves[index][1]
        stacked = torch.empty((world, *value.shape), dtype=value.dtype, device=device)
        rows_as_bytes = [row.view(-1).view(torch.uint8) for row in stacked.unbind(0)]
        pending.append(dist.all_gather(rows_as_bytes, _send_view(value, device), group=group, async_op=True))
        results[index] = stacked
    for work in pending:
        work.wait()
    for (_, groups), gathered in gathered_packs:
        for dtype, indices, offset, nbytes in groups:
            typed = gathered[:, offset:offset + nbytes].view(dtype)
            start = 0
            for index in indices:
                value = leaves[index][1]
                numel = value.numel()
                results[index] = typed[:, start:start + numel].reshape(world, *value.shape)
                start += numel
    if survey.non_tensor:
        per_rank = [_decode_non_tensor(raw) for raw in _gather_bytes(dist, group, json_bytes,
                                                                      [row[1] for row in rows], device)]
        for position, index in enumerate(survey.non_tensor):
            like = leaves[index][1]
            items = [_non_tensor_leaf(rank_items[position], like) for rank_items in per_rank]
            results[index] = combine_non_tensor(items, lambda grids: torch.stack(grids, 0))
    for index, (_, value, _, _) in enumerate(leaves):
        if isinstance(value, _Tensor) and results[index].device != value.device:
            results[index] = results[index].to(value.device)
    by_path = {leaves[index][0]: result for index, result in results.items()}
    return _stacked_like(td, by_path, world, ())


def _stacked_like(td: Any, by_path: dict, world: int, prefix: tuple) -> Any:
    """A TensorDict shaped like ``td`` with one more leading dim of size ``world``, leaves from ``by_path``."""
    storage = {}
    for key, value in td._tensordict.items():
        path = prefix + (key,)
        if isinstance(value, TensorCollection):
            storage[key] = rewrap(value, _stacked_like(unwrap(value), by_path, world, path))
        else:
            storage[key] = by_path[path]
    names = None if td._names is None else [None] + list(td._names)
    return td._new_unsafe(storage, torch.Size([world]) + td._batch_size, td._device, names)


# --------------------------------------------------------------------- the mixin
class DistributedMixin:
    """send / recv / isend / irecv and collectives of the whole TensorDict.

    Default mode: one packed exchange per TensorDict, its structure checked first on
    both sides (see :mod:`torchdict.distributed`). ``per_leaf=True``: upstream
    tensordict's one-message-per-leaf protocol, for interoperability.
    """

    __slots__ = ()

    def send(self, dst: Optional[int] = None, *, group: Any = None, group_dst: Optional[int] = None,
             init_tag: int = 0, pseudo_rand: bool = False, per_leaf: bool = False,
             consolidated: Optional[bool] = None) -> None:
        """Send every leaf to rank ``dst``, which calls :meth:`recv` on a TensorDict of the same structure.

        By default the leaves travel packed in one message, after both sides checked
        that keys, shapes and dtypes agree (a mismatch raises
        :class:`StructureMismatchError` on both). Non-tensor values (JSON) travel too.
        ``per_leaf=True`` sends one message per tensor leaf, tags ``init_tag, init_tag + 1, ...``
        in sorted-key order, as upstream tensordict does. ``group_dst`` names the
        receiver by its rank inside ``group``.

        Example (two processes in a gloo group)::

            >>> td = TensorDict(a=torch.ones(3), b={"c": torch.ones(())}, batch_size=[3])  # doctest: +SKIP
            >>> td.send(dst=1)            # on rank 0                                        # doctest: +SKIP
        """
        _check_peer(dst, group_dst, group, "dst", "group_dst")
        if _mode(per_leaf, consolidated):
            works, _ = _send_per_leaf(self, _dist(), dst, group_dst, group, init_tag, pseudo_rand)
            for work in works:
                work.wait()
            return None
        channel, leaves = _p2p_channel(self, dst, group_dst, group, init_tag, pseudo_rand)
        _send_packed(leaves, channel, early=False)
        return None

    def recv(self, src: Optional[int] = None, *, group: Any = None, group_src: Optional[int] = None,
             init_tag: int = 0, pseudo_rand: bool = False, per_leaf: bool = False,
             consolidated: Optional[bool] = None) -> int:
        """Receive what rank ``src`` sends, writing it into this TensorDict's leaves in place.

        Returns the last tag of the range the transfer reserves, ``init_tag + n_leaves - 1``
        (upstream's return value; with ``pseudo_rand`` the last tag of the chain).
        Raises :class:`StructureMismatchError` (on both sides) when the structures differ,
        leaving this TensorDict unchanged.

        Example (two processes in a gloo group)::

            >>> td = TensorDict(a=torch.zeros(3), b={"c": torch.zeros(())}, batch_size=[3])  # doctest: +SKIP
            >>> td.recv(src=0)            # on rank 1                                         # doctest: +SKIP
            1
        """
        _check_peer(src, group_src, group, "src", "group_src")
        if _mode(per_leaf, consolidated):
            works, last = _recv_per_leaf(self, _dist(), src, group_src, group, init_tag, pseudo_rand)
            for work in works:
                work.wait()
            return last
        channel, leaves = _p2p_channel(self, src, group_src, group, init_tag, pseudo_rand)
        _recv_packed(leaves, channel, premature=False)
        return _last_tag(init_tag, pseudo_rand, len(leaves))

    def isend(self, dst: Optional[int] = None, *, group: Any = None, group_dst: Optional[int] = None,
              init_tag: int = 0, pseudo_rand: bool = False, return_early: bool = False, per_leaf: bool = False,
              consolidated: Optional[bool] = None) -> Any:
        """Asynchronous :meth:`send`.

        Waits by default and returns the last tag, like upstream. With
        ``return_early=True`` it returns at once a list of waitable handles (one
        :class:`TransferHandle` in packed mode, one ``Work`` per leaf with ``per_leaf``):
        compute meanwhile, then call ``wait()`` on each. In packed mode the small leaves
        are copied at call time; leaves of 1 MiB or more are sent from their own memory,
        so don't modify them before ``wait()``.

        Example (two processes in a gloo group)::

            >>> handles = td.isend(dst=1, return_early=True)  # doctest: +SKIP
            >>> loss = model(batch)                             # overlaps with the transfer  # doctest: +SKIP
            >>> for handle in handles: handle.wait()            # doctest: +SKIP
        """
        _check_peer(dst, group_dst, group, "dst", "group_dst")
        if _mode(per_leaf, consolidated):
            works, last = _send_per_leaf(self, _dist(), dst, group_dst, group, init_tag, pseudo_rand)
            if return_early:
                return works
            for work in works:
                work.wait()
            return last
        channel, leaves = _p2p_channel(self, dst, group_dst, group, init_tag, pseudo_rand)
        handle = _send_packed(leaves, channel, early=return_early)
        return [handle] if return_early else _last_tag(init_tag, pseudo_rand, len(leaves))

    def irecv(self, src: Optional[int] = None, *, group: Any = None, group_src: Optional[int] = None,
              return_premature: bool = False, init_tag: int = 0, pseudo_rand: bool = False,
              per_leaf: bool = False, consolidated: Optional[bool] = None) -> Any:
        """Asynchronous :meth:`recv`.

        Waits by default and returns None, like upstream. With ``return_premature=True``
        it returns at once a list of waitable handles; the TensorDict holds the received
        values only after ``wait()`` returned on each (in packed mode, ``wait()`` is what
        copies the packed leaves and non-tensor values in).

        Example (two processes in a gloo group)::

            >>> handles = td.irecv(src=0, return_premature=True)  # doctest: +SKIP
            >>> for handle in handles: handle.wait()                # doctest: +SKIP
        """
        _check_peer(src, group_src, group, "src", "group_src")
        if _mode(per_leaf, consolidated):
            works, _ = _recv_per_leaf(self, _dist(), src, group_src, group, init_tag, pseudo_rand)
            if return_premature:
                return works
            for work in works:
                work.wait()
            return None
        channel, leaves = _p2p_channel(self, src, group_src, group, init_tag, pseudo_rand)
        handle = _recv_packed(leaves, channel, premature=return_premature)
        return [handle] if return_premature else None

    def broadcast(self, src: int, *, group: Any = None) -> Any:
        """Copy rank ``src``'s values into this TensorDict on every rank of ``group``, in place; returns self.

        Every rank calls it with a TensorDict of the same structure (checked first: a
        mismatch raises :class:`StructureMismatchError` on every rank). Non-tensor
        values are broadcast too.

        Example (every rank)::

            >>> td = TensorDict(w=torch.full((3,), float(rank)), batch_size=[3])  # doctest: +SKIP
            >>> td.broadcast(src=0)["w"]                                           # doctest: +SKIP
            tensor([0., 0., 0.])
        """
        return _broadcast(self, src, group)

    def all_reduce(self, op: Any = None, *, group: Any = None, async_op: bool = False) -> Any:
        """Reduce every tensor leaf across ``group`` in place (``op`` defaults to ``ReduceOp.SUM``).

        Small leaves are reduced in one buffer per dtype; large ones in place. Non-tensor
        leaves are left as they are. With ``async_op=True`` returns ``[handle]``; its
        ``wait()`` writes the results back.

        Example (every rank, two ranks)::

            >>> td = TensorDict(g=torch.ones(2) * (rank + 1), batch_size=[2])  # doctest: +SKIP
            >>> td.all_reduce()["g"]                                             # doctest: +SKIP
            tensor([3., 3.])
        """
        return _all_reduce(self, op, group, async_op)

    def all_gather(self, *, group: Any = None) -> Any:
        """Every rank's TensorDict, stacked: a new TensorDict of batch ``[world_size, *batch_size]``.

        Every rank calls it with the same structure (checked first). Item ``i`` of the
        result is rank ``i``'s TensorDict (use ``result[i]`` or ``result.unbind(0)`` for a
        list); non-tensor values become a stack of every rank's value.

        Example (every rank, two ranks)::

            >>> TensorDict(r=torch.tensor(rank)).all_gather()["r"]  # doctest: +SKIP
            tensor([0, 1])
        """
        return _all_gather(self, group)
