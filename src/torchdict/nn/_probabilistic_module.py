"""`ProbabilisticTensorDictModule`: reads distribution parameters from a tensordict and writes a value of that
distribution (and its log-probability). Public path: ``torchdict.nn.probabilistic``."""
from __future__ import annotations

import contextlib
import re
import warnings
from textwrap import indent
from typing import Any, Dict, List, Optional, Union

import torch
from torch import Tensor, distributions as D

from .._base import is_tensor_collection
from .._keys import NestedKey, unravel_key
from ..base import TensorDictBase
from ..nontensor import NonTensorData, is_non_tensor
from ._dispatch import dispatch
from ._modes import InteractionType, composite_lp_aggregate, interaction_type, set_composite_lp_aggregate
from ._sampling import (
    _draw,
    _joint_sample_and_log_prob,
    _plain_kwargs,
    _rename_entries,
    _sample,
    _sampling_with,
    _sum_of_leaves,
    _user_stacklevel,
    _zip_strict,
)
from .common import TensorDictModuleBase
from .distributions.composite import CompositeDistribution, _add_suffix, _resolve_name_map
from .distributions.continuous import Delta
from .utils import _set_skip_existing_None

__all__ = ["ProbabilisticTensorDictModule"]


class ProbabilisticTensorDictModule(TensorDictModuleBase):
    """Reads distribution parameters from a tensordict and writes a value of that distribution.

    The module has no parameters of its own: put the network that computes the parameters before it in a
    `ProbabilisticTensorDictSequential`. The value depends on `interaction_type()` inside a
    `set_interaction_type` block and on ``default_interaction_type`` outside one (see `InteractionType`).
    With ``return_log_prob=True`` the log-probability of the value is written too (keys: the table in
    ``torchdict.nn.probabilistic``'s docstring); under ``RANDOM`` a distribution's own ``rsample_and_log_prob`` / ``sample_and_log_prob`` is
    used when it defines one.

    Args:
        in_keys: the parameter entries. With a key or a list, the last element of each key is the keyword
            argument of ``distribution_class`` it feeds; with a dict, ``{keyword: key}``.
        out_keys: where the values go. ``None``: for a `CompositeDistribution` the values of ``name_map`` or
            the keys of ``distribution_map`` (from ``distribution_kwargs``); otherwise ``"_"`` (with a
            ``FutureWarning`` on the first call).

    Keyword Args:
        default_interaction_type: used when `interaction_type()` is ``None``. Default ``DETERMINISTIC``.
        distribution_class: a distribution class, a callable returning one, or a lower-case name from
            ``distributions_maps``. Default `Delta` (the module copies its input).
        distribution_kwargs: extra constructor arguments (a `TensorDictParams` moves with the module).
        return_log_prob: also write the log-probability.
        log_prob_keys / log_prob_key: custom log-probability keys (one per sampled key / the one key). A
            custom key equal to, inside, or holding a sample key raises ``ValueError``.
        cache_dist: deprecated, no effect.
        n_empirical_estimate: draws averaged for ``MEAN`` when the distribution has no mean.
        num_samples: leading sample dims: the output is expanded to ``num_samples + batch_size``.
        generator: a ``torch.Generator``, an ``int`` seed (a CPU generator owned by the module), or the key of
            an input entry holding a generator or a seed (a new seed is written back after sampling).

    Examples:
        >>> import torch
        >>> from torch import distributions as d
        >>> from torchdict import TensorDict
        >>> from torchdict.nn.probabilistic import ProbabilisticTensorDictModule
        >>> module = ProbabilisticTensorDictModule(
        ...     in_keys=["loc", "scale"], out_keys=["action"], distribution_class=d.Normal,
        ...     return_log_prob=True)
        >>> out = module(TensorDict(loc=torch.zeros(3), scale=torch.ones(3), batch_size=[3]))
        >>> out["action"], out["action_log_prob"]
        (tensor([0., 0., 0.]), tensor([-0.9189, -0.9189, -0.9189]))
    """

    # Set on an instance whose out_keys defaulted to ["_"]: the first call warns.
    _warn_default_out_key = False

    _CHANGE_IN_C_LP_A = (
        "The value returned by composite_lp_aggregate changed between init of {} and its execution ({} -> {}). "
        "Make sure the mode matches."
    )

    def __init__(
        self,
        in_keys: Union[NestedKey, List[NestedKey], Dict[str, NestedKey]],
        out_keys: Union[NestedKey, List[NestedKey], None] = None,
        *,
        default_interaction_type: InteractionType = InteractionType.DETERMINISTIC,
        distribution_class: Any = Delta,
        distribution_kwargs: Optional[dict] = None,
        return_log_prob: bool = False,
        log_prob_keys: Optional[List[NestedKey]] = None,
        log_prob_key: Optional[NestedKey] = None,
        cache_dist: bool = False,
        n_empirical_estimate: int = 1000,
        num_samples: Union[int, torch.Size, None] = None,
        generator: Union[torch.Generator, int, NestedKey, None] = None,
    ) -> None:
        super().__init__()
        distribution_kwargs = distribution_kwargs if distribution_kwargs is not None else {}
        if isinstance(in_keys, (str, tuple)):
            in_keys = [in_keys]
        out_keys = self._default_out_keys(out_keys, distribution_class, distribution_kwargs)
        dist_keys: Any
        if isinstance(in_keys, dict):
            dist_keys, in_keys = zip(*in_keys.items())
            if {type(key) for key in dist_keys} != {str}:
                raise ValueError(
                    f"If in_keys is dict, its keys must be strings matching to the distribution kwargs."
                    f"{type(self).__name__} got {dist_keys}"
                )
        else:
            dist_keys = in_keys
        self._out_keys = [unravel_key(key) for key in out_keys]
        self.in_keys = in_keys
        self.dist_keys = dist_keys

        aggregate = composite_lp_aggregate()
        single = len(out_keys) == 1
        if log_prob_keys is None:
            if single and log_prob_key is not None:
                log_prob_keys = [log_prob_key]
            elif aggregate:
                log_prob_keys = ["sample_log_prob"] if single else None
            else:
                log_prob_keys = [_add_suffix(key, "_log_prob") for key in self._out_keys]
        elif aggregate:
            raise RuntimeError(
                "composite_lp_aggregate is set to True but log_prob_keys were passed. "
                "When composite_lp_aggregate() returns ``True``, log_prob_key must be used instead."
            )
        if log_prob_key is None:
            if aggregate:
                log_prob_key = "sample_log_prob"
            elif single:
                log_prob_key = _add_suffix(out_keys[0], "_log_prob")
        elif not single and not aggregate:
            raise RuntimeError(
                "composite_lp_aggregate is set to `False` but a `log_prob_key` was passed. "
                "When composite_lp_aggregate() returns ``False``, log_prob_keys must be used instead."
            )
        self._log_prob_key = log_prob_key
        self._log_prob_keys = log_prob_keys
        # (default key, custom key) pairs; ProbabilisticTensorDictSequential.log_prob renames with them.
        self._custom_log_prob_keys = []
        if log_prob_keys is not None and len(log_prob_keys) == len(self._out_keys):
            for out_key, lp_key in zip(self._out_keys, log_prob_keys):
                default = _add_suffix(out_key, "_log_prob")
                if lp_key != default:
                    self._custom_log_prob_keys.append((default, lp_key))

        self.default_interaction_type = InteractionType(default_interaction_type)
        if isinstance(distribution_class, str):
            from .distributions import _distributions_maps

            distribution_class = _distributions_maps.get(distribution_class.lower())
        self.distribution_class = distribution_class
        self.distribution_kwargs = distribution_kwargs
        if return_log_prob:
            self._check_log_prob_keys(log_prob_keys, log_prob_key)
        self.n_empirical_estimate = n_empirical_estimate
        self._dist = None
        if cache_dist:
            warnings.warn(
                "ProbabilisticTensorDictModule(cache_dist=True) is deprecated and will be removed in TensorDict 0.17.",
                DeprecationWarning,
                stacklevel=2,
            )
        self.cache_dist = cache_dist if hasattr(distribution_class, "update") else False
        self.return_log_prob = return_log_prob
        if isinstance(num_samples, (int, torch.SymInt)):
            num_samples = torch.Size((num_samples,))
        self.num_samples = num_samples
        self._lp_aggregate_at_init = aggregate
        self._generator, self._generator_key = self._parse_generator(generator)

    def _default_out_keys(self, out_keys: Any, distribution_class: Any, distribution_kwargs: Any) -> list:
        if isinstance(out_keys, (str, tuple)):
            return [out_keys]
        if out_keys is not None:
            return out_keys
        if distribution_class is not CompositeDistribution:
            self._warn_default_out_key = True
            return ["_"]
        distribution_map = distribution_kwargs.get("distribution_map")
        if distribution_map is None:
            raise KeyError(
                "'distribution_map' must be provided within "
                "distribution_kwargs whenever the distribution is of type CompositeDistribution."
            )
        name_map = distribution_kwargs.get("name_map")
        if name_map is None:
            return list(distribution_map.keys())
        mapped = {unravel_key(name) for name in name_map}
        if any(unravel_key(name) not in mapped for name in distribution_map):
            warnings.warn(
                "ProbabilisticTensorDictModule got a name_map that leaves "
                "out components of distribution_map and no out_keys: these "
                "components are written but are not in out_keys. Starting "
                "with TensorDict 0.17, the default will change to out_keys "
                "that include them. Pass out_keys to keep the current keys.",
                FutureWarning,
                stacklevel=_user_stacklevel(),
            )
        return list(name_map.values())

    @staticmethod
    def _parse_generator(generator: Any) -> tuple:
        """``(generator owned or given, key of the input entry holding one)``."""
        if generator is None:
            return None, None
        if isinstance(generator, torch.Generator):
            return generator, None
        if isinstance(generator, int) and not isinstance(generator, bool):
            owned = torch.Generator()
            owned.manual_seed(generator)
            return owned, None
        if isinstance(generator, (str, tuple)):
            return None, unravel_key(generator)
        raise TypeError(
            f"generator must be a torch.Generator, int, NestedKey, or None; got {type(generator).__name__}."
        )

    def _check_log_prob_keys(self, log_prob_keys: Any, log_prob_key: Any) -> None:
        # A custom log-prob key at, inside or above a sample key would overwrite the sample. Sample keys are
        # only known for a distribution class (not for a factory function).
        distribution_class = self.distribution_class
        if not isinstance(distribution_class, type):
            return
        if issubclass(distribution_class, CompositeDistribution):
            distribution_map = self.distribution_kwargs.get("distribution_map")
            if distribution_map is None:
                return
            sample_keys = list(_resolve_name_map(self.distribution_kwargs.get("name_map"), distribution_map).values())
        else:
            sample_keys = self._out_keys
        defaults = {_add_suffix(key, "_log_prob") for key in [*self._out_keys, *sample_keys]}
        defaults.add("sample_log_prob")
        candidates = log_prob_keys if log_prob_keys is not None else [log_prob_key]
        clashes = []
        for lp_key in candidates:
            if not isinstance(lp_key, (str, tuple)):
                continue  # a malformed key fails at the first call instead
            lp_key = unravel_key(lp_key)
            if lp_key in defaults:
                continue
            lp_path = (lp_key,) if isinstance(lp_key, str) else lp_key
            for sample_key in sample_keys:
                sample_path = (sample_key,) if isinstance(sample_key, str) else sample_key
                shorter = min(len(lp_path), len(sample_path))
                if lp_path[:shorter] == sample_path[:shorter]:
                    clashes.append((lp_key, sample_key))
        if clashes:
            raise ValueError(
                "A custom log-probability key cannot be a sample key, lie inside one "
                "or hold one, since writing the log-probability would overwrite the "
                "sample. Got "
                + ", ".join(f"log-probability key {lp!r} for sample key {sample!r}" for lp, sample in clashes)
                + "."
            )

    def __repr__(self) -> str:
        fields = [
            f"in_keys={self.in_keys},",
            f"out_keys={self.out_keys},",
            f"distribution_class={self.distribution_class}, ",
            f"distribution_kwargs={self.distribution_kwargs}),",
            f"default_interaction_type={self.default_interaction_type}),",
            f"num_samples={self.num_samples}))",
        ]
        body = "".join(f"\n{indent(field, 4 * ' ')}" for field in fields)
        return f"{type(self).__name__}({body}"

    # ------------------------------------------------------------------------------------------ keys

    @property  # type: ignore[misc]  # read-only here, as upstream's
    def out_keys(self) -> List[NestedKey]:
        """The sampled keys, then the log-probability keys when ``return_log_prob`` is set."""
        out_keys = list(self._out_keys)
        if self.return_log_prob:
            if not composite_lp_aggregate():
                lp_keys = self.log_prob_keys
                if out_keys[-len(lp_keys):] != lp_keys:
                    out_keys.extend(lp_keys)
            elif self.log_prob_key not in out_keys:
                out_keys.append(self.log_prob_key)
        return out_keys

    def _check_aggregate_unchanged(self, attribute: str) -> bool:
        current = composite_lp_aggregate()
        if current != self._lp_aggregate_at_init:
            raise RuntimeError(
                f"composite_lp_aggregate is set to `{current}`, but the class was instantiated with "
                f"`{self._lp_aggregate_at_init}` which may affect the {attribute} property."
            )
        return current

    @property
    def log_prob_key(self) -> NestedKey:
        """The key of the log-probability when there is exactly one (``RuntimeError`` otherwise)."""
        if not self._check_aggregate_unchanged("log_prob_key"):
            if len(self.log_prob_keys) == 1:
                return self.log_prob_keys[0]
            raise RuntimeError(
                f"composite_lp_aggregate is set to ``False``, hence {type(self).__name__}.log_prob_key cannot be "
                f"accessed unless there is one and only one element in log_prob_keys (got "
                f"log_prob_keys={self.log_prob_keys}). When composite_lp_aggregate() returns ``False``, try to "
                f"use {type(self).__name__}.log_prob_keys instead."
            )
        assert self._log_prob_key is not None  # set at __init__ when aggregating, which has not changed since
        return self._log_prob_key

    @property
    def log_prob_keys(self) -> Any:
        """The keys of the log-probabilities: one per sampled key, or ``[log_prob_key]`` when aggregating."""
        if self._check_aggregate_unchanged("log_prob_keys"):
            return [self.log_prob_key]
        return self._log_prob_keys

    @property
    def dist_params_keys(self) -> List[NestedKey]:
        """The keys of the distribution parameters (the ``in_keys``)."""
        return list(self.in_keys)

    @property
    def dist_sample_keys(self) -> List[NestedKey]:
        """The keys of the sampled values (``out_keys`` without the log-probability keys)."""
        return list(self._out_keys)

    # ------------------------------------------------------------------------------------------ distribution

    def get_dist(self, tensordict: TensorDictBase) -> D.Distribution:
        """The distribution built from the parameters in ``tensordict``.

        Raises:
            TypeError: when the entries do not match the distribution's keyword arguments.
        """
        try:
            params = {}
            for dist_key, td_key in _zip_strict(self.dist_keys, self.in_keys):
                if isinstance(dist_key, tuple):
                    dist_key = dist_key[-1]
                params[dist_key] = tensordict.get(td_key, None)
            return self.distribution_class(**params, **_plain_kwargs(self.distribution_kwargs))
        except TypeError as err:
            message = str(err)
            if "an unexpected keyword argument" in message:
                raise TypeError(
                    "distribution keywords and tensordict keys indicated by ProbabilisticTensorDictModule.dist_keys "
                    f"must match. Got this error message: \n{indent(message, 4 * ' ')}\n"
                    f"with dist_keys={self.dist_keys}"
                ) from None
            if re.search(r"missing.*required positional arguments", message):
                raise TypeError(
                    f"TensorDict with keys {tensordict.keys()} does not match the distribution "
                    f"{self.distribution_class} keywords."
                ) from None
            raise

    build_dist_from_params = get_dist

    def log_prob(self, tensordict: TensorDictBase, *, dist: Optional[D.Distribution] = None) -> Any:
        """The log-probability of the value stored in ``tensordict`` (built from it unless ``dist`` is given).

        A tensor, or for a `CompositeDistribution` the per-key TensorDict (``composite_lp_aggregate()`` False)
        or their sum, with the entries also written into ``tensordict`` (True).
        """
        if dist is None:
            dist = self.get_dist(tensordict)
        if not isinstance(dist, CompositeDistribution):
            return dist.log_prob(tensordict.get(self.out_keys[0]))
        aggregate = self._check_consistent_aggregate()
        if aggregate:
            with set_composite_lp_aggregate(False):
                per_key = dist.log_prob(tensordict)
                tensordict.update(per_key)
            return _sum_of_leaves(per_key)
        per_key = dist.log_prob(tensordict)
        self._update_td_lp(per_key)
        return per_key

    def _check_consistent_aggregate(self) -> bool:
        current = composite_lp_aggregate()
        if current != self._lp_aggregate_at_init:
            raise RuntimeError(self._CHANGE_IN_C_LP_A.format(type(self).__name__, self._lp_aggregate_at_init, current))
        return current

    def _update_td_lp(self, log_prob: TensorDictBase) -> None:
        renames = []
        for out_key, lp_key in _zip_strict(self.dist_sample_keys, self.log_prob_keys):
            default = _add_suffix(out_key, "_log_prob")
            if lp_key != default:
                renames.append((default, lp_key))
        if renames:
            _rename_entries(log_prob, renames)

    # ------------------------------------------------------------------------------------------ the call

    @dispatch(auto_batch_size=False)
    @_set_skip_existing_None()
    def forward(self, tensordict: TensorDictBase, tensordict_out: Optional[TensorDictBase] = None,
                _requires_sample: bool = True) -> TensorDictBase:
        """Builds the distribution from ``tensordict`` and writes a value (and its log-probability) at ``out_keys``.

        Written into ``tensordict_out`` when given, else into ``tensordict``; with ``num_samples`` into a new
        tensordict expanded to ``num_samples + batch_size``.
        """
        if tensordict_out is None:
            tensordict_out = tensordict
        dist = self.get_dist(tensordict)
        if _requires_sample:
            return self._write_sample(dist, tensordict, tensordict_out)
        if self.return_log_prob:
            self._write_log_prob_of_input(dist, tensordict, tensordict_out)
        return tensordict_out

    def _write_sample(self, dist: Any, tensordict: TensorDictBase, tensordict_out: TensorDictBase) -> TensorDictBase:
        generator, writeback = self._resolve_generator(tensordict)
        log_prob = None
        joint = None
        if self.return_log_prob and (interaction_type() or self.default_interaction_type) is InteractionType.RANDOM:
            joint = _joint_sample_and_log_prob(dist)
        if joint is not None:
            # Score the draw itself, not a value recovered from the sample (e.g. atanh of a saturated tanh).
            per_key = set_composite_lp_aggregate(False) if isinstance(dist, CompositeDistribution) else None
            with _sampling_with(generator), (per_key or contextlib.nullcontext()):
                values, log_prob = joint(self.num_samples or torch.Size(()))
        else:
            values = self._dist_sample(dist, interaction_type=interaction_type(), generator=generator)
        if writeback is not None:
            writeback(generator)
        if self.num_samples is not None:
            tensordict_out = tensordict_out.expand(self.num_samples + tensordict_out.shape)
        if isinstance(values, TensorDictBase):
            if self.return_log_prob:
                if self._check_consistent_aggregate():
                    if log_prob is None:
                        with set_composite_lp_aggregate(False):
                            log_prob = dist.log_prob(values)
                    if log_prob is not values:
                        values.update(log_prob)
                    values.set(self.log_prob_key, _sum_of_leaves(log_prob))
                else:
                    if log_prob is None:
                        log_prob = dist.log_prob(values)
                    self._update_td_lp(log_prob)
                    values.update(log_prob)
            tensordict_out.update(values)
            return tensordict_out
        if isinstance(values, Tensor):
            values = (values,)
        if self._warn_default_out_key and not torch.compiler.is_dynamo_compiling():
            self._warn_default_out_key = False
            warnings.warn(
                'ProbabilisticTensorDictModule got no out_keys and writes its sample at "_". Starting with '
                'TensorDict 0.17, the default will change to not writing the sample at "_". Pass out_keys to '
                "write the sample at a key of your choice and silence this warning.",
                FutureWarning,
                stacklevel=_user_stacklevel(),
            )
        tensordict_out.update(dict(_zip_strict(self.dist_sample_keys, values)))
        if self.return_log_prob:
            if log_prob is None:
                log_prob = dist.log_prob(*values)
            tensordict_out.set(self.log_prob_key, log_prob)
        return tensordict_out

    def _write_log_prob_of_input(self, dist: Any, tensordict: TensorDictBase, tensordict_out: TensorDictBase) -> None:
        # The values were written by an earlier module: score them.
        lp_keys = self.log_prob_keys
        values = [tensordict.get(key) for key in self.out_keys if key not in lp_keys]
        if isinstance(dist, CompositeDistribution) and not (len(values) == 1 and is_tensor_collection(values[0])):
            log_prob = self.log_prob(tensordict, dist=dist)
            if is_tensor_collection(log_prob):
                tensordict_out.update(log_prob)
            else:
                tensordict_out.set(self.log_prob_key, log_prob)
            return
        tensordict_out.set(self.log_prob_key, dist.log_prob(*values))

    def _resolve_generator(self, tensordict: TensorDictBase) -> tuple:
        """``(generator for this call, writeback)``; ``writeback(generator)`` stores the next seed in the input."""
        if self._generator is not None:
            return self._generator, None
        key = self._generator_key
        if key is None:
            return None, None
        value = tensordict.get(key, None)
        if value is None:
            return None, None
        value = value.data if is_non_tensor(value) else value
        if isinstance(value, torch.Generator):
            return value, None
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"Generator key {key!r} resolved to a tensor of {value.numel()} elements; expected a scalar seed."
                )
            seed, device, seed_is_tensor = int(value.item()), value.device, True
        elif isinstance(value, int) and not isinstance(value, bool):
            seed, device, seed_is_tensor = value, self._infer_param_device(tensordict), False
        else:
            raise TypeError(
                f"Generator key {key!r} resolved to a value of type {type(value).__name__}; expected "
                f"torch.Generator, int, or scalar Tensor."
            )
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)

        def writeback(used: torch.Generator) -> None:
            next_seed = torch.randint(0, 2**62, (), generator=used, dtype=torch.int64, device=device)
            tensordict.set(key, next_seed if seed_is_tensor else NonTensorData(int(next_seed.item())))

        return generator, writeback

    def _infer_param_device(self, tensordict: TensorDictBase) -> torch.device:
        for key in self.in_keys:
            value = tensordict.get(key, None)
            if isinstance(value, Tensor):
                return value.device
        return torch.device("cpu")

    def _dist_sample(self, dist: D.Distribution, interaction_type: Optional[InteractionType] = None, *,
                     generator: Optional[torch.Generator] = None) -> Any:
        return _sample(self, dist, interaction_type, generator, self.n_empirical_estimate)

    def _draw_dist_sample(self, dist: D.Distribution, interaction_type: Optional[InteractionType] = None, *,
                          generator: Optional[torch.Generator] = None) -> Any:
        return _draw(self, dist, interaction_type, generator, self.num_samples, self.n_empirical_estimate)
