"""`ProbabilisticTensorDictSequential`: a `TensorDictSequential` of parameter modules and probabilistic modules
that can also return its distribution. Public path: ``torchdict.nn.probabilistic``."""
from __future__ import annotations

import collections
import warnings
from collections.abc import MutableSequence
from typing import Any, Callable, Dict, List, Optional, Union

import torch
from torch import Tensor, distributions as D, nn
from torch.compiler import is_compiling

from .._base import is_tensor_collection
from .._keys import NestedKey
from ..base import TensorDictBase
from ._dispatch import dispatch
from ._modes import InteractionType, interaction_type, set_interaction_type
from ._probabilistic_module import ProbabilisticTensorDictModule
from ._sampling import _draw, _rename_entries, _sample, _zip_strict
from .common import _undo_record, _undo_write
from .distributions.composite import CompositeDistribution
from .sequence import TensorDictSequential
from .utils import _set_skip_existing_None

__all__ = ["ProbabilisticTensorDictSequential"]


class ProbabilisticTensorDictSequential(TensorDictSequential):
    """A `TensorDictSequential` holding probabilistic modules, which can also return its distribution.

    Usually the modules before the last compute the parameters of the last, a
    `ProbabilisticTensorDictModule`. `get_dist` returns that module's distribution (``return_composite=False``)
    or a `CompositeDistribution` over every probabilistic module's distribution, each drawn in turn so later
    distributions are conditional on earlier values (``return_composite=True``, the default when there is
    more than one probabilistic module or the last module is not probabilistic). `log_prob` scores a
    sample. When the modules before the last already write its sampled keys, the last does not sample
    again (it only scores, with ``return_log_prob``).

    Args:
        *modules: the modules (or one list, or one dict / OrderedDict of named modules).

    Keyword Args:
        partial_tolerant: stored only; every module runs on the whole input.
        return_composite: see above.
        selected_out_keys: the ``out_keys`` to write (default all).
        inplace: ``True`` (into the input), ``False`` (a new TensorDict), ``"empty"`` (``input.empty()``), or
            ``None`` (what the last module returns).

    Raises:
        ValueError: no module.
        TypeError: ``return_composite=False`` and the last module is not probabilistic.

    Examples:
        >>> import torch
        >>> from torchdict import TensorDict
        >>> from torchdict.nn import TensorDictModule
        >>> from torchdict.nn.probabilistic import (
        ...     ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential)
        >>> seq = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["loc"]),
        ...     ProbabilisticTensorDictModule(in_keys=["loc"], out_keys=["y"],
        ...         distribution_class=torch.distributions.Normal, distribution_kwargs={"scale": 1.0}),
        ... )
        >>> td = seq(TensorDict(x=torch.zeros(2)))
        >>> td["y"], seq.log_prob(td)
        (tensor([1., 1.]), tensor([-0.9189, -0.9189]))
    """

    def __init__(
        self,
        *modules: Any,
        partial_tolerant: bool = False,
        return_composite: Optional[bool] = None,
        selected_out_keys: Optional[List[NestedKey]] = None,
        inplace: Optional[bool] = None,
    ) -> None:
        if len(modules) == 0:
            raise ValueError(
                "ProbabilisticTensorDictSequential must consist of zero or more "
                "TensorDictModules followed by a ProbabilisticTensorDictModule"
            )
        named = len(modules) == 1 and isinstance(modules[0], dict)
        if named:
            modules = (collections.OrderedDict(modules[0]),)
            module_list = list(modules[0].values())
        elif len(modules) == 1 and isinstance(modules[0], MutableSequence):
            modules = tuple(modules[0])
            module_list = list(modules)
        else:
            module_list = list(modules)
        module_list = self._convert_modules(module_list)
        last_is_probabilistic = isinstance(module_list[-1], _PROBABILISTIC)
        if return_composite is False and not last_is_probabilistic:
            raise TypeError(self._LAST_MODULE_ERROR)
        if return_composite is None:
            count = sum(isinstance(m, ProbabilisticTensorDictModule) for m in module_list)
            return_composite = not last_is_probabilistic or count > 1
        options: Dict[str, Any] = {"partial_tolerant": partial_tolerant, "inplace": inplace}
        if selected_out_keys is not None:
            options["selected_out_keys"] = selected_out_keys
        super().__init__(*modules, **options)
        self._ordered_dict = named
        if not any(isinstance(m, _PROBABILISTIC) for m in module_list):
            # Nothing to sample: a plain sequence whose forward runs every module.
            self._requires_sample = False
            self.__dict__["_det_part"] = None
            self.return_composite = True
            return
        self.return_composite = return_composite
        self._refresh_sampling_state()

    _LAST_MODULE_ERROR = (
        "The final module passed to ProbabilisticTensorDictSequential must be "
        "an instance of ProbabilisticTensorDictModule or another "
        "ProbabilisticTensorDictSequential (unless return_composite is set to ``True``)."
    )

    def _refresh_sampling_state(self) -> None:
        """Recompute what the constructor caches: the parameter part and whether the last module samples."""
        modules = list(self._module_iter())
        if not any(isinstance(m, _PROBABILISTIC) for m in modules):
            self._requires_sample = False
            self.__dict__["_det_part"] = None
            return
        _, written_before = self._compute_in_and_out_keys(modules[:-1])
        self._requires_sample = any(
            key not in written_before for key in getattr(modules[-1], "dist_sample_keys", [None])
        )
        # Kept out of the registered children: its modules are already ours (no duplicate parameters).
        if self._ordered_dict:
            self.__dict__["_det_part"] = TensorDictSequential(collections.OrderedDict(list(self.module.items())[:-1]))
        else:
            self.__dict__["_det_part"] = TensorDictSequential(*modules[:-1])

    def _edit_modules(self, edit: Callable[[nn.Module], None]) -> None:
        # Check the edited list first (as the constructor would), so a refused edit changes nothing.
        edited = self._modules_after(edit)
        if not edited:
            raise ValueError(
                "ProbabilisticTensorDictSequential must consist of zero or more "
                "TensorDictModules followed by a ProbabilisticTensorDictModule"
            )
        if not self.return_composite and not isinstance(edited[-1], _PROBABILISTIC):
            raise TypeError(self._LAST_MODULE_ERROR)
        super()._edit_modules(edit)
        self._refresh_sampling_state()

    def __getitem__(self, index: Union[int, slice, str]) -> Any:
        if isinstance(index, (int, str)):
            return self.module[index]
        selected = self.module[index]
        if isinstance(selected, nn.ModuleDict):
            selected = list(selected.values())
        selected = list(selected)
        if self.return_composite and any(isinstance(item, _PROBABILISTIC) for item in selected):
            return self._keep_options(type(self)(*selected, return_composite=self.return_composite))
        if selected and isinstance(selected[-1], _PROBABILISTIC):
            return self._keep_options(type(self)(*selected))
        return self._keep_options(TensorDictSequential(*selected))

    @property
    def det_part(self) -> Optional[TensorDictSequential]:
        """The modules before the last (deprecated: use `get_dist_params`)."""
        warnings.warn(
            "ProbabilisticTensorDictSequential.det_part is deprecated and will be removed in TensorDict 0.17. "
            "Use ProbabilisticTensorDictSequential.get_dist_params() instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._det_part

    @property
    def _last_module(self) -> Any:  # a probabilistic module, or another with in_keys / out_keys
        last = None
        for last in self._module_iter():  # noqa: B007
            pass
        return last

    def _dist_sample(self, dist: D.Distribution, interaction_type: Optional[InteractionType] = None, *,
                     generator: Optional[torch.Generator] = None) -> Any:
        return _sample(self, dist, interaction_type, generator, self._n_empirical_estimate())

    def _draw_dist_sample(self, dist: D.Distribution, interaction_type: Optional[InteractionType] = None, *,
                          generator: Optional[torch.Generator] = None) -> Any:
        return _draw(self, dist, interaction_type, generator, self.num_samples, self._n_empirical_estimate())

    def _n_empirical_estimate(self) -> int:
        for module in reversed(list(self._module_iter())):
            estimate = getattr(module, "n_empirical_estimate", None)
            if estimate is not None:
                return estimate
        return 1000

    # ------------------------------------------------------------------------------------------ keys

    @property
    def default_interaction_type(self) -> Optional[InteractionType]:
        """The ``default_interaction_type`` of the last module having one (else `interaction_type()`)."""
        for module in reversed(list(self._module_iter())):
            found = getattr(module, "default_interaction_type", None)
            if found is not None:
                return found
        return interaction_type()

    @property
    def log_prob_keys(self) -> List[NestedKey]:
        """The log-probability keys of every probabilistic module, the last module's first."""
        keys: list = []
        for module in reversed(list(self._module_iter())):
            keys.extend(getattr(module, "log_prob_keys", []))
        return keys

    @property
    def log_prob_key(self) -> NestedKey:
        """The one log-probability key (``AttributeError`` unless there is exactly one)."""
        # AttributeError keeps hasattr() / getattr(..., default) working.
        try:
            keys = self.log_prob_keys
        except RuntimeError as err:
            raise AttributeError("log_prob_key") from err
        if len(keys) == 1:
            return keys[0]
        raise AttributeError(f"log_prob_key needs exactly one log-probability key, got {keys}. "
                             f"Use log_prob_keys instead.")

    @property
    def dist_params_keys(self) -> List[NestedKey]:
        """The parameter keys of every probabilistic module, the last module's first."""
        keys: list = []
        for module in reversed(list(self._module_iter())):
            keys.extend(getattr(module, "dist_params_keys", []))
        return keys

    @property
    def dist_sample_keys(self) -> List[NestedKey]:
        """The sampled keys of every probabilistic module, the last module's first."""
        keys: list = []
        for module in reversed(list(self._module_iter())):
            keys.extend(getattr(module, "dist_sample_keys", []))
        return keys

    @property
    def num_samples(self) -> tuple:
        """The leading sample dims the probabilistic modules add, the last module's first (``()`` if none)."""
        dims: tuple = ()
        for module in self._module_iter():
            if isinstance(module, _PROBABILISTIC):
                own: Any = module.num_samples or ()
                dims = tuple(own) + dims
        return dims

    def _log_prob_renames(self) -> tuple:
        """The modules' (default key, custom key) pairs, and whether one was built while aggregating."""
        renames: list = []
        aggregated = False
        for module in self._module_iter():
            if isinstance(module, ProbabilisticTensorDictSequential):
                sub_renames, sub_aggregated = module._log_prob_renames()
            elif isinstance(module, ProbabilisticTensorDictModule):
                sub_renames, sub_aggregated = module._custom_log_prob_keys, module._lp_aggregate_at_init
            else:
                continue
            renames.extend(sub_renames)
            aggregated = aggregated or sub_aggregated
        return renames, aggregated

    # ------------------------------------------------------------------------------------------ distribution

    def get_dist_params(self, tensordict: TensorDictBase, tensordict_out: Optional[TensorDictBase] = None,
                        **kwargs: Any) -> TensorDictBase:
        """Runs every module but the last and returns the tensordict holding the distribution parameters.

        The modules run under `interaction_type()` if set, else the last ``default_interaction_type`` found.
        Extra keyword arguments go to the modules that are not `ProbabilisticTensorDictModule`.
        """
        parameters_part = self._det_part
        itype = interaction_type()
        if itype is None:
            for module in reversed(list(self._module_iter())):
                if hasattr(module, "default_interaction_type"):
                    itype = module.default_interaction_type
                    break
            else:
                raise ValueError("Could not find a default interaction in the modules.")
        with set_interaction_type(itype):
            if not kwargs:
                return parameters_part(tensordict, tensordict_out)
            running = tensordict if tensordict_out is None else tensordict.copy()
            for module in parameters_part._module_iter():
                module_kwargs = {} if isinstance(module, ProbabilisticTensorDictModule) else kwargs
                running = parameters_part._run_module(module, running, **module_kwargs)
            if tensordict_out is None:
                return running
            return tensordict_out.update(running, keys_to_update=parameters_part.out_keys)

    def get_dist(self, tensordict: TensorDictBase, tensordict_out: Optional[TensorDictBase] = None,
                 **kwargs: Any) -> D.Distribution:
        """The distribution the sequence samples from (see the class description).

        With ``return_composite=False`` the parameter modules write into ``tensordict`` (or ``tensordict_out``);
        with ``True`` they run on a shallow copy and ``kwargs`` are ignored.

        Raises:
            RuntimeError: the sequence has no probabilistic module.
        """
        if not self.return_composite:
            return self.build_dist_from_params(self.get_dist_params(tensordict, tensordict_out, **kwargs))
        running = tensordict.copy()
        dists: dict = {}
        modules = list(self._module_iter())
        for position, module in enumerate(modules):
            if not isinstance(module, _PROBABILISTIC):
                running = module(running)
                continue
            dist = module.get_dist(running)
            if position < len(modules) - 1:
                running = self._write_intermediate_value(module, dist, running)
            if isinstance(dist, CompositeDistribution):
                dists.update(dict(dist))
            else:
                dists[module.dist_sample_keys[0]] = dist
        if not dists:
            raise RuntimeError(f"No distribution module found in {self}.")
        return CompositeDistribution.from_distributions(running, dists)

    @staticmethod
    def _write_intermediate_value(module: Any, dist: Any, running: TensorDictBase) -> TensorDictBase:
        # A probabilistic module before the last draws its value: the modules after it read it.
        if isinstance(module, ProbabilisticTensorDictModule):
            generator, writeback = module._resolve_generator(running)
        else:
            generator, writeback = None, None
        value = module._dist_sample(dist, interaction_type=interaction_type(), generator=generator)
        if writeback is not None:
            writeback(generator)
        if module.num_samples not in ((), None):
            running = running.expand(tuple(module.num_samples) + tuple(running.shape))
        if isinstance(value, TensorDictBase):
            running.update(value)
        elif isinstance(module, ProbabilisticTensorDictModule):
            values = (value,) if isinstance(value, Tensor) else value
            running.update(dict(_zip_strict(module.dist_sample_keys, values)))
        else:
            # A nested sequence with return_composite=False: its last module's key comes first.
            running.set(module.dist_sample_keys[0], value)
        return running

    def build_dist_from_params(self, tensordict: TensorDictBase) -> D.Distribution:
        """The last `ProbabilisticTensorDictModule`'s distribution (nested sequences searched), from parameters.

        Raises:
            RuntimeError: the sequence has no `ProbabilisticTensorDictModule`.
        """
        for module in reversed(list(self.modules())):
            if isinstance(module, ProbabilisticTensorDictModule):
                return module.get_dist(tensordict)
        raise RuntimeError("Could not find any ProbabilisticTensorDictModule in the sequence.")

    def log_prob(self, tensordict: TensorDictBase, tensordict_out: Optional[TensorDictBase] = None, *,
                 dist: Optional[D.Distribution] = None, **kwargs: Any) -> Union[TensorDictBase, Tensor]:
        """The log-probability of the sampled values in ``tensordict``.

        With ``return_composite`` the composite's `~CompositeDistribution.log_prob` (a TensorDict at the keys a
        call writes, or their sum while aggregating); otherwise the last module's `log_prob`.
        """
        source = tensordict.copy() if tensordict_out is not None else tensordict
        if dist is None:
            reroute = bool(kwargs) and not self.return_composite
            if reroute:
                # The base log_prob of the last module takes no keyword arguments; an override does.
                leaf = self._last_module
                while type(leaf).log_prob is ProbabilisticTensorDictSequential.log_prob:
                    leaf = leaf._last_module
                reroute = type(leaf).log_prob is ProbabilisticTensorDictModule.log_prob
            if reroute:
                dist = self.get_dist(source, **kwargs)
                kwargs = {}
            else:
                dist = self.get_dist(source)
        if self.return_composite and isinstance(dist, CompositeDistribution):
            log_prob = dist.log_prob(tensordict, **kwargs)
            if is_tensor_collection(log_prob):
                renames, aggregated = self._log_prob_renames()
                if renames and not aggregated:
                    present = set(log_prob.keys(True, True))
                    _rename_entries(log_prob, [pair for pair in renames if pair[0] in present])
            return log_prob
        out = self._last_module.log_prob(source, dist=dist, **kwargs)
        if not is_tensor_collection(out):
            return out
        if tensordict_out is None:
            return out
        if out is source:
            # Only what log_prob added to the copy.
            tensordict_out.update(source.apply(lambda x, y: x if x is not y else None, tensordict, filter_empty=True))
        else:
            tensordict_out.update(out)
        return tensordict_out

    # ------------------------------------------------------------------------------------------ the call

    def _run_modules(self, running: TensorDictBase, requires_sample: bool, kwargs: dict) -> TensorDictBase:
        if not self.return_composite:
            running = self.get_dist_params(running, **kwargs)
            last_module = self._last_module
            if isinstance(last_module, ProbabilisticTensorDictSequential):
                return last_module(running, _requires_sample=requires_sample, **kwargs)
            if isinstance(last_module, ProbabilisticTensorDictModule):
                return last_module(running, _requires_sample=requires_sample)
            return last_module(running, **kwargs)
        modules = list(self._module_iter())
        last = len(modules) - 1
        for position, module in enumerate(modules):
            try:
                if isinstance(module, _PROBABILISTIC):
                    extra = kwargs if isinstance(module, ProbabilisticTensorDictSequential) else {}
                    running = module(running, _requires_sample=requires_sample if position == last else True, **extra)
                else:
                    running = module(running, **kwargs)
            except Exception as err:
                raise RuntimeError(
                    f"Failed while executing module '{self._get_module_num_or_key(module)}'. Scroll up for more info."
                ) from err
        return running

    @dispatch(auto_batch_size=False)
    @_set_skip_existing_None()
    def forward(self, tensordict: TensorDictBase, tensordict_out: Optional[TensorDictBase] = None,
                _requires_sample: Optional[bool] = None, **kwargs: Any) -> TensorDictBase:
        """Runs the modules in order; the last probabilistic module does not resample keys already written.

        Keyword arguments go to the modules that are not `ProbabilisticTensorDictModule`.
        """
        # A nested sequence gets the caller's flag and still keeps a sample its own prefix wrote.
        requires_sample = self._requires_sample if _requires_sample is None else (
            _requires_sample and self._requires_sample)
        inplace = self.inplace
        on_copy = tensordict_out is not None or self._select_before_return or inplace is False or inplace == "empty"
        running = tensordict.copy() if on_copy else tensordict
        # Writing into the input: what a failing module leaves behind is put back as it was.
        undo = None if on_copy or is_compiling() else [_undo_record(tensordict, key) for key in self._out_keys]
        try:
            running = self._run_modules(running, requires_sample, kwargs)
        except Exception:
            if undo is not None:
                for record in reversed(undo):
                    _undo_write(tensordict, record)
            raise
        if inplace is True:
            tensordict_out = tensordict
        elif inplace is False:
            from ..tensordict import TensorDict

            tensordict_out = TensorDict()
        elif inplace == "empty":
            tensordict_out = tensordict.empty()
        if tensordict_out is not None:
            tensordict_out.update(running, keys_to_update=self.out_keys)
            return tensordict_out
        if self._select_before_return:
            # The selected outputs, and any input entry a module replaced.
            keys = list(self.out_keys)
            keys += [key for key in tensordict.keys(True, True) if key not in keys]
            return tensordict.update(running, keys_to_update=keys)
        return running


_PROBABILISTIC = (ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential)
