"""broadcast / all_reduce / all_gather of a whole TensorDict.

Every collective first all-gathers each rank's structure fingerprint, plus its JSON
length and a failure flag (:class:`_Collective`), so a structure mismatch or a local
failure raises on every rank instead of leaving the others waiting in a collective
this rank skipped. Then they move the same packed buffers as the point-to-point
protocol (see :mod:`torchdict.distributed._wire`): small leaves in one byte buffer per pack,
large leaves in place, non-tensor values as JSON.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, List, Optional

import torch

from . import _wire
from .._apply import rewrap, unwrap
from .._base import TensorCollection
from ._transfer import (LocalPreparation, StructureMismatchError, TransferHandle, comm_device, copy_no_grad, dist,
                        failure_text)
from ..nontensor import combine_non_tensor

_Tensor = torch.Tensor


# --------------------------------------------------------------------- agreeing first
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


class _Collective(LocalPreparation):
    """What every collective does first: survey the local leaves, then agree with every rank.

    :meth:`agree` all-gathers ``[fingerprint, payload length, failed]``; if a rank
    failed (or its structure differs from the ``reference`` rank's), the reasons (or
    structure descriptions) are all-gathered too and every rank raises: nobody is
    left waiting in a collective the others skipped.
    """

    def __init__(self, td: Any, group: Any, op_name: str, tensors_only: bool = False) -> None:
        self.dist = dist()
        self.group = group
        self.op_name = op_name
        leaves = _wire.walk(td)
        if tensors_only:
            leaves = [leaf for leaf in leaves if isinstance(leaf[1], _Tensor)]
        self.device = comm_device(self.dist, group, leaves, td)
        super().__init__(leaves)

    def agree(self, payload_len: int, reference: int, extra: int = 0) -> list:
        """Every rank's ``[fingerprint, payload length, failed, extra]``; raises on every rank unless all agree.
        (``extra``: one more number a collective needs from every rank, for free in the same exchange.)"""
        dist, group = self.dist, self.group
        fingerprint = self.survey.fingerprint if self.survey is not None else 0
        rows = _gather_ints(dist, group, [fingerprint, payload_len, int(self.problem is not None), extra],
                            self.device)
        failed = [rank for rank, row in enumerate(rows) if row[2]]
        differing = [rank for rank, row in enumerate(rows) if row[0] != rows[reference][0]]
        if not failed and not differing:
            return rows
        report = failure_text(self.problem) if self.problem is not None else _wire.description_bytes(self.leaves)
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

    def encode_non_tensor(self) -> bytes:
        """The JSON of the non-tensor values (``b""`` if there are none or a step failed; see ``problem``)."""
        return self.check(lambda: _wire.encode_non_tensor(self.leaves, self.surveyed.non_tensor)) or b""


# --------------------------------------------------------------------- the collectives
def broadcast(td: Any, src: int, group: Any, result_device: Any = None, tensorclass_type: Optional[str] = None) -> Any:
    """Rank ``src``'s values written into ``td`` on every rank of ``group``; returns ``td`` (on
    ``result_device``: ``td.to(result_device)`` when it is elsewhere), as an instance of rank ``src``'s
    ``tensorclass_type`` on the other ranks."""
    collective = _Collective(td, group, "broadcast")
    dist, device = collective.dist, collective.device
    is_src = dist.get_rank() == src
    reference = src if group is None else dist.get_group_rank(group, src)
    type_name = (tensorclass_type or "").encode() if is_src else b""
    if is_src:
        json_bytes = collective.encode_non_tensor()
    else:
        json_bytes = b""
        collective.check_writable()
    json_nbytes, type_nbytes = collective.agree(len(json_bytes), reference, len(type_name))[reference][1::2]
    survey = collective.surveyed
    outgoing: Optional[_wire.OutgoingPayload] = None
    incoming: Optional[_wire.IncomingPayload] = None
    if is_src:
        outgoing = _wire.OutgoingPayload(survey, json_bytes, device)
        payload = outgoing.buffers
    else:
        incoming = _wire.IncomingPayload(survey, json_nbytes, device)
        payload = incoming.targets
    for work in [dist.broadcast(buffer, src=src, group=group, async_op=True) for buffer in payload]:
        work.wait()
    if outgoing is not None:
        outgoing.release()
    if incoming is not None:
        incoming.unpack()
    result = td
    if result_device is not None and _off_device(td, torch.device(result_device)):
        result = td.to(result_device)
    if type_nbytes:  # rank src named a tensorclass: one more broadcast, of its name
        name = _broadcast_text(dist, group, src, type_name, type_nbytes, device)
        if not is_src:
            result = _as_tensorclass(result, name)
    return result


def _off_device(td: Any, device: torch.device) -> bool:
    """True when ``td`` (its device, or any tensor leaf) is not on ``device``."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if td.device is not None and td.device != device:
        return True
    return any(isinstance(leaf, _Tensor) and leaf.device != device for leaf in td.values(True, True))


def _broadcast_text(dist: Any, group: Any, src: int, text: bytes, nbytes: int, device: torch.device) -> str:
    buffer = _wire.bytes_to_tensor(text, device) if text else torch.empty(nbytes, dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=src, group=group)
    return _wire.tensor_to_bytes(buffer).decode()


def _as_tensorclass(td: Any, name: str) -> Any:
    """``td`` as an instance of the tensorclass ``module.QualName`` (already imported here: nothing is
    imported because another rank named it)."""
    from ..tensorclass import is_tensorclass
    from ._remote import _importable

    cls = _importable(name)
    if cls is None or not is_tensorclass(cls):
        raise ImportError(f"broadcast: rank src sent a {name!r} tensorclass, which is not an imported tensorclass "
                          "in this process (import its module first).")
    return td if isinstance(td, cls) else cls.from_tensordict(unwrap(td))


def all_reduce(td: Any, op: Any, group: Any, async_op: bool,
               bucket_bytes: Optional[int] = None) -> Optional[List[TransferHandle]]:
    """Every tensor leaf of ``td`` reduced across ``group`` in place; ``[handle]`` with ``async_op`` (one
    handle per bucket with ``bucket_bytes``, see :mod:`._buckets`)."""
    collective = _Collective(td, group, "all_reduce", tensors_only=True)
    dist, device, leaves = collective.dist, collective.device, collective.leaves
    collective.check_writable()
    if bucket_bytes is not None:
        from ._buckets import plan_buckets

        collective.check(lambda: plan_buckets([], bucket_bytes))  # a bad value: every rank raises in agree()
    collective.agree(0, 0)
    if op is None:
        op = dist.ReduceOp.SUM
    if bucket_bytes is not None:
        from ._buckets import run_bucketed, wait_all

        handles = run_bucketed([leaf[1] for leaf in leaves], bucket_bytes,
                               lambda flat: dist.all_reduce(flat, op=op, group=group, async_op=True), device,
                               copy_back=True)
        if async_op:
            return handles
        wait_all(handles)
        return None
    survey = collective.surveyed
    # Small leaves: one reduction per dtype group, on the group's slice of the pack.
    packs = _wire.Packs.filled(survey, device)
    works = [dist.all_reduce(packs.typed(index, group_layout), op=op, group=group, async_op=True)
             for index, (_, groups) in enumerate(survey.packs) for group_layout in groups]
    copy_backs: List[Callable[[], None]] = []
    for index in survey.direct:  # large leaves: reduced in place
        value = leaves[index][1]
        if _wire.writable_in_place(value, device):
            works.append(dist.all_reduce(value.detach(), op=op, group=group, async_op=True))
        else:
            scratch = value.detach().to(device).contiguous()
            works.append(dist.all_reduce(scratch, op=op, group=group, async_op=True))
            copy_backs.append(partial(copy_no_grad, value, scratch))

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


def all_gather(td: Any, group: Any) -> Any:
    """Every rank's ``td`` stacked along a new leading dim of size ``world_size`` (a new TensorDict)."""
    collective = _Collective(td, group, "all_gather")
    dist, device, leaves = collective.dist, collective.device, collective.leaves
    json_bytes = collective.encode_non_tensor()
    rows = collective.agree(len(json_bytes), 0)
    survey = collective.surveyed
    world = len(rows)
    results: dict = {}
    pending = []
    packs = _wire.Packs.filled(survey, device)
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
