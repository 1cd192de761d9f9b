"""send / recv / isend / irecv and collectives of a whole TensorDict over ``torch.distributed``.

:class:`DistributedMixin` gives TensorDict the public methods; the work is done in
private modules, one concern each:

- :mod:`torchdict.distributed._point_to_point`: send / recv with one peer. By default the
  checked, *packed* protocol: a header with the structure fingerprint, an ack, then
  the payload (small leaves packed into one buffer, large ones straight from / into
  their memory, non-tensor values as JSON). A structure mismatch raises
  :class:`StructureMismatchError` on both sides and writes nothing;
- :mod:`torchdict.distributed._per_leaf`: ``per_leaf=True``, upstream tensordict's protocol
  (one message per tensor leaf on tags ``init_tag, init_tag + 1, ...``), and the
  tag numbering both modes report;
- :mod:`torchdict.distributed._collectives`: broadcast / all_reduce / all_gather, which agree on
  the structure across every rank before moving the same packed buffers;
- :mod:`torchdict.distributed._wire`: the wire format (survey, fingerprint, packs, payloads);
- :mod:`torchdict.distributed._transfer`: what they all share (:class:`TransferHandle`, the
  process-group plumbing, the channel to one peer).

``torch.distributed``, ``json``, ``hashlib`` and ``threading`` are imported lazily.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

# The tag chain keeps its former names here: tests/test_distributed.py reads them from this module.
import importlib

if TYPE_CHECKING:
    from .._host import TensorDictHost
else:
    TensorDictHost = object

# The implementation modules are imported on first use: a program that never sends a TensorDict doesn't
# pay for them in ``import torchdict`` (their objects count towards a full collection of torch's heap).
_DEFINED_IN = {
    "StructureMismatchError": "_transfer", "TransferHandle": "_transfer",
    "_last_tag": ("_per_leaf", "last_tag"), "_next_pseudo_tag": ("_per_leaf", "next_pseudo_tag"),
    "_tags": ("_per_leaf", "tags"),
}


def __getattr__(name: str) -> Any:
    where = _DEFINED_IN.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = (where, name) if isinstance(where, str) else where
    return getattr(importlib.import_module(f"torchdict.distributed.{module_name}"), attribute)


def _transfer_with_peer(*args: Any, **kwargs: Any) -> Any:
    from ._point_to_point import point_to_point

    return point_to_point(*args, **kwargs)

__all__ = ["DistributedMixin", "StructureMismatchError", "TransferHandle"]


class DistributedMixin(TensorDictHost):
    """send / recv / isend / irecv and collectives of the whole TensorDict.

    Default mode: one packed exchange per TensorDict, its structure checked first on
    both sides (see :mod:`torchdict.distributed._point_to_point`). ``per_leaf=True``: upstream
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
        in sorted-key order, as upstream tensordict does. ``consolidated=True`` sends the
        consolidated storage as one message (upstream's protocol; the receiver calls
        ``recv(consolidated=True)`` on a consolidated TensorDict of the same layout; see
        docs/distributed.md). ``group_dst`` names the receiver by its rank inside ``group``.

        Example (two processes in a gloo group)::

            >>> td = TensorDict(a=torch.ones(3), b={"c": torch.ones(3, 2)}, batch_size=[3])  # doctest: +SKIP
            >>> td.send(dst=1)            # on rank 0                                        # doctest: +SKIP
        """
        _transfer_with_peer(self, dst, group, group_dst, init_tag, pseudo_rand, per_leaf, consolidated,
                       sending=True, at_once=False)

    def recv(self, src: Optional[int] = None, *, group: Any = None, group_src: Optional[int] = None,
             init_tag: int = 0, pseudo_rand: bool = False, per_leaf: bool = False,
             consolidated: Optional[bool] = None) -> int:
        """Receive what rank ``src`` sends, writing it into this TensorDict's leaves in place.

        Returns the last tag of the range the transfer reserves, ``init_tag + n_leaves - 1``
        (upstream's return value; with ``pseudo_rand`` the last tag of the chain), or None with
        ``consolidated=True``, which receives one message into this TensorDict's consolidated storage.
        Raises :class:`StructureMismatchError` (on both sides) when the structures differ,
        leaving this TensorDict unchanged.

        Example (two processes in a gloo group)::

            >>> td = TensorDict(a=torch.zeros(3), b={"c": torch.zeros(3, 2)}, batch_size=[3])  # doctest: +SKIP
            >>> td.recv(src=0)            # on rank 1                                         # doctest: +SKIP
            1
        """
        return _transfer_with_peer(self, src, group, group_src, init_tag, pseudo_rand, per_leaf, consolidated,
                              sending=False, at_once=False)[1]

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
        handles, last = _transfer_with_peer(self, dst, group, group_dst, init_tag, pseudo_rand, per_leaf,
                                       consolidated, sending=True, at_once=return_early)
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
        handles, _ = _transfer_with_peer(self, src, group, group_src, init_tag, pseudo_rand, per_leaf,
                                    consolidated, sending=False, at_once=return_premature)
        return handles

    def broadcast(self, src: int, *, group: Any = None, device: Any = None,
                  _tensorclass_type: Optional[str] = None) -> Any:
        """Copy rank ``src``'s values into this TensorDict on every rank of ``group``, in place; returns self.

        Every rank calls it with a TensorDict of the same structure (checked first: a
        mismatch raises :class:`StructureMismatchError` on every rank). Non-tensor
        values are broadcast too. ``device`` (as upstream's): the device of the result on
        every rank: this TensorDict when it is there already, else a copy moved there
        (the values are written into this TensorDict either way). ``_tensorclass_type``
        (``"module.QualName"``, read on rank ``src``, as upstream's tensorclasses pass it):
        the other ranks return the result as an instance of that tensorclass, whose module
        they must have imported (nothing is imported on a remote rank's word).

        Example (every rank)::

            >>> td = TensorDict(w=torch.full((3,), float(rank)), batch_size=[3])  # doctest: +SKIP
            >>> td.broadcast(src=0)["w"]                                           # doctest: +SKIP
            tensor([0., 0., 0.])
        """
        from ._collectives import broadcast

        return broadcast(self, src, group, device, _tensorclass_type)

    def all_reduce(self, op: Any = None, *, group: Any = None, async_op: bool = False,
                   bucket_bytes: Optional[int] = None) -> Any:
        """Reduce every tensor leaf across ``group`` in place (``op`` defaults to ``ReduceOp.SUM``).

        Small leaves are reduced in one buffer per dtype; large ones in place. Non-tensor
        leaves are left as they are. With ``async_op=True`` returns ``[handle]``; its
        ``wait()`` writes the results back. ``bucket_bytes`` (as upstream's): the leaves of
        each device and dtype go in flat buckets of at most that many bytes (a larger or
        non-contiguous leaf is a bucket of its own), one reduction per bucket; ``async_op``
        then returns one handle per bucket.

        Example (every rank, two ranks)::

            >>> td = TensorDict(g=torch.ones(2) * (rank + 1), batch_size=[2])  # doctest: +SKIP
            >>> td.all_reduce()                                                  # doctest: +SKIP
            >>> td["g"]                                                          # doctest: +SKIP
            tensor([3., 3.])
        """
        from ._collectives import all_reduce

        return all_reduce(self, op, group, async_op, bucket_bytes)

    def reduce(self, dst: int, op: Any = None, async_op: bool = False, return_premature: bool = False,
               group: Any = None, *, bucket_bytes: Optional[int] = None) -> Any:
        """``torch.distributed.reduce`` of every tensor leaf into rank ``dst``, in place (``op``: SUM by
        default); the other ranks' values are undefined afterwards. ``bucket_bytes`` reduces small leaves in
        flat buckets; ``async_op=True, return_premature=True`` returns the works unwaited (see ``_remote``)."""
        from ._remote import reduce

        return reduce(self, dst, op, async_op, return_premature, group, bucket_bytes)

    def init_remote(self, dst: Optional[int] = None, group: Any = None, device: Any = None,
                    use_broadcast: bool = False, _tensorclass_type: Optional[str] = None) -> None:
        """Send this TensorDict to rank ``dst``, which does not know its structure and calls
        :meth:`from_remote_init`: a JSON skeleton (keys, shapes, dtypes, batch sizes; no pickling) then the
        values. ``use_broadcast=True`` sends it to every rank of ``group``."""
        from ._remote import init_remote

        init_remote(self, dst, group, device, use_broadcast)

    @classmethod
    def from_remote_init(cls, src: int, group: Any = None, device: Any = None, use_broadcast: bool = False) -> Any:
        """The TensorDict rank ``src`` sends with :meth:`init_remote` (a tensorclass comes back as its class when
        that class is already imported here)."""
        from ._remote import from_remote_init

        return from_remote_init(src, group, device, use_broadcast)

    def scatter(self, src: int, tensordicts: Optional[list] = None, *, group: Any = None, device: Any = None) -> Any:
        """Rank ``src`` sends ``tensordicts[r]`` to each rank ``r``; every rank returns the one it receives (this
        TensorDict is not used)."""
        from ._remote import scatter

        return scatter(self, src, tensordicts, group, device)

    def gather_and_stack(self, dst: int, group: Any = None) -> Any:
        """The other ranks' TensorDicts written, in rank order, into the rows of rank ``dst``'s TensorDict (first
        batch dim ``world_size - 1``); returns self on ``dst``, None elsewhere."""
        from ._remote import gather_and_stack

        return gather_and_stack(self, dst, group)

    async def asend(self, dst: Any) -> None:
        """Send through a UCXX pipe (``await dst.asend(self)``)."""
        await dst.asend(self)

    async def arecv(self, src: Any, *, device: Any = None) -> Any:
        """Receive through a UCXX pipe (``await src.arecv(self, device=device)``); use the returned TensorDict."""
        return await src.arecv(self, device=device)

    def all_gather(self, *, group: Any = None) -> Any:
        """Every rank's TensorDict, stacked: a new TensorDict of batch ``[world_size, *batch_size]``.

        Every rank calls it with the same structure (checked first). Item ``i`` of the
        result is rank ``i``'s TensorDict (use ``result[i]`` or ``result.unbind(0)`` for a
        list); non-tensor values become a stack of every rank's value.

        Example (every rank, two ranks)::

            >>> TensorDict(r=torch.tensor(rank)).all_gather()["r"]  # doctest: +SKIP
            tensor([0, 1])
        """
        from ._collectives import all_gather

        return all_gather(self, group)
