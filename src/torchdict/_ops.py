"""Pointwise arithmetic and comparisons, leaf by leaf, with ``torch._foreach_*`` where it pays.

Every op has the same shape: collect the tensor leaves (:func:`tensor_leaves`),
compute one result per leaf (one ``torch._foreach_*`` call when torch has one,
else a loop of the plain torch op), and rebuild a TensorDict of the same
structure (:func:`rebuild`). Non-tensor entries pass through unchanged, except
that ``==``/``!=`` between two TensorDicts compare their values.

The other operand is a number, a tensor broadcast *from the left* over the
batch dims, or a TensorDict with the same keys (see :mod:`torchdict._operands`).

In-place forms (``+=``, ``add_``, ...) keep the TensorDict and its leaf
objects, work on a locked TensorDict, and check every leaf first (dtypes and
shapes) so that a failing op leaves the TensorDict unchanged.

Most methods are generated from two tables (:data:`BINARY_OPS`,
:data:`UNARY_OPS`) by :func:`_install`.
"""
from __future__ import annotations

import operator
from collections.abc import Mapping
from itertools import repeat
from functools import partial
from typing import Any, Callable, Optional

import torch

from . import _masking
from ._apply import keep_non_tensor, rebuild, tensor_leaves, unwrap
from ._base import TensorCollection
from ._keys import key_to_tuple
from ._locking import keep_lock
from ._masking import finish, leaves_of
from ._operands import (
    UNSUPPORTED,
    TdOperands,
    as_operand,
    check_inplace_shapes,
    describe,
    distinct_leaves,
    empty_like_operand,
    grow_error,
    leaves_by_dtype,
    preflight,
    tensor_operands,
)
from ._reductions import ReductionsMixin, reduce
from ._stacked import run_stacked, run_stacked_
from .nontensor import NonTensorData

_Tensor = torch.Tensor
_NO_FALLBACK = (TypeError, RuntimeError, NotImplementedError, ValueError)


# --------------------------------------------------------------------------- the op tables


class PointwiseOp:
    """One pointwise op: the torch function per leaf, its reflected and in-place forms, its foreach forms."""

    __slots__ = ("name", "per_leaf", "reflected", "inplace", "foreach", "foreach_", "stackable")

    def __init__(self, name: str, *, reflected: Optional[Callable] = None, inplace: Any = True,
                 foreach: bool = False) -> None:
        self.name = name
        # With a number, may run on the stack of the leaves (_stacked.py): only ops whose
        # result doesn't depend on the kernel's vector width (transcendental ones like pow
        # can differ in the last bit between the vectorised and the scalar code paths).
        self.stackable = name in _EXACT_ON_ANY_LAYOUT
        self.per_leaf = getattr(torch, name, None) or getattr(_Tensor, name)
        self.reflected = reflected
        # ``inplace``: True for ``Tensor.<name>_``, False for none, or the in-place function itself.
        self.inplace = inplace if callable(inplace) else getattr(_Tensor, f"{name}_", None) if inplace else None
        self.foreach = getattr(torch, f"_foreach_{name}", None) if foreach else None
        self.foreach_ = getattr(torch, f"_foreach_{name}_", None) if foreach else None


_EXACT_ON_ANY_LAYOUT = frozenset({
    "add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max", "eq", "ne", "lt", "le", "gt",
    "ge", "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor",
})


def _written_into_leaf(function: Callable) -> Callable:
    """The in-place form of a torch function that has no ``Tensor.<name>_``: ``function(leaf, other, out=leaf)``."""

    def inplace(leaf: _Tensor, other: Any) -> _Tensor:
        if not isinstance(other, _Tensor):
            other = torch.as_tensor(other, device=leaf.device)  # maximum/minimum take tensors only
        return function(leaf, other, out=leaf)

    return inplace


def _swapped(python_operator: Callable) -> Callable:
    """``other <op> leaf``, evaluated by Python (so torch's own reflected dunder runs)."""
    return lambda leaf, other: python_operator(other, leaf)


BINARY_OPS = {
    op.name: op
    for op in (
        PointwiseOp("add", foreach=True, reflected=_swapped(operator.add)),
        PointwiseOp("sub", foreach=True, reflected=_swapped(operator.sub)),
        PointwiseOp("mul", foreach=True, reflected=_swapped(operator.mul)),
        PointwiseOp("div", foreach=True, reflected=_swapped(operator.truediv)),
        PointwiseOp("floor_divide", reflected=_swapped(operator.floordiv)),
        PointwiseOp("remainder", reflected=_swapped(operator.mod)),
        PointwiseOp("fmod"),
        PointwiseOp("pow", foreach=True, reflected=_swapped(operator.pow)),
        PointwiseOp("maximum", foreach=True, inplace=_written_into_leaf(torch.maximum)),
        PointwiseOp("minimum", foreach=True, inplace=_written_into_leaf(torch.minimum)),
        PointwiseOp("rsub", inplace=False),  # ``other - alpha * leaf``
        PointwiseOp("clamp_min", foreach=True),
        PointwiseOp("clamp_max", foreach=True),
        PointwiseOp("atan2"),
        PointwiseOp("hypot"),
        PointwiseOp("copysign"),
        PointwiseOp("logical_and"),
        PointwiseOp("logical_or"),
        PointwiseOp("logical_xor"),
        PointwiseOp("bitwise_and", reflected=_swapped(operator.and_)),
        PointwiseOp("bitwise_or", reflected=_swapped(operator.or_)),
        PointwiseOp("bitwise_xor", reflected=_swapped(operator.xor)),
        PointwiseOp("eq"),
        PointwiseOp("ne"),
        PointwiseOp("lt"),
        PointwiseOp("le"),
        PointwiseOp("gt"),
        PointwiseOp("ge"),
    )
}

_UNARY_WITH_FOREACH = (
    "abs", "neg", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "sigmoid", "sign", "floor",
    "ceil", "round", "trunc", "frac", "erf", "erfc", "reciprocal", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "lgamma",
)
_UNARY_WITHOUT_FOREACH = (
    "rsqrt", "sgn", "erfinv", "exp2", "relu", "square", "logical_not", "bitwise_not", "digamma", "asinh",
    "acosh", "atanh", "deg2rad", "rad2deg", "nan_to_num", "logit",
)
_UNARY_NOT_IN_PLACE = ("isnan", "isfinite", "isinf", "isposinf", "isneginf", "isreal", "signbit")

UNARY_OPS = {
    op.name: op
    for op in [PointwiseOp(name, foreach=True) for name in _UNARY_WITH_FOREACH]
    + [PointwiseOp(name) for name in _UNARY_WITHOUT_FOREACH]
    + [PointwiseOp(name, inplace=False) for name in _UNARY_NOT_IN_PLACE]
}


# --------------------------------------------------------------------------- running an op


def _run(op: PointwiseOp, leaves: list, other: Any, paired: bool, kwargs: dict, reflected: bool) -> list:
    """One result per leaf: ``op(leaf, other)``, or ``op(leaf, other[i])`` when ``paired``."""
    if not leaves:
        return []
    if op.stackable and not kwargs and not paired:
        fn = op.reflected if reflected else op.per_leaf
        if fn is not None:
            results = run_stacked(fn, leaves, other)
            if results is not None:
                return results
    if op.foreach is not None and not kwargs and not reflected:
        try:
            return op.foreach(leaves, other)
        except _NO_FALLBACK:
            pass  # the loop below gives torch's own error (or does what foreach doesn't)
    fn = op.reflected if reflected else op.per_leaf
    if fn is None:
        raise TypeError(f"{op.name} has no reflected form.")
    if kwargs:
        if paired:
            return [fn(leaf, item, **kwargs) for leaf, item in zip(leaves, other)]
        return [fn(leaf, other, **kwargs) for leaf in leaves]
    return list(map(fn, leaves, other if paired else repeat(other)))  # a C-level loop


def binary(td: Any, other: Any, op: PointwiseOp, kwargs: dict, reflected: bool = False) -> Any:
    """``op(leaf, other)`` for every leaf (``op(other, leaf)`` when ``reflected``).

    Returns :data:`UNSUPPORTED` when ``other`` has a type no op accepts (the
    dunders turn it into ``NotImplemented``). As upstream, the result of an arithmetic op
    on a locked TensorDict is locked; that of a comparison is not.
    """
    if op.name in _COMPARISONS and isinstance(other, Mapping):
        other = _mapping_operand(td, other)
    result = _binary(td, other, op, kwargs, reflected)
    if td._is_locked and result is not UNSUPPORTED and op.name not in _COMPARISONS:
        result._lock_tree()
    return result


_COMPARISONS = frozenset(("eq", "ne", "lt", "le", "gt", "ge"))


def _mapping_operand(td: Any, other: Mapping) -> Any:
    """A dict compared with a TensorDict is one (as upstream): with ``td``'s batch when its values
    have it, else with no batch (``td == {"a": 1}`` compares every element of ``a`` with 1)."""
    from .tensordict import TensorDict

    try:
        return TensorDict(other, batch_size=td._batch_size)
    except RuntimeError:
        return TensorDict(other)


def _binary(td: Any, other: Any, op: PointwiseOp, kwargs: dict, reflected: bool) -> Any:
    operand = as_operand(other)
    if operand is UNSUPPORTED:
        return UNSUPPORTED
    storage = td._tensordict
    if isinstance(operand, TensorCollection):
        pairs = TdOperands(td, operand)
        results = _run(op, pairs.leaves, pairs.others, True, kwargs, reflected)
        if pairs.flat and pairs.batch_size == td._batch_size:
            return td._new_like(dict(zip(storage, results)))
        non_tensor = keep_non_tensor
        if op.name in ("eq", "ne"):
            non_tensor = _non_tensor_comparison(pairs.non_tensor_pairs, op.name == "eq")
        return rebuild(td, iter(results), pairs.batch_size, non_tensor=non_tensor)
    leaves, flat = leaves_of(td)
    if isinstance(operand, _Tensor):
        if operand.ndim:
            leaves, others, batch_size = tensor_operands(td._batch_size, leaves, operand)
        else:
            # A 0-dim tensor is paired with each leaf (foreach's tensor-as-scalar form would
            # promote differently from torch when the leaf is 0-dim too).
            others, batch_size = [operand] * len(leaves), td._batch_size
        results = _run(op, leaves, others, True, kwargs, reflected)
        if batch_size == td._batch_size:
            return finish(td, results, flat)
        return rebuild(td, iter(results), batch_size, non_tensor=_grown_non_tensor(td.batch_dims, operand.ndim))
    results = _run(op, leaves, operand, False, kwargs, reflected)
    if flat:
        return td._new_like(dict(zip(storage, results)))
    return rebuild(td, iter(results), td._batch_size)


def _grown_non_tensor(n_batch: int, n_operand: int) -> Callable:
    """Non-tensor leaves under a batch grown by a tensor operand (the new dims in front, like the leaves')."""
    extra = max(n_operand - n_batch, 0)

    def grow(leaf: Any, batch_size: torch.Size) -> Any:
        if leaf.batch_size == batch_size:
            return leaf
        if isinstance(leaf, NonTensorData):
            return leaf._with_batch_size(batch_size)

        def spread(grid: torch.Tensor) -> torch.Tensor:
            return grid.view((1,) * extra + grid.shape).expand(batch_size)

        return leaf._batch_op(spread)

    return grow


def _non_tensor_comparison(pairs: dict, equal: bool) -> Callable:
    """``==``/``!=`` on non-tensor entries: a bool tensor of the batch shape comparing the values."""

    def compare(leaf: Any, batch_size: torch.Size) -> Any:
        other = pairs.get(id(leaf))
        if other is None:
            return keep_non_tensor(leaf, batch_size)
        mine, theirs = _values_over(leaf, batch_size), _values_over(other, batch_size)
        same = torch.tensor([a == b for a, b in zip(mine, theirs)], dtype=torch.bool).view(batch_size)
        return same if equal else ~same

    return compare


def _values_over(leaf: Any, batch_size: torch.Size) -> list:
    """The values of a non-tensor leaf, one per element of ``batch_size`` (broadcast from the left)."""
    if isinstance(leaf, NonTensorData):
        return [leaf.data] * batch_size.numel()
    grid = torch.arange(len(leaf._flat_values())).view(leaf.batch_size)
    grid = grid.view((1,) * (len(batch_size) - grid.ndim) + grid.shape).expand(batch_size)
    values = leaf._flat_values()
    return [values[i] for i in grid.reshape(-1).tolist()]


def binary_(td: Any, other: Any, op: PointwiseOp, kwargs: dict) -> Any:
    """``op`` in place on every leaf; returns ``td`` (:data:`UNSUPPORTED` for a bad operand type).

    Every leaf is checked (shapes, and dtypes through :func:`preflight`) before
    the first one is written, so a failing op leaves ``td`` unchanged.
    """
    if op.inplace is None:
        raise TypeError(f"{op.name} has no in-place form.")
    operand = as_operand(other)
    if operand is UNSUPPORTED:
        return UNSUPPORTED
    batch_size = td._batch_size
    paired = True
    if isinstance(operand, TensorCollection):
        pairs = TdOperands(td, operand)
        if pairs.batch_size != batch_size:
            raise grow_error(batch_size, pairs.batch_size)
        leaves, others = pairs.leaves, pairs.others
        check_inplace_shapes(leaves, others)
    else:
        leaves, _ = leaves_of(td)
        if isinstance(operand, _Tensor) and operand.ndim:
            leaves, others, new_batch = tensor_operands(batch_size, leaves, operand)
            if new_batch != batch_size:
                raise grow_error(batch_size, new_batch)
        elif isinstance(operand, _Tensor):
            others = [operand] * len(leaves)
        else:
            others, paired = operand, False
    if not leaves:
        return td
    leaves, others = distinct_leaves(leaves, others)
    _preflight_binary(op, leaves, others, paired, kwargs)
    if op.stackable and not kwargs and not paired and run_stacked_(op.inplace, leaves, others):
        return td
    if op.foreach_ is not None and not kwargs:
        op.foreach_(leaves, others)
    elif paired:
        for leaf, item in zip(leaves, others):
            op.inplace(leaf, item, **kwargs)
    else:
        for leaf in leaves:
            op.inplace(leaf, others, **kwargs)
    return td


def _preflight_binary(op: PointwiseOp, leaves: list, others: Any, paired: bool, kwargs: dict) -> None:
    if paired:
        distinct = list({(leaf.dtype, item.dtype, item.ndim == 0): (leaf, item)
                         for leaf, item in zip(leaves, others)}.values())
    else:
        distinct = [(leaf, others) for leaf in leaves_by_dtype(leaves)]
    extra = tuple(kwargs.items())
    inplace = op.inplace
    assert inplace is not None
    for leaf, item in distinct:
        preflight((op.name, leaf.dtype, leaf.device.type, describe(item), extra),
                  lambda: inplace(torch.empty(0, dtype=leaf.dtype, device=leaf.device),
                                  empty_like_operand(item), **kwargs))


def unary(td: Any, op: PointwiseOp, args: tuple, kwargs: dict) -> Any:
    """``op(leaf, *args, **kwargs)`` for every leaf."""
    leaves, flat = leaves_of(td)
    results: Optional[list] = None
    if op.foreach is not None and not args and not kwargs and leaves:
        try:
            results = list(op.foreach(leaves))
        except _NO_FALLBACK:
            results = None  # the loop below gives torch's own error
    if results is None:
        fn = op.per_leaf
        results = [fn(leaf, *args, **kwargs) for leaf in leaves]
    return keep_lock(td, finish(td, results, flat))


def unary_(td: Any, op: PointwiseOp, args: tuple, kwargs: dict) -> Any:
    """``op`` in place on every leaf (checked first, see :func:`binary_`); returns ``td``."""
    if op.inplace is None:
        raise TypeError(f"{op.name} has no in-place form.")
    leaves, _ = leaves_of(td)
    if not leaves:
        return td
    leaves, _ = distinct_leaves(leaves)
    extra = (args, tuple(kwargs.items()))
    fn: Callable = op.inplace
    for leaf in leaves_by_dtype(leaves):
        preflight((op.name, leaf.dtype, leaf.device.type, extra),
                  lambda: fn(torch.empty(0, dtype=leaf.dtype, device=leaf.device), *args, **kwargs))
    if op.foreach_ is not None and not args and not kwargs:
        op.foreach_(leaves)
    else:
        for leaf in leaves:
            fn(leaf, *args, **kwargs)
    return td


# --------------------------------------------------------------------------- fill, zero, all / any


def fill_(td: Any, key: Any, value: Any) -> Any:
    """Fill the entry at ``key`` (every leaf of it, for a sub-TensorDict) with ``value``, in place."""
    entry = td._get_path(key_to_tuple(key))
    if isinstance(entry, TensorCollection):
        leaves = tensor_leaves(unwrap(entry))
    elif isinstance(entry, _Tensor):
        leaves = [entry]
    else:
        raise TypeError(f"fill_(): the entry {key!r} holds non-tensor data.")
    for leaf in leaves_by_dtype(leaves):
        preflight(("fill_", leaf.dtype, leaf.device.type, describe(value)),
                  lambda: torch.empty(0, dtype=leaf.dtype, device=leaf.device).fill_(empty_like_operand(value)))
    for leaf in leaves:
        leaf.fill_(value)
    return td


def zero_(td: Any) -> Any:
    """Zero every tensor leaf in place; returns ``td``."""
    leaves, _ = leaves_of(td)
    if leaves:
        torch._foreach_zero_(leaves)
    return td


def all_any(td: Any, dim: Any, want_all: bool) -> Any:
    """``all()``/``any()``: a Python bool over every leaf, or a TensorDict reduced over batch ``dim``."""
    if dim is None:
        for leaf in tensor_leaves(td):
            if bool(leaf.all() if want_all else leaf.any()) != want_all:
                return not want_all
        return want_all
    return reduce(td, "all" if want_all else "any", dim, False, {})


# --------------------------------------------------------------------------- the mixin


def _binary_call(td: Any, other: Any, name: str, kwargs: dict, inplace: bool = False, default: Any = None) -> Any:
    """``binary``/``binary_`` for a named method: an unsupported operand type is a TypeError. ``default``
    pairs a TensorDict operand with other keys (see ``_binary_default``)."""
    op = BINARY_OPS[name]
    if default is not None and isinstance(other, TensorCollection):
        from ._binary_default import binary_with_default

        return binary_with_default(td, other, op.per_leaf, kwargs, default)
    result = binary_(td, other, op, kwargs) if inplace else binary(td, other, op, kwargs)
    if result is UNSUPPORTED:
        suffix = "_" if inplace else ""
        raise TypeError(f"{name}{suffix}(): unsupported operand type {type(other).__name__} for a TensorDict.")
    return result


#: The binary ops whose out-of-place form takes upstream's ``default=`` (keys only one operand holds).
_TAKES_DEFAULT = frozenset({"mul", "pow", "maximum", "minimum", "clamp_min", "clamp_max", "logical_and",
                            "bitwise_and"})


def _make_binary(name: str, inplace: bool) -> Callable:
    method: Callable
    if not inplace and name in _TAKES_DEFAULT:
        def with_default(self: Any, other: Any, *, default: Any = None) -> Any:
            return _binary_call(self, other, name, {}, default=default)
        method = with_default
    else:
        def plain(self: Any, other: Any) -> Any:
            return _binary_call(self, other, name, {}, inplace)
        method = plain

    method.__name__ = method.__qualname__ = f"{name}_" if inplace else name
    method.__doc__ = (f"``{name}_`` in place on every leaf (allowed on a locked TensorDict); returns self."
                      if inplace else
                      f"``torch.{name}(leaf, other)`` on every leaf; ``other`` is a number, a tensor (broadcast "
                      f"from the left over the batch dims) or a TensorDict with the same keys.")
    return method


def _make_dunder(op: PointwiseOp, reflected: bool = False, inplace: bool = False) -> Callable:
    # The op is read from the table by name, not captured: torch.compile can't wrap a PointwiseOp
    # it finds in the closure of a method reached without a source (e.g. on an intermediate result).
    name = op.name
    if inplace:
        def dunder(self: Any, other: Any) -> Any:
            result = binary_(self, other, BINARY_OPS[name], {})
            return NotImplemented if result is UNSUPPORTED else result
    else:
        def dunder(self: Any, other: Any) -> Any:
            result = binary(self, other, BINARY_OPS[name], {}, reflected)
            return NotImplemented if result is UNSUPPORTED else result
    return dunder


def _make_unary(op: PointwiseOp, inplace: bool) -> Callable:
    name = op.name  # looked up by name, as in _make_dunder (torch.compile)
    if inplace:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return unary_(self, UNARY_OPS[name], args, kwargs)
    else:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return unary(self, UNARY_OPS[name], args, kwargs)

    method.__name__ = method.__qualname__ = f"{op.name}_" if inplace else op.name
    method.__doc__ = (f"``{op.name}_`` in place on every leaf; returns self." if inplace
                      else f"``torch.{op.name}`` applied to every leaf.")
    return method


#: Python operators: (dunder stem, op name, has a reflected form).
_OPERATORS = (
    ("add", "add", True), ("sub", "sub", True), ("mul", "mul", True), ("truediv", "div", True),
    ("floordiv", "floor_divide", True), ("mod", "remainder", True), ("pow", "pow", True),
    ("and", "bitwise_and", True), ("or", "bitwise_or", True), ("xor", "bitwise_xor", True),
    ("eq", "eq", False), ("ne", "ne", False), ("lt", "lt", False), ("le", "le", False),
    ("gt", "gt", False), ("ge", "ge", False),
)


class OpsMixin(ReductionsMixin):
    """Pointwise arithmetic, comparisons and reductions; most methods come from the op tables.

    >>> import torch
    >>> from torchdict import TensorDict
    >>> td = TensorDict(a=torch.ones(3), b=torch.zeros(3, 2), batch_size=[3])
    >>> (td * 2 + 1)["a"]
    tensor([3., 3., 3.])
    >>> (td + torch.arange(3.))["b"]
    tensor([[0., 0.],
            [1., 1.],
            [2., 2.]])
    >>> (td == td.clone()).all()
    True
    """

    __slots__ = ()

    __hash__ = None  # type: ignore[assignment]  # ``==`` is elementwise, so a TensorDict isn't hashable

    def __neg__(self) -> Any:
        return unary(self, UNARY_OPS["neg"], (), {})

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        return unary(self, UNARY_OPS["abs"], (), {})

    def __invert__(self) -> Any:
        return unary(self, UNARY_OPS["bitwise_not"], (), {})

    def add(self, other: Any, alpha: Any = None, *, default: Any = None) -> Any:
        """``torch.add(leaf, other, alpha=alpha)`` on every leaf.

        With a TensorDict ``other`` whose keys differ, ``default="intersection"`` adds the leaves both hold,
        and a tensor ``default`` stands in for the missing side (the result holds the keys of both).

        >>> TensorDict(a=torch.ones(2)).add(1, alpha=2)["a"]
        tensor([3., 3.])
        >>> sorted(TensorDict(a=1, b=1).add(TensorDict(b=1, c=1), default="intersection").keys())
        ['b']
        """
        return _binary_call(self, other, "add", {} if alpha is None else {"alpha": alpha}, default=default)

    def add_(self, other: Any, alpha: Any = None) -> Any:
        """``leaf.add_(other, alpha=alpha)`` on every leaf; returns self (allowed when locked).

        >>> td = TensorDict(a=torch.zeros(2))
        >>> td.add_(1, alpha=3)["a"]
        tensor([3., 3.])
        """
        return _binary_call(self, other, "add", {} if alpha is None else {"alpha": alpha}, inplace=True)

    def sub(self, other: Any, alpha: Any = None, *, default: Any = None) -> Any:
        """``torch.sub(leaf, other, alpha=alpha)`` on every leaf (``default`` as in :meth:`add`)."""
        return _binary_call(self, other, "sub", {} if alpha is None else {"alpha": alpha}, default=default)

    def sub_(self, other: Any, alpha: Any = None) -> Any:
        """``leaf.sub_(other, alpha=alpha)`` on every leaf; returns self."""
        return _binary_call(self, other, "sub", {} if alpha is None else {"alpha": alpha}, inplace=True)

    def rsub(self, other: Any, *, alpha: Any = None, default: Any = None) -> Any:
        """``torch.rsub(leaf, other, alpha=alpha)`` (``other - alpha * leaf``) on every leaf.

        >>> TensorDict(a=torch.ones(2)).rsub(10, alpha=2)["a"]
        tensor([8., 8.])
        """
        return _binary_call(self, other, "rsub", {} if alpha is None else {"alpha": alpha}, default=default)

    def div(self, other: Any, *, rounding_mode: Optional[str] = None, default: Any = None) -> Any:
        """``torch.div(leaf, other, rounding_mode=...)`` on every leaf (``default`` as in :meth:`add`)."""
        return _binary_call(self, other, "div", {} if rounding_mode is None else {"rounding_mode": rounding_mode},
                            default=default)

    def div_(self, other: Any, *, rounding_mode: Optional[str] = None) -> Any:
        """``leaf.div_(other, rounding_mode=...)`` on every leaf; returns self."""
        return _binary_call(self, other, "div", {} if rounding_mode is None else {"rounding_mode": rounding_mode},
                            inplace=True)

    def clamp(self, min: Any = None, max: Any = None, *, out: Any = None) -> Any:
        """``torch.clamp`` on every leaf; bounds are numbers, tensors (from the left) or TensorDicts.

        ``out`` receives the result in place (and is returned).

        >>> TensorDict(a=torch.tensor([-2., 0., 2.])).clamp(-1, 1)["a"]
        tensor([-1.,  0.,  1.])
        """
        result = _masking.clamp(self, min, max)
        return result if out is None else _into_out(out, result)

    def clamp_(self, min: Any = None, max: Any = None) -> Any:
        """``clamp`` in place; returns self."""
        return _masking.clamp(self, min, max, inplace=True)

    def lerp(self, end: Any, weight: Any) -> Any:
        """``torch.lerp(leaf, end, weight)`` on every leaf.

        >>> TensorDict(a=torch.zeros(2)).lerp(TensorDict(a=torch.ones(2)), 0.25)["a"]
        tensor([0.2500, 0.2500])
        """
        return keep_lock(self, _masking.lerp(self, end, weight))

    def lerp_(self, end: Any, weight: Any) -> Any:
        """``lerp`` in place; returns self."""
        return _masking.lerp(self, end, weight, inplace=True)

    def where(self, condition: torch.Tensor, other: Any, *, out: Any = None, pad: Any = None,
              update_batch_size: bool = False) -> Any:
        """``torch.where(condition, leaf, other)`` per leaf; the condition is broadcast from the left.

        ``pad`` fills the keys a TensorDict ``other`` lacks; ``out`` takes the result's entries (through
        ``out.update(result, update_batch_size=update_batch_size)``, as upstream) and is returned.

        >>> td = TensorDict(a=torch.ones(3, 2), batch_size=[3])
        >>> td.where(torch.tensor([True, False, True]), 0)["a"][:, 0]
        tensor([1., 0., 1.])
        """
        if pad is not None and isinstance(other, TensorCollection):
            other = _with_missing_keys(self, unwrap(other), pad)
        result = _masking.where(self, condition, other)
        if out is not None:
            out.update(result, update_batch_size=update_batch_size)
            return out
        return result

    def masked_fill(self, mask: torch.Tensor, value: Any) -> Any:
        """``leaf.masked_fill(mask, value)`` per leaf; the mask is broadcast from the left over the batch.

        >>> td = TensorDict(a=torch.zeros(3, 2), batch_size=[3])
        >>> td.masked_fill(torch.tensor([True, False, False]), 5.0)["a"][:, 1]
        tensor([5., 0., 0.])
        """
        return _masking.masked_fill(self, mask, value)

    def masked_select(self, mask: torch.Tensor, *, inplace: bool = False) -> Any:
        """The elements where ``mask`` (a bool tensor of the leading batch dims) is True, as ``td[mask]``;
        ``inplace=True`` makes this TensorDict hold them (its identity and nested TensorDicts kept).

        >>> td = TensorDict(a=torch.arange(3), batch_size=[3])
        >>> td.masked_select(torch.tensor([True, False, True]))["a"]
        tensor([0, 2])
        """
        if not isinstance(mask, torch.Tensor) or mask.dtype is not torch.bool:
            raise RuntimeError(f"masked_select: expected a bool tensor for the mask, got {_describe_mask(mask)}.")
        if inplace:
            from ._inplace_results import take_over

            self._check_unlocked()
            return take_over(self, self[mask])
        return self[mask]

    def masked_fill_(self, mask: torch.Tensor, value: Any) -> Any:
        """``masked_fill`` in place (allowed when locked); returns self."""
        return _masking.masked_fill(self, mask, value, inplace=True)

    def fill_(self, key: Any, value: Any) -> Any:
        """Fill the entry at ``key`` (all its leaves, for a sub-TensorDict) with ``value``; returns self.

        >>> TensorDict(a=torch.zeros(2)).fill_("a", 3)["a"]
        tensor([3., 3.])
        """
        return fill_(self, key, value)

    def zero_(self) -> Any:
        """Zero every tensor leaf in place (allowed when locked); returns self.

        >>> TensorDict(a=torch.ones(2)).zero_()["a"]
        tensor([0., 0.])
        """
        return zero_(self)

    def all(self, dim: Any = None) -> Any:
        """True when every element of every leaf is true; with ``dim`` (batch dims), a TensorDict.

        >>> td = TensorDict(a=torch.tensor([True, False]), batch_size=[2])
        >>> td.all(), td.any()
        (False, True)
        >>> td.all(0)["a"]
        tensor(False)
        """
        return all_any(self, dim, True)

    def any(self, dim: Any = None) -> Any:
        """True when some element of some leaf is true; with ``dim`` (batch dims), a TensorDict."""
        return all_any(self, dim, False)


def _into_out(out: Any, result: Any) -> Any:
    """``out=``: the result copied into ``out``'s tensors (checked before the first write); returns ``out``."""
    out.update_(result)
    return out


def _with_missing_keys(td: Any, other: Any, pad: Any) -> Any:
    """A shallow copy of ``other`` with the tensor leaves only ``td`` holds filled with ``pad``."""
    result = other.copy()
    present = set(result.keys(include_nested=True, leaves_only=True))
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        if key not in present and isinstance(leaf, _Tensor):
            result.set(key, torch.full_like(leaf, pad))
    return result


def _describe_mask(mask: Any) -> str:
    return f"a {mask.dtype} tensor" if isinstance(mask, torch.Tensor) else type(mask).__name__


def _install() -> None:
    """Add the generated methods and operators to :class:`OpsMixin` (hand-written methods win)."""
    handwritten = set(vars(OpsMixin))

    def put(name: str, method: Callable) -> None:
        if name not in handwritten:
            setattr(OpsMixin, name, method)

    for name, op in BINARY_OPS.items():
        put(name, _make_binary(name, inplace=False))
        if op.inplace is not None:
            put(f"{name}_", _make_binary(name, inplace=True))
    for name, op in UNARY_OPS.items():
        put(name, _make_unary(op, inplace=False))
        if op.inplace is not None:
            put(f"{name}_", _make_unary(op, inplace=True))
    for stem, name, has_reflected in _OPERATORS:
        op = BINARY_OPS[name]
        put(f"__{stem}__", _make_dunder(op))
        if has_reflected:
            put(f"__r{stem}__", _make_dunder(op, reflected=True))
        if op.inplace is not None and stem not in ("eq", "ne", "lt", "le", "gt", "ge"):
            put(f"__i{stem}__", _make_dunder(op, inplace=True))
    put("mod", getattr(OpsMixin, "remainder"))  # upstream's name for remainder (it has no ``mod_``)
    # ``1 + td`` is ``td + 1``: commutative ops skip the reflected loop and use foreach.
    setattr(OpsMixin, "__radd__", vars(OpsMixin)["__add__"])
    setattr(OpsMixin, "__rmul__", vars(OpsMixin)["__mul__"])
    for alias, name in (("multiply", "mul"), ("subtract", "sub"), ("divide", "div"), ("true_divide", "div"),
                        ("clip", "clamp"), ("absolute", "abs"), ("negative", "neg"), ("greater", "gt"),
                        ("greater_equal", "ge"), ("less", "lt"), ("less_equal", "le"), ("not_equal", "ne")):
        put(alias, getattr(OpsMixin, name))
        if hasattr(OpsMixin, f"{name}_"):
            put(f"{alias}_", getattr(OpsMixin, f"{name}_"))


_install()


# --------------------------------------------------------------------------- torch.<fn>(td, ...)


def _torch_binary(op: PointwiseOp) -> Callable:
    """``torch.<op>(input, other, ...)`` with a TensorDict as either argument (a partial, not a closure: these
    handlers are made at import, one object each)."""
    return partial(_torch_binary_call, op)


def _torch_binary_call(op: PointwiseOp, input: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(input, TensorCollection):
        return getattr(input, op.name)(other, *args, **kwargs)
    if args:
        raise TypeError(f"torch.{op.name}() with a TensorDict second takes keyword options only.")
    result = binary(unwrap(other), input, _swapped_op(op), kwargs, reflected=True)
    if result is UNSUPPORTED:
        raise TypeError(f"torch.{op.name}(): unsupported operand type {type(input).__name__}.")
    return result


def _swapped_op(op: PointwiseOp) -> PointwiseOp:
    """``op`` with its operands swapped (``torch.sub(t, td)``: the TensorDict's leaves come second)."""
    swapped = PointwiseOp(op.name, inplace=False)
    swapped.reflected = partial(_call_swapped, op.per_leaf)
    return swapped


def _call_swapped(per_leaf: Callable, leaf: Any, item: Any, **kwargs: Any) -> Any:
    return per_leaf(item, leaf, **kwargs)


def _register_torch_functions() -> None:
    from ._torch_function import TORCH_FUNCTIONS, dispatch_to_method

    for name, op in BINARY_OPS.items():
        function = getattr(torch, name, None)
        if function is not None:
            TORCH_FUNCTIONS[function] = _torch_binary(op)
    for name, alias in (("mul", "multiply"), ("sub", "subtract"), ("div", "divide"), ("div", "true_divide"),
                        ("gt", "greater"), ("ge", "greater_equal"), ("lt", "less"), ("le", "less_equal"),
                        ("ne", "not_equal")):
        TORCH_FUNCTIONS[getattr(torch, alias)] = _torch_binary(BINARY_OPS[name])
    methods = list(UNARY_OPS) + [f"{name}_" for name, op in UNARY_OPS.items() if op.inplace is not None]
    methods += ["sum", "nansum", "mean", "nanmean", "prod", "std", "var", "amax", "amin", "max", "min", "all",
                "any", "clamp", "clamp_", "clip", "lerp", "masked_fill", "zero_", "absolute", "negative"]
    methods += ["logsumexp", "quantile", "cummax", "cummin"]
    for name in methods:
        function = getattr(torch, name, None)
        if function is not None and function not in TORCH_FUNCTIONS:
            dispatch_to_method(function, name)
    TORCH_FUNCTIONS[torch.norm] = _torch_norm
    TORCH_FUNCTIONS[torch.linalg.vector_norm] = _torch_vector_norm


def _torch_norm(input: Any, p: Any = "fro", dim: Any = None, keepdim: bool = False, out: Any = None,
                dtype: Optional[torch.dtype] = None) -> Any:
    # torch.norm hands every argument over by keyword, out=None included.
    if out is not None:
        raise TypeError("torch.norm(td, out=...) is not supported: use the TensorDict it returns.")
    return input.norm(dim, keepdim, p=p, dtype=dtype)


def _torch_vector_norm(x: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                       dtype: Optional[torch.dtype] = None, out: Any = None) -> Any:
    # vector_norm's second positional argument is the order, not the dim.
    if out is not None:
        raise TypeError("torch.linalg.vector_norm(td, out=...) is not supported: use the TensorDict it returns.")
    return x.norm(dim, keepdim, p=ord, dtype=dtype)


_register_torch_functions()
