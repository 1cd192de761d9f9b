"""How a probabilistic module gets a value out of a distribution: the interaction types, the fallbacks of
``DETERMINISTIC``, sampling on a given generator, and small helpers the module and the sequence share."""
from __future__ import annotations

import contextlib
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import torch
from torch import distributions as D
from torch.compiler import is_compiling

from ..base import TensorDictBase
from ..nontensor import is_non_tensor
from ._modes import InteractionType
from .distributions import _fallbacks

if TYPE_CHECKING:
    from typing import Sequence


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside torchdict and torch."""
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith(("torchdict.", "torch.")):
        frame = frame.f_back
        level += 1
    return level


def _zip_strict(*iterables: Any) -> Iterator:
    return zip(*iterables, strict=True)


def _sum_of_leaves(log_prob: TensorDictBase) -> Any:
    """The sum over every entry of ``log_prob`` and over each entry's non-batch dims."""
    return sum(log_prob.sum(dim="feature").values(True, True))


@contextlib.contextmanager
def _sampling_with(generator: Optional[torch.Generator]) -> Iterator[None]:
    """Run the block on ``generator``'s stream (advanced in place), leaving the global RNG untouched."""
    if generator is None or is_compiling():
        yield
        return
    device = generator.device
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index]):
            torch.cuda.set_rng_state(generator.get_state(), index)
            try:
                yield
            finally:
                generator.set_state(torch.cuda.get_rng_state(index))
    else:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(generator.get_state())
            try:
                yield
            finally:
                generator.set_state(torch.get_rng_state())


def _rename_entries(tensordict: TensorDictBase, renames: list) -> None:
    # Pop every source first, so two keys swapping names do not overwrite each other.
    values = [tensordict.pop(source) for source, _ in renames]
    for (_, target), value in zip(renames, values):
        tensordict.set(target, value)


def _joint_sample_and_log_prob(dist: Any) -> Optional[Callable]:
    """The distribution's own draw-and-score method (``rsample_and_log_prob`` when it reparameterizes)."""
    if not isinstance(dist, D.Distribution):
        return None
    name = "rsample_and_log_prob" if dist.has_rsample else "sample_and_log_prob"
    if callable(getattr(type(dist), name, None)):
        return getattr(dist, name)
    return None


def _plain_kwargs(kwargs: Any) -> Any:
    # Under torch.compile, unpacking a TensorDict of constants is replaced by a plain dict of its entries.
    if not is_compiling() or not isinstance(kwargs, TensorDictBase):
        return kwargs
    return {key: value.data if is_non_tensor(value) else value for key, value in kwargs.items()}


def _draw(owner: Any, dist: Any, itype: Optional[InteractionType], generator: Optional[torch.Generator],
          num_samples: Optional[Sequence[int]], n_empirical_estimate: int) -> Any:
    """One value of ``dist`` for the interaction type (``None``: the owner's default)."""
    if not isinstance(dist, D.Distribution):
        raise TypeError("Expected Distribution, but got {}".format(type(dist)))
    if itype is None:
        itype = owner.default_interaction_type
    if isinstance(dist, D.LKJCholesky) and itype in (
        InteractionType.DETERMINISTIC, InteractionType.MEAN, InteractionType.MODE
    ):
        raise RuntimeError(f"DETERMINISTIC, MEAN and MODE are not implemented for {type(dist).__name__}.")
    if itype is InteractionType.DETERMINISTIC:
        value = _fallbacks.builtin_deterministic_sample(dist)
        if value is not None:
            return value
        registered = _fallbacks.registered_type(dist)
        if registered is InteractionType.DETERMINISTIC and isinstance(dist, D.Independent):
            value = _fallbacks.builtin_deterministic_sample(dist.base_dist)
            if value is not None:
                return value
        if registered is None:
            fallback = _fallbacks.support_fallback(dist)
            warnings.warn(_fallbacks.fallback_warning(dist, type(owner).__name__, fallback), UserWarning,
                          stacklevel=_user_stacklevel())
            registered = InteractionType.MEAN if fallback == "mean" else InteractionType.MODE
        itype = registered
    if itype is InteractionType.MODE:
        try:
            return dist.mode
        except AttributeError:
            raise NotImplementedError(f"method {type(dist)}.mode is not implemented") from None
    if itype is InteractionType.MEDIAN:
        try:
            return dist.median
        except AttributeError:
            raise NotImplementedError(f"method {type(dist)}.median is not implemented") from None
    if itype is InteractionType.MEAN:
        try:
            return dist.mean
        except (AttributeError, NotImplementedError):
            pass
        # No closed-form mean: average draws.
        with _sampling_with(generator):
            draws = dist.rsample((n_empirical_estimate,)) if dist.has_rsample else dist.sample((n_empirical_estimate,))
        return draws.mean(0)
    if itype is InteractionType.RANDOM:
        shape = num_samples if num_samples is not None else torch.Size(())
        with _sampling_with(generator):
            return dist.rsample(shape) if dist.has_rsample else dist.sample(shape)
    raise NotImplementedError(f"unknown interaction_type {itype}")


def _sample(owner: Any, dist: Any, itype: Optional[InteractionType], generator: Optional[torch.Generator],
            n_empirical_estimate: int) -> Any:
    """`_draw`, with a non-random value repeated over ``num_samples`` (only ``RANDOM`` draws that many)."""
    if itype is None:
        itype = owner.default_interaction_type
    num_samples = owner.num_samples
    value = _draw(owner, dist, itype, generator, num_samples, n_empirical_estimate)
    if num_samples and itype is not InteractionType.RANDOM:
        if isinstance(value, tuple):
            return tuple(item.expand(num_samples + item.shape) for item in value)
        return value.expand(num_samples + value.shape)
    return value
