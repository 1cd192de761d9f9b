"""Reductions over the batch dims: sum, mean, std, var, prod, max, min, amax, amin, nansum, nanmean,
logsumexp, norm, quantile; and the cumulative cummax / cummin.

``dim`` selects what is reduced in every leaf:

- ``None`` (the default): each leaf is reduced wholly (a batch ``[]`` result);
- an int or a tuple of ints: batch dims (negative ones count from the last
  *batch* dim), reduced in every leaf; feature dims are kept;
- ``"feature"``: every dim after the batch dims; the batch is kept.

``reduce=True`` pools all the leaves into one tensor (each leaf's feature dims
flattened and concatenated) and returns a single tensor. ``max``/``min`` with a
``dim`` return ``torch.return_types.max(values=td, indices=td)`` like torch.
``logsumexp`` without ``dim`` reduces every *batch* dim (feature dims stay), as
upstream does. ``cummax``/``cummin`` keep the batch and return
``torch.return_types.cummax(values=td, indices=td)``.
Non-tensor data shared by the batch (``NonTensorData``) is kept; per-element
non-tensor stacks are dropped, as there is no way to reduce them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

import torch

from ._apply import DROP, flat_tensors, rebuild, tensor_leaves
from ._errors import batch_dim_error
from .nontensor import NonTensorData
from ._unbatched import UnbatchedTensor as _Unbatched

if TYPE_CHECKING:
    from ._host import TensorDictHost
else:
    TensorDictHost = object

_Tensor = torch.Tensor
_NO_DIM: Any = object()
# Per-leaf functions that take a tuple of dims (the others reduce one dim at a time).
_TUPLE_DIMS = frozenset({"sum", "mean", "std", "var", "amax", "amin", "nansum", "nanmean", "all", "any",
                         "logsumexp", "norm", "quantile"})
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


def _merge_dims(leaf: torch.Tensor, dims: tuple) -> torch.Tensor:
    """``leaf`` with ``dims`` (sorted, non-empty) moved to the front and flattened into dim 0."""
    return leaf.movedim(dims, tuple(range(len(dims)))).flatten(0, len(dims) - 1)


def _restore_dims(result: torch.Tensor, dims: tuple, lead: int = 0) -> torch.Tensor:
    """``keepdim`` for a reduction of merged ``dims``: size-1 dims back in place (after ``lead`` new dims)."""
    for dim in dims:  # increasing, so each position is final once inserted
        result = result.unsqueeze(dim + lead)
    return result


def _vector_norm(leaf: torch.Tensor, dim: Any = None, keepdim: bool = False, *, p: Any = 2,
                 dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    # "fro" is torch.norm's default; over a flattened vector it is the 2-norm.
    return torch.linalg.vector_norm(leaf, 2 if p == "fro" else p, dim, keepdim, dtype=dtype)


def _quantile(leaf: torch.Tensor, dim: Any = None, keepdim: bool = False, *, q: Any,
              interpolation: str = "linear") -> torch.Tensor:
    """``torch.quantile``, also over a tuple of dims (the quantile of all their elements together)."""
    if not isinstance(dim, tuple):
        return torch.quantile(leaf, q, dim, keepdim, interpolation=interpolation)
    merged = _merge_dims(leaf, dim)
    result = torch.quantile(merged, q, 0, interpolation=interpolation)
    # A 1-d ``q`` puts one leading dim in front of the result.
    return _restore_dims(result, dim, result.ndim - merged.ndim + 1) if keepdim else result


# Reductions whose per-leaf function is not ``torch.<name>`` (same (leaf, dim, keepdim, **kwargs) calling form).
_LEAF_FUNCTIONS: Dict[str, Callable[..., torch.Tensor]] = {"norm": _vector_norm, "quantile": _quantile}


def _leaf_function(name: str) -> Any:
    return _LEAF_FUNCTIONS.get(name) or getattr(torch, name)


def _reduce_dims(name: str, leaf: torch.Tensor, dims: tuple, keepdim: bool, kwargs: dict) -> Any:
    """``torch.<name>`` over ``dims`` of one leaf (ops without tuple dims reduce one dim at a time)."""
    fn = _leaf_function(name)
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
    values, indices = fn(_merge_dims(leaf, dims), 0)
    if keepdim:
        values, indices = _restore_dims(values, dims), _restore_dims(indices, dims)
    return values, indices


def _whole(name: str, leaf: torch.Tensor, keepdim: bool, kwargs: dict) -> torch.Tensor:
    result = _leaf_function(name)(leaf, **kwargs)
    if name in _WITH_INDICES and not isinstance(result, _Tensor):
        result = result.values
    # ``result.shape`` is ``()``, or ``(n,)`` for a quantile with ``n`` values of ``q``.
    return result.reshape(result.shape + (1,) * leaf.ndim) if keepdim else result


def _keep_shared_non_tensor(leaf: Any, batch_size: torch.Size) -> Any:
    if isinstance(leaf, NonTensorData):
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


def _values_and_indices(td: Any, name: str, pairs: list, batch_size: torch.Size, batch_of: Any = None) -> Any:
    """``torch.return_types.<name>(values=td, indices=td)`` from one (values, indices) pair per tensor leaf.

    Non-tensor entries are dropped from both: they have no indices, and upstream drops them too.
    """
    values = rebuild(td, (pair[0] for pair in pairs), batch_size, batch_of, _drop_non_tensor)
    indices = rebuild(td, (pair[1] for pair in pairs), batch_size, batch_of, _drop_non_tensor)
    return getattr(torch.return_types, name)((values, indices))


def reduce(td: Any, name: str, dim: Any = _NO_DIM, keepdim: bool = False, kwargs: Optional[dict] = None,
           reduce_all: bool = False, lead: tuple = ()) -> Any:
    """``torch.<name>`` over ``dim`` (see the module docstring) of every leaf.

    ``lead``: the sizes of the dims the op puts in front of every result (a 1-d
    ``q`` of ``quantile``); they lead the result's batch too.
    """
    kwargs = kwargs or {}
    prefix = torch.Size(lead)
    n_batch = len(td._batch_size)
    feature = isinstance(dim, str)
    if feature and dim != "feature":
        raise ValueError(f"dim must be an int, a tuple of ints or 'feature', got {dim!r}.")
    whole = dim is _NO_DIM or dim is None
    dims = None if whole or feature else batch_dims_of(dim, n_batch)
    if reduce_all:
        return _reduce_pooled(td, name, dims, feature, keepdim, kwargs)
    if whole:
        # Without keepdim the batch is ``[]`` even when the op adds leading dims (upstream's choice).
        new_batch = prefix + (1,) * n_batch if keepdim else torch.Size()

        def batch_of(old: torch.Size) -> torch.Size:
            return prefix + (1,) * len(old) if keepdim else torch.Size()

        def per_leaf(leaf: torch.Tensor) -> Any:
            return _whole(name, leaf, keepdim, kwargs)
    elif feature:
        new_batch = prefix + td._batch_size

        def batch_of(old: torch.Size) -> torch.Size:
            return prefix + old[:n_batch] + ((1,) * (len(old) - n_batch) if keepdim else ())

        def per_leaf(leaf: torch.Tensor) -> Any:
            feature_dims = tuple(range(n_batch, leaf.ndim))
            if name in _WITH_INDICES:
                return _max_min_dims(name, leaf, feature_dims, keepdim)
            return _reduce_dims(name, leaf, feature_dims, keepdim, kwargs)
    else:
        assert dims is not None
        kept = [1 if position in dims else size for position, size in enumerate(td._batch_size)]
        new_batch = prefix + tuple(kept if keepdim else [size for position, size in enumerate(td._batch_size)
                                                          if position not in dims])

        def batch_of(old: torch.Size) -> torch.Size:
            return new_batch + old[n_batch:]

        torch_fn = _leaf_function(name)
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
    if flat is not None:
        results = [per_leaf(leaf) for leaf in flat]
    else:
        # An UnbatchedTensor has no batch dims to reduce: it is kept (rebuild gives it the new batch size).
        paired = name in _WITH_INDICES and not whole
        results = [per_leaf(leaf) if not isinstance(leaf, _Unbatched) else (leaf, leaf) if paired else leaf
                   for leaf in tensor_leaves(td)]
    if name in _WITH_INDICES and not whole:
        return _values_and_indices(td, name, results, new_batch, batch_of)
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


class ReductionsMixin(TensorDictHost):
    __slots__ = ()

    def sum(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
            reduce: Optional[bool] = None, key_transform: Optional[Callable[[str], str]] = None) -> Any:
        """Sum over batch ``dim`` of every leaf (each leaf wholly when ``dim`` is omitted).

        >>> import torch
        >>> from torchdict import TensorDict
        >>> td = TensorDict(a=torch.ones(3, 2), batch_size=[3])
        >>> td.sum(0)["a"], td.sum()["a"]
        (tensor([3., 3.]), tensor(6.))

        ``key_transform`` renames every key of the result, level by level (ignored with ``reduce=True``):

        >>> list(td.sum(0, key_transform=lambda key: f"sum_{key}").keys())
        ['sum_a']
        """
        return _renamed(_reduction(self, "sum", dim, keepdim, reduce, dtype=dtype), key_transform)

    def nansum(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
               reduce: Optional[bool] = None) -> Any:
        """``sum`` treating NaN as zero."""
        return _reduction(self, "nansum", dim, keepdim, reduce, dtype=dtype)

    def mean(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
             reduce: Optional[bool] = None, key_transform: Optional[Callable[[str], str]] = None) -> Any:
        """Mean over batch ``dim`` of every leaf (each leaf wholly when ``dim`` is omitted).

        >>> TensorDict(a=torch.arange(4.)).mean()["a"]
        tensor(1.5000)
        """
        return _renamed(_reduction(self, "mean", dim, keepdim, reduce, dtype=dtype), key_transform)

    def nanmean(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
                reduce: Optional[bool] = None) -> Any:
        """``mean`` ignoring NaN."""
        return _reduction(self, "nanmean", dim, keepdim, reduce, dtype=dtype)

    def prod(self, dim: Any = _NO_DIM, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None,
             reduce: Optional[bool] = None) -> Any:
        """Product over batch ``dim`` of every leaf (each leaf wholly when ``dim`` is omitted)."""
        return _reduction(self, "prod", dim, keepdim, reduce, dtype=dtype)

    def std(self, dim: Any = _NO_DIM, keepdim: bool = False, *, correction: int = 1,
            reduce: Optional[bool] = None, key_transform: Optional[Callable[[str], str]] = None) -> Any:
        """Standard deviation over batch ``dim`` of every leaf (``correction=1``: Bessel's)."""
        return _renamed(_reduction(self, "std", dim, keepdim, reduce, correction=correction), key_transform)

    def var(self, dim: Any = _NO_DIM, keepdim: bool = False, *, correction: int = 1,
            reduce: Optional[bool] = None, key_transform: Optional[Callable[[str], str]] = None) -> Any:
        """Variance over batch ``dim`` of every leaf (``correction=1``: Bessel's)."""
        return _renamed(_reduction(self, "var", dim, keepdim, reduce, correction=correction), key_transform)

    def amax(self, dim: Any = _NO_DIM, keepdim: bool = False, *, reduce: Optional[bool] = None) -> Any:
        """Maximum over batch ``dim`` of every leaf (values only)."""
        return _reduction(self, "amax", dim, keepdim, reduce)

    def amin(self, dim: Any = _NO_DIM, keepdim: bool = False, *, reduce: Optional[bool] = None) -> Any:
        """Minimum over batch ``dim`` of every leaf (values only)."""
        return _reduction(self, "amin", dim, keepdim, reduce)

    def max(self, dim: Any = _NO_DIM, keepdim: bool = False, *, reduce: Optional[bool] = None,
            return_indices: bool = True) -> Any:
        """Maximum over batch ``dim``: ``torch.return_types.max(values=td, indices=td)``.

        Without ``dim``, a TensorDict of each leaf's maximum. ``return_indices=False``
        returns the values TensorDict only (what ``amax`` returns).

        >>> td = TensorDict(a=torch.tensor([1., 5., 3.]), batch_size=[3])
        >>> td.max(0).indices["a"], td.max()["a"], td.max(0, return_indices=False)["a"]
        (tensor(1), tensor(5.), tensor(5.))
        """
        return _reduction(self, "max" if return_indices else "amax", dim, keepdim, reduce)

    def min(self, dim: Any = _NO_DIM, keepdim: bool = False, *, reduce: Optional[bool] = None,
            return_indices: bool = True) -> Any:
        """Minimum over batch ``dim``: ``torch.return_types.min(values=td, indices=td)`` (see ``max``)."""
        return _reduction(self, "min" if return_indices else "amin", dim, keepdim, reduce)

    def logsumexp(self, dim: Any = _NO_DIM, keepdim: bool = False, *, reduce: Optional[bool] = None,
                  out: Any = None) -> Any:
        """``log(sum(exp(leaf)))`` over batch ``dim``, computed stably as ``torch.logsumexp``.

        Unlike ``sum``, omitting ``dim`` reduces every *batch* dim, not the whole
        leaf: the feature dims stay (as upstream).

        >>> td = TensorDict(a=torch.zeros(2, 3), batch_size=[2])
        >>> td.logsumexp()["a"]
        tensor([0.6931, 0.6931, 0.6931])

        ``out`` receives the result as torch's ``out=`` does (each of its tensors resized and written).
        """
        if dim is _NO_DIM or dim is None:
            dim = _every_batch_dim(self)
        result = _reduction(self, "logsumexp", dim, keepdim, reduce)
        return result if out is None else _written_into(out, result)

    def norm(self, dim: Any = _NO_DIM, keepdim: bool = False, *, p: Any = 2, dtype: Optional[torch.dtype] = None,
             reduce: Optional[bool] = None, out: Any = None,
             key_transform: Optional[Callable[[str], str]] = None) -> Any:
        """Vector ``p``-norm (``torch.linalg.vector_norm``) over batch ``dim`` of every leaf.

        Without ``dim``, each leaf's norm over all its elements. ``p="fro"``
        (``torch.norm``'s default) is the 2-norm. ``reduce=True`` gives the norm of
        all the leaves' elements together.

        >>> TensorDict(a=torch.ones(3), batch_size=[3]).norm()["a"]
        tensor(1.7321)

        ``out`` takes the result's entries (``out.update``, as upstream); ``key_transform`` renames the keys.
        """
        result = _renamed(_reduction(self, "norm", dim, keepdim, reduce, p=p, dtype=dtype), key_transform)
        if out is None:
            return result
        out.update(result)
        return out

    def quantile(self, q: Any, dim: Any = _NO_DIM, keepdim: bool = False, *, interpolation: str = "linear",
                 reduce: Optional[bool] = None, key_transform: Optional[Callable[[str], str]] = None) -> Any:
        """``torch.quantile`` over batch ``dim`` of every leaf (each leaf wholly when ``dim`` is omitted).

        Over a tuple of dims, the quantile of all their elements together. A 1-d
        tensor ``q`` of ``n`` values adds a leading dim of size ``n`` to every leaf,
        and to the batch unless ``dim`` is omitted without ``keepdim`` (then the
        batch is ``[]``, as upstream).

        >>> td = TensorDict(a=torch.tensor([1., 3., 2.]), batch_size=[3])
        >>> td.quantile(0.5)["a"], td.quantile(torch.tensor([0., 1.]), 0).batch_size
        (tensor(2.), torch.Size([2]))
        """
        lead = tuple(q.shape) if isinstance(q, _Tensor) and q.ndim == 1 else ()
        return _renamed(_reduction(self, "quantile", dim, keepdim, reduce, lead=lead, q=q,
                                   interpolation=interpolation), key_transform)

    def cummax(self, dim: int, *, reduce: Optional[bool] = None, return_indices: bool = True) -> Any:
        """Running maximum along batch ``dim``: ``torch.return_types.cummax(values=td, indices=td)``.

        The batch is kept. ``return_indices=False`` returns the values TensorDict
        only; ``reduce=True`` runs it over the pooled leaves (one tensor, see the
        module docstring).

        >>> td = TensorDict(a=torch.tensor([1., 3., 2.]), batch_size=[3])
        >>> td.cummax(0).values["a"], td.cummax(0).indices["a"]
        (tensor([1., 3., 3.]), tensor([0, 1, 1]))
        """
        return _cumulative(self, "cummax", dim, bool(reduce), return_indices)

    def cummin(self, dim: int, *, reduce: Optional[bool] = None, return_indices: bool = True) -> Any:
        """Running minimum along batch ``dim`` (see ``cummax``)."""
        return _cumulative(self, "cummin", dim, bool(reduce), return_indices)


def _reduction(td: Any, name: str, dim: Any, keepdim: bool, reduce_all: Optional[bool], *, lead: tuple = (),
               **kwargs: Any) -> Any:
    # The methods' ``reduce`` argument hides the module's ``reduce``: they call this instead.
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    return reduce(td, name, dim, keepdim, kwargs, bool(reduce_all), lead)


def _renamed(result: Any, key_transform: Optional[Callable[[str], str]]) -> Any:
    """``key_transform`` applied to every key of a reduction's TensorDict result, level by level."""
    if key_transform is None or not hasattr(result, "_tensordict"):
        return result  # no transform, or a tensor (reduce=True)
    from ._keyops import transform_keys

    return transform_keys(result, key_transform)


def _written_into(out: Any, result: Any) -> Any:
    """torch's ``out=`` for a TensorDict result: each tensor of ``out`` resized to the result's shape and
    written (a missing entry is set); returns ``out``."""
    for key, value in result.items(include_nested=True, leaves_only=True):
        if not isinstance(value, torch.Tensor):
            continue
        target = out.get(key, None)
        if isinstance(target, torch.Tensor):
            with torch.no_grad():
                target.resize_(value.shape).copy_(value)
        else:
            out.set(key, value)
    return out


def _every_batch_dim(td: Any) -> tuple:
    return tuple(range(len(td._batch_size)))


def _cumulative(td: Any, name: str, dim: Any, reduce_all: bool, return_indices: bool) -> Any:
    """``torch.cummax``/``cummin`` along one batch dim of every leaf; the batch is kept."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} takes one batch dim (an int), got {dim!r}.")
    position = check_batch_dim(dim, len(td._batch_size))
    fn = getattr(torch, name)
    if reduce_all:
        result = fn(_pooled(td, ()), position)
        return result if return_indices else result.values
    pairs = [fn(leaf, position) for leaf in tensor_leaves(td)]
    if return_indices:
        return _values_and_indices(td, name, pairs, td._batch_size)
    # Values only: the batch is unchanged, so shared non-tensor data stays, as in the reductions.
    return rebuild(td, (pair.values for pair in pairs), td._batch_size, None, _keep_shared_non_tensor)

