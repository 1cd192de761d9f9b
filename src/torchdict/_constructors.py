"""The other ways to build a TensorDict: ``fromkeys``, ``from_dict`` and ``auto_batch_size_``."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ._convert import to_leaf
from ._keys import key_to_tuple

if TYPE_CHECKING:
    from .tensordict import TensorDict


class ConstructorsMixin:
    __slots__ = ()

    @classmethod
    def fromkeys(cls, keys: Sequence[Any], value: Any = 0) -> "TensorDict":
        """A new TensorDict with every key set to ``value`` (one shared leaf).

        >>> TensorDict.fromkeys(["a", ("b", "c")], 0)["b", "c"]
        tensor(0)
        """
        td = cls()
        leaf = to_leaf(value, None, td._batch_size, None)
        for key in keys:
            td._set_path(key_to_tuple(key), leaf)
        return td

    @classmethod
    def from_dict(cls, input_dict: Mapping, *, auto_batch_size: Optional[bool] = None,
                  batch_size: Any = None, device: Any = None, batch_dims: Optional[int] = None,
                  names: Optional[Sequence[Optional[str]]] = None) -> "TensorDict":
        """Recursively convert a (nested) mapping.

        With ``batch_dims`` (or ``auto_batch_size=True``) the batch size is the
        leading dims shared by every leaf (at most ``batch_dims`` of them).

        >>> TensorDict.from_dict({"a": torch.zeros(3, 2)}, batch_dims=1).batch_size
        torch.Size([3])
        """
        if isinstance(input_dict, Mapping) and any(type(key) is tuple for key in input_dict):
            # Tuple keys merge into the levels the other keys make (the constructor refuses a str key
            # that would replace a level written through a tuple key): they go last.
            input_dict = {**{key: value for key, value in input_dict.items() if type(key) is not tuple},
                          **{key: value for key, value in input_dict.items() if type(key) is tuple}}
        td = cls(input_dict, batch_size=batch_size, device=device)
        if batch_size is None and (auto_batch_size or batch_dims is not None):
            td.auto_batch_size_(batch_dims)
        if names is not None:
            td.names = names
        return td

    def auto_batch_size_(self, batch_dims: Optional[int] = None) -> "TensorDict":
        """Set the batch size to the leading dims common to every leaf (at most ``batch_dims``),
        and each sub-TensorDict's to those common to its own leaves, as upstream; returns self.

        >>> td = TensorDict({"a": torch.zeros(4, 2), "n": {"b": torch.zeros(4, 3)}}).auto_batch_size_()
        >>> td.batch_size, td["n"].batch_size
        (torch.Size([4]), torch.Size([4, 3]))
        """
        _auto_batch_size(self, batch_dims)
        return self


def _auto_batch_size(td: Any, batch_dims: Optional[int]) -> None:
    # The sub-TensorDicts first: the dims common to a part of the leaves extend those common to all.
    subs = [value for value in td._tensordict.values() if isinstance(value, ConstructorsMixin)]
    for sub in subs:
        _auto_batch_size(sub, batch_dims)
    shapes = [leaf.shape for _, leaf in td.items(True, True)]
    common: list = []
    if shapes:
        for dims in zip(*shapes):
            if any(dim != dims[0] for dim in dims) or (batch_dims is not None and len(common) >= batch_dims):
                break
            common.append(dims[0])
    td.batch_size = torch.Size(common)
