"""``torchdict.utils``: the helpers programs import from upstream's ``tensordict.utils``.

Keys (``NestedKey``, ``unravel_key``, ``unravel_key_list``, ``unravel_key_to_tuple``, ``KEY_SEPARATOR``),
right-aligned expansion (``expand_right``, ``expand_as_right``), type tests (``is_tensorclass``,
``is_non_tensor``, ``is_batchedtensor``, ``is_compiling``), dtype predicates usable as ``cast_filter``
(``is_bool``, ``is_floating``, ``is_inexact``, ``is_integer``), the behaviour toggles, test helpers
(``assert_close`` / ``assert_allclose_td``), ``parse_tensor_dict_string``, the batch helpers ``isin`` and
``remove_duplicates``, ``print_directory_tree`` and the ``timeit`` timer.

Imported on first use (``import torchdict`` does not load it).
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple, TypeVar, Union

import torch
from torch._C._functorch import is_batchedtensor
from torch.compiler import is_compiling

from ._future import TensorDictFuture
from ._keys import NestedKey, unravel_key, unravel_key_list
from ._linked_list import LinkedList
from ._options import (capture_non_tensor_stack, get_printoptions, lazy_legacy, list_to_stack,
                       set_capture_non_tensor_stack, set_lazy_legacy, set_list_to_stack, set_printoptions)
from ._parse_repr import parse_tensor_dict_string
from .tensorclass import is_tensorclass

__all__ = [
    "KEY_SEPARATOR", "NestedKey", "IndexType", "DeviceType", "unravel_key", "unravel_key_list",
    "unravel_key_to_tuple", "expand_as_right", "expand_right", "is_tensorclass", "is_non_tensor",
    "is_batchedtensor", "is_compiling", "is_bool", "is_floating", "is_inexact", "is_integer", "assert_close",
    "assert_allclose_td", "parse_tensor_dict_string", "isin", "remove_duplicates", "print_directory_tree",
    "timeit", "capture_non_tensor_stack", "get_printoptions", "lazy_legacy", "list_to_stack",
    "set_capture_non_tensor_stack", "set_lazy_legacy", "set_list_to_stack", "set_printoptions",
    "LinkedList", "TensorDictFuture",
]

#: The separator ``flatten_keys`` / ``unflatten_keys`` use by default.
KEY_SEPARATOR = "."

T = TypeVar("T")
IndexType = Union[None, int, slice, str, torch.Tensor, List[Any], Tuple[Any, ...]]
DeviceType = Union[torch.device, str, int]

_zip_strict = functools.partial(zip, strict=True)


# ---------------------------------------------------------------------------------------------- keys
def _flat_key_parts(key: Any, out: list) -> bool:
    if isinstance(key, str):
        out.append(key)
        return True
    if type(key) is tuple:
        return all(_flat_key_parts(part, out) for part in key)
    return False


def unravel_key_to_tuple(key: NestedKey) -> Tuple[str, ...]:
    """A nested key as a flat tuple of str; ``()`` when ``key`` is not a key (upstream does not raise).

    >>> unravel_key_to_tuple(("a", ("b", "c"))), unravel_key_to_tuple("a"), unravel_key_to_tuple(1)
    (('a', 'b', 'c'), ('a',), ())
    """
    parts: list = []
    return tuple(parts) if _flat_key_parts(key, parts) else ()


_unravel_key_to_tuple = unravel_key_to_tuple


# ---------------------------------------------------------------------------------------------- expansion
def expand_as_right(tensor: Any, dest: Any) -> Any:
    """``tensor`` with dims added on the right, then expanded to ``dest``'s shape (its batch size for a
    TensorDict). The leading dims must match ``dest``'s or be 1; the result is a view.

    >>> expand_as_right(torch.arange(3), torch.zeros(3, 2))
    tensor([[0, 0],
            [1, 1],
            [2, 2]])
    """
    if dest.ndimension() < tensor.ndimension():
        raise RuntimeError(
            "expand_as_right requires the destination tensor to have at least as many dimensions as the input "
            f"tensor, got tensor.ndimension()={tensor.ndimension()} and dest.ndimension()={dest.ndimension()}")
    for position in range(tensor.ndimension()):
        if tensor.shape[position] not in (1, dest.shape[position]):
            raise RuntimeError(f"tensor shape is incompatible with dest shape, got: tensor.shape={tensor.shape}, "
                               f"dest={dest.shape}")
    for _ in range(dest.ndimension() - tensor.ndimension()):
        tensor = tensor.unsqueeze(-1)
    return tensor.expand(dest.shape)


def expand_right(tensor: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``tensor`` with dims added on the right until it has ``len(shape)`` dims, then expanded to ``shape``.

    >>> expand_right(torch.zeros(3, 4), (3, 4, 5)).shape
    torch.Size([3, 4, 5])
    """
    while tensor.ndimension() < len(shape):
        tensor = tensor.unsqueeze(-1)
    return tensor.expand(shape)


# ---------------------------------------------------------------------------------------------- type tests
def is_non_tensor(data: Any) -> bool:
    """Whether ``data`` is non-tensor data (a ``NonTensorData`` / ``NonTensorStack`` instance).

    >>> from torchdict import NonTensorData, TensorDict
    >>> is_non_tensor(NonTensorData("a")), is_non_tensor(TensorDict())
    (True, False)
    """
    return bool(getattr(type(data), "_is_non_tensor", False))


def is_inexact(*args: Any) -> bool:
    """Whether the last argument has a floating-point or complex dtype (``fn(value)`` or ``fn(key, value)``,
    so it serves as ``apply``'s function and as a ``cast_filter``).

    >>> is_inexact(torch.zeros(3)), is_inexact("key", torch.zeros(3, dtype=torch.long))
    (True, False)
    """
    dtype = args[-1].dtype
    return dtype.is_floating_point or dtype.is_complex


def is_floating(*args: Any) -> bool:
    """Whether the last argument has a floating-point dtype.

    >>> is_floating(torch.zeros(3)), is_floating(torch.zeros(3, dtype=torch.complex64))
    (True, False)
    """
    return args[-1].dtype.is_floating_point


def is_integer(*args: Any) -> bool:
    """Whether the last argument has an integer dtype (signed or unsigned; not bool).

    >>> is_integer(torch.zeros(3, dtype=torch.uint8)), is_integer(torch.zeros(3, dtype=torch.bool))
    (True, False)
    """
    dtype = args[-1].dtype
    return not (dtype.is_floating_point or dtype.is_complex or dtype is torch.bool)


def is_bool(*args: Any) -> bool:
    """Whether the last argument has dtype ``torch.bool``.

    >>> is_bool(torch.zeros(3, dtype=torch.bool)), is_bool("mask", torch.zeros(3))
    (True, False)
    """
    return args[-1].dtype is torch.bool


# ---------------------------------------------------------------------------------------------- testing
def assert_close(actual: Any, expected: Any, rtol: float | None = None, atol: float | None = None,
                 equal_nan: bool = True, intersection: bool = False, msg: str = "",
                 prefix: NestedKey = ()) -> bool:
    """Check that two collections have the same keys and close tensors (``torch.testing.assert_close`` per
    leaf, which checks dtypes, shapes and devices too); non-tensor data is not compared. Returns True.

    ``intersection=True`` compares the keys both hold; otherwise different keys raise ``KeyError``. A
    mismatch raises ``AssertionError`` naming the key and the root mean squared error.

    >>> from torchdict import TensorDict
    >>> a = TensorDict(x=torch.zeros(3))
    >>> assert_close(a, a.clone())
    True
    """
    from ._base import is_tensor_collection

    if not is_tensor_collection(type(actual)) or not is_tensor_collection(type(expected)):
        raise TypeError(f"assert_allclose inputs must be of TensorDict type, got {type(actual)} and {type(expected)}")
    actual = _inner(actual)
    expected = _inner(expected)
    prefix = unravel_key_to_tuple(prefix) if prefix != () else ()
    if _is_lazy(actual) and _is_lazy(expected):
        if expected.stack_dim != actual.stack_dim:
            expected = expected.to_lazystack(actual.stack_dim)
        for sub_actual, sub_expected in _zip_strict(actual.tensordicts, expected.tensordicts):
            assert_close(sub_actual, sub_expected, rtol=rtol, atol=atol, equal_nan=equal_nan,
                         intersection=intersection, msg=msg, prefix=prefix)
        return True
    actual_keys, expected_keys = set(actual.keys()), set(expected.keys())
    if actual_keys != expected_keys:
        if not intersection:
            raise KeyError(f"key sets mismatch: only in actual: {sorted(actual_keys - expected_keys)}, "
                           f"only in expected: {sorted(expected_keys - actual_keys)}")
        actual = actual.select(*expected_keys, strict=False)
        expected = expected.select(*actual_keys, strict=False)
    for key in sorted(actual.keys(), key=str):
        first, second = actual.get(key), expected.get(key)
        if is_tensor_collection(type(first)):
            if not is_non_tensor(first):
                assert_close(first, second, rtol=rtol, atol=atol, equal_nan=equal_nan, intersection=intersection,
                             msg=msg, prefix=prefix + (key,))
            continue
        if not isinstance(first, torch.Tensor):
            continue
        try:
            squared = (first.detach().to(torch.float) - second.detach().to(torch.float)).pow(2).sum()
        except Exception as error:
            raise RuntimeError(f"Failed to compare key {prefix + (key,)}. Scroll up for more details.") from error
        rmse = squared.div(max(first.numel(), 1)).sqrt().item()
        header = f"key {prefix + (key,)} does not match, got mse = {rmse:4.4f}"
        header = ",\t".join([header, msg]) if msg else header
        def message(torch_msg: str, header: str = header) -> str:
            return f"{header}\n{torch_msg}"

        torch.testing.assert_close(first.detach(), second.detach(), rtol=rtol, atol=atol, equal_nan=equal_nan,
                                   msg=message)
    return True


assert_allclose_td = assert_close


def _inner(collection: Any) -> Any:
    inner = getattr(collection, "_tensordict", None)
    return inner if is_tensorclass(collection) else collection


def _is_lazy(collection: Any) -> bool:
    return hasattr(collection, "tensordicts") and hasattr(collection, "stack_dim")


# ---------------------------------------------------------------------------------------------- batch helpers
def _slices(td: Any, key: NestedKey, dim: int, name: str) -> torch.Tensor:
    value = td.get(key, None)
    if not isinstance(value, torch.Tensor):
        raise KeyError(f"The key {key!r} must hold a tensor in the {name} tensordict.")
    return value.movedim(dim, 0)


def isin(input: Any, reference: Any, key: NestedKey, dim: int = 0) -> torch.Tensor:
    """Which elements of ``input`` along batch dim ``dim`` have a ``key`` slice equal to one of ``reference``'s.

    >>> from torchdict import TensorDict
    >>> td = TensorDict(a=torch.arange(4).view(4, 1), batch_size=[4])
    >>> isin(td, TensorDict(a=torch.tensor([[1], [3]]), batch_size=[2]), "a")
    tensor([False,  True, False,  True])
    """
    if input.batch_dims != reference.batch_dims:
        raise ValueError(f"The input and reference tensordicts must have the same number of batch dimensions, got "
                         f"{input.batch_dims} and {reference.batch_dims}.")
    if not -input.batch_dims <= dim < input.batch_dims:
        raise ValueError(f"The dimension {dim} is not a batch dimension of a tensordict with batch size "
                         f"{input.batch_size}.")
    dim %= input.batch_dims
    mine = _slices(input, key, dim, "input")
    theirs = _slices(reference, key, dim, "reference")
    if mine.shape[1:] != theirs.shape[1:]:
        raise RuntimeError(f"The entries {key!r} of input and reference must have the same shape outside dim {dim}, "
                           f"got {tuple(mine.movedim(0, dim).shape)} and {tuple(theirs.movedim(0, dim).shape)}.")
    if len(mine) == 0 or len(theirs) == 0:
        return torch.zeros(len(mine), dtype=torch.bool, device=mine.device)
    mine_flat = mine.reshape(len(mine), -1)
    theirs_flat = theirs.reshape(len(theirs), -1).to(mine_flat.device)
    return (mine_flat.unsqueeze(1) == theirs_flat.unsqueeze(0)).all(-1).any(-1)


def remove_duplicates(input: Any, key: NestedKey, dim: int = 0, *, return_indices: bool = False) -> Any:
    """``input`` keeping, along batch dim ``dim``, the first element of each group with equal ``key`` slices;
    sorted by the value of ``key`` (as ``torch.unique``). ``return_indices=True`` also returns, per input
    element, the index of its value in the result.

    >>> from torchdict import TensorDict
    >>> td = TensorDict(a=torch.tensor([3, 1, 3, 2]), b=torch.arange(4), batch_size=[4])
    >>> remove_duplicates(td, "a")["b"]
    tensor([1, 3, 0])
    """
    if not -input.batch_dims <= dim < input.batch_dims:
        raise ValueError(f"The dimension {dim} is not a batch dimension of a tensordict with batch size "
                         f"{input.batch_size}.")
    dim %= input.batch_dims
    values = _slices(input, key, dim, "input")
    _, inverse = torch.unique(values, dim=0, sorted=True, return_inverse=True)
    count = int(inverse.max()) + 1 if inverse.numel() else 0
    # The first position of each unique value: the smallest position among those mapping to it.
    positions = torch.arange(len(inverse), device=inverse.device)
    first = torch.full((count,), len(inverse), dtype=positions.dtype, device=inverse.device)
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    index = [slice(None)] * dim + [first]
    result = input[tuple(index)]
    return (result, inverse) if return_indices else result


# ---------------------------------------------------------------------------------------------- misc
def print_directory_tree(path: str, indent: str = "", display_metadata: bool = True) -> str:
    """Print (and return) the tree of files under ``path``, with their sizes when ``display_metadata``."""
    lines = []

    def walk(folder: str, prefix: str) -> None:
        name = os.path.basename(os.path.normpath(folder)) or folder
        if display_metadata:
            total = sum(os.path.getsize(os.path.join(root, file))
                        for root, _, files in os.walk(folder) for file in files)
            lines.append(f"{prefix}{name}/ ({total / 1024 / 1024:.2f} MB)")
        else:
            lines.append(f"{prefix}{name}/")
        for entry in sorted(os.listdir(folder)):
            full = os.path.join(folder, entry)
            if os.path.isdir(full) and not os.path.islink(full):
                walk(full, prefix + "    ")
            elif display_metadata:
                lines.append(f"{prefix}    {entry} ({os.path.getsize(full) / 1024 / 1024:.2f} MB)")
            else:
                lines.append(f"{prefix}    {entry}")

    walk(path, indent)
    text = "\n".join(lines)
    print(text)
    return text


class timeit:
    """Time a function (decorator) or a block (``with``) under a name: call count, total and mean times.

    >>> with timeit("block"):
    ...     _ = sum(range(10))
    >>> timeit.todict()["block"] >= 0
    True
    >>> timeit.erase()
    """

    _REG: Dict[str, list] = {}

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return timed

    def __enter__(self) -> "timeit":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        elapsed = time.perf_counter() - self._start
        record = self._REG.setdefault(self.name, [0.0, 0.0, 0])  # mean, total, count
        record[2] += 1
        record[1] += elapsed
        record[0] = record[1] / record[2]

    @classmethod
    def print(cls, prefix: str | None = None) -> str:
        """Print (and return) one line per name: ``name took <mean> msec (total = <total> sec)``."""
        lines = []
        for name, (mean, total, _count) in sorted(cls._REG.items(), key=lambda item: -item[1][1]):
            line = f"{name} took {mean * 1000:4.4f} msec (total = {total:4.4f} sec)"
            lines.append(f"{prefix} {line}" if prefix else line)
        text = "\n".join(lines)
        if text:
            print(text)
        return text

    @classmethod
    def todict(cls, percall: bool = True, prefix: str | None = None) -> Dict[str, float]:
        """Name -> mean time per call (``percall``) or total time, in seconds."""
        key = (lambda name: f"{prefix}/{name}") if prefix else (lambda name: name)
        return {key(name): record[0] if percall else record[1] for name, record in cls._REG.items()}

    @classmethod
    def erase(cls) -> None:
        cls._REG.clear()
