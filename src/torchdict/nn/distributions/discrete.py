"""Discrete-action helpers: `OneHotCategorical` (a categorical read and written as one-hot) and `rand_one_hot`."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import distributions as D
from torch.nn.functional import one_hot

__all__ = ["OneHotCategorical"]


def _drop_singleton_category_dim(params: torch.Tensor | None) -> torch.Tensor | None:
    if params is not None and params.shape[-1] == 1:
        return params[..., 0]
    return params


def _straight_through(hard: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    # The values of ``hard`` with the gradient of ``soft``: ``soft - soft.detach()`` is exactly zero.
    return hard + (soft - soft.detach())


def rand_one_hot(values: torch.Tensor, do_softmax: bool = True) -> torch.Tensor:
    """A one-hot ``torch.long`` draw along the last dim of ``values`` (logits, or probabilities with ``do_softmax=False``).

    One uniform number per row picks the first category whose cumulative probability exceeds it.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions import rand_one_hot
        >>> rand_one_hot(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), do_softmax=False)
        tensor([[0, 1],
                [1, 0]])
    """
    probs = values.softmax(-1) if do_softmax else values
    threshold = torch.rand_like(probs[..., :1])
    reached = probs.cumsum(-1) > threshold
    # ``reached`` is False...False True...True along the row; keep only its first True.
    return (reached.cumsum(-1) == 1).to(torch.long)


class OneHotCategorical(D.Categorical):
    """A `torch.distributions.Categorical` whose values are one-hot ``torch.long`` tensors.

    ``log_prob`` reads a one-hot value (its argmax); ``mode`` / ``deterministic_sample`` mark the first most
    likely category; ``rsample`` returns one-hot values carrying the gradient of a temperature-1
    `~torch.distributions.RelaxedOneHotCategorical` draw (straight-through). A trailing category dim of
    size 1 in ``logits`` / ``probs`` is dropped.

    Examples:
        >>> import torch
        >>> from torchdict.nn.distributions import OneHotCategorical
        >>> dist = OneHotCategorical(logits=torch.tensor([0.0, 2.0, 1.0]))
        >>> dist.mode
        tensor([0, 1, 0])
        >>> dist.log_prob(torch.tensor([0, 1, 0]))
        tensor(-0.4076)
    """

    num_params: int = 1

    def __init__(self, logits: torch.Tensor | None = None, probs: torch.Tensor | None = None, **kwargs) -> None:
        super().__init__(
            probs=_drop_singleton_category_dim(probs), logits=_drop_singleton_category_dim(logits), **kwargs
        )

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """The log-probability of the category marked by the one-hot ``value``."""
        return super().log_prob(value.argmax(dim=-1))

    @property
    def mode(self) -> torch.Tensor:
        """The one-hot first most likely category."""
        num_categories = self.logits.shape[-1]
        return one_hot(self.logits.argmax(-1), num_categories)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        return self.mode

    def sample(self, sample_shape: torch.Size | Sequence[int] | None = None) -> torch.Tensor:
        """One-hot draws of shape ``sample_shape + batch_shape + (num_categories,)``."""
        indices = super().sample(torch.Size(sample_shape) if sample_shape is not None else torch.Size())
        return one_hot(indices, self.logits.shape[-1]).to(torch.long)

    def rsample(self, sample_shape: torch.Size | Sequence[int] | None = None) -> torch.Tensor:
        """One-hot draws with a straight-through gradient (see the class description)."""
        shape = torch.Size(sample_shape) if sample_shape is not None else torch.Size()
        # torch takes a number for the temperature (its stub says a tensor)
        relaxed = D.RelaxedOneHotCategorical(1.0, logits=self.logits).rsample(shape)  # type: ignore[arg-type]
        hard = (relaxed == relaxed.max(-1, keepdim=True).values).to(relaxed.dtype)
        return _straight_through(hard, relaxed)
