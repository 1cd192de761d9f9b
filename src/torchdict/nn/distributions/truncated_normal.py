"""Normal distributions restricted to an interval ``[a, b]``, with reparameterized samples.

Sampling is inverse-CDF: a uniform draw in ``(eps, 1 - eps)`` is mapped through the normal quantile function
restricted to ``[Phi(a), Phi(b)]``. The CDF values are kept inside ``[eps, 1 - eps]`` so far-out bounds and
infinite bounds stay finite.
"""
from __future__ import annotations

import math
import warnings
from numbers import Number
from typing import Any, Sequence

import torch
from torch.distributions import Distribution, constraints
from torch.distributions.utils import broadcast_all

__all__ = ["TruncatedNormal", "TruncatedStandardNormal"]

_SQRT_2 = math.sqrt(2)
_INV_SQRT_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_LOG_INV_SQRT_2PI = math.log(_INV_SQRT_2PI)
# Entropy of the standard normal, log(sqrt(2 pi e)).
_LOG_SQRT_2PI_E = 0.5 * math.log(2 * math.pi * math.e)


def _any_true(mask: torch.Tensor) -> bool:
    """``mask.any()`` as a bool; ``False`` where it cannot be read (batched under ``torch.vmap``)."""
    try:
        return bool(mask.any())
    except RuntimeError:
        if torch._C._functorch.is_functorch_wrapped_tensor(mask):
            return False
        raise


def _finite(x: torch.Tensor) -> torch.Tensor:
    # An infinite bound times its (zero) density must count as 0, not nan: use the largest finite value.
    return torch.nan_to_num(x, nan=math.nan)


class TruncatedStandardNormal(Distribution):
    """The standard normal (mean 0, std 1) restricted to ``[a, b]``.

    ``a`` and ``b`` broadcast together into the batch shape; they must share a dtype and satisfy ``a < b``
    everywhere (``ValueError`` otherwise). ``auc`` is the standard-normal mass between them.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions.truncated_normal import TruncatedStandardNormal
        >>> dist = TruncatedStandardNormal(torch.zeros(2), torch.tensor([1.0, 2.0]))
        >>> dist.auc
        tensor([0.3413, 0.4772])
    """

    arg_constraints = {"a": constraints.real, "b": constraints.real}
    has_rsample = True
    eps = 1e-6

    def __init__(self, a: float | torch.Tensor, b: float | torch.Tensor, validate_args: bool | None = None) -> None:
        self.a, self.b = broadcast_all(a, b)
        both_numbers = isinstance(a, Number) and isinstance(b, Number)
        super().__init__(torch.Size() if both_numbers else self.a.size(), validate_args=validate_args)
        if self.a.dtype != self.b.dtype:
            raise ValueError("Truncation bounds types are different")
        if _any_true(self.a >= self.b):
            raise ValueError("Incorrect truncation range")
        eps = self.eps
        self._dtype_min_gt_0 = eps
        self._dtype_max_lt_1 = 1 - eps
        pdf_a, pdf_b = self._little_phi(self.a), self._little_phi(self.b)
        self._little_phi_a, self._little_phi_b = pdf_a, pdf_b
        self._big_phi_a = self._big_phi(self.a)
        self._big_phi_b = self._big_phi(self.b)
        self._Z = (self._big_phi_b - self._big_phi_a).clamp(eps, 1 - eps)
        self._log_Z = self._Z.log()
        # (b phi(b) - a phi(a)) / Z and (phi(b) - phi(a)) / Z appear in the mean, variance and entropy.
        weighted = (pdf_b * _finite(self.b) - pdf_a * _finite(self.a)) / self._Z
        spread = (pdf_b - pdf_a) / self._Z
        self._lpbb_m_lpaa_d_Z = weighted
        self._mean = -spread
        self._variance = 1 - weighted - spread**2
        self._entropy = _LOG_SQRT_2PI_E + self._log_Z - 0.5 * weighted

    @constraints.dependent_property
    def support(self) -> constraints.Constraint:
        return constraints.interval(self.a, self.b)

    @property
    def mean(self) -> torch.Tensor:
        return self._mean

    @property
    def variance(self) -> torch.Tensor:
        return self._variance

    def entropy(self) -> torch.Tensor:
        return self._entropy

    @property
    def auc(self) -> torch.Tensor:
        """The standard-normal mass between ``a`` and ``b`` (before truncation)."""
        return self._Z

    @staticmethod
    def _little_phi(x: torch.Tensor) -> torch.Tensor:
        return torch.exp(-0.5 * x**2) * _INV_SQRT_2PI

    def _big_phi(self, x: torch.Tensor) -> torch.Tensor:
        cdf = 0.5 * (1 + torch.erf(x * _INV_SQRT_2))
        return cdf.clamp(self.eps, 1 - self.eps)

    @staticmethod
    def _inv_big_phi(p: torch.Tensor) -> torch.Tensor:
        return _SQRT_2 * torch.erfinv(2 * p - 1)

    def cdf(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return self._standard_cdf(value)

    def _standard_cdf(self, std_value: torch.Tensor) -> torch.Tensor:
        return ((self._big_phi(std_value) - self._big_phi_a) / self._Z).clamp(0, 1)

    def icdf(self, value: torch.Tensor) -> torch.Tensor:
        p = (self._big_phi_a + value * self._Z).clamp(self.eps, 1 - self.eps)
        return self._inv_big_phi(p)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return _LOG_INV_SQRT_2PI - self._log_Z - 0.5 * value**2

    def rsample(self, sample_shape: torch.Size | Sequence[int] | None = None) -> torch.Tensor:
        shape = self._extended_shape(torch.Size(sample_shape) if sample_shape is not None else torch.Size())
        uniform = torch.empty(shape, device=self.a.device).uniform_(self._dtype_min_gt_0, self._dtype_max_lt_1)
        return self.icdf(uniform)


class TruncatedNormal(TruncatedStandardNormal):
    """A normal of mean ``loc`` and std ``scale`` (floored at ``1e-6``) restricted to ``[a, b]``.

    ``a`` and ``b`` are in the units of the values; ``mean``, ``variance``, ``entropy``, ``log_prob``, ``cdf``
    and ``icdf`` are those of the truncated distribution. Samples are clamped into ``[a, b]`` with an
    identity gradient.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions import TruncatedNormal
        >>> TruncatedNormal(loc=5.0, scale=1.0, a=4.0, b=6.0).mean
        tensor(5.)
    """

    has_rsample = True

    def __init__(
        self,
        loc: float | torch.Tensor,
        scale: float | torch.Tensor,
        a: float | torch.Tensor,
        b: float | torch.Tensor,
        validate_args: bool | None = None,
    ) -> None:
        self.loc, scale, a, b = broadcast_all(loc, scale, a, b)
        self.scale = scale.clamp_min(self.eps)
        self._non_std_a = a
        self._non_std_b = b
        super().__init__((a - self.loc) / self.scale, (b - self.loc) / self.scale, validate_args=validate_args)
        self._log_scale = self.scale.log()
        self._mean = self._mean * self.scale + self.loc
        self._variance = self._variance * self.scale**2
        self._entropy = self._entropy + self._log_scale

    @constraints.dependent_property
    def support(self) -> constraints.Constraint:
        return constraints.interval(self._non_std_a, self._non_std_b)

    def _standardize(self, value: torch.Tensor) -> torch.Tensor:
        std_value = (value - self.loc) / self.scale
        if self._validate_args:
            # The support is in the units of the values, so check the value, in the dtype of the result.
            self._validate_sample(torch.as_tensor(value, dtype=std_value.dtype, device=std_value.device))
        return std_value

    def cdf(self, value: torch.Tensor) -> torch.Tensor:
        return self._standard_cdf(self._standardize(value))

    def icdf(self, value: torch.Tensor) -> torch.Tensor:
        sample = super().icdf(value) * self.scale + self.loc
        low = self._non_std_a.detach().expand_as(sample)
        high = self._non_std_b.detach().expand_as(sample)
        clamped = torch.minimum(torch.maximum(sample.detach(), low), high)
        # Clamped values, with the gradient of the unclamped sample.
        return clamped + (sample - sample.detach())

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        std_value = self._standardize(value)
        return _LOG_INV_SQRT_2PI - self._log_Z - 0.5 * std_value**2 - self._log_scale


_DEPRECATED_CONSTANTS = {
    "CONST_SQRT_2": _SQRT_2,
    "CONST_INV_SQRT_2PI": _INV_SQRT_2PI,
    "CONST_INV_SQRT_2": _INV_SQRT_2,
    "CONST_LOG_INV_SQRT_2PI": _LOG_INV_SQRT_2PI,
    "CONST_LOG_SQRT_2PI_E": _LOG_SQRT_2PI_E,
}


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED_CONSTANTS:
        warnings.warn(
            f"{__name__}.{name} is deprecated and will be removed in TensorDict 0.17.",
            DeprecationWarning,
            stacklevel=2,
        )
        return _DEPRECATED_CONSTANTS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
