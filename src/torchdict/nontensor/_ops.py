"""Comparisons, ``where`` and the refused arithmetic of the non-tensor leaves.

``NonTensorOpsMixin`` (a base of ``NonTensorData`` and ``NonTensorStack``) gives upstream's answers for
``==`` / ``!=`` / ``^`` / ``|`` (bool tensors of the batch shape, compared value by value) and ``where``.
Arithmetic and reductions (``add``, ``sum``, ``+``, ``abs``, ...) raise a ``TypeError`` naming the op and
the type: upstream answers them with the leaf unchanged, which hides the mistake.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .. import nontensor as _core
from .._base import BoundCall
from ._members import values_over

if TYPE_CHECKING:
    from ._host import NonTensorHost
else:
    NonTensorHost = object

__all__ = ["NonTensorOpsMixin", "ARITHMETIC_MEMBERS"]


def _bool_result(value: Any, batch_size: torch.Size, device: Any) -> torch.Tensor:
    """A comparison of two values as upstream gives it: tensors and arrays as they come, else a
    bool tensor of the batch shape."""
    if isinstance(value, torch.Tensor):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "shape"):
        return torch.as_tensor(value, device=device)
    return torch.full(batch_size, bool(value), device=device)


def _empty_result(batch_size: torch.Size) -> Any:
    """What upstream answers when a non-tensor leaf meets a number, a tensor or a collection: the
    comparison of two TensorDicts without entries (an empty TensorDict of the batch)."""
    from ..tensordict import TensorDict

    return TensorDict({}, batch_size=batch_size)


def _compared_batch(left: Any, right: Any) -> torch.Size:
    """The batch two compared leaves broadcast to; upstream's RuntimeError when they don't."""
    try:
        return torch.broadcast_shapes(left._batch_size, right._batch_size)
    except RuntimeError as error:
        raise RuntimeError(
            f"Could not compare tensordicts with shapes {left._batch_size} and {right._batch_size}"
        ) from error


def _elementwise(left: Any, right: Any, op: Any) -> torch.Tensor:
    """``op`` value by value over the broadcast batch of two leaves: a bool tensor."""
    shape = _compared_batch(left, right)
    answers = [bool(op(a, b)) for a, b in zip(values_over(left, shape), values_over(right, shape))]
    return torch.tensor(answers, dtype=torch.bool, device=left._device).view(shape)


def _is_collection_like(other: Any) -> bool:
    from .._base import TensorCollection

    return isinstance(other, (TensorCollection, torch.Tensor, int, float, complex)) or (
        type(other).__module__ == "numpy" and hasattr(other, "shape"))


def _compare(self: Any, other: Any, op: Any, fallback: bool) -> Any:
    """``self <op> other`` for ``==`` / ``!=`` (``fallback``: the answer for an unrelated object)."""
    is_data = isinstance(self, _core.NonTensorData)
    if isinstance(other, _core.NonTensorData):
        if not is_data:
            return _compare(other, self, op, fallback)  # upstream reflects the comparison to the data
        return _bool_result(op(self._data, other._data), self._batch_size, self._device)
    if type(other) is _core.NonTensorStack:
        if is_data:
            data = self._data
            if (other._batch_size == self._batch_size and self._batch_size.numel()
                    and not isinstance(data, torch.Tensor) and not hasattr(data, "__array__")):
                return _elementwise(self, other, op)
            # Other cases go through upstream's comparison of the (empty) TensorDicts of the two.
            return _empty_result(_compared_batch(self, other))
        return _elementwise(self, other, op)
    if _is_collection_like(other):
        return _empty_result(self._batch_size)
    return fallback


# Members that compute on tensor values: refused (a TypeError naming the op) rather than answered
# with the leaf unchanged, as upstream does.
ARITHMETIC_MEMBERS: tuple = (
    "abs", "abs_", "acos", "acos_", "add", "add_", "addcdiv", "addcdiv_", "addcmul", "addcmul_", "all",
    "amax", "amin", "any", "asin", "asin_", "atan", "atan_", "bitwise_and", "ceil", "ceil_", "clamp",
    "clamp_", "clamp_max", "clamp_max_", "clamp_min", "clamp_min_", "cos", "cos_", "cosh", "cosh_",
    "cummax", "cummin", "div", "div_", "erf", "erf_", "erfc", "erfc_", "exp", "exp_", "expm1", "expm1_",
    "fill_", "floor", "floor_", "frac", "frac_", "isfinite", "isnan", "isneginf", "isposinf", "isreal",
    "lerp", "lerp_", "lgamma", "lgamma_", "log", "log10", "log10_", "log1p", "log1p_", "log2", "log2_",
    "log_", "logical_and", "logsumexp", "masked_fill", "masked_fill_", "max", "maximum", "maximum_",
    "mean", "min", "minimum", "minimum_", "mod", "mul", "mul_", "nanmean", "nansum", "neg", "neg_",
    "norm", "pow", "pow_", "prod", "quantile", "reciprocal", "reciprocal_", "round", "round_", "rsub",
    "sigmoid", "sigmoid_", "sign", "sign_", "sin", "sin_", "sinh", "sinh_", "softmax", "sqrt", "sqrt_",
    "std", "sub", "sub_", "sum", "tan", "tan_", "tanh", "tanh_", "trunc", "trunc_", "var", "zero_",
)
_OPERATORS: dict = {
    "__add__": "+", "__radd__": "+", "__iadd__": "+=", "__sub__": "-", "__rsub__": "-", "__isub__": "-=",
    "__mul__": "*", "__rmul__": "*", "__imul__": "*=", "__truediv__": "/", "__rtruediv__": "/",
    "__itruediv__": "/=", "__floordiv__": "//", "__rfloordiv__": "//", "__ifloordiv__": "//=",
    "__mod__": "%", "__rmod__": "%", "__imod__": "%=", "__pow__": "**", "__rpow__": "**", "__ipow__": "**=",
    "__matmul__": "@", "__rmatmul__": "@", "__neg__": "unary -", "__pos__": "unary +", "__abs__": "abs()",
    "__invert__": "~", "__and__": "&", "__rand__": "&", "__iand__": "&=", "__lt__": "<", "__le__": "<=",
    "__gt__": ">", "__ge__": ">=",
}


def _refuse(leaf: Any, shown: str, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(
        f"{shown} is not supported by {type(leaf).__name__}: it holds a Python value "
        f"({type(leaf._first_value()).__name__}), not tensors."
    )


def _refused(name: str, shown: str) -> Any:
    return BoundCall(_refuse, shown)


class NonTensorOpsMixin(NonTensorHost):
    """``==`` / ``!=`` / ``^`` / ``|``, ``where``, and the arithmetic refused with a ``TypeError``."""

    __slots__ = ()

    def where(self, condition: torch.Tensor, other: Any, *, out: Any = None, pad: Any = None,
              update_batch_size: bool = False) -> Any:
        """The value of this leaf where ``condition`` is True, of ``other`` (a non-tensor leaf) elsewhere,
        element by element (as upstream): a ``NonTensorData`` result when a ``NonTensorData`` gives one
        value everywhere, else a ``NonTensorStack``. Any other ``other`` leaves the values as they are."""
        from .._indexing import same_value

        if not _core.is_non_tensor(other) or (
                isinstance(other, _core.NonTensorData) and isinstance(self, _core.NonTensorData)
                and same_value(self._data, other._data)):
            result = self._shallow()
        else:
            batch = self._batch_size
            try:
                theirs = values_over(other, batch)
            except RuntimeError:
                raise ValueError(f"other of batch size {list(other._batch_size)} cannot be expanded to the batch "
                                 f"size {list(batch)}.") from None
            picks = condition.reshape(condition.shape + (1,) * (len(batch) - condition.ndim)).expand(batch)
            mine = self._flat_values()
            values = [a if pick else b for pick, a, b in zip(picks.reshape(-1).tolist(), mine, theirs)]
            if isinstance(self, _core.NonTensorData) and all(same_value(value, values[0]) for value in values[1:]):
                result = _core.NonTensorData._make(values[0] if values else self._data, batch, self._device,
                                                   self._names)
            else:
                result = _core.NonTensorStack._from_flat(values, batch, self._device)
        if out is None or (type(result) is _core.NonTensorStack and type(out) is not _core.NonTensorStack):
            return result
        return out.update_(result)

    def __eq__(self, other: object) -> Any:
        return _compare(self, other, lambda a, b: a == b, False)

    def __ne__(self, other: object) -> Any:
        return _compare(self, other, lambda a, b: a != b, True)

    def __xor__(self, other: Any) -> Any:
        if _core.is_non_tensor(other):
            if isinstance(self, _core.NonTensorData) and isinstance(other, _core.NonTensorData):
                return _bool_result(self._data ^ other._data, self._batch_size, self._device)
            return _elementwise(self, other, lambda a, b: a ^ b)
        raise TypeError(f"^ is not supported between {type(self).__name__} and {type(other).__name__}.")

    def __or__(self, other: Any) -> Any:
        if _core.is_non_tensor(other):
            if isinstance(self, _core.NonTensorData) and isinstance(other, _core.NonTensorData):
                return _bool_result(self._data | other._data, self._batch_size, self._device)
            return _elementwise(self, other, lambda a, b: a | b)
        raise TypeError(f"| is not supported between {type(self).__name__} and {type(other).__name__}.")

    __hash__ = None  # type: ignore[assignment]  # ``==`` compares element by element, as on a tensor

    def _first_value(self) -> Any:
        if isinstance(self, _core.NonTensorData):
            return self._data
        return self._values[0] if self._values else None


for _name in ARITHMETIC_MEMBERS:
    setattr(NonTensorOpsMixin, _name, _refused(_name, f"{_name}()"))
for _name, _shown in _OPERATORS.items():
    setattr(NonTensorOpsMixin, _name, _refused(_name, _shown))
del _name, _shown
