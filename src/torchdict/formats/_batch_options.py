"""The batch options every tabular / struct-array reader takes: ``auto_batch_size``, ``batch_dims``, ``batch_size``.

Upstream's readers build their result with ``batch_size`` (or the shape of the data), then apply
``auto_batch_size`` (refused together with ``batch_size``) and warn when ``batch_dims`` is given alone, since
upstream 0.17 will start inferring the batch size from it.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

__all__ = ["apply_batch_options", "result_class"]


def result_class(cls: Optional[type]) -> type:
    """The class a ``from_*`` classmethod builds: ``cls`` when it is a TensorDict, else TensorDict itself."""
    from ..tensordict import TensorDict

    return cls if isinstance(cls, type) and issubclass(cls, TensorDict) else TensorDict


def apply_batch_options(result: Any, name: str, auto_batch_size: bool, batch_dims: Optional[int],
                        batch_size: Any) -> Any:
    """Apply ``auto_batch_size`` / ``batch_dims`` to a reader's ``result`` (built with ``batch_size``)."""
    if auto_batch_size:
        if batch_size is not None:
            raise TypeError(f"Conflicting batch sizes in {name}: batch_size and auto_batch_size cannot be both "
                            "specified.")
        result.auto_batch_size_(batch_dims=batch_dims)
    elif batch_dims is not None and _batch_dims_would_change(result, batch_dims, batch_size):
        advice = ("Drop batch_dims to keep today's result." if batch_size is not None
                  else "Pass auto_batch_size=True to get that result now, or drop batch_dims.")
        warnings.warn(f"{name} ignores batch_dims={batch_dims} without auto_batch_size=True. Starting with "
                      "TensorDict 0.17, the default will change to turning auto_batch_size on when batch_dims is "
                      f"given, as from_dict does. {advice}", FutureWarning, stacklevel=4)
    return result


def _batch_dims_would_change(result: Any, batch_dims: int, batch_size: Any) -> bool:
    """Whether inferring the batch size from ``batch_dims`` would give another result than ``result``."""
    if batch_size is not None:
        return True  # auto_batch_size would then be refused: the call itself changes
    try:
        inferred = result.copy().auto_batch_size_(batch_dims=batch_dims)
    except Exception:
        return True
    if inferred.batch_size != result.batch_size:
        return True
    return any(inferred.get(key).batch_size != value.batch_size
               for key, value in result.items(include_nested=True) if hasattr(value, "auto_batch_size_"))
