"""Probabilistic modules: build a distribution from tensordict entries and write a value drawn from it.

`ProbabilisticTensorDictModule` reads distribution parameters at its ``in_keys``, builds
``distribution_class(**params, **distribution_kwargs)`` and writes a value (chosen by the interaction type) at
its ``out_keys``, optionally with its log-probability. `ProbabilisticTensorDictSequential` chains modules that
compute the parameters with one or more probabilistic modules and can hand back the distribution itself.

Log-probability keys (``return_log_prob=True``) follow `composite_lp_aggregate()`, read when the module is built:

=====================================  ==========================================  ==============================
case                                   ``False`` (default)                          ``True``
=====================================  ==========================================  ==============================
one sampled key ``"action"``           ``"action_log_prob"``                        ``"sample_log_prob"``
nested key ``("agent", "action")``     ``("agent", "action_log_prob")``             ``"sample_log_prob"``
composite, keys ``"a"``, ``("n","b")`` ``"a_log_prob"``, ``("n", "b_log_prob")``    those and ``"sample_log_prob"``
=====================================  ==========================================  ==============================
"""
from __future__ import annotations

import warnings
from typing import Any

from ._modes import (
    InteractionType,
    composite_lp_aggregate,
    interaction_type,
    set_composite_lp_aggregate,
    set_interaction_type,
)
from ._probabilistic_module import ProbabilisticTensorDictModule
from ._probabilistic_sequence import ProbabilisticTensorDictSequential
from .distributions import _fallbacks
from .distributions.composite import CompositeDistribution
from .distributions.continuous import Delta
from .distributions.discrete import OneHotCategorical
from .distributions.truncated_normal import TruncatedNormal, TruncatedStandardNormal

__all__ = [
    "InteractionType",
    "ProbabilisticTensorDictModule",
    "ProbabilisticTensorDictSequential",
    "interaction_type",
    "set_interaction_type",
    "composite_lp_aggregate",
    "set_composite_lp_aggregate",
]


def __getattr__(name: str) -> Any:
    if name == "DETERMINISTIC_REGISTER":
        warnings.warn(
            f"{__name__}.DETERMINISTIC_REGISTER is deprecated and will be removed in TensorDict 0.17. "
            f"Use a deterministic_sample attribute on the distribution instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return _fallbacks.DETERMINISTIC_REGISTER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
