"""send / recv / isend / irecv and collectives of a whole TensorDict over ``torch.distributed``.

Default ("packed") point-to-point protocol, all messages on one tag:

1. sender -> receiver: a header of 8 int64 (magic, version, status, structure
   fingerprint, leaf count, JSON length, extra length, eager flag);
2. receiver -> sender: an ack of 3 int64 (magic, status, length of what follows);
3. the payload (see :mod:`torchdict._wire`): the small leaves packed into one byte
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

``per_leaf=True`` speaks upstream tensordict's protocol instead: one message per
tensor leaf in sorted-key order, tags ``init_tag, init_tag + 1, ...``.

Collectives first all-gather each rank's fingerprint (plus JSON length and an
error flag), so a mismatch or a local failure raises on every rank instead of
hanging, then move the same packed buffers.

``torch.distributed``, ``json``, ``hashlib`` and ``threading`` are imported lazily.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, List, Optional, Sequence

import torch

from . import _wire
from ._apply import rewrap, unwrap
from ._base import TensorCollection
from .nontensor import combine_non_tensor

__all__ = ["DistributedMixin", "StructureMismatchError", "TransferHandle"]

_Tensor = torch.Tensor
_MAGIC = 0x74_64_2D_77_69_72_65  # "td-wire"
_VERSION = 1
_OK, _MISMATCH, _FAILED = 0, 1, 2
_HEADER_LEN = 8
_ACK_LEN = 3
# Payloads up to this size (no leaf sent on its own) follow the header without waiting for the ack.
_EAGER_MAX_BYTES = 1 << 20


class StructureMismatchError(RuntimeError):
    """Two ranks tried to exchange TensorDicts whose keys, shapes or dtypes differ."""


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
            self.isend(_wire.bytes_to_tensor(data, self.device)).wait()

    def recv_bytes(self, count: int) -> bytes:
        if count <= 0:
            return b""
        received = torch.empty(count, dtype=torch.uint8, device=self.device)
        self.irecv(received).wait()
        return _wire.tensor_to_bytes(received)


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


class _Outgoing:
    """The sender's side: survey, filled packs, and every buffer to send in order.

    The small leaves are copied into the packs at construction, so the caller may
    modify them while an asynchronous send runs; direct (large) leaves are sent from
    their own memory.
    """

    def __init__(self, leaves: list, device: torch.device) -> None:
        self.survey = survey = _wire.Survey(leaves)
        self.json = _wire.encode_non_tensor(leaves, survey.non_tensor)
        self.packs = _wire.Packs.borrow(survey, device)
        self.packs.fill(survey)
        self.buffers = self.packs.buffers + [_wire.send_view(leaves[i][1], device) for i in survey.direct]
        if self.json:
            self.buffers.append(_wire.bytes_to_tensor(self.json, device))


def _send_packed(leaves: list, channel: _Channel, early: bool) -> Optional[TransferHandle]:
    try:
        outgoing = _Outgoing(leaves, channel.device)
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
        return TransferHandle(lambda: _exchange_as_sender(channel, outgoing))
    _exchange_as_sender(channel, outgoing)
    return None


def _exchange_as_sender(channel: _Channel, outgoing: _Outgoing) -> None:
    survey = outgoing.survey
    # A small payload (no direct leaf, at most one pack) goes out right behind the header, without waiting
    # for the ack: one hop less. A receiver whose structure differs reads it into scratch and drops it.
    eager = not survey.direct and len(survey.packs) <= 1 and _payload_bytes(outgoing) <= _EAGER_MAX_BYTES
    pack_bytes = survey.packs[0][0] if survey.packs else 0
    channel.send_ints([_MAGIC, _VERSION, _OK, survey.fingerprint, len(survey.leaves), len(outgoing.json),
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
        outgoing.packs.release()
        return
    outgoing.packs.release()  # whatever was sent from them has been received (and dropped)
    if status == _MISMATCH:
        import json

        description = _wire.description_bytes(survey.leaves)
        channel.send_ints([len(description)])
        channel.send_bytes(description)
        theirs = json.loads(channel.recv_bytes(extra).decode())
        raise StructureMismatchError(
            f"send to {channel.name}: structure mismatch, nothing was written on the receiver: "
            f"{_wire.difference(_wire.describe(survey.leaves), theirs, 'the sender', 'the receiver')}. Both "
            "sides need the same keys, shapes and dtypes (non-tensor values may differ)."
        )
    reason = channel.recv_bytes(extra).decode(errors="replace")
    raise RuntimeError(f"send to {channel.name}: the receiver refused the TensorDict: {reason}")


def _payload_bytes(outgoing: _Outgoing) -> int:
    return sum(buffer.numel() for buffer in outgoing.buffers)


class _Incoming:
    """The receiver's side: its survey, any reason it can't receive, and where the payload lands."""

    def __init__(self, leaves: list, device: torch.device) -> None:
        self.leaves = leaves
        self.device = device
        self.problem: Optional[BaseException] = None
        self.survey: Optional[_wire.Survey] = None
        try:
            self.survey = _wire.Survey(leaves)
            _raise_if(_wire.expanded_leaf(leaves, self.survey.strided))
        except Exception as error:
            self.problem = error
        self.packs: Optional[_wire.Packs] = None
        self.copy_backs: list = []
        self.json_buffer: Optional[_Tensor] = None
        self.works: list = []

    @property
    def surveyed(self) -> _wire.Survey:
        """The survey; it exists whenever ``problem`` is None, which callers checked."""
        assert self.survey is not None
        return self.survey

    def post(self, channel: _Channel, json_nbytes: int) -> None:
        """Post every receive of the payload: packs, direct leaves (in place when possible), JSON."""
        device, survey = self.device, self.surveyed
        self.packs = _wire.Packs.borrow(survey, device)
        targets = list(self.packs.buffers)
        for index in survey.direct:
            target, copy_back = _wire.recv_target(self.leaves[index][1], device)
            targets.append(target)
            if copy_back is not None:
                self.copy_backs.append(copy_back)
        if json_nbytes:
            self.json_buffer = torch.empty(json_nbytes, dtype=torch.uint8, device=device)
            targets.append(self.json_buffer)
        self.works = [channel.irecv(target) for target in targets]

    def wait(self) -> None:
        for work in self.works:
            work.wait()

    def finish(self) -> None:
        """Write what arrived into the TensorDict (packed leaves, copied-back leaves, non-tensor values)."""
        survey, packs = self.surveyed, self.packs
        assert packs is not None, "finish() runs after post() and wait()"
        packs.drain(survey)
        packs.release()  # only after a complete receive: a late message could still land in a failed one
        for copy_back in self.copy_backs:
            copy_back()
        if survey.non_tensor:
            raw = _wire.tensor_to_bytes(self.json_buffer) if self.json_buffer is not None else b""
            _wire.set_non_tensor(self.leaves, survey.non_tensor, _wire.decode_non_tensor(raw))


def _recv_packed(leaves: list, channel: _Channel, premature: bool) -> Optional[TransferHandle]:
    incoming = _Incoming(leaves, channel.device)
    if premature:
        return TransferHandle(lambda: _exchange_as_receiver(channel, incoming), finish=incoming.finish)
    _exchange_as_receiver(channel, incoming)
    incoming.finish()
    return None


def _exchange_as_receiver(channel: _Channel, incoming: _Incoming) -> None:
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
        message = _failure_text(incoming.problem)
        channel.send_ints([_MAGIC, _FAILED, len(message)])
        for work in dropped:
            work.wait()
        channel.send_bytes(message)
        raise incoming.problem
    if not matches:
        import json

        description = _wire.description_bytes(incoming.leaves)
        channel.send_ints([_MAGIC, _MISMATCH, len(description)])
        for work in dropped:
            work.wait()
        (their_length,) = channel.recv_ints(1)
        theirs = json.loads(channel.recv_bytes(their_length).decode())
        channel.send_bytes(description)
        raise StructureMismatchError(
            f"recv from {channel.name}: structure mismatch, nothing was received and the TensorDict is "
            f"unchanged: {_wire.difference(_wire.describe(incoming.leaves), theirs, 'the receiver', 'the sender')}"
            ". Both sides need the same keys, shapes and dtypes (non-tensor values may differ)."
        )
    channel.send_ints([_MAGIC, _OK, 0])
    if not eager:
        incoming.post(channel, json_nbytes)
    incoming.wait()


def _raise_if(complaint: Optional[str]) -> None:
    if complaint:
        raise RuntimeError(complaint)


# --------------------------------------------------------------------- per-leaf point-to-point
def _tensor_leaves(td: Any) -> list:
    leaves = _wire.walk(td)
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
    _raise_if(_wire.expanded_leaf(leaves, [i for i, leaf in enumerate(leaves) if not leaf[1].is_contiguous()]))
    tags = _tags(init_tag, pseudo_rand, len(leaves))
    works = []
    for (_, value, _, _), tag in zip(leaves, tags):
        channel = _Channel(dist, src, group_src, group, tag, value.device)
        if _wire.writable_in_place(value, value.device):
            works.append(channel.irecv(value.detach()))
        else:
            scratch = torch.empty(value.shape, dtype=value.dtype, device=value.device)
            works.append(TransferHandle(works=[channel.irecv(scratch)], finish=partial(_copy_no_grad, value, scratch)))
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
    leaves = _wire.walk(td)
    tag = _next_pseudo_tag(init_tag) if pseudo_rand else init_tag
    return _Channel(dist, peer, group_peer, group, tag, _comm_device(dist, group, leaves, td)), leaves


def _send(td: Any, dst: Optional[int], group: Any, group_dst: Optional[int], init_tag: int, pseudo_rand: bool,
          per_leaf: bool, consolidated: Optional[bool], early: bool) -> tuple:
    """``(handles, or None once the send has completed; last tag)``."""
    _check_peer(dst, group_dst, group, "dst", "group_dst")
    if _mode(per_leaf, consolidated):
        works, last = _send_per_leaf(td, _dist(), dst, group_dst, group, init_tag, pseudo_rand)
    else:
        channel, leaves = _p2p_channel(td, dst, group_dst, group, init_tag, pseudo_rand)
        handle = _send_packed(leaves, channel, early)
        works, last = ([handle] if handle is not None else []), _last_tag(init_tag, pseudo_rand, len(leaves))
    if early:
        return works, last
    for work in works:
        work.wait()
    return None, last


def _recv(td: Any, src: Optional[int], group: Any, group_src: Optional[int], init_tag: int, pseudo_rand: bool,
          per_leaf: bool, consolidated: Optional[bool], premature: bool) -> tuple:
    """``(handles, or None once the data is in ``td``; last tag)``."""
    _check_peer(src, group_src, group, "src", "group_src")
    if _mode(per_leaf, consolidated):
        works, last = _recv_per_leaf(td, _dist(), src, group_src, group, init_tag, pseudo_rand)
    else:
        channel, leaves = _p2p_channel(td, src, group_src, group, init_tag, pseudo_rand)
        handle = _recv_packed(leaves, channel, premature)
        works, last = ([handle] if handle is not None else []), _last_tag(init_tag, pseudo_rand, len(leaves))
    if premature:
        return works, last
    for work in works:
        work.wait()
    return None, last


# --------------------------------------------------------------------- collectives
def _rank_name(dist: Any, group: Any, group_rank: int) -> str:
    if group is None:
        return f"rank {group_rank}"
    try:
        return f"rank {dist.get_global_rank(group, group_rank)}"
    except Exception:
        return f"group rank {group_rank}"


def _gather_ints(dist: Any, group: Any, values: list, device: torch.device) -> list:
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    gathered = torch.empty(dist.get_world_size(group), len(values), dtype=torch.int64, device=device)
    dist.all_gather(list(gathered.unbind(0)), mine, group=group)
    return gathered.tolist()


def _gather_bytes(dist: Any, group: Any, data: bytes, lengths: list, device: torch.device) -> list:
    """Every rank's ``data`` (of the given per-rank lengths), on every rank."""
    longest = max(lengths)
    if longest == 0:
        return [b""] * len(lengths)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    if data:
        padded[: len(data)] = _wire.bytes_to_tensor(data, device)
    gathered = torch.empty(len(lengths), longest, dtype=torch.uint8, device=device)
    dist.all_gather(list(gathered.unbind(0)), padded, group=group)
    return [_wire.tensor_to_bytes(row[:length]) for row, length in zip(gathered, lengths)]


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
        leaves = _wire.walk(td)
        if tensors_only:
            leaves = [leaf for leaf in leaves if isinstance(leaf[1], _Tensor)]
        self.leaves = leaves
        self.device = _comm_device(self.dist, group, leaves, td)
        self.problem: Optional[BaseException] = None
        self.survey: Optional[_wire.Survey] = None
        try:
            self.survey = _wire.Survey(leaves)
        except Exception as error:
            self.problem = error

    @property
    def surveyed(self) -> _wire.Survey:
        """The survey; it exists whenever ``problem`` is None, which callers checked."""
        assert self.survey is not None
        return self.survey

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
        report = _failure_text(self.problem) if self.problem is not None else _wire.description_bytes(self.leaves)
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
        detail = _wire.difference(_wire.describe(self.leaves), json.loads(reports[other].decode()), "this rank",
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
    if is_src:
        json_bytes = collective.check(lambda: _wire.encode_non_tensor(leaves, collective.surveyed.non_tensor)) or b""
    else:
        json_bytes = b""
        collective.check(lambda: _raise_if(_wire.expanded_leaf(leaves, collective.surveyed.strided)))
    json_nbytes = collective.agree(len(json_bytes), reference)[reference][1]
    survey = collective.surveyed
    packs = _wire.Packs.borrow(survey, device)
    payload = list(packs.buffers)
    copy_backs = []
    if is_src:
        packs.fill(survey)
        payload += [_wire.send_view(leaves[index][1], device) for index in survey.direct]
        if json_nbytes:
            payload.append(_wire.bytes_to_tensor(json_bytes, device))
    else:
        for index in survey.direct:
            target, copy_back = _wire.recv_target(leaves[index][1], device)
            payload.append(target)
            if copy_back is not None:
                copy_backs.append(copy_back)
        if json_nbytes:
            payload.append(torch.empty(json_nbytes, dtype=torch.uint8, device=device))
    for work in [dist.broadcast(buffer, src=src, group=group, async_op=True) for buffer in payload]:
        work.wait()
    if not is_src:
        packs.drain(survey)
        for copy_back in copy_backs:
            copy_back()
        if json_nbytes:
            _wire.set_non_tensor(leaves, survey.non_tensor, _wire.decode_non_tensor(_wire.tensor_to_bytes(payload[-1])))
    packs.release()
    return td


def _all_reduce(td: Any, op: Any, group: Any, async_op: bool) -> Optional[List[TransferHandle]]:
    collective = _Collective(td, group, "all_reduce", tensors_only=True)
    dist, device, leaves = collective.dist, collective.device, collective.leaves
    collective.check(lambda: _raise_if(_wire.expanded_leaf(leaves, collective.surveyed.strided)))
    collective.agree(0, 0)
    if op is None:
        op = dist.ReduceOp.SUM
    survey = collective.surveyed
    # Small leaves: one reduction per dtype group, on the group's slice of the pack.
    packs = _wire.Packs.borrow(survey, device)
    packs.fill(survey)
    works = [dist.all_reduce(packs.typed(index, group_layout), op=op, group=group, async_op=True)
             for index, (_, groups) in enumerate(survey.packs) for group_layout in groups]
    copy_backs = []
    for index in survey.direct:  # large leaves: reduced in place
        value = leaves[index][1]
        if _wire.writable_in_place(value, device):
            works.append(dist.all_reduce(value.detach(), op=op, group=group, async_op=True))
        else:
            scratch = value.detach().to(device).contiguous()
            works.append(dist.all_reduce(scratch, op=op, group=group, async_op=True))
            copy_backs.append(partial(_copy_no_grad, value, scratch))

    def finish() -> None:
        packs.drain(survey)
        packs.release()
        for copy_back in copy_backs:
            copy_back()

    handle = TransferHandle(works=works, finish=finish)
    if async_op:
        return [handle]
    handle.wait()
    return None


def _all_gather(td: Any, group: Any) -> Any:
    collective = _Collective(td, group, "all_gather")
    dist, device, leaves = collective.dist, collective.device, collective.leaves
    json_bytes = collective.check(lambda: _wire.encode_non_tensor(leaves, collective.surveyed.non_tensor)) or b""
    rows = collective.agree(len(json_bytes), 0)
    survey = collective.surveyed
    world = len(rows)
    results: dict = {}
    pending = []
    packs = _wire.Packs.borrow(survey, device)
    packs.fill(survey)
    gathered_packs = []
    for (total, groups), local in zip(survey.packs, packs.buffers):
        gathered = torch.empty(world, total, dtype=torch.uint8, device=device)
        pending.append(dist.all_gather(list(gathered.unbind(0)), local, group=group, async_op=True))
        gathered_packs.append((groups, gathered))
    for index in survey.direct:
        value = leaves[index][1]
        stacked = torch.empty((world, *value.shape), dtype=value.dtype, device=device)
        rows_as_bytes = [row.view(-1).view(torch.uint8) for row in stacked.unbind(0)]
        pending.append(dist.all_gather(rows_as_bytes, _wire.send_view(value, device), group=group, async_op=True))
        results[index] = stacked
    for work in pending:
        work.wait()
    packs.release()
    for groups, gathered in gathered_packs:
        for dtype, indices, offset, nbytes in groups:
            typed = gathered[:, offset:offset + nbytes].view(dtype)
            start = 0
            for index in indices:
                value = leaves[index][1]
                numel = value.numel()
                results[index] = typed[:, start:start + numel].reshape(world, *value.shape)
                start += numel
    if survey.non_tensor:
        per_rank = [_wire.decode_non_tensor(raw)
                    for raw in _gather_bytes(dist, group, json_bytes, [row[1] for row in rows], device)]
        for position, index in enumerate(survey.non_tensor):
            like = leaves[index][1]
            items = [_wire.non_tensor_leaf(rank_items[position], like) for rank_items in per_rank]
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

            >>> td = TensorDict(a=torch.ones(3), b={"c": torch.ones(3, 2)}, batch_size=[3])  # doctest: +SKIP
            >>> td.send(dst=1)            # on rank 0                                        # doctest: +SKIP
        """
        _send(self, dst, group, group_dst, init_tag, pseudo_rand, per_leaf, consolidated, early=False)

    def recv(self, src: Optional[int] = None, *, group: Any = None, group_src: Optional[int] = None,
             init_tag: int = 0, pseudo_rand: bool = False, per_leaf: bool = False,
             consolidated: Optional[bool] = None) -> int:
        """Receive what rank ``src`` sends, writing it into this TensorDict's leaves in place.

        Returns the last tag of the range the transfer reserves, ``init_tag + n_leaves - 1``
        (upstream's return value; with ``pseudo_rand`` the last tag of the chain).
        Raises :class:`StructureMismatchError` (on both sides) when the structures differ,
        leaving this TensorDict unchanged.

        Example (two processes in a gloo group)::

            >>> td = TensorDict(a=torch.zeros(3), b={"c": torch.zeros(3, 2)}, batch_size=[3])  # doctest: +SKIP
            >>> td.recv(src=0)            # on rank 1                                         # doctest: +SKIP
            1
        """
        return _recv(self, src, group, group_src, init_tag, pseudo_rand, per_leaf, consolidated, premature=False)[1]

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
        handles, last = _send(self, dst, group, group_dst, init_tag, pseudo_rand, per_leaf, consolidated,
                              early=return_early)
        return handles if return_early else last

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
        handles, _ = _recv(self, src, group, group_src, init_tag, pseudo_rand, per_leaf, consolidated,
                           premature=return_premature)
        return handles

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
            >>> td.all_reduce()                                                  # doctest: +SKIP
            >>> td["g"]                                                          # doctest: +SKIP
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
