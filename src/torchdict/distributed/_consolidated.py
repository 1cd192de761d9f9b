"""``send`` / ``recv`` / ``isend`` / ``irecv`` with ``consolidated=True``: upstream tensordict's one-buffer protocol.

The sender's consolidated storage (every tensor leaf as a view of one byte buffer, see
:mod:`torchdict._consolidate`) travels as a single message on tag 0; the receiver's consolidated
storage takes it in place, which updates all its leaves at once. Nothing else is exchanged: no
header, no structure check, no non-tensor values (``init_tag`` and ``pseudo_rand`` are ignored).
Both sides must hold the same layout, e.g. the receiver made by ``from_remote_init`` or by
``consolidate(metadata=True)`` on a TensorDict of the same structure. The layout is upstream's, so
either side may be upstream tensordict.

A sender that is not consolidated is consolidated for the call (one copy of every leaf); a receiver
that is not consolidated raises ``AttributeError`` before anything is received, as upstream.
"""
from __future__ import annotations

from typing import Any, Optional

from ._transfer import Channel, dist

__all__ = ["consolidated_transfer"]


def _storage_to_send(td: Any) -> Any:
    from .._apply import unwrap

    source = td if td.is_consolidated() else td.consolidate(metadata=True)
    return unwrap(source)._consolidated["storage"]


def _storage_to_fill(td: Any) -> Any:
    from .._apply import unwrap

    record = getattr(unwrap(td), "_consolidated", None)
    if record is None or not td.is_consolidated():
        raise AttributeError(
            f"recv(consolidated=True) receives into the consolidated storage of the {type(td).__name__}, and this "
            "one is not consolidated: call consolidate(metadata=True) on a TensorDict of the sender's structure "
            "first (or receive the first one with from_remote_init)."
        )
    return record["storage"]


def consolidated_transfer(td: Any, peer: Optional[int], group: Any, group_peer: Optional[int], *, sending: bool,
                          at_once: bool) -> tuple:
    """``(handles, or None once done; None)``: the one-message exchange of the consolidated storage."""
    storage = _storage_to_send(td) if sending else _storage_to_fill(td)
    channel = Channel(dist(), peer, group_peer, group, 0, storage.device)
    work = channel.isend(storage) if sending else channel.irecv(storage)
    if at_once:
        return [work], None
    work.wait()
    return None, None
