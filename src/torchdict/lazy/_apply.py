"""``apply`` and its relatives on a lazy stack, member by member, as upstream tensordict 0.15.3 does.

Each member runs its own ``apply`` (``named_apply``, ``empty``, ``clone``, ``data``, ``grad``, ...)
with the other collections split along the stack dim, and the results are stacked lazily again, so
ragged leaves and exclusive keys are fine. With ``batch_size=`` the result is a new dense
TensorDict (the function changes the batch), computed on the dense stack as upstream.

In place (``apply_``, ``apply(..., inplace=True)``), every member's results are computed first and
written only when all of them succeeded, so a failing function changes nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional

import torch

from .._base import TensorCollection

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object

_NO: Any = object()  # "argument not given" (None is a value for several options)


class LazyApplyMixin(LazyHost):
    """The class using it provides ``tensordicts``, ``stack_dim``, ``batch_size``, ``contiguous``,
    ``is_locked`` and ``_restack``."""

    __slots__ = ()

    # ------------------------------------------------------------------ helpers
    def _split_others(self, others: tuple) -> List[tuple]:
        """Per member, its part of each of ``others`` (collections of this batch size, split along the
        stack dim; a lazy stack along the same dim gives its members)."""
        parts = [other.unbind(self.stack_dim) if isinstance(other, TensorCollection) else [other] * len(self.tensordicts)
                 for other in others]
        return [tuple(part[position] for part in parts) for position in range(len(self.tensordicts))]

    def _member_names(self, names: Any) -> Any:
        """``names`` for a member: the stack dim's entry dropped."""
        if names is _NO or names is None:
            return names
        names = list(names)
        del names[self.stack_dim]
        return names

    def _apply_members(self, method: str, fn: Callable, others: tuple, options: dict) -> Any:
        batch_size = options.pop("batch_size", None)
        out = options.pop("out", None)
        propagate_lock = options.get("propagate_lock", False)
        if batch_size is not None:  # a new batch: the dense stack's result (as upstream)
            dense_others = [other.contiguous() if hasattr(other, "tensordicts") else other for other in others]
            return getattr(self.contiguous(), method)(fn, *dense_others, batch_size=batch_size, out=out,
                                                      **_given(options))
        if out is not None:
            result = self._apply_members(method, fn, others, options)
            if result is not None:
                out.update(result)
            return out
        if options.get("inplace"):
            options = {**options, "inplace": False}
            results = [getattr(td, method)(fn, *parts, **_given(options))
                       for td, parts in zip(self.tensordicts, self._split_others(others))]
            for td, result in zip(self.tensordicts, results):  # every result exists: now write
                if result is not None:
                    td.update_(result)
            return self
        names = self._member_names(options.pop("names", _NO))
        if names is not _NO:
            options["names"] = names
        results = [getattr(td, method)(fn, *parts, **_given(options))
                   for td, parts in zip(self.tensordicts, self._split_others(others))]
        if all(result is None for result in results):
            return None
        stacked = self._restack(results, self.stack_dim)
        if propagate_lock and self.is_locked:
            stacked.lock_()
        return stacked

    # ------------------------------------------------------------------ the apply family
    def apply(self, fn: Callable, *others: Any, batch_size: Any = None, device: Any = _NO, names: Any = _NO,
              inplace: bool = False, default: Any = _NO, filter_empty: Optional[bool] = None,
              propagate_lock: bool = False, call_on_nested: bool = False, is_leaf: Optional[Callable] = None,
              out: Any = None, **constructor_kwargs: Any) -> Any:
        """A lazy stack of ``member.apply(fn, *others' parts, ...)``; ``batch_size=`` gives the dense
        stack's ``apply`` (a TensorDict of that batch).

        >>> import torch
        >>> from torchdict import TensorDict, lazy_stack
        >>> lazy_stack([TensorDict(a=torch.ones(1))]).apply(lambda x: x * 2)["a"]
        tensor([[2.]])
        """
        options = dict(batch_size=batch_size, device=device, names=names, inplace=inplace, default=default,
                       filter_empty=filter_empty, propagate_lock=propagate_lock, call_on_nested=call_on_nested,
                       is_leaf=is_leaf, out=out, **constructor_kwargs)
        return self._apply_members("apply", fn, others, options)

    def named_apply(self, fn: Callable, *others: Any, nested_keys: bool = False, batch_size: Any = None,
                    device: Any = _NO, names: Any = _NO, inplace: bool = False, default: Any = _NO,
                    filter_empty: Optional[bool] = None, propagate_lock: bool = False,
                    call_on_nested: bool = False, is_leaf: Optional[Callable] = None, out: Any = None,
                    **constructor_kwargs: Any) -> Any:
        """A lazy stack of ``member.named_apply(fn, ...)`` (``fn(key, leaf, ...)``)."""
        options = dict(nested_keys=nested_keys, batch_size=batch_size, device=device, names=names,
                       inplace=inplace, default=default, filter_empty=filter_empty, propagate_lock=propagate_lock,
                       call_on_nested=call_on_nested, is_leaf=is_leaf, out=out, **constructor_kwargs)
        return self._apply_members("named_apply", fn, others, options)

    def apply_(self, fn: Callable, *others: Any, **kwargs: Any) -> Any:
        """``fn`` on every leaf of every member, written into the leaves; returns self (nothing is written
        if ``fn`` fails on some member)."""
        return self.apply(fn, *others, inplace=True, **kwargs)

    # ------------------------------------------------------------------ other member-wise results
    def empty(self, recurse: bool = False, *, batch_size: Any = None, device: Any = _NO, names: Any = None) -> Any:
        """A lazy stack of the members' ``empty(recurse)`` (no tensor leaf); with ``batch_size``, a dense
        TensorDict of that batch."""
        kwargs = {} if device is _NO else {"device": device}
        if batch_size is not None:
            from ..tensordict import TensorDict

            source = self.contiguous() if recurse else TensorDict({}, batch_size=self.batch_size,
                                                                   device=self.device)
            return source.empty(recurse, batch_size=batch_size, names=names, **kwargs)
        return self._restack([td.empty(recurse, **kwargs) for td in self.tensordicts], self.stack_dim)

    def clone(self, recurse: bool = True, **kwargs: Any) -> Any:
        """A lazy stack of the members' clones (``recurse=False``: new structures over the same leaves).

        >>> from torchdict import TensorDict, lazy_stack
        >>> a = TensorDict(a=0)
        >>> lazy_stack([a]).clone()[0] is a
        False
        """
        return self._restack([td.clone(recurse, **kwargs) for td in self.tensordicts], self.stack_dim)

    @property
    def data(self) -> Any:
        """A lazy stack of the members' ``data`` (the leaves detached from autograd, same storage)."""
        return self._restack([td.data for td in self.tensordicts], self.stack_dim)

    @property
    def grad(self) -> Any:
        """A lazy stack of the members' ``grad``."""
        grads = [td.grad for td in self.tensordicts]
        if all(grad is None for grad in grads):
            return None
        # A member without gradients (None) is an empty member in the stack.
        return self._restack([td.empty() if grad is None else grad for td, grad in zip(self.tensordicts, grads)],
                             self.stack_dim)

    def to_lazystack(self, dim: int = 0) -> Any:
        """A lazy stack along batch dim ``dim`` of ``unbind(dim)`` (the members themselves along the stack
        dim; lazy stacks of their slices along others)."""
        n_batch = len(self.batch_size)
        if not -n_batch <= dim < n_batch:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n_batch}, {n_batch - 1}], "
                             f"but got {dim})")
        dim %= n_batch
        return self._restack(list(self.unbind(dim)), dim)

    def softmax(self, dim: int, dtype: Optional[torch.dtype] = None) -> Any:
        """Softmax along batch dim ``dim``: each member's along another dim; along the stack dim, the dense
        stack's (each member gets its slice; its exclusive leaves are softmaxed along ``dim`` alone)."""
        n_batch = len(self.batch_size)
        if not -n_batch <= dim < n_batch:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n_batch}, {n_batch - 1}], "
                             f"but got {dim})")
        dim %= n_batch
        stack_dim = self.stack_dim
        if dim != stack_dim:
            return self._restack([td.softmax(dim - (dim > stack_dim), dtype) for td in self.tensordicts], stack_dim)
        if _any_ragged(self):
            # Upstream's fallback: each leaf of each member along ``dim`` (its own dim of that number).
            return self.apply(lambda leaf: torch.softmax(leaf, dim=dim, dtype=dtype))
        parts = self.contiguous().softmax(dim, dtype).unbind(stack_dim)
        members = []
        for td, part in zip(self.tensordicts, parts):
            member = part.clone()
            shared = set(member.keys(True, True))
            for key in td.keys(True, True):
                leaf = td.get(key)
                if key not in shared and isinstance(leaf, torch.Tensor):
                    member.set(key, torch.softmax(leaf, dim=dim, dtype=dtype))
            members.append(member)
        return self._restack(members, stack_dim)


def _given(options: dict) -> dict:
    """``options`` without the ones left at their "not given" default."""
    return {name: value for name, value in options.items() if value is not _NO}


def _any_ragged(td: Any) -> bool:
    from ._ops import is_ragged

    return any(is_ragged(td._member_values(key)) for key in td.keys(True, True))
