"""Continuous-action helpers: modules that produce normal-distribution parameters, and the `Delta` distribution."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import distributions as D, nn

from .utils import mappings

__all__ = ["NormalParamExtractor", "AddStateIndependentNormalScale", "Delta"]


class NormalParamExtractor(nn.Module):
    """Splits the last dim of its first input in two: a location, and a scale made positive.

    The second half goes through ``mappings(scale_mapping)`` and is floored at ``scale_lb``. With an odd
    size the location gets the extra element. Further inputs are passed through after the scale:
    ``module(x, *rest) -> (loc, scale, *rest)``.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions import NormalParamExtractor
        >>> loc, scale = NormalParamExtractor()(torch.zeros(3, 4))
        >>> loc.shape, scale
        (torch.Size([3, 2]), tensor([[1., 1.],
                [1., 1.],
                [1., 1.]]))
    """

    def __init__(self, scale_mapping: str = "biased_softplus_1.0", scale_lb: float = 1e-4) -> None:
        super().__init__()
        self.scale_mapping = mappings(scale_mapping)
        self.scale_lb = scale_lb

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        params, *rest = tensors
        loc, raw_scale = params.chunk(2, -1)
        scale = self.scale_mapping(raw_scale).clamp_min(self.scale_lb)
        return (loc, scale, *rest)


class AddStateIndependentNormalScale(nn.Module):
    """Passes its input through as the location and adds a learned scale that ignores the input.

    The scale is one tensor of shape ``scale_shape`` (a parameter, or a buffer with ``make_param=False``),
    initialised to ``init_value``, broadcast to the location, mapped by ``mappings(scale_mapping)`` and
    floored at ``scale_lb``. The trailing dims of the location must equal ``scale_shape``
    (``RuntimeError`` otherwise).

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions import AddStateIndependentNormalScale
        >>> loc, scale = AddStateIndependentNormalScale(3)(torch.zeros(2, 3))
        >>> scale
        tensor([[1., 1., 1.],
                [1., 1., 1.]], grad_fn=<ClampMinBackward0>)
    """

    def __init__(
        self,
        scale_shape: torch.Size | int | tuple | None = None,
        *,
        scale_mapping: str = "exp",
        scale_lb: float = 1e-4,
        device: torch.device | None = None,
        make_param: bool = True,
        init_value: float = 0.0,
    ) -> None:
        super().__init__()
        if scale_shape is None:
            scale_shape = ()
        elif isinstance(scale_shape, int):
            scale_shape = (scale_shape,)
        self.scale_shape = torch.Size(scale_shape)
        self.scale_lb = scale_lb
        self.scale_mapping = scale_mapping
        initial = torch.full(self.scale_shape, init_value, dtype=torch.get_default_dtype(), device=device)
        if make_param:
            self.state_independent_scale = nn.Parameter(initial)
        else:
            self.register_buffer("state_independent_scale", initial)

    def forward(self, loc: torch.Tensor, *others: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Returns ``(loc, scale, *others)``, the scale broadcast to ``loc``'s shape."""
        ndim = len(self.scale_shape)
        trailing = loc.shape[max(loc.ndim - ndim, 0):]
        if trailing != self.scale_shape:
            raise RuntimeError(
                f"Last dimensions of loc ({trailing}) do not match the number of dimensions "
                f"in scale ({self.state_independent_scale.shape})"
            )
        scale = self.state_independent_scale.expand_as(loc)
        scale = mappings(self.scale_mapping)(scale).clamp_min(self.scale_lb)
        return (loc, scale, *others)


class Delta(D.Distribution):
    """All the mass on one value, ``param``.

    ``sample`` / ``rsample`` return ``param`` expanded to the sample shape (``sample`` without gradient);
    ``mean``, ``mode`` and ``deterministic_sample`` are ``param``. ``log_prob`` is ``+inf`` where a value
    matches ``param`` (within ``atol + rtol * |param|`` on every element of the event) and ``-inf``
    elsewhere. Unless shapes are given, the last dim of ``param`` is the event and the rest the batch.
    It is the default distribution of a probabilistic module, which then copies its input.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions import Delta
        >>> dist = Delta(torch.tensor([1.0, 2.0]))
        >>> dist.batch_shape, dist.event_shape
        (torch.Size([]), torch.Size([2]))
        >>> dist.log_prob(torch.tensor([1.0, 2.0])), dist.log_prob(torch.tensor([1.0, 2.5]))
        (tensor(inf), tensor(-inf))
    """

    arg_constraints: dict = {}

    def __init__(
        self,
        param: torch.Tensor,
        atol: float = 1e-6,
        rtol: float = 1e-6,
        batch_shape: torch.Size | Sequence[int] | None = None,
        event_shape: torch.Size | Sequence[int] | None = None,
    ) -> None:
        batch_shape = torch.Size(batch_shape or ())
        event_shape = torch.Size(event_shape or ())
        self.update(param)
        self.atol = atol
        self.rtol = rtol
        if not batch_shape and not event_shape:
            batch_shape, event_shape = param.shape[:-1], param.shape[-1:]
        super().__init__(batch_shape=batch_shape, event_shape=event_shape)

    def update(self, param: torch.Tensor) -> None:
        """Replaces ``param`` (the batch and event shapes stay as they were)."""
        self.param = param

    def _matches(self, value: torch.Tensor) -> torch.Tensor:
        param = self.param.expand_as(value)
        close = (value - param).abs() < self.atol + self.rtol * param.abs()
        event_dims = len(self.event_shape)
        if event_dims:
            close = close.flatten(-event_dims).all(-1)
        return close

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        close = self._matches(value)
        plus = torch.full((), float("inf"), dtype=value.dtype, device=value.device)
        return torch.where(close, plus, -plus)

    def sample(self, sample_shape: torch.Size | Sequence[int] | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape: torch.Size | Sequence[int] | None = None) -> torch.Tensor:
        leading = tuple(sample_shape) if sample_shape is not None else ()
        return self.param.expand(leading + tuple(self.param.shape))

    @property
    def mode(self) -> torch.Tensor:
        return self.param

    @property
    def mean(self) -> torch.Tensor:
        return self.param

    @property
    def deterministic_sample(self) -> torch.Tensor:
        return self.param
