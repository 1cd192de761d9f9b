"""Named elementwise maps to positive numbers, used to turn a network's output into a scale.

`mappings("softplus")`, `mappings("biased_softplus_2.0_0.1")`, ... return a callable; `add_custom_mapping`
registers more names.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

__all__ = ["mappings", "inv_softplus", "biased_softplus", "expln", "add_custom_mapping"]


def inv_softplus(bias: float | torch.Tensor) -> float | torch.Tensor:
    """The input ``x`` with ``softplus(x) == bias``, i.e. ``log(exp(bias) - 1)``.

    ``exp(bias) - 1`` is floored at ``1e-6`` so a non-positive ``bias`` gives a finite answer. A number in
    gives a number out (computed in the default float dtype), a tensor gives a tensor.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions.utils import inv_softplus
        >>> torch.nn.functional.softplus(inv_softplus(torch.tensor([0.5, 3.0])))
        tensor([0.5000, 3.0000])
    """
    as_tensor = bias if isinstance(bias, torch.Tensor) else torch.tensor(bias)
    result = torch.log(torch.clamp_min(torch.expm1(as_tensor), 1e-6))
    if not isinstance(bias, torch.Tensor) and result.numel() == 1:
        return result.item()
    return result


class biased_softplus(nn.Module):
    """``softplus(x + inv_softplus(bias - min_val)) + min_val``: equals ``bias`` at 0 and stays above ``min_val``.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions.utils import biased_softplus
        >>> biased_softplus(1.0)(torch.zeros(2))
        tensor([1., 1.])
    """

    def __init__(self, bias: float, min_val: float = 0.01) -> None:
        super().__init__()
        self.bias = inv_softplus(bias - min_val)
        self.min_val = min_val

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softplus(x + self.bias) + self.min_val


def expln(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` where ``x <= 0`` and ``1 + log1p(x)`` elsewhere: positive, smooth, logarithmic growth.

    Written without in-place masked writes, so it works under ``torch.vmap`` and keeps both branches'
    gradients apart.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions.utils import expln
        >>> expln(torch.tensor([-1.0, 0.0, 1.0]))
        tensor([0.3679, 1.0000, 1.6931])
    """
    non_positive = x <= 0
    # Each branch only sees inputs from its own side, so neither overflows nor produces nan gradients.
    low = torch.exp(torch.where(non_positive, x, torch.zeros_like(x)))
    high = torch.log1p(torch.where(non_positive, torch.zeros_like(x), x)) + 1
    return torch.where(non_positive, low, high)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


_MAPPINGS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "softplus": torch.nn.functional.softplus,
    "exp": torch.exp,
    "relu": torch.relu,
    "biased_softplus": biased_softplus(1.0),
    "none": _identity,
    "expln": expln,
}


def mappings(key: str) -> Callable:
    """The map registered as ``key``.

    Known names: ``"softplus"``, ``"exp"``, ``"relu"``, ``"expln"``, ``"none"`` (identity),
    ``"biased_softplus"`` (bias 1.0), ``"biased_softplus_<bias>"``, ``"biased_softplus_<bias>_<min_val>"``,
    and whatever `add_custom_mapping` added. An unknown name raises ``NotImplementedError``; a
    ``biased_softplus`` name with the wrong number of fields raises ``ValueError``.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions.utils import mappings
        >>> mappings("biased_softplus_2.0_0.1")(torch.zeros(2))
        tensor([2., 2.])
    """
    found = _MAPPINGS.get(key)
    if found is not None:
        return found
    if key.startswith("biased_softplus"):
        fields = key.split("_")
        # "biased", "softplus", then one or two numbers
        if len(fields) == 3:
            return biased_softplus(float(fields[2]))
        if len(fields) == 4:
            return biased_softplus(float(fields[2]), min_val=float(fields[3]))
        raise ValueError(f"Invalid number of args in  {key}")
    raise NotImplementedError(f"Unknown mapping {key}")


def add_custom_mapping(name: str, mapping: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Registers ``mapping`` under ``name`` for `mappings` (replacing an existing entry)."""
    _MAPPINGS[name] = mapping
