"""What ``DETERMINISTIC`` means for a distribution without a ``deterministic_sample`` attribute.

`DETERMINISTIC_REGISTER` maps a distribution class to the interaction type used in its place: the mode for
classes with enumerable support, the mean for the others, and a computed value (`builtin_deterministic_sample`)
for the few torch classes whose mean is not a natural point value. Unknown classes are decided from their
support, with a warning (done by the callers, which word it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import distributions as D
from torch.nn.functional import one_hot

from .._modes import InteractionType
from .continuous import Delta
from .discrete import OneHotCategorical
from .truncated_normal import TruncatedNormal, TruncatedStandardNormal

if TYPE_CHECKING:
    from typing import Any


def _logistic_normal_point(dist: D.LogisticNormal) -> torch.Tensor:
    # The location pushed through the stick-breaking transforms.
    value = dist.loc
    for transform in dist.transforms:
        value = transform(value)
    return value


def _relaxed_bernoulli_point(dist: D.RelaxedBernoulli) -> torch.Tensor:
    return vars(D.Bernoulli)["mode"].fget(dist)  # Bernoulli's own property, read on the relaxed one


def _relaxed_one_hot_point(dist: D.RelaxedOneHotCategorical) -> torch.Tensor:
    probs = dist.base_dist.probs
    return one_hot(probs.argmax(dim=-1), num_classes=probs.shape[-1]).to(probs)


# torch classes that upstream tensordict gives a ``deterministic_sample`` attribute (by patching torch);
# torchdict computes the same value here instead of changing torch's classes.
_BUILTIN_POINTS: dict[type, Callable[[Any], torch.Tensor]] = {  # each takes its class's instances
    D.LogisticNormal: _logistic_normal_point,
    D.RelaxedBernoulli: _relaxed_bernoulli_point,
    D.RelaxedOneHotCategorical: _relaxed_one_hot_point,
}


def builtin_deterministic_sample(dist: D.Distribution) -> torch.Tensor | None:
    """``dist.deterministic_sample`` if it has one, else the value computed for the known torch classes."""
    value = getattr(dist, "deterministic_sample", None)
    if value is not None:
        return value
    for cls in type(dist).__mro__:
        compute = _BUILTIN_POINTS.get(cls)
        if compute is not None:
            return compute(dist)
    return None


def _torch_register() -> dict[type, InteractionType]:
    register: dict[type, InteractionType] = {}
    for name in dir(D):
        cls = getattr(D, name)
        if not (isinstance(cls, type) and issubclass(cls, D.Distribution)):
            continue
        if cls is D.LogisticNormal:
            register[cls] = InteractionType.DETERMINISTIC
        elif getattr(cls, "has_enumerate_support", False):
            register[cls] = InteractionType.MODE
        else:
            register[cls] = InteractionType.MEAN
    return register


DETERMINISTIC_REGISTER: dict[type, InteractionType] = _torch_register()
DETERMINISTIC_REGISTER.update(
    {
        Delta: InteractionType.DETERMINISTIC,
        OneHotCategorical: InteractionType.MODE,
        TruncatedNormal: InteractionType.MEAN,
        TruncatedStandardNormal: InteractionType.MEAN,
    }
)


def registered_type(dist: D.Distribution) -> InteractionType | None:
    """The registered stand-in for ``dist``'s class (the base class for an `Independent`), or ``None``."""
    cls = type(dist)
    if isinstance(dist, D.Independent):
        cls = type(dist.base_dist)
    return DETERMINISTIC_REGISTER.get(cls)


def support_fallback(dist: D.Distribution) -> str:
    """``"mean"`` for a distribution over the reals (or without a support), ``"mode"`` otherwise."""
    try:
        support = dist.support
    except NotImplementedError:
        return "mean"
    return "mean" if isinstance(support, D.constraints._Real) else "mode"


def fallback_warning(dist: D.Distribution, owner: str, fallback: str) -> str:
    return (
        f"deterministic_sample wasn't found when queried on {type(dist)}. "
        f"{owner} is falling back on {fallback} instead. "
        f"For better code quality and efficiency, make sure to either "
        f"provide a distribution with a deterministic_sample attribute or "
        f"to change the InteractionMode to the desired value."
    )
