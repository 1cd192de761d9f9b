"""Differential machinery for lazy stacks: equal inputs in upstream ``tensordict`` and torchdict, results
reduced to plain comparable trees, and one comparison that names the first difference.

A *spec* says how to build the members (batch shape, count, stack dim, which kinds of entries); both
libraries get members built from the same raw tensors, so any difference in a result is a difference
of the libraries.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Callable, Optional

import numpy as np
import tensordict
import torch
from hypothesis import strategies as st

import torchdict


@dataclasses.dataclass(frozen=True)
class Lib:
    name: str
    module: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


UP = Lib("upstream", tensordict)
OURS = Lib("torchdict", torchdict)


@dataclasses.dataclass(frozen=True)
class Spec:
    member_batch: tuple
    count: int
    stack_dim: int
    nested: bool
    ragged: bool
    exclusive: bool
    nontensor: bool
    seed: int

    @property
    def batch(self) -> tuple:
        batch = list(self.member_batch)
        batch.insert(self.stack_dim, self.count)
        return tuple(batch)


@st.composite
def specs(draw: Callable, ragged: Optional[bool] = None, exclusive: Optional[bool] = None,
          nontensor: Optional[bool] = False, min_rank: int = 0, max_rank: int = 2, min_count: int = 1) -> Spec:
    """Member batch ranks ``min_rank``..``max_rank`` (sizes 1-3), 1-3 members, any stack dim; nested keys,
    ragged leaves and exclusive keys drawn unless fixed."""
    rank = draw(st.integers(min_rank, max_rank))
    member_batch = tuple(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    return Spec(
        member_batch=member_batch,
        count=draw(st.integers(min_count, 3)),
        stack_dim=draw(st.integers(0, rank)),
        nested=draw(st.booleans()),
        ragged=draw(st.booleans()) if ragged is None else ragged,
        exclusive=draw(st.booleans()) if exclusive is None else exclusive,
        nontensor=draw(st.booleans()) if nontensor is None else nontensor,
        seed=draw(st.integers(0, 2 ** 16)),
    )


def raw_members(spec: Spec, offset: int = 0) -> list:
    """One nested dict of tensors per member: "a" float [*batch, 2], "n" {"b": int64, "c": float} (nested),
    "r" float [*batch, i + 1] (ragged), "e{i}" (exclusive), "s" a string (non-tensor)."""
    gen = torch.Generator().manual_seed(spec.seed * 7 + offset)
    batch = spec.member_batch
    members = []
    for i in range(spec.count):
        # Values in (0.05, 0.95): inside the domain of every unary op but acosh (NaN there in both libraries).
        member: dict = {"a": torch.rand((*batch, 2), generator=gen) * 0.9 + 0.05}
        if spec.nested:
            member["n"] = {"b": torch.randint(1, 5, tuple(batch), generator=gen),
                           "c": torch.rand(tuple(batch), generator=gen) * 0.9 + 0.05}
        if spec.ragged:
            member["r"] = torch.rand((*batch, i + 1), generator=gen) * 0.9 + 0.05
        if spec.exclusive:
            member[f"e{i}"] = torch.rand(tuple(batch), generator=gen) * 0.9 + 0.05
        if spec.nontensor:
            member["s"] = f"v{i}"
        members.append(member)
    return members


def _copy_tree(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _copy_tree(value) for key, value in tree.items()}
    return tree.clone() if isinstance(tree, torch.Tensor) else tree


def build_members(lib: Lib, spec: Spec, offset: int = 0) -> list:
    return [lib.TensorDict(_copy_tree(member), batch_size=spec.member_batch) for member in raw_members(spec, offset)]


def build_lazy(lib: Lib, spec: Spec, offset: int = 0) -> Any:
    return lib.LazyStackedTensorDict(*build_members(lib, spec, offset), stack_dim=spec.stack_dim)


def build_dense(lib: Lib, spec: Spec, offset: int = 0) -> Any:
    """A dense TensorDict of the lazy stack's batch size with its shared tensor keys ("a", "n")."""
    gen = torch.Generator().manual_seed(spec.seed * 11 + offset)
    batch = spec.batch
    source: dict = {"a": torch.rand((*batch, 2), generator=gen) * 0.9 + 0.05}
    if spec.nested:
        source["n"] = {"b": torch.randint(1, 5, tuple(batch), generator=gen),
                       "c": torch.rand(tuple(batch), generator=gen) * 0.9 + 0.05}
    return lib.TensorDict(source, batch_size=batch)


class Ctx:
    """What a case builds its call from: the library, the spec, the lazy stack under test, operands."""

    def __init__(self, lib: Lib, spec: Spec) -> None:
        self.lib = lib
        self.spec = spec
        self.td = build_lazy(lib, spec)
        self.batch = torch.Size(spec.batch)

    @property
    def L(self) -> Lib:
        return self.lib

    def lazy(self, offset: int = 1) -> Any:
        return build_lazy(self.lib, self.spec, offset)

    def dense(self, offset: int = 1) -> Any:
        return build_dense(self.lib, self.spec, offset)

    def tensor(self, shape: Optional[tuple] = None, offset: int = 3) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.spec.seed * 13 + offset)
        return torch.rand(tuple(self.batch if shape is None else shape), generator=gen) * 0.9 + 0.05

    def mask(self, offset: int = 5) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.spec.seed * 17 + offset)
        return torch.rand(tuple(self.batch), generator=gen) > 0.5

    def some_mask(self) -> torch.Tensor:
        """A mask with at least one true entry (a lazy stack can't select no element)."""
        mask = self.mask()
        mask.view(-1)[0] = True
        return mask


# ------------------------------------------------------------------------------ normal forms
def _is_lazy(value: Any) -> bool:
    return type(value).__name__ == "LazyStackedTensorDict"


def _is_dense(value: Any) -> bool:
    return type(value).__name__ == "TensorDict"


def _is_non_tensor(value: Any) -> bool:
    return type(value).__name__ in ("NonTensorData", "NonTensorStack")


def norm(value: Any) -> Any:
    """``value`` as nested tuples/dicts of plain values: the same shape in both libraries when equal."""
    if _is_lazy(value):
        return ("lazy", tuple(value.batch_size), value.stack_dim, tuple(norm(td) for td in value.tensordicts))
    if _is_non_tensor(value):
        return ("non_tensor", tuple(value.batch_size), repr(value.tolist()))
    if _is_dense(value):
        entries = {}
        for key in value.keys():
            entries[key] = norm(_raw_get(value, key))
        return ("dense", tuple(value.batch_size), entries)
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return ("nested_tensor", value.dtype, tuple(norm(part) for part in value.unbind()))
        return ("tensor", value.dtype, tuple(value.shape), value.detach().cpu().clone())
    if isinstance(value, torch.Size):
        return ("size", tuple(value))
    if type(value).__module__ == "torch.return_types":
        return (type(value).__name__, tuple(norm(part) for part in value))
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return ("namedtuple", tuple(value._fields), tuple(norm(part) for part in value))
    if isinstance(value, list):  # upstream's LinkedList is a list too
        return ("list", tuple(norm(part) for part in value))
    if isinstance(value, tuple):
        return ("tuple", tuple(norm(part) for part in value))
    if isinstance(value, Mapping):
        return ("mapping", {_key(key): norm(part) for key, part in value.items()})
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tolist())
    if isinstance(value, (bool, int, float, str, type(None), torch.dtype, torch.device)):
        return value
    if type(value).__name__ == "_LazyStackedTensorDictKeysView" or type(value).__name__.endswith("KeysView"):
        return ("keys", tuple(_key(key) for key in value))
    if hasattr(value, "__next__"):
        return ("iter", tuple(norm(part) for part in value))
    return ("object", type(value).__name__)


def _key(key: Any) -> Any:
    return key if isinstance(key, str) else tuple(key)


def _raw_get(td: Any, key: str) -> Any:
    """``td``'s entry at ``key`` with non-tensor data as its wrapper (both libraries' ``get`` unwrap)."""
    getter = getattr(td, "_get_str", None)
    return td.get(key) if getter is None else getter(key, None)


def compare(up: Any, ours: Any, path: str = "result") -> None:
    """Raise an AssertionError naming the first place where the normal forms differ."""
    if isinstance(up, tuple) and up and up[0] == "tensor":
        assert isinstance(ours, tuple) and ours and ours[0] == "tensor", f"{path}: {_short(up)} != {_short(ours)}"
        assert up[1] == ours[1], f"{path}: dtype {up[1]} != {ours[1]}"
        assert up[2] == ours[2], f"{path}: shape {up[2]} != {ours[2]}"
        a, b = up[3], ours[3]
        if a.dtype.is_floating_point or a.dtype.is_complex:
            torch.testing.assert_close(b, a, equal_nan=True, rtol=1e-5, atol=1e-6, msg=f"{path}: values differ")
        else:
            assert torch.equal(a, b), f"{path}: values {a} != {b}"
        return
    if isinstance(up, dict):
        assert isinstance(ours, dict), f"{path}: {_short(up)} != {_short(ours)}"
        assert set(up) == set(ours), f"{path}: keys {sorted(map(str, up))} != {sorted(map(str, ours))}"
        for key in up:
            compare(up[key], ours[key], f"{path}[{key!r}]")
        return
    if isinstance(up, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(up), f"{path}: {_short(up)} != {_short(ours)}"
        if up and isinstance(up[0], str) and up[0] != ours[0]:
            raise AssertionError(f"{path}: kind {up[0]} != {ours[0]}")
        for position, (a, b) in enumerate(zip(up, ours)):
            compare(a, b, f"{path}.{up[0] if up and isinstance(up[0], str) else ''}[{position}]")
        return
    if isinstance(up, float) and isinstance(ours, float) and math.isnan(up) and math.isnan(ours):
        return
    if isinstance(up, float) and isinstance(ours, (int, float)):
        assert math.isclose(up, ours, rel_tol=1e-5, abs_tol=1e-6), f"{path}: {up} != {ours}"
        return
    assert up == ours and type(up) is type(ours), f"{path}: {up!r} ({type(up).__name__}) != {ours!r} " \
                                                  f"({type(ours).__name__})"


def _short(value: Any) -> str:
    text = repr(value if not isinstance(value, tuple) else value[:3])
    return text[:200]


# ------------------------------------------------------------------------------ running a case on both
@dataclasses.dataclass
class Outcome:
    result: Any = None  # the normal form
    error: Optional[BaseException] = None
    after: Any = None  # the normal form of the lazy stack after the call
    before: Any = None


def run(lib: Lib, spec: Spec, call: Callable[[Ctx], Any]) -> Outcome:
    ctx = Ctx(lib, spec)
    outcome = Outcome(before=norm(ctx.td))
    try:
        outcome.result = norm(call(ctx))
    except Exception as error:  # noqa: BLE001 - the exception type is compared
        outcome.error = error
    outcome.after = norm(ctx.td)
    return outcome


def same_error_type(up: BaseException, ours: BaseException) -> bool:
    return isinstance(ours, type(up)) or type(ours).__name__ == type(up).__name__


def check_case(spec: Spec, call: Callable[[Ctx], Any], *, state: bool = True) -> None:
    """``call`` on equal inputs in both libraries: equal results (and equal stacks after the call, when
    ``state``), or errors of the same type with our stack unchanged."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        up = run(UP, spec, call)
        ours = run(OURS, spec, call)
    if up.error is not None or ours.error is not None:
        if up.error is None:
            raise AssertionError(f"upstream returned but torchdict raised {type(ours.error).__name__}: "
                                 f"{ours.error}") from ours.error
        if ours.error is None:
            raise AssertionError(f"upstream raised {type(up.error).__name__}: {up.error}; torchdict returned "
                                 f"{_short(ours.result)}")
        assert same_error_type(up.error, ours.error), (
            f"upstream raised {type(up.error).__name__}: {up.error}; torchdict raised "
            f"{type(ours.error).__name__}: {ours.error}")
        compare(ours.before, ours.after, "the stack after a failed call")
        return
    compare(up.result, ours.result)
    if state:
        compare(up.after, ours.after, "the stack after the call")
