"""Reductions of a lazy stack: ``sum``, ``nansum``, ``mean``, ``nanmean``, ``prod``, ``std``, ``var``,
``amax``, ``amin``, ``max``, ``min``, and ``all``/``any`` (with or without ``dim``).

Nothing here computes a reduction itself: each case hands the work to the dense
TensorDict's method of the same name (same arguments, same errors), on

- ``dim`` omitted / ``None``: the dense stack (``contiguous()`` of the keys every member
  has) when no entry is ragged; otherwise a batch-less TensorDict whose leaves are the
  members' elements concatenated, so a ragged key reduces over all its elements (a mean
  weighted by each member's element count, a std over every element, ...);
- ``dim`` holding the stack dim: the dense stack (a ragged entry raises its error);
- ``dim`` of other batch dims, or ``"feature"``: every member, over the matching member
  dims; the results are stacked again lazily (a ``max``/``min`` pair of lazy stacks, or
  ``torch.stack`` of the tensors ``reduce=True`` gives), along the stack dim moved left by
  the reduced dims before it (unless ``keepdim``).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, List

import torch

from ._base import TensorCollection
from ._lazy_ops import is_ragged
from ._reductions import _NO_DIM, batch_dims_of
from .tensordict import TensorDict

_Tensor = torch.Tensor
#: The lazy stack's reductions that take ``(dim, keepdim, **options)`` as the dense ones.
_NAMES = ("sum", "nansum", "mean", "nanmean", "prod", "std", "var", "amax", "amin", "max", "min")


class LazyReductionsMixin:
    """Reductions; the class using it provides ``_tds``, ``_stack_dim``, ``batch_dims``, ``keys``,
    ``select``, ``contiguous``, ``_exclusive_keys`` and ``_member_values``."""

    __slots__ = ()

    def all(self, dim: Any = None) -> Any:
        """True when every element of every member's leaves is true; with ``dim``, a TensorDict
        (the stack dim) or a lazy stack (other batch dims), as the dense ``all(dim)``.

        >>> import torch
        >>> from torchdict import TensorDict, lazy_stack
        >>> td = lazy_stack([TensorDict(a=torch.ones(1)), TensorDict(a=torch.ones(2))])
        >>> (td == 1).all(), (td == 0).any()
        (True, False)
        """
        if dim is None:
            return all(td.all() for td in self._tds)
        return self._lazy_reduce("all", dim, {})

    def any(self, dim: Any = None) -> Any:
        """True when some element of some member's leaf is true; with ``dim``, as ``all(dim)``."""
        if dim is None:
            return any(td.any() for td in self._tds)
        return self._lazy_reduce("any", dim, {})

    # ------------------------------------------------------------------ dispatch
    def _lazy_reduce(self, name: str, dim: Any, kwargs: dict) -> Any:
        if dim is _NO_DIM or dim is None:
            return self._reduce_whole(name, kwargs)
        if isinstance(dim, str):  # "feature" (the members give the dense error for other strings)
            return self._reduce_members(name, dim, self._stack_dim, kwargs)
        dims = batch_dims_of(dim, self.batch_dims)
        stack_dim = self._stack_dim
        if stack_dim in dims:
            return getattr(self._dense_common(), name)(dim, **kwargs)
        member_dims = tuple(d - (d > stack_dim) for d in dims)
        shift = 0 if kwargs.get("keepdim") else sum(d < stack_dim for d in dims)
        member_dim = member_dims if isinstance(dim, (tuple, list)) else member_dims[0]
        return self._reduce_members(name, member_dim, stack_dim - shift, kwargs)

    def _reduce_members(self, name: str, member_dim: Any, new_stack_dim: int, kwargs: dict) -> Any:
        """Each member's ``<name>(member_dim, ...)``, stacked again along ``new_stack_dim``."""
        results = [getattr(td, name)(member_dim, **kwargs) for td in self._tds]
        first = results[0]
        if isinstance(first, _Tensor):  # reduce=True
            return torch.stack(results, new_stack_dim)
        if isinstance(first, TensorCollection):
            return self._restack(results, new_stack_dim)
        # torch.return_types.max / min: a pair of lazy stacks.
        values = self._restack([result.values for result in results], new_stack_dim)
        indices = self._restack([result.indices for result in results], new_stack_dim)
        return type(first)((values, indices))

    @staticmethod
    def _restack(members: List[Any], stack_dim: int) -> Any:
        from .lazy import LazyStackedTensorDict

        return LazyStackedTensorDict(*members, stack_dim=stack_dim)

    def _dense_common(self) -> Any:
        """The dense stack of the keys every member has (ragged entries raise)."""
        if any(self._exclusive_keys()) or self._nested_exclusive():
            return self.select(*self.keys(True, True)).contiguous()
        return self.contiguous()

    def _nested_exclusive(self) -> bool:
        shared = set(self.keys(True, True))
        return any(set(td.keys(True, True)) != shared for td in self._tds)

    def _reduce_whole(self, name: str, kwargs: dict) -> Any:
        """``<name>`` over every element of each key (see the module docstring)."""
        if not any(is_ragged(self._member_values(key)) for key in self.keys(True, True)):
            return getattr(self._dense_common(), name)(**kwargs)
        return self._reduce_concatenated(name, kwargs)

    def _reduce_concatenated(self, name: str, kwargs: dict) -> Any:
        """``<name>`` of a batch-less TensorDict holding, per tensor key, every member's elements in one
        tensor (shaped ``(1, ..., 1, count)`` with the stacked entry's dims for ``keepdim``)."""
        keepdim = kwargs.get("keepdim", False)
        flat = TensorDict({}, batch_size=[], device=self.device)
        for key in self.keys(True, True):
            values = self._member_values(key)
            if not all(isinstance(value, _Tensor) for value in values):
                continue  # non-tensor data: nothing to reduce
            elements = torch.cat([value.reshape(-1) for value in values])
            if keepdim:
                elements = elements.reshape((1,) * values[0].ndim + (-1,))
            flat.set(key, elements)
        result = getattr(flat, name)(**kwargs)
        if keepdim and isinstance(result, TensorCollection):
            result.batch_size = torch.Size((1,) * self.batch_dims)
        return result


def _reduction(name: str) -> Callable:
    def method(self: Any, dim: Any = _NO_DIM, keepdim: bool = False, **kwargs: Any) -> Any:
        return self._lazy_reduce(name, dim, {"keepdim": keepdim, **kwargs})

    dense = getattr(TensorDict, name)
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.signature(dense)  # type: ignore[attr-defined]
    method.__doc__ = (f"The dense ``{name}`` of the lazy stack (options as there): over every element of each "
                      "key when ``dim`` is omitted (ragged keys too), the dense stack's along the stack dim, "
                      "a lazy stack of the members' along other batch dims.")
    return method


def _install() -> None:
    for name in _NAMES:
        setattr(LazyReductionsMixin, name, _reduction(name))


_install()
