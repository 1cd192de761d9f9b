"""Distributions and parameter modules for probabilistic TensorDict modules (upstream's ``tensordict.nn.distributions``).

- `continuous`: `NormalParamExtractor`, `AddStateIndependentNormalScale`, `Delta`.
- `discrete`: `OneHotCategorical`, `rand_one_hot`.
- `truncated_normal`: `TruncatedNormal` (and `TruncatedStandardNormal`).
- `composite`: `CompositeDistribution`, over TensorDict samples.
- `utils`: the named positive maps (`mappings`, `add_custom_mapping`, `biased_softplus`, `expln`, `inv_softplus`).
"""
import warnings as _warnings

from .._modes import InteractionType, set_interaction_type
from . import continuous, discrete
from .composite import CompositeDistribution
from .continuous import AddStateIndependentNormalScale, Delta, NormalParamExtractor
from .discrete import OneHotCategorical, rand_one_hot
from .truncated_normal import TruncatedNormal
from .utils import add_custom_mapping, mappings

__all__ = [
    "CompositeDistribution",
    "AddStateIndependentNormalScale",
    "Delta",
    "NormalParamExtractor",
    "OneHotCategorical",
    "rand_one_hot",
    "TruncatedNormal",
    "InteractionType",
    "set_interaction_type",
    "continuous",
    "discrete",
    "add_custom_mapping",
    "mappings",
]

# Lower-cased class name -> class, for ``distribution_class="normalparamextractor"``-style lookups.
_distributions_maps = {
    name.lower(): getattr(module, name)
    for module in (continuous, discrete)
    for name in module.__all__
}


def __getattr__(name: str) -> object:
    if name == "distributions_maps":
        _warnings.warn(
            f"{__name__}.distributions_maps is deprecated and will be removed in TensorDict 0.17.",
            DeprecationWarning,
            stacklevel=2,
        )
        return _distributions_maps
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
