"""NonTensorData / NonTensorStack against upstream tensordict 0.15.3, member by member.

Each member in ``CASES`` is called on equal leaves built in both libraries (hypothesis draws the batch
shape (rank 0-3), the values (str / int / None / dicts, lists for a shared value) and how the leaf is
made: one shared value, a nested list, ``torch.stack`` of shared values along any dim, or the
``NonTensorStack(*values)`` constructor). The results must be equal: ``tolist()`` (so the values and the
batch size), the kind of result (data-like: ``NonTensorData``; stack-like: ``NonTensorStack``), tensors
and plain values; or both calls raise errors of the same type, ours leaving the leaf unchanged. The leaf
after the call is compared too (in-place members).

Where upstream is plainly wrong (``UPSTREAM_WRONG``) the case states what torchdict does instead; the
deliberate differences (arithmetic refused, ``NonTensorStack.data``) have tests of their own below.
"""
from __future__ import annotations

import dataclasses
import os
import random
import warnings
from typing import Any, Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdict

upstream = pytest.importorskip("tensordict")

EXAMPLES = int(os.environ.get("NONTENSOR_DIFF_EXAMPLES", "12"))
PER_ELEMENT = ("a", "b", 1, None, {"k": 1}, "")
SHARED = PER_ELEMENT + ([1, 2], {"k": [1, 2]})


# ------------------------------------------------------------------------------ equal inputs
@dataclasses.dataclass(frozen=True)
class Spec:
    """How to build the leaf: ``kind`` is "data", "list", "stack" or "ctor"."""

    kind: str
    shape: tuple
    values: tuple  # the shared value (data), the flat values (list), one value per member (stack, ctor)
    stack_dim: int = 0

    def build(self, lib: Any) -> Any:
        if self.kind == "data":
            return lib.NonTensorData(self.values[0], batch_size=list(self.shape))
        if self.kind == "list":
            return lib.NonTensorStack.from_list(_nest(list(self.values), list(self.shape)))
        members = [lib.NonTensorData(value, batch_size=list(self.shape)) for value in self.values]
        if self.kind == "stack":
            return torch.stack(members, self.stack_dim)
        return lib.NonTensorStack(*members, stack_dim=self.stack_dim)


def _nest(values: list, shape: list) -> Any:
    if not shape:
        return values[0]
    step = len(values) // shape[0]
    return [_nest(values[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


@st.composite
def specs(draw: Callable) -> Spec:
    kind = draw(st.sampled_from(["data", "data", "list", "list", "stack", "ctor"]))
    if kind == "data":
        shape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
        return Spec(kind, shape, (draw(st.sampled_from(SHARED)),))
    if kind == "list":
        shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
        count = torch.Size(shape).numel()
        return Spec(kind, shape, tuple(draw(st.lists(st.sampled_from(PER_ELEMENT), min_size=count, max_size=count))))
    # At least two members: a stack of one value differs in kind (see test_known_differences_of_kind).
    shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    members = draw(st.lists(st.sampled_from(PER_ELEMENT), min_size=2, max_size=3))
    return Spec(kind, shape, tuple(members), draw(st.integers(0, len(shape))))


# ------------------------------------------------------------------------------ comparable results
def describe(value: Any, lib: Any) -> Any:
    """A result as a plain tree: data-like / stack-like leaves with their batch and values, tensors,
    (empty) TensorDicts by batch size, containers item by item, plain values as they are."""
    if isinstance(value, lib.NonTensorData):
        return ("data", list(value.batch_size), value.tolist(), str(value.device))
    if isinstance(value, lib.NonTensorStack):
        return ("stack", list(value.batch_size), value.tolist(), str(value.device))
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if isinstance(value, (lib.TensorDict, getattr(lib, "LazyStackedTensorDict", lib.TensorDict))):
        return ("tensordict", list(value.batch_size), sorted(map(str, value.keys())))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [describe(item, lib) for item in value])
    if isinstance(value, torch.Size):
        return ("size", list(value))
    return ("value", value)


def _builtin_type(error: BaseException) -> str:
    """The nearest builtin class of an error (a library's own subclass compares as its builtin base)."""
    for cls in type(error).__mro__:
        if cls.__module__ == "builtins":
            return cls.__name__
    return type(error).__name__


def _announced_error(warning: FutureWarning) -> str:
    """The error type an upstream FutureWarning announces for 0.17 ("... raising an IndexError ...")."""
    text = str(warning)
    return next((name for name in ("IndexError", "RuntimeError", "ValueError") if f"raising an {name}" in text
                 or f"raising a {name}" in text), "FutureWarning")


def outcome(lib: Any, spec: Spec, call: Callable, seed: int) -> tuple:
    leaf = spec.build(lib)
    before = describe(leaf, lib)
    with warnings.catch_warnings():
        # Upstream's announced errors ("Starting with TensorDict 0.17 ... raising an IndexError") count as
        # raised: torchdict raises them already, as torch does for a tensor of the batch shape.
        warnings.simplefilter("error", FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        try:
            result = ("ok", describe(call(leaf, lib, random.Random(seed)), lib))
        except FutureWarning as warning:
            result = ("raised", _announced_error(warning), str(warning))
        except Exception as error:  # noqa: BLE001 - the error type is the outcome compared
            result = ("raised", _builtin_type(error), str(error))
    return result, describe(leaf, lib), before


# ------------------------------------------------------------------------------ the case table
Call = Callable[[Any, Any, random.Random], Any]
CASES: dict = {}


def case(member: str, *calls: Call) -> None:
    CASES.setdefault(member, []).extend(calls)


def dim(x: Any, r: random.Random, extra: int = 0) -> int:
    """A dim of ``x`` (sometimes out of range: both libraries must refuse it alike)."""
    n = x.ndim + extra
    return r.randint(-n - 1, n) if n else r.choice([0, -1, 1])


def size_index(x: Any, r: random.Random) -> Any:
    return r.choice([0, -1, slice(None, 1), slice(1, None), (Ellipsis, 0), None, (0, 0), 5,
                     torch.tensor([0, 0]), [0], slice(None, None, 2)])


case("view", lambda x, L, r: x.view(-1), lambda x, L, r: x.view(*reversed(x.batch_size)),
     lambda x, L, r: x.view(x.batch_size), lambda x, L, r: x.view(-1, *x.batch_size[2:]),
     lambda x, L, r: x.view(*x.batch_size, 1))
case("reshape", lambda x, L, r: x.reshape(-1), lambda x, L, r: x.reshape(*reversed(x.batch_size)),
     lambda x, L, r: x.reshape(1, -1), lambda x, L, r: x.reshape(*x.batch_size, 1), lambda x, L, r: x.reshape(7))
# (Upstream's NonTensorData takes ``permute(0)`` on any rank; torchdict refuses a permutation of another rank.)
case("permute", lambda x, L, r: x.permute(*reversed(range(x.ndim))), lambda x, L, r: x.permute(*range(x.ndim)))
case("unsqueeze", lambda x, L, r: x.unsqueeze(dim(x, r, 1)))
case("squeeze", lambda x, L, r: x.squeeze(), lambda x, L, r: x.squeeze(dim(x, r)))
case("expand", lambda x, L, r: x.expand(2, *x.batch_size), lambda x, L, r: x.expand(x.batch_size),
     lambda x, L, r: x.expand(*[3 if s == 1 else s for s in x.batch_size]))
case("flatten", lambda x, L, r: x.flatten(), lambda x, L, r: x.flatten(0, 1),
     lambda x, L, r: x.flatten(1, -1) if x.ndim else x.flatten(0, 0))
case("unflatten", lambda x, L, r: x.unflatten(0, (x.batch_size[0], 1)),
     lambda x, L, r: x.unflatten(-1, (1, -1)), lambda x, L, r: x.unflatten(0, (5, 7)))
case("transpose", lambda x, L, r: x.transpose(dim(x, r), dim(x, r)))
# (Upstream gives an empty TensorDict for an empty piece of a stack: pieces here are never empty.)
case("split", lambda x, L, r: x.split(1, dim(x, r)),
     lambda x, L, r: x.split([1, x.batch_size[0] - 1], 0) if x.ndim and x.batch_size[0] > 1 else x.split(1, 0))
case("unbind", lambda x, L, r: x.unbind(dim(x, r)))
case("chunk", lambda x, L, r: x.chunk(2, dim(x, r)))
case("__getitem__", lambda x, L, r: x[size_index(x, r)], lambda x, L, r: x[torch.ones(x.batch_size, dtype=torch.bool)],
     lambda x, L, r: x["key"])
case("__iter__", lambda x, L, r: list(x))
case("__len__", lambda x, L, r: len(x))
case("__bool__", lambda x, L, r: bool(x))
case("__hash__", lambda x, L, r: hash(x))
case("__repr__", lambda x, L, r: repr(x))


def _row_values(x: Any) -> list:
    return ["p"] * x.batch_size[0] if x.ndim == 1 else [x.tolist()[0][0]] * x.batch_size[1]


case("__setitem__",
     lambda x, L, r: (x.__setitem__(0, "zz"), x)[1],
     lambda x, L, r: (x.__setitem__((0,) * x.ndim, "q"), x[0])[1],
     lambda x, L, r: (x.__setitem__(slice(None), x.tolist()), x)[1],
     lambda x, L, r: (x.__setitem__(0, L.NonTensorData("w")), x)[1],
     lambda x, L, r: (x.__setitem__(0, x[0]), x)[1],
     lambda x, L, r: (x.__setitem__(1, _row_values(x)), x)[1],
     lambda x, L, r: (x.__setitem__(0, ["x"] * 5), x)[1],
     lambda x, L, r: (x.__setitem__("key", 1), x)[1])
case("stack", lambda x, L, r: torch.stack([x, x.clone()], dim(x, r, 1)),
     lambda x, L, r: torch.stack([x, x], 0)[0], lambda x, L, r: torch.stack([x, x[None]]))
case("cat", lambda x, L, r: torch.cat([x, x.clone()], dim(x, r)), lambda x, L, r: torch.cat([x, x], 0)[0],
     lambda x, L, r: torch.cat([x, x], 0)[:1],
     lambda x, L, r: torch.cat([x, L.NonTensorData("x", batch_size=x.batch_size)]))
case("torch functions", lambda x, L, r: torch.unbind(x, 0), lambda x, L, r: torch.reshape(x, (-1,)),
     lambda x, L, r: torch.unsqueeze(x, 0), lambda x, L, r: torch.squeeze(x), lambda x, L, r: torch.clone(x),
     lambda x, L, r: torch.split(x, 1), lambda x, L, r: torch.permute(x, tuple(range(x.ndim))))
for _name in ("clone", "copy", "detach", "cpu", "contiguous", "float", "double", "int", "bool"):
    case(_name, lambda x, L, r, n=_name: getattr(x, n)())
case("to", lambda x, L, r: x.to("cpu"), lambda x, L, r: x.to(torch.float64), lambda x, L, r: x.to("cpu").device)
case("clone", lambda x, L, r: x.clone(recurse=False))
case("data", lambda x, L, r: x.data if isinstance(x, L.NonTensorData) else x.tolist())
for _name in ("tolist", "to_dict", "is_empty", "numel", "dim", "ndimension", "size", "maybe_to_stack", "empty",
              "is_memmap", "is_shared", "to_tensordict"):
    case(_name, lambda x, L, r, n=_name: getattr(x, n)())
for _name in ("batch_size", "shape", "batch_dims", "ndim", "device", "names", "is_locked", "dtype",
              "requires_grad", "depth"):
    case(_name, lambda x, L, r, n=_name: getattr(x, n))
case("keys", lambda x, L, r: list(x.keys()), lambda x, L, r: list(x.keys(True, True)))
case("values", lambda x, L, r: list(x.values()))
case("items", lambda x, L, r: list(x.items()))
case("get", lambda x, L, r: x.get("data"), lambda x, L, r: x.get("missing"), lambda x, L, r: x.get("missing", 3))
case("__contains__", lambda x, L, r: "data" in x)
case("lock_", lambda x, L, r: x.lock_().is_locked, lambda x, L, r: (x.lock_(), x.unlock_().is_locked)[1])
def _unlocked_inside(x: Any) -> tuple:
    x.lock_()
    with x.unlock_():
        inside = x.is_locked
    return inside, x.is_locked


case("unlock_", _unlocked_inside)
case("data setter", lambda x, L, r: (setattr(x, "data", "z"), x)[1],
     lambda x, L, r: (setattr(x.lock_(), "data", "z"), x)[1])
case("update locked", lambda x, L, r: x.lock_().update(x.clone()), lambda x, L, r: x.lock_().update_(x.clone()),
     lambda x, L, r: x.lock_().copy_(x.clone()))
# (A lock also freezes the batch size and names here, as on torchdict's TensorDicts: upstream allows them.)
case("batch_size setter", lambda x, L, r: (setattr(x, "batch_size", x.batch_size), x)[1])
case("update", lambda x, L, r: x.update(x.clone()),
     lambda x, L, r: x.update(L.NonTensorData("u", batch_size=x.batch_size)),
     lambda x, L, r: x.update(L.NonTensorStack.from_list(x.tolist()) if x.ndim else x.clone()))
case("update_", lambda x, L, r: x.update_(x.clone()),
     lambda x, L, r: x.update_(L.NonTensorData("u", batch_size=x.batch_size)))
case("copy_", lambda x, L, r: x.copy_(x.clone()))
case("size", lambda x, L, r: x.size(dim(x, r)))
case("__eq__", lambda x, L, r: x == x, lambda x, L, r: x == x.clone(), lambda x, L, r: x == "a",
     lambda x, L, r: x == L.NonTensorData("a", batch_size=x.batch_size), lambda x, L, r: x == [1],
     lambda x, L, r: x == L.NonTensorData("a"), lambda x, L, r: x == None)  # noqa: E711
case("__ne__", lambda x, L, r: x != x, lambda x, L, r: x != "a",
     lambda x, L, r: x != L.NonTensorData("a", batch_size=x.batch_size))
case("flip", lambda x, L, r: x.flip(dim(x, r)))
case("narrow", lambda x, L, r: x.narrow(0, 0, 1))
case("repeat", lambda x, L, r: x.repeat(*([2] + [1] * (x.ndim - 1))))
case("movedim", lambda x, L, r: x.movedim(0, -1), lambda x, L, r: x.moveaxis(-1, 0))
case("expand_as", lambda x, L, r: x.expand_as(torch.zeros(2, *x.batch_size)))


def _condition(x: Any, r: random.Random) -> torch.Tensor:
    return torch.tensor([r.random() < 0.5 for _ in range(x.numel())], dtype=torch.bool).view(x.batch_size)


case("where", lambda x, L, r: x.where(_condition(x, r), L.NonTensorData("w", batch_size=x.batch_size)),
     lambda x, L, r: x.where(_condition(x, r), x.clone()), lambda x, L, r: x.where(_condition(x, r), 1)
     if isinstance(x, L.NonTensorData) else x)
case("rename", lambda x, L, r: x.rename(*[f"d{i}" for i in range(x.ndim)]).names,
     lambda x, L, r: x.rename_(*[f"d{i}" for i in range(x.ndim)]).names)
case("select", lambda x, L, r: x.select(), lambda x, L, r: x.select("data"), lambda x, L, r: x.exclude("x"))
for _name in ("sorted_keys",):
    case(_name, lambda x, L, r, n=_name: getattr(x, n))
for _name in ("uint16", "zero_grad", "pin_memory_"):
    case(_name, lambda x, L, r, n=_name: getattr(x, n)())

# Where upstream fails on a case that has a plain answer: the reason, and how the plain answer is checked.
UPSTREAM_WRONG = {
    "Cannot update a NonTensorDataBase object with a NonTensorStack": (
        "a write into a stack whose members are NonTensorData with batch dims fails upstream (the member "
        "refuses the stacked piece); torchdict writes the values, as upstream does into a stack of the "
        "same values made by from_list"
    ),
}


def _per_element_spec(spec: Spec) -> Spec:
    """The same values as a from_list stack (upstream's members then take writes)."""
    values = spec.build(torchdict).tolist()
    flat = torch.Size(spec.build(torchdict).batch_size)
    return Spec("list", tuple(flat), tuple(_flatten(values, len(flat))))


def _flatten(values: Any, depth: int) -> list:
    return [values] if depth == 0 else [item for sub in values for item in _flatten(sub, depth - 1)]


@pytest.mark.parametrize("member", sorted(CASES))
@settings(max_examples=EXAMPLES)
@given(spec=specs(), seed=st.integers(0, 2 ** 16))
def test_member_matches_upstream(member: str, spec: Spec, seed: int) -> None:
    for call in CASES[member]:
        theirs, theirs_after, _ = outcome(upstream, spec, call, seed)
        ours, ours_after, ours_before = outcome(torchdict, spec, call, seed)
        if theirs[0] == "raised" and any(message in theirs[2] for message in UPSTREAM_WRONG):
            plain = _per_element_spec(spec)
            theirs, theirs_after, _ = outcome(upstream, plain, call, seed)
            ours, ours_after, ours_before = outcome(torchdict, plain, call, seed)
            assert ours[0] == theirs[0] == "ok", (member, spec, ours, theirs)
            assert ours[1][2:] == theirs[1][2:], (member, spec, ours, theirs)  # values (kinds follow the members)
            continue
        assert ours[:2] == theirs[:2], (member, spec, ours, theirs)
        assert ours_after == theirs_after, (member, spec, ours_after, theirs_after)
        if ours[0] == "raised":
            assert ours_after == ours_before, (member, spec, "a failed call changed the leaf")


# ------------------------------------------------------------------------------ construction
def test_constructors_match_upstream() -> None:
    calls = [
        lambda L: L.NonTensorData("x"),
        lambda L: L.NonTensorData("x", batch_size=[2, 3]),
        lambda L: L.NonTensorData("x", batch_size=3),
        lambda L: L.NonTensorData("x", batch_size=[2], device="cpu"),
        lambda L: L.NonTensorData("x", batch_size=[2], names=["n"]).names,
        lambda L: L.NonTensorData(L.NonTensorData("y", batch_size=[3]), batch_size=[2]),
        lambda L: L.NonTensorData(L.NonTensorStack("a", "a"), batch_size=[2]),
        lambda L: L.NonTensorData(L.NonTensorStack("a", "b"), batch_size=[2]),
        lambda L: L.NonTensorStack(),
        lambda L: L.NonTensorStack("a", "b"),
        lambda L: L.NonTensorStack("a", 1, None, {"k": 1}, [1, 2]),
        lambda L: L.NonTensorStack(L.NonTensorData("a", batch_size=[2]), L.NonTensorData("b", batch_size=[2]),
                                   stack_dim=1),
        lambda L: L.NonTensorStack(L.NonTensorData("a", batch_size=[2]), L.NonTensorData("b", batch_size=[2]),
                                   stack_dim=-1),
        lambda L: L.NonTensorStack(L.NonTensorData("a"), L.NonTensorData("b"), stack_dim=1),
        lambda L: L.NonTensorStack(L.NonTensorStack("a", "b"), L.NonTensorStack("c", "d")),
        lambda L: L.NonTensorStack(L.NonTensorStack("a", "b"), L.NonTensorStack("c", "d"))[0],
        lambda L: L.NonTensorStack(L.NonTensorData("a", device="cpu"), L.NonTensorData("b", device="cpu")).device,
        lambda L: L.NonTensorStack(L.TensorDict()),
        lambda L: L.NonTensorStack.from_list([]),
        lambda L: L.NonTensorStack.from_list([[]]),
        lambda L: L.NonTensorStack.from_list([["a", "b"], ["c", "d"]]),
        lambda L: L.NonTensorStack.from_list([["a", "b"], "c"]),
        lambda L: L.NonTensorStack.from_list([{"a": 1}, (1, 2)]),
        lambda L: L.NonTensorStack.from_list([L.NonTensorData("a", batch_size=[2]),
                                              L.NonTensorData("b", batch_size=[2])])[0],
        lambda L: L.NonTensorStack("a", "a")[0],
        lambda L: L.NonTensorStack("a", "a")[:1],
    ]
    for position, call in enumerate(calls):
        theirs, ours = [], []
        for lib, out in ((upstream, theirs), (torchdict, ours)):
            try:
                out.append(("ok", describe(call(lib), lib)))
            except Exception as error:  # noqa: BLE001
                out.append(("raised", _builtin_type(error)))
        assert ours == theirs, (position, ours, theirs)


def test_is_tensor_collection_is_true_as_upstream() -> None:
    for lib in (upstream, torchdict):
        assert lib.is_tensor_collection(lib.NonTensorData("x"))
        assert lib.is_tensor_collection(lib.NonTensorStack("a", "b"))
        assert lib.is_tensor_collection(lib.NonTensorData) and lib.is_tensor_collection(lib.NonTensorStack)
    # ...while every internal recursion still takes them for leaves.
    td = torchdict.TensorDict({"s": "x", "n": {"t": "y"}}, batch_size=[2])
    assert list(td.keys(True, True)) == [] and sorted(map(str, td.keys(True))) == ["('n', 't')", "n", "s"]
    assert td.apply(lambda t: t) is not None and td.clone()["n", "t"] == "y"


# ------------------------------------------------------------------------------ saving
@pytest.mark.parametrize("make", [
    lambda L: L.NonTensorData("x", batch_size=[2]),
    lambda L: L.NonTensorData({"k": [1, None]}),
    lambda L: L.NonTensorStack.from_list([["a", "b"], ["c", "d"]]),
    lambda L: L.NonTensorStack("a", 1, None),
    lambda L: torch.stack([L.NonTensorData("a", batch_size=[2]), L.NonTensorData("b", batch_size=[2])], 1),
])
def test_memmap_folders_load_in_both_libraries(make: Callable, tmp_path: Any) -> None:
    for writer, reader in ((torchdict, upstream), (upstream, torchdict), (torchdict, torchdict)):
        folder = tmp_path / f"{writer.__name__}-{reader.__name__}"
        saved = make(writer).memmap(folder)
        assert saved.is_locked and saved.is_memmap() and saved.tolist() == make(writer).tolist()
        loaded = type(make(reader)).load_memmap(folder)
        # As upstream loads it (a NonTensorData's batch size is not saved; a stack's is its list's nesting).
        reference = type(make(upstream)).load_memmap(folder)
        assert describe(loaded, reader) == describe(reference, upstream)
        assert loaded.tolist() == make(reader).tolist() or isinstance(loaded, reader.NonTensorData)


def test_memmap_in_place_writes_back(tmp_path: Any) -> None:
    for lib in (torchdict, upstream):
        stack = lib.NonTensorStack.from_list([["a", "b"], ["c", "d"]])
        assert stack.memmap_(tmp_path / lib.__name__) is stack and stack.is_memmap() and stack.is_locked
        stack[0] = "q"
        assert lib.NonTensorStack.load_memmap(tmp_path / lib.__name__).tolist() == [["q", "q"], ["c", "d"]]
    ours = torchdict.NonTensorData({1, 2})
    with pytest.raises(TypeError, match="allow_pickle=True"):
        ours.memmap(tmp_path / "set")
    ours.memmap(tmp_path / "set", allow_pickle=True)
    assert upstream.NonTensorData.load_memmap(tmp_path / "set", allow_pickle=True).data == {1, 2}
    with pytest.raises(RuntimeError, match="allow_pickle"):
        torchdict.NonTensorData.load_memmap(tmp_path / "set")
    assert torchdict.NonTensorData.load_memmap(tmp_path / "set", allow_pickle=True).data == {1, 2}


# ------------------------------------------------------------------------------ deliberate differences
ARITHMETIC = [("add", (1,)), ("mul", (2,)), ("sum", ()), ("abs", ()), ("mean", ()), ("exp_", ()), ("clamp", (0, 1))]
OPERATORS = [lambda x: x + 1, lambda x: 1 + x, lambda x: x * 2, lambda x: -x, lambda x: abs(x), lambda x: x < 1]


@pytest.mark.parametrize("leaf", [torchdict.NonTensorData("x", batch_size=[2]), torchdict.NonTensorStack("a", "b")])
def test_arithmetic_raises_a_type_error_naming_the_op_and_the_type(leaf: Any) -> None:
    # Upstream answers these with the leaf unchanged (``NonTensorData("x") + 1`` is ``NonTensorData("x")``).
    kind = type(leaf).__name__
    for name, args in ARITHMETIC:
        with pytest.raises(TypeError, match=rf"{name}\(\) is not supported by {kind}: it holds a Python value \(str\)"):
            getattr(leaf, name)(*args)
    for operator in OPERATORS:
        with pytest.raises(TypeError, match=f"is not supported by {kind}"):
            operator(leaf)
    before = leaf.tolist()
    with pytest.raises(TypeError):
        leaf += 1
    assert leaf.tolist() == before


def test_stack_data_is_the_nested_list() -> None:
    # torchdict: ``NonTensorStack.data`` is the nested list that ``td[key]`` returns (read by the TensorDict
    # paths); upstream gives the value every element holds, or raises AttributeError when they differ.
    ours = torchdict.NonTensorStack("a", "a")
    assert ours.data == ["a", "a"] and upstream.NonTensorStack("a", "a").data == "a"
    with pytest.raises(AttributeError):
        upstream.NonTensorStack("a", "b").data
    assert torchdict.NonTensorStack("a", "b").data == ["a", "b"]


def test_known_differences_of_kind() -> None:
    # A stack of *one* value along a dim it keeps: upstream's lazy stack reads a slice back as a
    # stack while that stack dim remains, torchdict as the value (its rule: all the elements come from
    # one value spanning at least the result's dims). The values are the same.
    for lib, kind in ((upstream, "stack"), (torchdict, "data")):
        one = torch.stack([lib.NonTensorData("x", batch_size=[2, 3])], 1)  # [2, 1, 3]
        assert describe(one[0], lib)[:3] == (kind, [1, 3], [["x", "x", "x"]])
        assert describe(one[:, 0], lib)[0] == "data"


def test_a_lock_freezes_the_batch_size_and_names() -> None:
    # Stricter than upstream (which lets a locked leaf change them), as torchdict's TensorDict lock.
    for leaf in (torchdict.NonTensorData("x", batch_size=[2]), torchdict.NonTensorStack("a", "b")):
        leaf.lock_()
        for attribute, value in (("batch_size", [1, 2]), ("names", ["n"])):
            with pytest.raises(RuntimeError, match="Cannot modify locked"):
                setattr(leaf, attribute, value)
        assert leaf.batch_size == (2,) and leaf.names == [None]
        with leaf.unlock_():
            leaf.names = ["n"]
        assert leaf.names == ["n"] and leaf.is_locked


def test_old_internal_constructor_form_still_builds() -> None:
    # ``NonTensorStack(flat_values, torch.Size)`` (a Size is not a value one stacks): internal callers.
    stack = torchdict.NonTensorStack(["a", "b", "c", "d"], torch.Size([2, 2]))
    assert stack.tolist() == [["a", "b"], ["c", "d"]]
    assert torchdict.NonTensorStack._from_flat(["a", "b"], [2]).tolist() == ["a", "b"]
