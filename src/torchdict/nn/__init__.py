"""torchdict.nn: modules that read their inputs from a TensorDict and write their outputs into it.

Imported on its own (``import torchdict.nn``), never by ``import torchdict``: the module layer is only paid
for by programs that use it.
"""
from .._params import TensorDictParams
from ._dispatch import dispatch, make_tensordict
from .common import (
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictModuleWrapper,
    WrapModule,
    as_tensordict_module,
)
from .cudagraphs import CudaGraphModule
from .ensemble import EnsembleModule
from .sequence import TensorDictSequential
from .tensorclass_module import TensorClassModuleBase, TensorClassModuleWrapper
from .utils import set_skip_existing, skip_existing
from . import distributions, probabilistic  # noqa: F401  (upstream's submodules, reachable as attributes)
from .distributions import (AddStateIndependentNormalScale, CompositeDistribution, NormalParamExtractor,
                            OneHotCategorical, TruncatedNormal, add_custom_mapping, mappings, rand_one_hot)
from .distributions.utils import biased_softplus, inv_softplus
from .probabilistic import (InteractionType, ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential,
                            composite_lp_aggregate, interaction_type, set_composite_lp_aggregate,
                            set_interaction_type)
from . import functional_modules, params  # noqa: F401  (upstream's submodules, reachable as attributes)

__all__ = [
    # core modules
    "TensorDictModule",
    "TensorDictModuleBase",
    "TensorDictModuleWrapper",
    "WrapModule",
    "TensorDictSequential",
    "EnsembleModule",
    "CudaGraphModule",
    "TensorClassModuleBase",
    "TensorClassModuleWrapper",
    # parameters
    "TensorDictParams",
    # utilities
    "dispatch",
    "make_tensordict",
    "as_tensordict_module",
    "set_skip_existing",
    "skip_existing",
    # probabilistic modules and distributions
    "ProbabilisticTensorDictModule",
    "ProbabilisticTensorDictSequential",
    "InteractionType",
    "interaction_type",
    "set_interaction_type",
    "composite_lp_aggregate",
    "set_composite_lp_aggregate",
    "NormalParamExtractor",
    "CompositeDistribution",
    "AddStateIndependentNormalScale",
    "OneHotCategorical",
    "TruncatedNormal",
    "rand_one_hot",
    "mappings",
    "add_custom_mapping",
    "biased_softplus",
    "inv_softplus",
]
