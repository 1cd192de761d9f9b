"""Reductions of a lazy stack: ``sum``, ``nansum``, ``mean``, ``nanmean``, ``prod``, ``std``, ``var``,
``amax``, ``amin``, ``max``, ``min``, ``all`` and ``any``, as upstream tensordict 0.15.3 does them.

Nothing here computes a reduction itself: each case hands the work to the dense
TensorDict's method of the same name (same arguments, same errors), on

- ``reduce=True`` with no ``dim``: a batch-less TensorDict holding every element of
  every member's tensor leaves (exclusive keys and ragged leaves too) in one tensor,
  so the single result is over all of them;
- otherwise the dense stack (``contiguous()``: the keys every member has). A stack
  that can't be made dense (ragged leaves) raises upstream's RuntimeError
  "<name> requires this object to be cast to a regular TensorDict".

``all()`` / ``any()`` without ``dim`` combine the members' own answers, so ragged
members and exclusive keys take part.
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from .._reductions import _NO_DIM
from ..tensordict import TensorDict

if TYPE_CHECKING:
    from ._host import LazyHost
else:
    LazyHost = object

_Tensor = torch.Tensor
#: The lazy stack's reductions that take ``(dim, keepdim, **options)`` as the dense ones.
_NAMES = ("sum", "nansum", "mean", "nanmean", "prod", "std", "var", "amax", "amin", "max", "min")


def _cast_error(collection: Any, name: str) -> RuntimeError:
    # Upstream's wording, so code matching on it keeps working.
    return RuntimeError(
        f"{name} requires this object to be cast to a regular TensorDict. If you need "
        f"{type(collection).__name__} to support {name}, help us by filing an issue on github!"
    )


def member_leaves(td: Any) -> Iterator[_Tensor]:
    """Every tensor leaf of every (dense) member of ``td``, member by member; nested lazy stacks are
    walked down to their dense members, so ragged leaves and exclusive keys are included."""
    if hasattr(td, "tensordicts"):
        for member in td.tensordicts:
            yield from member_leaves(member)
        return
    for value in td.values(True, True):
        if isinstance(value, _Tensor):
            yield value


class LazyReductionsMixin(LazyHost):
    """Reductions; the class using it provides ``tensordicts`` and ``contiguous``."""

    __slots__ = ()

    def all(self, dim: Any = None) -> Any:
        """True when every element of every member's leaves is true (ragged members and exclusive keys
        too); with ``dim``, the dense stack's ``all(dim)``.

        >>> import torch
        >>> from torchdict import TensorDict, lazy_stack
        >>> td = lazy_stack([TensorDict(a=torch.ones(1)), TensorDict(a=torch.ones(2))])
        >>> (td == 1).all(), (td == 0).any()
        (True, False)
        """
        if dim is None:
            return all(td.all() for td in self.tensordicts)
        return self._dense_for("all").all(dim)

    def any(self, dim: Any = None) -> Any:
        """True when some element of some member's leaf is true; with ``dim``, as ``all(dim)``."""
        if dim is None:
            return any(td.any() for td in self.tensordicts)
        return self._dense_for("any").any(dim)

    def _dense_for(self, name: str) -> TensorDict:
        """The dense stack, or upstream's error for a reduction when there is none (ragged leaves)."""
        try:
            return self.contiguous()
        except Exception as error:  # noqa: BLE001 - upstream turns any failure into this error
            raise _cast_error(self, name) from error

    def _lazy_reduce(self, name: str, dim: Any, keepdim: bool, kwargs: dict) -> Any:
        if dim is None and not keepdim:
            dim = _NO_DIM  # dim=None is over every element, as an omitted dim
        if kwargs.get("reduce") and dim is _NO_DIM:
            return getattr(self._all_elements(), name)(keepdim=keepdim, **kwargs)
        if kwargs.get("reduce") and dim == "feature":
            return getattr(self.contiguous(), name)(dim, keepdim=keepdim, **kwargs)  # the ragged-read error
        return getattr(self._dense_for(name), name)(dim, keepdim=keepdim, **kwargs)

    def _all_elements(self) -> TensorDict:
        """A batch-less TensorDict holding every element of every member's tensor leaves in one tensor."""
        leaves = [leaf.reshape(-1) for leaf in member_leaves(self)]
        if not leaves:
            return TensorDict({}, batch_size=[])
        dtype = leaves[0].dtype
        for leaf in leaves[1:]:
            dtype = torch.promote_types(dtype, leaf.dtype)
        return TensorDict({"elements": torch.cat([leaf.to(dtype) for leaf in leaves])}, batch_size=[])


def _reduction(name: str) -> Callable:
    def method(self: Any, dim: Any = _NO_DIM, keepdim: bool = False, **kwargs: Any) -> Any:
        return self._lazy_reduce(name, dim, keepdim, kwargs)

    dense = getattr(TensorDict, name)
    method.__name__ = method.__qualname__ = name
    setattr(method, "__signature__", inspect.signature(dense))
    method.__doc__ = (f"The dense ``{name}`` of the lazy stack (options as there); with ``reduce=True`` and no "
                      "``dim``, over every element of every member (ragged leaves and exclusive keys too).")
    return method


def _install() -> None:
    for name in _NAMES:
        setattr(LazyReductionsMixin, name, _reduction(name))


_install()

__all__ = ["LazyReductionsMixin", "member_leaves"]
