"""``bucket_bytes=`` of ``all_reduce`` and ``reduce``: tensor leaves packed into flat buckets, one collective
per bucket instead of one per leaf.

The leaves of one device and dtype are laid end to end, in the order given, into buckets of at most
``bucket_bytes`` bytes (the bucket is closed before a leaf that would overflow it, so a leaf larger than
``bucket_bytes`` is a bucket of its own); a non-contiguous or non-strided leaf is always alone, reduced
on its own. These are upstream's buckets, so ``async_op=True`` returns as many handles as upstream
returns works. Every rank must pass leaves of the same shapes and dtypes in the same order (the callers
take them in sorted-key order, after checking the structure where they can).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, List, Optional, Sequence

import torch

from ._transfer import TransferHandle
from ._wire import writable_in_place

_Tensor = torch.Tensor


def plan_buckets(leaves: Sequence[_Tensor], bucket_bytes: int) -> List[List[_Tensor]]:
    """The buckets of ``leaves`` (see the module docstring); ``ValueError`` unless ``bucket_bytes > 0``."""
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be a positive number of bytes, got {bucket_bytes!r}.")
    alone: List[List[_Tensor]] = []
    by_kind: dict = {}
    for leaf in leaves:
        if leaf.layout != torch.strided or not leaf.is_contiguous():
            alone.append([leaf])  # packing would copy it, and copying back into an expanded leaf fails
        else:
            by_kind.setdefault((leaf.device, leaf.dtype), []).append(leaf)
    buckets = alone
    for kind_leaves in by_kind.values():
        bucket: List[_Tensor] = []
        size = 0
        for leaf in kind_leaves:
            nbytes = leaf.numel() * leaf.element_size()
            if bucket and size + nbytes > bucket_bytes:
                buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(leaf)
            size += nbytes
        buckets.append(bucket)
    return buckets


def run_bucketed(leaves: Sequence[_Tensor], bucket_bytes: int, collective: Callable[[_Tensor], Any],
                 device: torch.device, copy_back: bool) -> List[TransferHandle]:
    """``collective(flat)`` (asynchronous: it returns a ``Work``) on every bucket of ``leaves``; one handle per
    bucket, whose ``wait()`` waits for it and, with ``copy_back``, writes the result into the leaves.

    ``flat`` is the leaf itself for a bucket of one leaf that lives on ``device`` and is contiguous; else a
    copy on ``device`` (the flattened leaves end to end).
    """
    handles = []
    for bucket in plan_buckets(leaves, bucket_bytes):
        if len(bucket) == 1 and writable_in_place(bucket[0], device):
            flat = bucket[0].detach()
            finish: Optional[Callable[[], None]] = None
        else:
            with torch.no_grad():
                flat = torch.cat([leaf.detach().reshape(-1).to(device) for leaf in bucket])
            finish = partial(_copy_into, flat, bucket) if copy_back else None
        handles.append(TransferHandle(works=[collective(flat)], finish=finish))
    return handles


def _copy_into(flat: _Tensor, leaves: List[_Tensor]) -> None:
    # no_grad: a leaf may require grad (a parameter whose gradients are being averaged).
    with torch.no_grad():
        for leaf, chunk in zip(leaves, flat.split([leaf.numel() for leaf in leaves])):
            leaf.copy_(chunk.view(leaf.shape))


def wait_all(handles: Sequence[TransferHandle]) -> None:
    """Wait for every handle, then raise the first error: stopping at the first one would leave later
    collectives still writing into the leaves."""
    error: Optional[BaseException] = None
    for handle in handles:
        try:
            handle.wait()
        except Exception as caught:  # noqa: BLE001 - re-raised below, after every wait
            error = error or caught
    if error is not None:
        raise error
