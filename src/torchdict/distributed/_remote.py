"""Distributed members beyond send / recv and the collectives of ``distributed.py``: ``init_remote`` /
``from_remote_init`` (a TensorDict sent to a rank that does not know its structure), ``scatter``,
``gather_and_stack``, ``reduce``, and the UCXX-pipe awaiters ``asend`` / ``arecv``.

Where upstream pickles the structure (``send_object_list``), torchdict sends a *skeleton*: a JSON text of
the keys, shapes, dtypes, batch sizes, device and JSON-able non-tensor values, as a uint8 tensor (its length
first), so a receiver never unpickles. The values then travel with the packed, checked ``send`` / ``recv``.
"""
from __future__ import annotations

import json
from typing import Any, List, Optional

import torch

from .._apply import unwrap
from .._base import TensorCollection
from ._transfer import dist

_SKELETON_TAG = 8191  # the tag of the skeleton messages (the values use send / recv's own tags)


# ------------------------------------------------------------------------------------------------ skeletons
def skeleton(td: Any) -> dict:
    """A JSON-able description of ``td``: enough to build an empty TensorDict of the same structure."""
    from ..tensorclass import is_tensorclass

    entries: dict = {}
    for key, value in unwrap(td)._tensordict.items():
        if isinstance(value, torch.Tensor):
            entries[key] = {"tensor": [list(value.shape), str(value.dtype).replace("torch.", ""), str(value.device)]}
        elif getattr(type(value), "_is_non_tensor", False):
            entries[key] = {"non_tensor": [value.tolist(), list(value.batch_size)]}
        elif isinstance(value, TensorCollection):
            entries[key] = {"collection": skeleton(value)}
    description = {"batch_size": list(td.batch_size), "device": None if td.device is None else str(td.device),
                   "entries": entries}
    if is_tensorclass(td):
        description["tensorclass"] = f"{type(td).__module__}.{type(td).__qualname__}"
    return description


def build(description: dict, device: Any = None) -> Any:
    """An uninitialised TensorDict laid out as ``description`` (``device`` overrides the recorded one)."""
    from ..nontensor import NonTensorData, NonTensorStack
    from ..tensordict import TensorDict

    target = device if device is not None else description["device"]
    storage: dict = {}
    for key, entry in description["entries"].items():
        if "tensor" in entry:
            shape, dtype, leaf_device = entry["tensor"]
            storage[key] = torch.empty(shape, dtype=getattr(torch, dtype), device=target or leaf_device)
        elif "non_tensor" in entry:
            values, batch = entry["non_tensor"]
            storage[key] = NonTensorStack.from_nested_list(values) if batch else NonTensorData(values)
        else:
            storage[key] = build(entry["collection"], device)
    td = TensorDict(storage, batch_size=description["batch_size"], device=target)
    name = description.get("tensorclass")
    if name is not None:
        cls = _importable(name)
        if cls is not None:
            return cls.from_tensordict(td)
    return td


def _importable(qualified: str) -> Any:
    """The class at ``module.QualName`` if its module is already imported (nothing is imported or unpickled)."""
    import sys

    module_name, _, name = qualified.rpartition(".")
    while module_name and module_name not in sys.modules:
        module_name, _, outer = module_name.rpartition(".")
        name = f"{outer}.{name}"
    if not module_name:
        return None
    obj: Any = sys.modules[module_name]
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, type) else None


def _encode(description: dict) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(description).encode()), dtype=torch.uint8)


def _send_skeleton(td: Any, dst: int, group: Any, device: Any) -> None:
    payload = _encode(skeleton(td))
    where = torch.device(device) if device is not None else torch.device("cpu")
    dist().send(torch.tensor([payload.numel()], dtype=torch.int64, device=where), dst, group=group, tag=_SKELETON_TAG)
    dist().send(payload.to(where), dst, group=group, tag=_SKELETON_TAG + 1)


def _recv_skeleton(src: int, group: Any, device: Any) -> dict:
    where = torch.device(device) if device is not None else torch.device("cpu")
    length = torch.zeros(1, dtype=torch.int64, device=where)
    dist().recv(length, src, group=group, tag=_SKELETON_TAG)
    payload = torch.empty(int(length.item()), dtype=torch.uint8, device=where)
    dist().recv(payload, src, group=group, tag=_SKELETON_TAG + 1)
    return json.loads(bytes(payload.cpu().tolist()).decode())


def _broadcast_skeleton(td: Any, src: int, group: Any) -> dict:
    is_source = dist().get_rank() == src
    payload = _encode(skeleton(td)) if is_source else None
    length = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
    dist().broadcast(length, src, group=group)
    buffer = payload if payload is not None else torch.empty(int(length.item()), dtype=torch.uint8)
    dist().broadcast(buffer, src, group=group)
    return json.loads(bytes(buffer.tolist()).decode())


# ------------------------------------------------------------------------------------------------ the members
def init_remote(td: Any, dst: Optional[int], group: Any, device: Any, use_broadcast: bool) -> None:
    if use_broadcast:
        src = dist().get_rank()
        _broadcast_skeleton(td, src, group)
        td.broadcast(src, group=group)
        return
    if dst is None:
        raise ValueError("init_remote() needs dst unless use_broadcast=True.")
    _send_skeleton(td, dst, group, device)
    td.send(dst, group=group)


def from_remote_init(src: int, group: Any, device: Any, use_broadcast: bool) -> Any:
    if use_broadcast:
        td = build(_broadcast_skeleton(None, src, group), device)
        td.broadcast(src, group=group)
        return td
    td = build(_recv_skeleton(src, group, None), device)
    td.recv(src, group=group)
    return td


def scatter(td: Any, src: int, tensordicts: Optional[List[Any]], group: Any, device: Any) -> Any:
    """Rank ``src`` sends ``tensordicts[r]`` to each rank ``r``; every rank returns what it receives."""
    rank = dist().get_rank()
    world = dist().get_world_size(group)
    if rank == src:
        if tensordicts is None or len(tensordicts) != world:
            raise ValueError(f"scatter() on the source rank needs one tensordict per rank ({world}), got "
                             f"{None if tensordicts is None else len(tensordicts)}.")
        for other in range(world):
            if other != src:
                init_remote(tensordicts[other], other, group, None, False)
        mine = tensordicts[src]
        return mine.clone() if device is None else mine.to(device)
    return from_remote_init(src, group, device, False)


def gather_and_stack(td: Any, dst: int, group: Any) -> Any:
    """The other ranks' TensorDicts written, in rank order, into the rows of rank ``dst``'s (its first batch dim
    is ``world_size - 1``); ``self`` on ``dst``, ``None`` elsewhere."""
    rank = dist().get_rank()
    world = dist().get_world_size(group)
    if rank != dst:
        td.send(dst, group=group)
        return None
    if not td.batch_size or td.batch_size[0] != world - 1:
        raise RuntimeError(f"gather_and_stack: on rank dst, the first batch dim must be world_size - 1 = {world - 1}, "
                           f"got batch_size={td.batch_size}.")
    row = 0
    for other in range(world):
        if other == dst:
            continue
        td[row].recv(other, group=group)
        row += 1
    return td


def reduce(td: Any, dst: int, op: Any, async_op: bool, return_premature: bool, group: Any,
           bucket_bytes: Optional[int]) -> Any:
    """``torch.distributed.reduce`` of every tensor leaf into rank ``dst`` (in place; ``op`` defaults to SUM).

    ``bucket_bytes`` packs the leaves of one dtype and device into flat buckets of at most that many bytes
    (one reduction each; a larger leaf is a bucket of its own, see :mod:`._buckets`), copied back into the
    leaves on ``dst``. With ``async_op=True, return_premature=True``: the ``Work`` of every leaf, or with
    ``bucket_bytes`` one handle per bucket, whose ``wait()`` also copies the result back on ``dst``.
    """
    distributed = dist()
    op = distributed.ReduceOp.SUM if op is None else op
    leaves = [leaf for leaf in _sorted_leaves(td) if isinstance(leaf, torch.Tensor)]
    if bucket_bytes is not None:
        from ._buckets import run_bucketed, wait_all
        from ._transfer import comm_device

        device = comm_device(distributed, group, [(None, leaf, None, None) for leaf in leaves], unwrap(td))
        handles = run_bucketed(leaves, bucket_bytes,
                               lambda flat: distributed.reduce(flat, dst, op=op, group=group, async_op=True), device,
                               copy_back=distributed.get_rank() == dst)
        if async_op and return_premature:
            return handles
        wait_all(handles)
        return None
    works = [distributed.reduce(leaf, dst, op=op, group=group, async_op=async_op) for leaf in leaves]
    if async_op and return_premature:
        return works
    if async_op:
        for work in works:
            work.wait()
    return None


def _sorted_leaves(td: Any) -> list:
    """The leaves in sorted-key order at every level (upstream's order for reduce: every rank issues the
    same collectives whatever order its keys were set in)."""
    leaves: list = []
    for key in sorted(td.keys()):
        value = td.get(key)
        if isinstance(value, TensorCollection):
            leaves.extend(_sorted_leaves(value))
        else:
            leaves.append(value)
    return leaves
