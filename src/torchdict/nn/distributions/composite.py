"""`CompositeDistribution`: several named distributions sampled and scored together as one TensorDict.

Samples are TensorDicts with one entry per component (nested keys allowed); log-probabilities and entropies are
either a TensorDict of ``<key>_log_prob`` / ``<key>_entropy`` entries or, while `composite_lp_aggregate()` is
``True``, one tensor summed over components and their event dims.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional

import torch
from torch import distributions as d

from ..._keys import unravel_key
from ...tensordict import TensorDict
from .._modes import InteractionType, composite_lp_aggregate
from . import _fallbacks

__all__ = ["CompositeDistribution"]


def _add_suffix(key: Any, suffix: str) -> Any:
    """``"a" -> "a<suffix>"``, ``("n", "a") -> ("n", "a<suffix>")``."""
    key = unravel_key(key)
    if isinstance(key, str):
        return key + suffix
    return key[:-1] + (key[-1] + suffix,)


def _resolve_name_map(name_map: dict | None, names: Any) -> dict:
    """Each component name (unravelled) -> the key its sample is written at."""
    renamed = {unravel_key(src): unravel_key(dst) for src, dst in (name_map or {}).items()}
    resolved = {}
    for name in names:
        name = unravel_key(name)
        resolved[name] = renamed.get(name, name)
    return resolved


def _sum_event_dims(value: torch.Tensor, batch_ndim: int) -> torch.Tensor:
    if value.ndim > batch_ndim:
        return value.flatten(batch_ndim, -1).sum(-1)
    return value


def _entropy_or_estimate(dist: d.Distribution, samples_mc: int) -> torch.Tensor:
    try:
        return dist.entropy()
    except NotImplementedError:
        draws = dist.rsample((samples_mc,))
        return -dist.log_prob(draws).mean(0)


class CompositeDistribution(d.Distribution, Mapping):
    """A distribution over TensorDicts, made of named component distributions.

    Component ``name`` is built as ``distribution_map[name](**params[name], **extra_kwargs[name])`` and its
    values live at ``name`` (or ``name_map[name]``) in samples. ``batch_shape`` is ``params.batch_size``;
    ``event_shape`` is empty (each component keeps its event dims in its entry). The object is also a
    read-only mapping from sample keys to components.

    ``log_prob`` / ``entropy`` return a TensorDict of ``<key>_log_prob`` / ``<key>_entropy`` entries (the
    suffix on the last element of a nested key), or one summed tensor while `composite_lp_aggregate()` is
    ``True``. ``log_prob_key`` / ``entropy_key`` name the summed entry the ``*_composite`` methods add with
    ``include_sum=True`` (defaults ``"sample_log_prob"`` / ``"entropy"``).

    Raises:
        KeyError: when ``params`` has no entry for a component.

    Examples:
        >>> import torch
        >>> from torch import distributions as d
        >>> from torchdict import TensorDict
        >>> from torchdict.nn.distributions import CompositeDistribution
        >>> params = TensorDict({
        ...     "cont": {"loc": torch.zeros(3, 4), "scale": torch.ones(3, 4)},
        ...     ("nested", "disc"): {"logits": torch.zeros(3, 10)},
        ... }, [3])
        >>> dist = CompositeDistribution(
        ...     params, distribution_map={"cont": d.Normal, ("nested", "disc"): d.Categorical})
        >>> sample = dist.sample((4,))
        >>> sample.batch_size, sample["cont"].shape, sample["nested", "disc"].shape
        (torch.Size([4, 3]), torch.Size([4, 3, 4]), torch.Size([4, 3]))
        >>> sorted(dist.log_prob(sample).keys(True, True), key=str)
        [('nested', 'disc_log_prob'), 'cont_log_prob']
    """

    # Its values, scores and entropies are TensorDicts where torch's Distribution has tensors (as upstream's
    # composite): the overrides below say so, against Distribution's signatures.
    if TYPE_CHECKING:
        aggregate_probabilities: Optional[bool]  # set by from_distributions only, as upstream

    def __init__(
        self,
        params: Any,
        distribution_map: dict,
        *,
        name_map: dict | None = None,
        extra_kwargs: dict | None = None,
        log_prob_key: Any = None,
        entropy_key: Any = None,
    ) -> None:
        self._batch_shape = params.shape
        self._event_shape = torch.Size(())
        extra_kwargs = extra_kwargs or {}
        write_keys = _resolve_name_map(name_map, distribution_map)
        components = {}
        for raw_name, dist_class in distribution_map.items():
            name = unravel_key(raw_name)
            component_params = params.get(name, None)
            if component_params is None:
                raise KeyError(f"no param {name} found in params with keys {params.keys(True, True)}")
            kwargs = extra_kwargs.get(name, extra_kwargs.get(raw_name, {}))
            components[write_keys[name]] = dist_class(**component_params, **kwargs)
        self.dists = components
        self.log_prob_key = log_prob_key
        self.entropy_key = entropy_key

    @classmethod
    def from_distributions(
        cls,
        params: Any,
        distributions: Dict[Any, d.Distribution],
        *,
        name_map: dict | None = None,
        log_prob_key: Any = None,
        entropy_key: Any = None,
    ) -> CompositeDistribution:
        """A composite over ready-made distribution instances; ``params`` only gives the batch shape."""
        self = cls.__new__(cls)
        self._batch_shape = params.shape
        self._event_shape = torch.Size(())
        write_keys = _resolve_name_map(name_map, distributions)
        self.dists = {write_keys[unravel_key(name)]: dist for name, dist in distributions.items()}
        self.log_prob_key = log_prob_key
        self.entropy_key = entropy_key
        self.aggregate_probabilities = None
        return self

    # Mapping protocol: sample key -> component.
    def __iter__(self) -> Iterator:
        return iter(self.dists)

    def __getitem__(self, item: Any) -> d.Distribution:
        return self.dists[item]

    def __len__(self) -> int:
        return len(self.dists)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dists})"

    @property
    def log_prob_key(self) -> Any:
        """Key of the summed log-probability (``"sample_log_prob"`` unless set; ``None`` restores it)."""
        return "sample_log_prob" if self._log_prob_key is None else self._log_prob_key

    @log_prob_key.setter
    def log_prob_key(self, value: Any) -> None:
        self._log_prob_key = value

    @property
    def entropy_key(self) -> Any:
        """Key of the summed entropy (``"entropy"`` unless set; ``None`` restores it)."""
        return "entropy" if self._entropy_key is None else self._entropy_key

    @entropy_key.setter
    def entropy_key(self, value: Any) -> None:
        self._entropy_key = value

    def _as_tensordict(self, values: dict, leading: tuple = ()) -> TensorDict:
        return TensorDict(values, torch.Size(leading) + self.batch_shape)

    # --- values ---------------------------------------------------------------------------------------

    def sample(self, shape: Any = None) -> TensorDict:  # type: ignore[override]
        """A TensorDict of draws, batch size ``shape + batch_shape``."""
        shape = torch.Size(shape) if shape is not None else torch.Size()
        return self._as_tensordict({key: dist.sample(shape) for key, dist in self.dists.items()}, shape)

    def rsample(self, shape: Any = None) -> TensorDict:  # type: ignore[override]
        """A TensorDict of reparameterized draws (every component must support ``rsample``)."""
        shape = torch.Size(shape) if shape is not None else torch.Size()
        return self._as_tensordict({key: dist.rsample(shape) for key, dist in self.dists.items()}, shape)

    @property
    def mode(self) -> TensorDict:  # type: ignore[override]
        return self._as_tensordict({key: dist.mode for key, dist in self.dists.items()})

    @property
    def mean(self) -> TensorDict:  # type: ignore[override]
        return self._as_tensordict({key: dist.mean for key, dist in self.dists.items()})

    @property
    def deterministic_sample(self) -> TensorDict:
        """Each component's ``deterministic_sample``, or its registered / support-based stand-in.

        Raises:
            NotImplementedError: when the stand-in (mean or mode) is not implemented for a component.
        """
        return self._as_tensordict({key: self._point_value(dist) for key, dist in self.dists.items()})

    def _point_value(self, dist: d.Distribution) -> torch.Tensor:
        value = _fallbacks.builtin_deterministic_sample(dist)
        if value is not None:
            return value
        registered = _fallbacks.registered_type(dist)
        if registered is InteractionType.RANDOM:
            return dist.rsample() if dist.has_rsample else dist.sample()
        if registered is InteractionType.DETERMINISTIC and isinstance(dist, d.Independent):
            # Independent only reinterprets dims: its base's point value is its own.
            base_value = _fallbacks.builtin_deterministic_sample(dist.base_dist)
            if base_value is not None:
                return base_value
        if registered is InteractionType.MODE:
            fallback = "mode"
        elif registered is InteractionType.MEAN:
            fallback = "mean"
        elif registered is None:
            fallback = _fallbacks.support_fallback(dist)
        else:
            raise RuntimeError(f"InteractionType {registered} is unaccounted for.")
        # For a registered class an AttributeError is a bug worth seeing; for an unknown one it means "absent".
        absent = (AttributeError, NotImplementedError) if registered is None else (NotImplementedError,)
        try:
            value = dist.mean if fallback == "mean" else dist.mode
        except absent as err:
            raise NotImplementedError(
                f"{type(dist)} has no deterministic_sample, and its {fallback} "
                f"is not implemented, so {type(self).__name__} cannot compute "
                f"a deterministic sample for it. Use a distribution with a "
                f"deterministic_sample attribute (for example TanhNormal), or "
                f"another interaction type."
            ) from err
        if registered is None:
            warnings.warn(_fallbacks.fallback_warning(dist, type(self).__name__, fallback), UserWarning, stacklevel=3)
        return value

    # --- sampling with scores ------------------------------------------------------------------------------

    def sample_and_log_prob(self, shape: Any = None) -> tuple[TensorDict, torch.Tensor | TensorDict]:
        """A draw and the log-probability of that same draw (in `log_prob`'s layout).

        A component with its own ``sample_and_log_prob`` scores its draw itself.
        """
        return self._draw_and_score(shape, reparameterized=False)

    def rsample_and_log_prob(self, shape: Any = None) -> tuple[TensorDict, torch.Tensor | TensorDict]:
        """As `sample_and_log_prob`, with reparameterized draws (``rsample_and_log_prob`` of a component)."""
        return self._draw_and_score(shape, reparameterized=True)

    def _draw_and_score(self, shape: Any, *, reparameterized: bool) -> tuple[TensorDict, Any]:
        shape = torch.Size(shape) if shape is not None else torch.Size()
        joint = "rsample_and_log_prob" if reparameterized else "sample_and_log_prob"
        draws, scores = {}, {}
        for key, dist in self.dists.items():
            if callable(getattr(type(dist), joint, None)):
                draws[key], scores[key] = getattr(dist, joint)(shape)
            else:
                draws[key] = dist.rsample(shape) if reparameterized else dist.sample(shape)
                scores[key] = dist.log_prob(draws[key])
        sample = self._as_tensordict(draws, shape)
        if not composite_lp_aggregate():
            named = {_add_suffix(key, "_log_prob"): lp for key, lp in scores.items()}
            return sample, sample.empty(recurse=True).update(named).filter_empty_()
        total: torch.Tensor | float = 0.0  # a tensor once a component adds to it
        for lp in scores.values():
            total = total + _sum_event_dims(lp, sample.ndim)
        return sample, total

    # --- scores ---------------------------------------------------------------------------------------

    # A TensorDict of per-component entries, or their sum while composite_lp_aggregate() (a tensor; 0.0 with no
    # component): the type follows that mode, which no annotation can say.
    def log_prob(self, sample: Any) -> Any:
        """The log-probability of a sample TensorDict: per-component entries, or their sum when aggregating."""
        if not composite_lp_aggregate():
            return self.log_prob_composite(sample)
        total: torch.Tensor | float = 0.0  # a tensor once a component adds to it
        for key, dist in self.dists.items():
            total = total + _sum_event_dims(dist.log_prob(sample.get(key)), sample.ndim)
        return total

    def log_prob_composite(self, sample: Any, *, include_sum: bool | None = None) -> TensorDict:
        """The ``<key>_log_prob`` entries (and, with ``include_sum``, their sum at `log_prob_key`).

        While `composite_lp_aggregate()` is ``True`` they are written into ``sample``, which is returned;
        otherwise they go to a new TensorDict.
        """
        aggregate = composite_lp_aggregate()
        if include_sum is None:
            include_sum = aggregate
        entries: dict = {}
        total: torch.Tensor | float = 0.0  # a tensor once a component adds to it
        for key, dist in self.dists.items():
            try:
                value = sample.get(key)
            except AttributeError:
                raise RuntimeError(
                    f"Expected a tensordict sample, but got a {type(sample).__name__} instead."
                ) from None
            lp = entries[_add_suffix(key, "_log_prob")] = dist.log_prob(value)
            if include_sum:
                total = total + _sum_event_dims(lp, sample.ndim)
        if include_sum:
            entries[self.log_prob_key] = total
        if aggregate:
            return sample.update(entries)
        return sample.empty(recurse=True).update(entries).filter_empty_()

    def entropy(
        self,
        samples_mc: int = 1,
        *,
        aggregate_probabilities: bool | None = None,
        include_sum: bool | None = None,
    ) -> Any:  # as log_prob's
        """Per-component entropies (a TensorDict), or their sum while `composite_lp_aggregate()` is ``True``.

        A component without a closed form gets a Monte Carlo estimate from ``samples_mc`` ``rsample`` draws.
        ``aggregate_probabilities`` is deprecated and ignored.
        """
        if aggregate_probabilities is not None:
            warnings.warn(
                "CompositeDistribution.entropy(aggregate_probabilities=...), which has no effect, is deprecated "
                "and will be removed in TensorDict 0.17. Use set_composite_lp_aggregate instead.",
                DeprecationWarning,
                stacklevel=2,
            )
        aggregate = composite_lp_aggregate()
        if include_sum is None:
            include_sum = aggregate
        if not aggregate:
            return self.entropy_composite(samples_mc, include_sum=include_sum)
        total: torch.Tensor | float = 0.0  # a tensor once a component adds to it
        for dist in self.dists.values():
            total = total + _sum_event_dims(_entropy_or_estimate(dist, samples_mc), len(self.batch_shape))
        return total

    def entropy_composite(self, samples_mc: int = 1, *, include_sum: bool | None = None) -> TensorDict:
        """A new TensorDict of ``<key>_entropy`` entries (and, with ``include_sum``, their sum at `entropy_key`)."""
        if include_sum is None:
            include_sum = composite_lp_aggregate()
        entries: dict = {}
        total: torch.Tensor | float = 0.0  # a tensor once a component adds to it
        for key, dist in self.dists.items():
            ent = entries[_add_suffix(key, "_entropy")] = _entropy_or_estimate(dist, samples_mc)
            if include_sum:
                total = total + _sum_event_dims(ent, len(self.batch_shape))
        if include_sum:
            entries[self.entropy_key] = total
        return self._as_tensordict(entries)

    def cdf(self, sample: Any) -> Any:
        """Writes each component's CDF at ``<key>_cdf`` into ``sample`` and returns it."""
        sample.update({_add_suffix(key, "_cdf"): dist.cdf(sample.get(key)) for key, dist in self.dists.items()})
        return sample

    def icdf(self, sample: Any) -> Any:
        """Writes each component's inverse CDF at ``<key>_icdf`` into ``sample`` and returns it.

        The probability is read at ``<key>_cdf``, or computed from the value at ``key`` when that is absent.

        Raises:
            KeyError: when neither entry exists for a component.
        """
        for key, dist in self.dists.items():
            cdf_key = _add_suffix(key, "_cdf")
            prob = sample.get(cdf_key, None)
            if prob is None:
                value = sample.get(key, None)
                if value is None:
                    raise KeyError(
                        f"Neither {key} nor {cdf_key} could be found in the sampled tensordict. "
                        f"Make sure one of these is available to icdf."
                    )
                prob = dist.cdf(value)
            sample.set(_add_suffix(key, "_icdf"), dist.icdf(prob))
        return sample
