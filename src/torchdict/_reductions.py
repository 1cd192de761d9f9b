"""Reductions over the batch dims: sum, mean, std, var, prod, max, min, amax, amin, nansum, nanmean.

``dim`` selects what is reduced in every leaf:

- ``None`` (the default): each leaf is reduced wholly (a batch ``[]`` result);
- an int or a tuple of ints: batch dims (negative ones count from the last
  *batch* dim), reduced in every leaf; feature dims are kept;
- ``"feature"``: every dim after the batch dims; the batch is kept.

``reduce=True`` pools all the leaves into one tensor (each leaf's feature dims
flattened and concatenated) and returns a single tensor. ``max``/``min`` with a
``dim`` return ``torch.return_types.max(values=td, indices=td)`` like torch.
Non-tensor data shared by the batch (``NonTensorData``) is kept; per-element
non-tensor stacks are dropped, as there is no way to reduce them.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ._apply import DROP, flat_tensors, rebuild, tensor_leaves
from ._errors import batch_dim_error
from .nontensor import NonTensorData

_Tensor = torch.Tensor
_NO_DIM: Any = object()
_TUPLE_DIMS = frozenset({"sum", "mean", "std", "var", "amax", "amin", "nansum", "nanmean", "all", "any"})
_WITH_INDICES = frozenset({"max", "min"})


def check_batch_dim(dim: Any, batch_dims: int) -> int:
    """``dim`` as a non-negative batch dim; raises :class:`BatchDimError` when out of range."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, a tuple of ints or 'feature', got {dim!r}.")
    if not -batch_dims <= dim < batch_dims:
        raise batch_dim_error(dim, batch_dims)
    return dim + batch_dims if dim < 0 else dim


def batch_dims_of(dim: Any, batch_dims: int) -> tuple:
    """``dim`` (an int, or a tuple/list of ints) as sorted, distinct, non-negative batch dims."""
    items = dim if isinstance(dim, (tuple, list)) else (dim,)
    dims = sorted({check_batch_dim(item, batch_dims) for item in items})
    if len(dims) != len(items):
        raise RuntimeError(f"dim {dim} appears multiple times in the list of dims")
    return tuple(dims)


def _reduce_dims(name: str, leaf: torch.Tensor, dims: tuple, keepdim: bool, kwargs: dict) -> Any:
    """``torch.<name>`` over ``dims`` of one leaf (ops without tuple dims reduce one dim at a time)."""
    fn = getattr(torch, name)
    if not dims:  # nothing to reduce; torch would read an empty tuple as "every dim"
        return fn(leaf.unsqueeze(-1), dim=-1, **kwargs)
    if name in _TUPLE_DIMS:
        return fn(leaf, dim=dims, keepdim=keepdim, **kwargs)
    for dim in reversed(dims):  # from the last so earlier positions stay valid
        leaf = fn(leaf, dim, keepdim=keepdim, **kwargs)
    return leaf


def _max_min_dims(name: str, leaf: torch.Tensor, dims: tuple, keepdim: bool) -> tuple:
    """``torch.max``/``min`` over several dims: indices are flat positions within those dims."""
    fn = getattr(torch, name)
    if not dims:
        result = fn(leaf.unsqueeze(-1), -1)
        return result.values, result.indices
    if len(dims) == 1:
        result = fn(leaf, dims[0], keepdim=keepdim)
        return result.values, result.indices
    moved = leaf.movedim(dims, tuple(range(len(dims)))).flatten(0, len(dims) - 1)
    values, indices = fn(moved, 0)
    if keepdim:
        for dim in dims:
            values, indices = values.unsqueeze(dim), indices.unsqueeze(dim)
    return values, indices


def _whole(name: str, leaf: torch.Tensor, keepdim: bool, kwargs: dict) -> torch.Tensor:
    result = getattr(torch, name)(leaf, **kwargs)
    if name in _WITH_INDICES and not isinstance(result, _Tensor):
        result = result.values
    return result.reshape((1,) * leaf.ndim) if keepdim else result


def _keep_shared_non_tensor(leaf: Any, batch_size: torch.Size) -> Any:
    if type(leaf) is NonTensorData:
        return leaf if leaf.batch_size == batch_size else leaf._with_batch_size(batch_size)
    return DROP


def _drop_non_tensor(leaf: Any, batch_size: torch.Size) -> Any:
    return DROP


def _pooled(td: Any, dims: Optional[tuple]) -> torch.Tensor:
    """Every leaf as ``batch + (features,)``, concatenated on the last dim (``reduce=True``)."""
    n_batch = len(td._batch_size)
    leaves = tensor_leaves(td)
    if dims is None:
        return torch.cat([leaf.reshape(-1) for leaf in leaves])
    parts = [leaf.flatten(n_batch) if leaf.ndim > n_batch else leaf.unsqueeze(-1) for leaf in leaves]
    return torch.cat(parts, dim=-1)


def reduce(td: Any, name: str, dim: Any = _NO_DIM, keepdim: bool = False, kwargs: Optional[dict] = None,
           reduce_all: bool = False) -> Any:
    """``torch.<name>`` over ``dim`` (see the module docstring) of every leaf."""
    kwargs = kwargs or {}
    n_batch = len(td._batch_size)
    feature = isinstance(dim, str)
    if feature and dim != "feature":
        raise ValueError(f"dim must be an int, a tuple of ints or 'feature', got {dim!r}.")
    whole = dim is _NO_DIM or dim is None
    dims = None if whole or feature else batch_dims_of(dim, n_batch)
    if reduce_all:
        return _reduce_pooled(td, name, dims, feature, keepdim, kwargs)
    if whole:
        new_batch = torch.Size((1,) * n_batch if keepdim else ())

        def batch_of(old: torch.Size) -> torch.Size:
            return torch.Size((1,) * len(old) if keepdim else ())

        def per_leaf(leaf: torch.Tensor) -> Any:
            return _whole(name, leaf, keepdim, kwargs)
    elif feature:
        new_batch = td._batch_size

        def batch_of(old: torch.Size) -> torch.Size:
            return old[:n_batch] + ((1,) * (len(old) - n_batch) if keepdim else ())

        def per_leaf(leaf: torch.Tensor) -> Any:
            feature_dims = tuple(range(n_batch, leaf.ndim))
            if name in _WITH_INDICES:
                return _max_min_dims(name, leaf, feature_dims, keepdim)
            return _reduce_dims(name, leaf, feature_dims, keepdim, kwargs)
    else:
        assert dims is not None
        kept = [1 if position in dims else size for position, size in enumerate(td._batch_size)]
        new_batch = torch.Size(kept if keepdim else [size for position, size in enumerate(td._batch_size)
                                                      if position not in dims])

        def batch_of(old: torch.Size) -> torch.Size:
            return new_batch + old[n_batch:]

        torch_fn = getattr(torch, name)
        if len(dims) == 1 and name not in _WITH_INDICES and name not in ("std", "var"):
            # The common ``td.sum(0)``: torch's positional (input, dim, keepdim) form.
            single = dims[0]

            def per_leaf(leaf: torch.Tensor) -> Any:
                return torch_fn(leaf, single, keepdim, **kwargs)
        else:
            def per_leaf(leaf: torch.Tensor) -> Any:
                if name in _WITH_INDICES:
                    return _max_min_dims(name, leaf, dims, keepdim)
                return _reduce_dims(name, leaf, dims, keepdim, kwargs)

    storage = td._tensordict
    flat = flat_tensors(storage)
    if flat is not None and name not in _WITH_INDICES:
        return td._new_unsafe(dict(zip(storage, map(per_leaf, flat))), new_batch, td._device)
    results = [per_leaf(leaf) for leaf in (flat if flat is not None else tensor_leaves(td))]
    if name in _WITH_INDICES and not whole:
        values = rebuild(td, (pair[0] for pair in results), new_batch, batch_of, _drop_non_tensor)
        indices = rebuild(td, (pair[1] for pair in results), new_batch, batch_of, _drop_non_tensor)
        return getattr(torch.return_types, name)((values, indices))
    return rebuild(td, iter(results), new_batch, batch_of, _keep_shared_non_tensor)


def _reduce_pooled(td: Any, name: str, dims: Optional[tuple], feature: bool, keepdim: bool,
                   kwargs: dict) -> torch.Tensor:
    if name in _WITH_INDICES:
        name = "amax" if name == "max" else "amin"
    if dims is None and not feature:
        return _whole(name, _pooled(td, None), False, kwargs)
    pooled = _pooled(td, ())
    reduced = (len(td._batch_size),) if feature or dims is None else dims + (pooled.ndim - 1,)
    result = _reduce_dims(name, pooled, reduced, keepdim, kwargs)
    return result.squeeze(-1) if keepdim else result


class ReductionsMixin:
    __slots__ = ()

    def sum(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
            reduce: Optional[bool] = None) -> Any:
        """Sum over batch ``dim`` of every leaf (each leaf wholly when ``dim`` is omitted).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.ones(3, 2), batch_size=[3])
        >>> td.sum(0)["a"], td.sum()["a"]
        (tensor([3., 3.]), tensor(6.))
        """
        return _reduction(self, "sum", dim, keepdim, reduce, dtype=dtype)

    def nansum(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
               reduce: Optional[bool] = None) -> Any:
        """``sum`` treating NaN as zero."""
        return _reduction(self, "nansum", dim, keepdim, reduce, dtype=dtype)

    def mean(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
             reduce: Optional[bool] = None) -> Any:
        """Mean over batch ``dim`` of every leaf (each leaf wholly when ``dim`` is omitted).

        >>> TensorDict(a=torch.arange(4.)).mean()["a"]
        tensor(1.5000)
        """
        return _reduction(self, "mean", dim, keepdim, reduce, dtype=dtype)

    def nanmean(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
                reduce: Optional[bool] = None) -> Any:
        """``mean`` ignoring NaN."""
        return _reduction(self, "nanmean", dim, keepdim, reduce, dtype=dtype)

    def prod(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
             reduce: Optional[bool] = None) -> Any:
        """Product over batch ``dim`` of every leaf (each leaf wholly when ``dim`` is omitted)."""
        return _reduction(self, "prod", dim, keepdim, reduce, dtype=dtype)

    def std(self, dim: Any = _NO_DIM, keepdim: bool = False, *, correction: int = 1,
            reduce: Optional[bool] = None) -> Any:
        """Standard deviation over batch ``dim`` of every leaf (``correction=1``: Bessel's)."""
        return _reduction(self, "std", dim, keepdim, reduce, correction=correction)

    def var(self, dim: Any = _NO_DIM, keepdim: bool = False, *, correction: int = 1,
            reduce: Optional[bool] = None) -> Any:
        """Variance over batch ``dim`` of every leaf (``correction=1``: Bessel's)."""
        return _reduction(self, "var", dim, keepdim, reduce, correction=correction)

    def amax(self, dim: Any = _NO_DIM, keepdim: bool = False, *, reduce: Optional[bool] = None) -> Any:
        """Maximum over batch ``dim`` of every leaf (values only)."""
        return _reduction(self, "amax", dim, keepdim, reduce)

    def amin(self, dim: Any = _NO_DIM, keepdim: bool = False, *, reduce: Optional[bool] = None) -> Any:
        """Minimum over batch ``dim`` of every leaf (values only)."""
        return _reduction(self, "amin", dim, keepdim, reduce)

    def max(self, dim: Any = _NO_DIM, keepdim: bool = False, *, reduce: Optional[bool] = None) -> Any:
        """Maximum over batch ``dim``: ``torch.return_types.max(values=td, indices=td)``.

        Without ``dim``, a TensorDict of each leaf's maximum.

        >>> td = TensorDict(a=torch.tensor([1., 5., 3.]), batch_size=[3])
        >>> td.max(0).indices["a"], td.max()["a"]
        (tensor(1), tensor(5.))
        """
        return _reduction(self, "max", dim, keepdim, reduce)

    def min(self, dim: Any = _NO_DIM, keepdim: bool = False, *, reduce: Optional[bool] = None) -> Any:
        """Minimum over batch ``dim``: ``torch.return_types.min(values=td, indices=td)``."""
        return _reduction(self, "min", dim, keepdim, reduce)


def _reduction(td: Any, name: str, dim: Any, keepdim: bool, reduce_all: Optional[bool], **kwargs: Any) -> Any:
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    return reduce(td, name, dim, keepdim, kwargs, bool(reduce_all))

