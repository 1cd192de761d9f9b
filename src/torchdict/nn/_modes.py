"""Process-wide switches of the probabilistic layer: the interaction type and the log-prob aggregation.

Both are read on every call of a probabilistic module, so a read is one attribute lookup while no thread
has asked for a value of its own. Both work as context managers and as decorators, like upstream's.
"""
from __future__ import annotations

import enum
import os
import sys
from typing import Any

from torch.utils._contextlib import _DecoratorContextManager

from .utils import ModeSlot

__all__ = [
    "InteractionType",
    "interaction_type",
    "set_interaction_type",
    "composite_lp_aggregate",
    "set_composite_lp_aggregate",
]


class _SwitchBlock(_DecoratorContextManager):
    """A ``with`` block (or decorator) that sets a `ModeSlot` and restores the previous value on exit."""

    _slot: ModeSlot

    def _set_value(self, value: Any, thread_local: bool) -> None:
        self._value = value
        self.thread_local = thread_local

    def __enter__(self) -> None:
        if self.thread_local:
            self.prev = self._slot.get_thread_mode()
            self._slot.set_thread_mode(self._value)
        else:
            self.prev = self._slot.get_mode()
            self._slot.set_mode(self._value)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if self.thread_local:
            self._slot.set_thread_mode(self.prev)
        else:
            self._slot.set_mode(self.prev)


if sys.version_info >= (3, 11):
    _StrEnumBase = enum.StrEnum
else:  # pragma: no cover - Python 3.10

    class _StrEnumBase(str, enum.Enum):
        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]  # str's, as StrEnum's (3.11+)


class InteractionType(_StrEnumBase):
    """How a probabilistic module turns its distribution into a value.

    ``RANDOM`` draws (``rsample`` when the distribution has it), ``MODE`` / ``MEDIAN`` / ``MEAN`` read that
    attribute, and ``DETERMINISTIC`` reads ``deterministic_sample``, falling back on the mode (discrete
    support) or the mean (continuous support). Names are matched in any case.

    Examples:
        >>> from torchdict.nn.probabilistic import InteractionType
        >>> InteractionType("Random") is InteractionType.RANDOM
        True
        >>> str(InteractionType.MODE)
        'mode'
    """

    MODE = "mode"
    MEDIAN = "median"
    MEAN = "mean"
    RANDOM = "random"
    DETERMINISTIC = "deterministic"

    @classmethod
    def from_str(cls, type_str: str) -> InteractionType:
        """The member named ``type_str`` in any case; a ``ValueError`` for an unknown name."""
        return cls(type_str.lower())

    @classmethod
    def _missing_(cls, value: object) -> InteractionType | None:
        if isinstance(value, str):
            lowered = value.lower()
            for member in cls:
                if member.value == lowered:
                    return member
        return None


_interaction_slot = ModeSlot()


def interaction_type() -> InteractionType | None:
    """The interaction type of the enclosing `set_interaction_type` block, or ``None`` outside any.

    Examples:
        >>> from torchdict.nn.probabilistic import interaction_type, set_interaction_type
        >>> print(interaction_type())
        None
        >>> with set_interaction_type("mean"):
        ...     print(interaction_type())
        mean
    """
    return _interaction_slot.get_mode()


class set_interaction_type(_SwitchBlock):
    """Makes every probabilistic module inside the block (or decorated function) use ``type``.

    ``None`` lets each module use its own ``default_interaction_type``. With ``thread_local=True`` the value
    applies to the calling thread only.
    """

    _slot = _interaction_slot

    def __init__(
        self,
        type: InteractionType | str | None = InteractionType.DETERMINISTIC,
        *,
        thread_local: bool = False,
    ) -> None:
        super().__init__()
        if type is not None and not isinstance(type, InteractionType):
            if not isinstance(type, str):
                raise ValueError(f"{type} is not a valid InteractionType")
            type = InteractionType(type.lower())
        self.type = type
        self._set_value(type, thread_local)

    def clone(self) -> set_interaction_type:
        return type(self)(self.type, thread_local=self.thread_local)


def _env_flag(name: str) -> bool | None:
    raw = os.getenv(name)
    if raw is None:
        return None
    lowered = raw.lower()
    if lowered in ("1", "true", "t", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "f", "no", "n", "off"):
        return False
    raise ValueError(f"invalid truth value {lowered!r}")


_aggregate_slot = ModeSlot(default=_env_flag("COMPOSITE_LP_AGGREGATE"))


def composite_lp_aggregate(nowarn: bool = False) -> bool:
    """Whether composite distributions sum their log-probabilities (and entropies) into one tensor.

    ``False`` unless `set_composite_lp_aggregate` or the ``COMPOSITE_LP_AGGREGATE`` environment variable
    says otherwise. ``nowarn`` is accepted for compatibility and does nothing.

    Examples:
        >>> from torchdict.nn.probabilistic import composite_lp_aggregate, set_composite_lp_aggregate
        >>> composite_lp_aggregate()
        False
        >>> with set_composite_lp_aggregate(True):
        ...     composite_lp_aggregate()
        True
    """
    return bool(_aggregate_slot.get_mode())


class set_composite_lp_aggregate(_SwitchBlock):
    """Sets what `composite_lp_aggregate` returns inside the block, decorated function, or until `unset`.

    Set it before building the modules: it decides the keys their log-probabilities are written at.
    """

    _slot = _aggregate_slot

    def __init__(self, mode: bool = True, *, thread_local: bool = False) -> None:
        super().__init__()
        self.mode = mode
        self._set_value(mode, thread_local)

    def clone(self) -> set_composite_lp_aggregate:
        return type(self)(self.mode, thread_local=self.thread_local)

    def set(self) -> None:
        """Applies the mode until `unset` is called."""
        self.__enter__()

    def unset(self) -> None:
        """Restores the mode that `set` replaced."""
        self.__exit__(None, None, None)
