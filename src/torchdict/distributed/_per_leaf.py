"""Upstream tensordict's point-to-point protocol (``per_leaf=True``), and its tag numbering.

One message per tensor leaf, in sorted-key order (recursing into sub-TensorDicts),
on tags ``init_tag, init_tag + 1, ...`` (or upstream's pseudo-random chain with
``pseudo_rand``). There is no structure check and no non-tensor value: this mode
exists to talk to upstream ``tensordict`` in both directions. The packed mode uses
the tag numbering too, for its one tag and for the "last tag" ``recv`` returns.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Optional

import torch

from . import _wire
from ._transfer import Channel, TransferHandle, copy_no_grad, raise_if

_Tensor = torch.Tensor


# --------------------------------------------------------------------- tags
def next_pseudo_tag(seed: int) -> int:
    """Upstream tensordict's pseudo-random tag chain (needs numpy), so ``pseudo_rand`` tags interoperate."""
    try:
        import numpy
    except ImportError:
        raise ImportError("pseudo_rand=True needs numpy (the tags follow upstream tensordict's generator).") from None
    return int.from_bytes(numpy.random.default_rng(seed).bytes(8), "big") % 10_000


def tags(init_tag: int, pseudo_rand: bool, count: int) -> list:
    """The tags of ``count`` leaves, in order.

    Example::

        >>> tags(5, False, 3)
        [5, 6, 7]
    """
    chain = []
    tag = init_tag - 1
    for _ in range(count):
        tag = next_pseudo_tag(tag + 1) if pseudo_rand else tag + 1
        chain.append(tag)
    return chain


def last_tag(init_tag: int, pseudo_rand: bool, count: int) -> int:
    """The last of ``tags(init_tag, pseudo_rand, count)`` (``init_tag - 1`` for no leaf): what ``recv`` returns.

    Example::

        >>> last_tag(5, False, 3), last_tag(5, False, 0)
        (7, 4)
    """
    if not pseudo_rand:
        return init_tag + count - 1
    chain = tags(init_tag, True, count)
    return chain[-1] if chain else init_tag - 1


# --------------------------------------------------------------------- transfers
def _tensor_leaves(td: Any) -> list:
    leaves = _wire.walk(td)
    for _, value, _, _ in leaves:
        if not isinstance(value, _Tensor):
            raise NotImplementedError(
                f"Type {type(value)} is not supported. Non-tensor values travel only in the default packed "
                "mode (per_leaf=False)."
            )
    return leaves


def _leaf_channels(leaves: list, dist: Any, peer: Optional[int], group_peer: Optional[int], group: Any,
                   init_tag: int, pseudo_rand: bool) -> tuple:
    """``([(leaf, its channel), ...], last tag)``: each leaf on its own tag, on its own device."""
    chain = tags(init_tag, pseudo_rand, len(leaves))
    pairs = [(value, Channel(dist, peer, group_peer, group, tag, value.device))
             for (_, value, _, _), tag in zip(leaves, chain)]
    return pairs, chain[-1] if chain else init_tag - 1


def send_per_leaf(td: Any, dist: Any, dst: Optional[int], group_dst: Optional[int], group: Any,
                  init_tag: int, pseudo_rand: bool) -> tuple:
    """Post one isend per tensor leaf; returns ``(works, last tag)``."""
    pairs, last = _leaf_channels(_tensor_leaves(td), dist, dst, group_dst, group, init_tag, pseudo_rand)
    works = []
    for value, channel in pairs:
        payload = value.detach()
        if payload.is_conj() or payload.is_neg():
            payload = payload.resolve_conj().resolve_neg()
        works.append(channel.isend(payload.contiguous()))
    return works, last


def recv_per_leaf(td: Any, dist: Any, src: Optional[int], group_src: Optional[int], group: Any,
                  init_tag: int, pseudo_rand: bool) -> tuple:
    """Post one irecv per tensor leaf (into the leaf when it is contiguous); returns ``(works, last tag)``."""
    leaves = _tensor_leaves(td)
    raise_if(_wire.expanded_leaf(leaves, [i for i, leaf in enumerate(leaves) if not leaf[1].is_contiguous()]))
    pairs, last = _leaf_channels(leaves, dist, src, group_src, group, init_tag, pseudo_rand)
    works = []
    for value, channel in pairs:
        if _wire.writable_in_place(value, value.device):
            works.append(channel.irecv(value.detach()))
        else:
            scratch = torch.empty(value.shape, dtype=value.dtype, device=value.device)
            works.append(TransferHandle(works=[channel.irecv(scratch)], finish=partial(copy_no_grad, value, scratch)))
    return works, last
