"""The wire format of :mod:`torchdict.distributed`: how a TensorDict's leaves become a few messages.

One pass over the leaves (:class:`Survey`, in sorted-key order, recursing into
sub-TensorDicts like upstream) gives

- the structure *fingerprint*: a 64-bit hash of every leaf's key path, dtype and
  shape (non-tensor leaves: their batch shape). Two sides exchange data only when
  their fingerprints agree, and equal fingerprints mean equal layouts below;
- the *packs*: small leaves, grouped by dtype, laid out one after the other in a
  byte buffer (each group aligned to ``ALIGN`` bytes so it can be viewed as its dtype);
- the *direct* leaves (at least ``DIRECT_MIN_BYTES``): one message each, straight
  from the sender's memory into the receiver's, no copy;
- the *non-tensor* leaves, sent as one JSON document.

:class:`Packs` holds the buffers of a survey's packs plus a view of every small
leaf's slot in them; they are cached by fingerprint, so sending or receiving the
same structure again allocates nothing: filling or draining a pack is one
``torch._foreach_copy_`` per dtype group. :class:`OutgoingPayload` and
:class:`IncomingPayload` list every message of a payload in wire order (packs,
direct leaves, JSON), on the sending and on the receiving side.
"""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence

import torch

from .._apply import unwrap
from .._base import TensorCollection
from ..nontensor import NonTensorData, NonTensorStack

_Tensor = torch.Tensor
# Leaves this large travel as their own message, from and into their own memory:
# packing them would cost a copy on each side (and page faults in a fresh buffer).
DIRECT_MIN_BYTES = 1 << 20
# Small leaves are packed into buffers of at most this many bytes.
PACK_MAX_BYTES = 64 << 20
# Each dtype group in a pack starts on this boundary so it can be viewed as its dtype.
ALIGN = 64
_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}


# --------------------------------------------------------------------- leaves
def walk(td: Any, prefix: tuple = (), out: Optional[list] = None) -> list:
    """``(path, value, storage, key)`` for every leaf, sorted by key at each level (upstream's order)."""
    out = [] if out is None else out
    storage = td._tensordict
    for key in sorted(storage):
        value = storage[key]
        if isinstance(value, TensorCollection):
            walk(unwrap(value), prefix + (key,), out)
        else:
            out.append((prefix + (key,), value, storage, key))
    return out


def show_key(path: Sequence[str]) -> str:
    return repr(path[0]) if len(path) == 1 else repr(tuple(path))


_DTYPE_NAMES: dict = {}


def _dtype_name(path: tuple, value: _Tensor) -> str:
    dtype = value.dtype
    if dtype in _QUANTIZED:
        raise TypeError(f"Cannot transfer {show_key(path)}: quantized tensors are not supported.")
    name = _DTYPE_NAMES[dtype] = str(dtype)[6:]
    return name


def _refuse(path: tuple, value: _Tensor) -> None:
    kind = "nested" if value.is_nested else str(value.layout)
    raise TypeError(f"Cannot transfer {show_key(path)}: only dense (strided) tensors can be sent, got a {kind} tensor.")


def describe(leaves: list) -> list:
    """The structure as JSON-ready entries ``[path, dtype or "non-tensor", shape]`` (for error messages)."""
    entries = []
    for path, value, _, _ in leaves:
        if isinstance(value, _Tensor):
            entries.append([list(path), str(value.dtype)[6:], list(value.shape)])
        else:
            entries.append([list(path), "non-tensor", list(value.batch_size)])
    return entries


def description_bytes(leaves: list) -> bytes:
    import json

    return json.dumps(describe(leaves), separators=(",", ":")).encode()


def difference(mine: list, theirs: list, my_name: str, their_name: str) -> str:
    """Which keys differ between two structure descriptions, in words."""
    mine_map = {tuple(path): (kind, shape) for path, kind, shape in mine}
    theirs_map = {tuple(path): (kind, shape) for path, kind, shape in theirs}

    def listing(paths: list) -> str:
        shown = ", ".join(show_key(path) for path in paths[:10])
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
        parts.append(f"{show_key(path)} is {kind_a}{shape_a} on {my_name} but {kind_b}{shape_b} on {their_name}")
    if len(changed) > 10:
        parts.append(f"{len(changed) - 10} more keys differ")
    return "; ".join(parts) or "the structures differ"


# --------------------------------------------------------------------- the survey
def _lay_out(groups: dict, group_bytes: dict) -> tuple:
    """``(total bytes, [(dtype, leaf indices, byte offset, nbytes), ...])`` of one pack."""
    laid_out = []
    offset = 0
    for dtype, indices in groups.items():
        nbytes = group_bytes[dtype]
        laid_out.append((dtype, indices, offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return offset, laid_out


class Survey:
    """One pass over the leaves: the structure fingerprint and how the leaves travel.

    ``packs`` holds ``(nbytes, groups)`` with ``groups`` a list of
    ``(dtype, leaf indices, byte offset, nbytes)``; ``direct`` lists the leaves of
    at least ``DIRECT_MIN_BYTES``; ``non_tensor`` the non-tensor values; ``strided``
    the non-contiguous tensor leaves. Raises TypeError for a tensor with no flat
    byte representation (sparse, nested, quantized).
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
        self.strided: list = []
        kinds = []
        dims = array("q")
        groups: dict = {}
        group_bytes: dict = {}
        pack_bytes = 0
        dense = torch.strided
        names = _DTYPE_NAMES
        for index, (path, value, _, _) in enumerate(leaves):
            if isinstance(value, _Tensor):
                if value.layout is not dense or value.is_nested:
                    _refuse(path, value)
                dtype = value.dtype
                kinds.append(names.get(dtype) or _dtype_name(path, value))
                shape = value.shape
                if not value.is_contiguous():
                    self.strided.append(index)
                nbytes = value.nbytes
                if nbytes >= DIRECT_MIN_BYTES:
                    self.direct.append(index)
                else:
                    if groups and pack_bytes + nbytes > PACK_MAX_BYTES:
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


# --------------------------------------------------------------------- packs
class Packs:
    """The byte buffers of a survey's packs, and a view of every small leaf's slot in them.

    ``slots[p][g]`` lists, for group ``g`` of pack ``p``, views of the buffer shaped
    like the group's leaves. Borrow with :meth:`borrow`, give back with
    :meth:`release` once no transfer uses the buffers any more (never after a failed
    transfer: a late message could still land in them).
    """

    __slots__ = ("key", "buffers", "slots", "nbytes")

    _free: dict = {}  # (fingerprint, device) -> [Packs, ...] ready for reuse, oldest key first
    _cached_bytes = 0
    _MAX_CACHED_BYTES = 32 << 20  # what the cache may hold in all; a larger Packs is used once and dropped

    def __init__(self, key: tuple, survey: Survey, device: torch.device) -> None:
        from torch._C._nn import unflatten_dense_tensors

        self.key = key
        self.buffers: list = []
        self.slots: list = []
        self.nbytes = 0
        leaves = survey.leaves
        for total, groups in survey.packs:
            # Zeroed once: the alignment padding never carries stale memory over the wire.
            buffer = torch.zeros(total, dtype=torch.uint8, device=device)
            self.buffers.append(buffer)
            self.nbytes += total
            self.slots.append([
                list(unflatten_dense_tensors(buffer[offset:offset + nbytes].view(dtype),
                                             [leaves[i][1] for i in indices]))
                for dtype, indices, offset, nbytes in groups
            ])

    @classmethod
    def borrow(cls, survey: Survey, device: torch.device) -> "Packs":
        """Cached buffers for this structure if some are free, else new ones."""
        key = (survey.fingerprint, device)
        free = cls._free.get(key)
        if free:
            try:
                packs = free.pop()
            except IndexError:  # emptied by another thread meanwhile
                pass
            else:
                cls._cached_bytes -= packs.nbytes
                return packs
        return cls(key, survey, device)

    def release(self) -> None:
        """Return the buffers to the cache, dropping the oldest structures' buffers if it is full."""
        cls = type(self)
        if self.nbytes > cls._MAX_CACHED_BYTES:
            return
        while cls._free and cls._cached_bytes + self.nbytes > cls._MAX_CACHED_BYTES:
            oldest = next(iter(cls._free))
            cls._cached_bytes -= sum(packs.nbytes for packs in cls._free.pop(oldest, ()))
        cls._free.setdefault(self.key, []).append(self)
        cls._cached_bytes += self.nbytes

    @classmethod
    def filled(cls, survey: Survey, device: torch.device) -> "Packs":
        """Borrowed buffers holding a copy of the small leaves, ready to send or reduce."""
        packs = cls.borrow(survey, device)
        packs.fill(survey)
        return packs

    def fill(self, survey: Survey) -> None:
        """Copy the small leaves into the buffers (one ``_foreach_copy_`` per dtype group)."""
        with torch.no_grad():
            for views, values in self._dtype_groups(survey):
                torch._foreach_copy_(views, values)

    def drain(self, survey: Survey) -> None:
        """Copy the buffers into the small leaves, in place."""
        with torch.no_grad():
            for views, values in self._dtype_groups(survey):
                torch._foreach_copy_(values, views)

    def _dtype_groups(self, survey: Survey) -> Iterator[tuple]:
        """``(slot views, leaf values)`` of every dtype group of every pack."""
        leaves = survey.leaves
        for (_, groups), slots in zip(survey.packs, self.slots):
            for (_, indices, _, _), views in zip(groups, slots):
                yield views, [leaves[i][1] for i in indices]

    def typed(self, pack_index: int, group: tuple) -> _Tensor:
        """The flat slice of a dtype group, viewed as its dtype (what all_reduce reduces)."""
        dtype, _, offset, nbytes = group
        return self.buffers[pack_index][offset:offset + nbytes].view(dtype)


# --------------------------------------------------------------------- direct leaves
def send_view(value: _Tensor, device: torch.device) -> _Tensor:
    """A contiguous byte view of a leaf to send (a copy only when it must be)."""
    value = value.detach()
    if value.device != device:
        value = value.to(device)
    if value.is_conj():
        value = value.resolve_conj()
    if value.is_neg():
        value = value.resolve_neg()
    return value.contiguous().view(-1).view(torch.uint8)


def writable_in_place(value: _Tensor, device: torch.device) -> bool:
    return value.device == device and value.is_contiguous() and not value.is_conj() and not value.is_neg()


def recv_target(value: _Tensor, device: torch.device) -> tuple:
    """``(byte buffer to receive into, follow-up copy or None)`` for a direct leaf."""
    if writable_in_place(value, device):
        return value.detach().view(-1).view(torch.uint8), None
    scratch = torch.empty(value.nbytes, dtype=torch.uint8, device=device)

    def copy_back() -> None:
        with torch.no_grad():
            value.copy_(scratch.view(value.dtype).view(value.shape))

    return scratch, copy_back


def expanded_leaf(leaves: list, indices: Sequence[int]) -> Optional[str]:
    """A complaint about the first of ``indices`` that can't be written in place (an expanded tensor).

    Only non-contiguous leaves can be expanded, so callers pass those.
    """
    for index in indices:
        path, value = leaves[index][0], leaves[index][1]
        if any(stride == 0 and size > 1 for stride, size in zip(value.stride(), value.shape)):
            return (
                f"Cannot write into {show_key(path)}: it is expanded (stride 0), so values can't be written "
                "into it in place; clone it first."
            )
    return None


# --------------------------------------------------------------------- a whole payload
class OutgoingPayload:
    """Every message of a payload, in wire order: the packs, the direct leaves, the JSON.

    The small leaves are copied into the packs at construction, so the caller may
    modify them while an asynchronous send runs; direct leaves are sent from their
    own memory. :meth:`release` gives the pack buffers back once the sends are done.

    Example::

        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.ones(2), b=torch.zeros(3, dtype=torch.int64), note="hi")
        >>> survey = Survey(walk(td))
        >>> json_bytes = encode_non_tensor(survey.leaves, survey.non_tensor)
        >>> json_bytes
        b'[[0,"hi"]]'
        >>> payload = OutgoingPayload(survey, json_bytes, torch.device("cpu"))
        >>> [buffer.numel() for buffer in payload.buffers]  # one pack: two dtype groups of 64 aligned bytes
        [128, 10]
        >>> payload.release()
    """

    __slots__ = ("survey", "packs", "buffers", "json_nbytes")

    def __init__(self, survey: Survey, json_bytes: bytes, device: torch.device) -> None:
        self.survey = survey
        self.packs = Packs.filled(survey, device)
        self.buffers = self.packs.buffers + [send_view(survey.leaves[i][1], device) for i in survey.direct]
        self.json_nbytes = len(json_bytes)
        if json_bytes:
            self.buffers.append(bytes_to_tensor(json_bytes, device))

    @property
    def nbytes(self) -> int:
        return sum(buffer.numel() for buffer in self.buffers)

    def release(self) -> None:
        self.packs.release()


class IncomingPayload:
    """Where each message of a payload is received, in wire order (``targets``).

    Packed leaves land in borrowed pack buffers, direct leaves in their own memory
    when it can be written in place (else in scratch, copied back), the JSON in a
    byte buffer. :meth:`unpack` writes it all into the leaves once every receive
    is complete.
    """

    __slots__ = ("survey", "packs", "targets", "copy_backs", "json_buffer")

    def __init__(self, survey: Survey, json_nbytes: int, device: torch.device) -> None:
        self.survey = survey
        self.packs = Packs.borrow(survey, device)
        self.targets = list(self.packs.buffers)
        self.copy_backs: list = []
        for index in survey.direct:
            target, copy_back = recv_target(survey.leaves[index][1], device)
            self.targets.append(target)
            if copy_back is not None:
                self.copy_backs.append(copy_back)
        self.json_buffer: Optional[_Tensor] = None
        if json_nbytes:
            self.json_buffer = torch.empty(json_nbytes, dtype=torch.uint8, device=device)
            self.targets.append(self.json_buffer)

    def unpack(self) -> None:
        """Write what arrived into the leaves: packed leaves, copied-back direct leaves, non-tensor values."""
        survey, packs = self.survey, self.packs
        packs.drain(survey)
        packs.release()  # only after a complete receive: a late message could still land in a failed one
        for copy_back in self.copy_backs:
            copy_back()
        if survey.non_tensor:
            raw = tensor_to_bytes(self.json_buffer) if self.json_buffer is not None else b""
            set_non_tensor(survey.leaves, survey.non_tensor, decode_non_tensor(raw))


# --------------------------------------------------------------------- non-tensor values
def encode_non_tensor(leaves: list, indices: List[int]) -> bytes:
    """The JSON of the non-tensor values at ``indices``: ``[0, value]`` or ``[1, [one value per element]]``."""
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
                f"The non-tensor value at {show_key(path)} can't be sent: {error}. Only JSON values (str, "
                "int, float, bool, None, and lists and dicts of them) travel with send, recv and the "
                "collectives."
            ) from None
        values.append(item)
    return json.dumps(values, separators=(",", ":")).encode()


def decode_non_tensor(raw: bytes) -> list:
    import json

    return json.loads(raw.decode("utf-8")) if raw else []


def non_tensor_leaf(item: list, like: Any) -> Any:
    """The leaf for a decoded ``item``, with the batch size and device of the receiver's leaf ``like``."""
    if item[0] == 0:
        return NonTensorData(item[1], like.batch_size, like.device)
    return NonTensorStack(item[1], like.batch_size, like.device)


def set_non_tensor(leaves: list, indices: List[int], items: list) -> None:
    for index, item in zip(indices, items):
        _, old, storage, key = leaves[index]
        storage[key] = non_tensor_leaf(item, old)


def bytes_to_tensor(data: bytes, device: torch.device) -> _Tensor:
    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return tensor if device.type == "cpu" else tensor.to(device)


def tensor_to_bytes(tensor: _Tensor) -> bytes:
    import ctypes

    tensor = tensor.detach().to("cpu").contiguous()
    return ctypes.string_at(tensor.data_ptr(), tensor.numel()) if tensor.numel() else b""
