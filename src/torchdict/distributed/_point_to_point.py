"""send / recv of a whole TensorDict with one peer: the checked, packed protocol (the default).

All messages travel on one tag:

1. sender -> receiver: a header of 8 int64 (magic, version, status, structure
   fingerprint, leaf count, JSON length, extra length, eager flag);
2. receiver -> sender: an ack of 3 int64 (magic, status, length of what follows);
3. the payload (see :mod:`torchdict.distributed._wire`): the small leaves packed into one byte
   buffer, each leaf of 1 MiB or more as its own message straight from / into its
   memory, then the JSON of the non-tensor values. A large payload is sent only
   after an OK ack. A small one (up to 1 MiB, no leaf on its own) is sent *eagerly*
   right behind the header, saving one round trip; a receiver whose structure
   differs reads it into scratch and drops it, so nothing is written either way.

On a mismatch both sides swap their structure descriptions and both raise
:class:`StructureMismatchError` naming the keys that differ; nothing is written.
A failure on either side before the payload (a value JSON can't encode, a leaf
that can't be written in place) is reported to the peer the same way. Every wait
is bounded by the process group's timeout.

:func:`point_to_point` is the entry point of ``send`` / ``recv`` / ``isend`` /
``irecv``: it checks the peer arguments and picks this protocol or one of upstream's
(:mod:`torchdict.distributed._per_leaf`, :mod:`torchdict.distributed._consolidated`).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import _wire
from ._per_leaf import last_tag, next_pseudo_tag, recv_per_leaf, send_per_leaf
from ._transfer import (Channel, LocalPreparation, StructureMismatchError, TransferHandle, comm_device, dist,
                        failure_text)

_MAGIC = 0x74_64_2D_77_69_72_65  # "td-wire"
_VERSION = 1
_OK, _MISMATCH, _FAILED = 0, 1, 2
_HEADER_LEN = 8
_ACK_LEN = 3
# Payloads up to this size (no leaf sent on its own) follow the header without waiting for the ack.
_EAGER_MAX_BYTES = 1 << 20


# --------------------------------------------------------------------- entry point
def point_to_point(td: Any, peer: Optional[int], group: Any, group_peer: Optional[int], init_tag: int,
                   pseudo_rand: bool, per_leaf: bool, consolidated: Optional[bool], *, sending: bool,
                   at_once: bool) -> tuple:
    """Send ``td`` to, or receive it from, ``peer``: ``(handles, or None once the transfer is over; last tag)``.

    ``at_once`` returns the handles while the transfer runs (``return_early`` /
    ``return_premature``); otherwise every handle has been waited on.
    """
    if sending:
        _check_peer(peer, group_peer, group, "dst", "group_dst")
    else:
        _check_peer(peer, group_peer, group, "src", "group_src")
    if consolidated and not _per_leaf_mode(per_leaf, consolidated):
        from ._consolidated import consolidated_transfer

        return consolidated_transfer(td, peer, group, group_peer, sending=sending, at_once=at_once)
    if _per_leaf_mode(per_leaf, consolidated):
        transfer = send_per_leaf if sending else recv_per_leaf
        works, last = transfer(td, dist(), peer, group_peer, group, init_tag, pseudo_rand)
    else:
        distributed = dist()
        leaves = _wire.walk(td)
        tag = next_pseudo_tag(init_tag) if pseudo_rand else init_tag
        channel = Channel(distributed, peer, group_peer, group, tag, comm_device(distributed, group, leaves, td))
        handle = (_send_packed if sending else _recv_packed)(leaves, channel, at_once)
        works, last = ([handle] if handle is not None else []), last_tag(init_tag, pseudo_rand, len(leaves))
    if at_once:
        return works, last
    for work in works:
        work.wait()
    return None, last


def _check_peer(peer: Optional[int], group_peer: Optional[int], group: Any, name: str, group_name: str) -> None:
    if group_peer is not None:
        if group is None:
            raise ValueError(f"`{group_name}` is a rank inside `group`, so `group` must be passed too.")
        if peer is not None:
            raise ValueError(f"Pass either `{name}` or `{group_name}`, not both.")
    elif peer is None:
        raise ValueError(f"Exactly one of `{name}` and `{group_name}` must be given.")


def _per_leaf_mode(per_leaf: bool, consolidated: Optional[bool]) -> bool:
    """True for the per-leaf protocol (``consolidated=True``, upstream's one-buffer protocol, is neither)."""
    if per_leaf and consolidated:
        raise ValueError("per_leaf=True and consolidated=True ask for opposite protocols; pass one of them.")
    return bool(per_leaf)


# --------------------------------------------------------------------- the sender
def _send_packed(leaves: list, channel: Channel, early: bool) -> Optional[TransferHandle]:
    try:
        survey = _wire.Survey(leaves)
        outgoing = _wire.OutgoingPayload(survey, _wire.encode_non_tensor(leaves, survey.non_tensor), channel.device)
    except Exception as error:
        # Tell the receiver, so it raises too instead of waiting for data that never comes.
        message = failure_text(error)
        try:
            channel.send_ints([_MAGIC, _VERSION, _FAILED, 0, 0, 0, len(message), 0])
            channel.send_bytes(message)
        except Exception:
            pass
        raise
    if early:
        return TransferHandle(lambda: _exchange_as_sender(channel, outgoing))
    _exchange_as_sender(channel, outgoing)
    return None


def _exchange_as_sender(channel: Channel, outgoing: _wire.OutgoingPayload) -> None:
    survey = outgoing.survey
    # A small payload (no direct leaf, at most one pack) goes out right behind the header, without waiting
    # for the ack: one hop less. A receiver whose structure differs reads it into scratch and drops it.
    eager = not survey.direct and len(survey.packs) <= 1 and outgoing.nbytes <= _EAGER_MAX_BYTES
    pack_bytes = survey.packs[0][0] if survey.packs else 0
    channel.send_ints([_MAGIC, _VERSION, _OK, survey.fingerprint, len(survey.leaves), outgoing.json_nbytes,
                       pack_bytes if eager else 0, int(eager)])
    works = [channel.isend(buffer) for buffer in outgoing.buffers] if eager else []
    magic, status, extra = channel.recv_ints(_ACK_LEN)
    for work in works:
        work.wait()
    if magic != _MAGIC:
        raise RuntimeError(f"send: {channel.name} answered with something that is not a torchdict ack.")
    if status == _OK:
        for work in [channel.isend(buffer) for buffer in outgoing.buffers] if not eager else []:
            work.wait()
        outgoing.release()
        return
    outgoing.release()  # whatever was sent from them has been received (and dropped)
    if status == _MISMATCH:
        description = _wire.description_bytes(survey.leaves)
        channel.send_ints([len(description)])
        channel.send_bytes(description)
        detail = _difference(survey.leaves, channel.recv_bytes(extra), "the sender", "the receiver")
        raise StructureMismatchError(
            f"send to {channel.name}: structure mismatch, nothing was written on the receiver: {detail}. Both "
            "sides need the same keys, shapes and dtypes (non-tensor values may differ)."
        )
    reason = channel.recv_bytes(extra).decode(errors="replace")
    raise RuntimeError(f"send to {channel.name}: the receiver refused the TensorDict: {reason}")


def _difference(leaves: list, their_description: bytes, my_name: str, their_name: str) -> str:
    """Which keys differ between our leaves and the peer's structure description, in words."""
    import json

    theirs = json.loads(their_description.decode())
    return _wire.difference(_wire.describe(leaves), theirs, my_name, their_name)


# --------------------------------------------------------------------- the receiver
class _Incoming(LocalPreparation):
    """The receiver's side: its survey, any reason it can't receive, and where the payload lands."""

    def __init__(self, leaves: list, device: torch.device) -> None:
        super().__init__(leaves)
        self.check_writable()
        self.device = device
        self.payload: Optional[_wire.IncomingPayload] = None
        self.works: list = []

    def post(self, channel: Channel, json_nbytes: int) -> None:
        """Post every receive of the payload: packs, direct leaves (in place when possible), JSON."""
        self.payload = _wire.IncomingPayload(self.surveyed, json_nbytes, self.device)
        self.works = [channel.irecv(target) for target in self.payload.targets]

    def wait(self) -> None:
        for work in self.works:
            work.wait()

    def finish(self) -> None:
        """Write what arrived into the TensorDict (packed leaves, copied-back leaves, non-tensor values)."""
        assert self.payload is not None, "finish() runs after post() and wait()"
        self.payload.unpack()


def _recv_packed(leaves: list, channel: Channel, premature: bool) -> Optional[TransferHandle]:
    incoming = _Incoming(leaves, channel.device)
    if premature:
        return TransferHandle(lambda: _exchange_as_receiver(channel, incoming), finish=incoming.finish)
    _exchange_as_receiver(channel, incoming)
    incoming.finish()
    return None


def _exchange_as_receiver(channel: Channel, incoming: _Incoming) -> None:
    magic, version, status, fingerprint, _, json_nbytes, extra, eager = channel.recv_ints(_HEADER_LEN)
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
    matches = incoming.problem is None and fingerprint == incoming.surveyed.fingerprint
    dropped: list = []
    if eager and matches:
        incoming.post(channel, json_nbytes)
    elif eager:  # read the payload already on its way into scratch, so the channel stays clean
        sizes = [size for size in (extra, json_nbytes) if size]
        dropped = [channel.irecv(torch.empty(size, dtype=torch.uint8, device=channel.device)) for size in sizes]
    if incoming.problem is not None:
        message = failure_text(incoming.problem)
        channel.send_ints([_MAGIC, _FAILED, len(message)])
        for work in dropped:
            work.wait()
        channel.send_bytes(message)
        raise incoming.problem
    if not matches:
        description = _wire.description_bytes(incoming.leaves)
        channel.send_ints([_MAGIC, _MISMATCH, len(description)])
        for work in dropped:
            work.wait()
        (their_length,) = channel.recv_ints(1)
        detail = _difference(incoming.leaves, channel.recv_bytes(their_length), "the receiver", "the sender")
        channel.send_bytes(description)
        raise StructureMismatchError(
            f"recv from {channel.name}: structure mismatch, nothing was received and the TensorDict is "
            f"unchanged: {detail}. Both sides need the same keys, shapes and dtypes (non-tensor values may differ)."
        )
    channel.send_ints([_MAGIC, _OK, 0])
    if not eager:
        incoming.post(channel, json_nbytes)
    incoming.wait()
