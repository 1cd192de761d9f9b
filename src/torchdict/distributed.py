"""send / recv / isend / irecv and collectives of a whole TensorDict over ``torch.distributed``.

:class:`DistributedMixin` gives TensorDict the public methods; the work is done in
private modules, one concern each:

- :mod:`torchdict._point_to_point`: send / recv with one peer. By default the
  checked, *packed* protocol: a header with the structure fingerprint, an ack, then
  the payload (small leaves packed into one buffer, large ones straight from / into
  their memory, non-tensor values as JSON). A structure mismatch raises
  :class:`StructureMismatchError` on both sides and writes nothing;
- :mod:`torchdict._per_leaf`: ``per_leaf=True``, upstream tensordict's protocol
  (one message per tensor leaf on tags ``init_tag, init_tag + 1, ...``), and the
  tag numbering both modes report;
- :mod:`torchdict._collectives`: broadcast / all_reduce / all_gather, which agree on
  the structure across every rank before moving the same packed buffers;
- :mod:`torchdict._wire`: the wire format (survey, fingerprint, packs, payloads);
- :mod:`torchdict._transfer`: what they all share (:class:`TransferHandle`, the
  process-group plumbing, the channel to one peer).

``torch.distributed``, ``json``, ``hashlib`` and ``threading`` are imported lazily.
"""
from __future__ import annotations

from typing import Any, Optional

from ._collectives import all_gather, all_reduce, broadcast
# The tag chain keeps its former names here: tests/test_distributed.py reads them from this module.
from ._per_leaf import last_tag as _last_tag, next_pseudo_tag as _next_pseudo_tag, tags as _tags  # noqa: F401
from ._point_to_point import point_to_point
from ._transfer import StructureMismatchError, TransferHandle

__all__ = ["DistributedMixin", "StructureMismatchError", "TransferHandle"]


class DistributedMixin:
    """send / recv / isend / irecv and collectives of the whole TensorDict.

    Default mode: one packed exchange per TensorDict, its structure checked first on
    both sides (see :mod:`torchdict._point_to_point`). ``per_leaf=True``: upstream
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
        point_to_point(self, dst, group, group_dst, init_tag, pseudo_rand, per_leaf, consolidated,
                       sending=True, at_once=False)

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
        return point_to_point(self, src, group, group_src, init_tag, pseudo_rand, per_leaf, consolidated,
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
        handles, last = point_to_point(self, dst, group, group_dst, init_tag, pseudo_rand, per_leaf,
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
        handles, _ = point_to_point(self, src, group, group_src, init_tag, pseudo_rand, per_leaf,
                                    consolidated, sending=False, at_once=return_premature)
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
        return broadcast(self, src, group)

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
        return all_reduce(self, op, group, async_op)

    def all_gather(self, *, group: Any = None) -> Any:
        """Every rank's TensorDict, stacked: a new TensorDict of batch ``[world_size, *batch_size]``.

        Every rank calls it with the same structure (checked first). Item ``i`` of the
        result is rank ``i``'s TensorDict (use ``result[i]`` or ``result.unbind(0)`` for a
        list); non-tensor values become a stack of every rank's value.

        Example (every rank, two ranks)::

            >>> TensorDict(r=torch.tensor(rank)).all_gather()["r"]  # doctest: +SKIP
            tensor([0, 1])
        """
        return all_gather(self, group)
