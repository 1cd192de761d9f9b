"""``UnbatchedTensor``: a tensor entry with no batch dims, which the batch ops of a TensorDict leave unchanged.

Each op is run on equal inputs in upstream ``tensordict`` and torchdict (batch ranks 1-3 drawn by
hypothesis, an unbatched entry at the top level and one in a sub-TensorDict) and must give the same
result (classes, batch sizes, each entry's ``batch_size``, values, and whether the unbatched payload is
still the source's storage) or the same exception kind. The C batch checks and their pure-Python twins
must refuse to "fit" an UnbatchedTensor alike (the write then takes the path that stamps its batch size).
The suite runs with ``TORCHDICT_PURE_PYTHON=1`` too.
"""
from __future__ import annotations

import pickle
import warnings
from typing import Any, Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdict
from torchdict import TensorDict, UnbatchedTensor, _accel
from _dropin_diff import exception_kind, upstream

LIBS = (upstream, torchdict)


# --------------------------------------------------------------------------- building and reducing
def _values(batch: tuple, payload: tuple, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"u": torch.randn(payload, generator=generator), "x": torch.randn(batch + (2,), generator=generator),
            "v": torch.randn((3,) + payload, generator=generator), "y": torch.randn(batch, generator=generator)}


def build(lib: Any, batch: tuple, payload: tuple, seed: int = 0) -> Any:
    """``{"u": unbatched, "x": batched, "n": {"v": unbatched, "y": batched}}`` of batch ``batch`` in ``lib``."""
    values = _values(batch, payload, seed)
    inner = lib.TensorDict(v=lib.UnbatchedTensor(values["v"].clone()), y=values["y"].clone(), batch_size=batch)
    return lib.TensorDict(u=lib.UnbatchedTensor(values["u"].clone()), x=values["x"].clone(), n=inner,
                          batch_size=batch)


def _is_unbatched(value: Any) -> bool:
    return any(isinstance(value, lib.UnbatchedTensor) for lib in LIBS)


def reduce(value: Any, sources: frozenset = frozenset()) -> Any:
    """A library-independent form of a result. An unbatched entry shows its ``batch_size`` and whether its
    payload is one of ``sources`` (the data pointers of the input's unbatched payloads)."""
    if isinstance(value, torch.Tensor):
        data = value.detach()
        values = torch.Tensor.as_subclass(data, torch.Tensor).tolist()
        head: tuple = ("tensor",)
        if _is_unbatched(value):
            head = ("unbatched", tuple(value.batch_size), value.data_ptr() in sources)
        return head + (str(value.dtype), tuple(value.shape), _rounded(values))
    if isinstance(value, torch.Size):
        return ("size", tuple(value))
    if hasattr(value, "batch_size") and hasattr(value, "keys") and callable(value.keys):
        entries = {key: reduce(value.get(key), sources) for key in value.keys()}
        return ("collection", type(value).__name__, tuple(value.batch_size), entries)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [reduce(item, sources) for item in value])
    if isinstance(value, dict):
        return ("dict", {key: reduce(item, sources) for key, item in value.items()})
    return value


def _rounded(values: Any) -> Any:
    if isinstance(values, list):
        return [_rounded(item) for item in values]
    return round(values, 4) if isinstance(values, float) else values


def _sources(td: Any) -> frozenset:
    return frozenset(leaf.data_ptr() for _, leaf in td.items(True, True) if _is_unbatched(leaf))


def outcome(make: Callable[[], Any], sources: Callable[[], frozenset] = frozenset) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = make()
            return ("value", reduce(result, sources()))
        except Exception as error:  # noqa: BLE001 - the kind is what is compared
            return ("raises", exception_kind(error))


def same_outcome(call: Callable[[Any, Any], Any], batch: tuple, payload: tuple) -> Any:
    """``call(lib, td)`` on equal inputs in both libraries: equal outcomes."""
    results = []
    for lib in LIBS:
        td = build(lib, batch, payload)
        results.append(outcome(lambda: call(lib, td), lambda: _sources(td)))
    theirs, ours = results
    assert ours == theirs, f"\nupstream:  {theirs}\ntorchdict: {ours}"
    return ours


batches = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)
payloads = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


def _mask(batch: tuple) -> torch.Tensor:
    return (torch.arange(torch.Size(batch).numel()) % 2 == 0).view(batch)


def _reversed_dims(td: Any) -> tuple:
    return tuple(reversed(range(td.batch_dims)))


# --------------------------------------------------------------------------- the batch ops, differential
OPS: dict = {
    "td[key]": lambda lib, td: td["u"],
    "td[nested key]": lambda lib, td: td["n", "v"],
    "get": lambda lib, td: td.get("u"),
    "index int": lambda lib, td: td[0],
    "index slice": lambda lib, td: td[:1],
    "index ellipsis": lambda lib, td: td[..., -1],
    "index tensor": lambda lib, td: td[torch.tensor([0, 0])],
    "index mask": lambda lib, td: td[_mask(tuple(td.batch_size))],
    "index None": lambda lib, td: td[None],
    "view": lambda lib, td: td.view(-1),
    "reshape": lambda lib, td: td.reshape(1, -1),
    "permute": lambda lib, td: td.permute(*_reversed_dims(td)),
    "transpose": lambda lib, td: td.transpose(0, -1),
    "unsqueeze": lambda lib, td: td.unsqueeze(0),
    "unsqueeze last": lambda lib, td: td.unsqueeze(-1),
    "squeeze": lambda lib, td: td.unsqueeze(1).squeeze(1),
    "flatten": lambda lib, td: td.flatten(0, -1),
    "unflatten": lambda lib, td: td.unflatten(0, (td.batch_size[0], 1)),
    "expand": lambda lib, td: td.expand(2, *td.batch_size),
    "stack": lambda lib, td: torch.stack([td, td], 0),
    "stack last": lambda lib, td: torch.stack([td, td], -1),
    "cat": lambda lib, td: torch.cat([td, td], 0),
    "cat last": lambda lib, td: torch.cat([td, td], -1),
    "unbind": lambda lib, td: td.unbind(0),
    "split": lambda lib, td: td.split(1, 0),
    "chunk": lambda lib, td: td.chunk(2, -1),
    "apply": lambda lib, td: td.apply(lambda x: x * 2),
    "apply new batch": lambda lib, td: td.apply(lambda x: x.reshape(-1, *x.shape[td.batch_dims:]),
                                                batch_size=[td.batch_size.numel()]),
    "clone": lambda lib, td: td.clone(),
    "to dtype": lambda lib, td: td.to(torch.float64),
    "select": lambda lib, td: td.select("u", ("n", "v")),
    "exclude": lambda lib, td: td.exclude("x", ("n", "y")),
    "update": lambda lib, td: lib.TensorDict(batch_size=td.batch_size).update(td),
    "arithmetic": lambda lib, td: td + 1,
    "sum over dim 0": lambda lib, td: td.sum(0),
    "mean": lambda lib, td: td.mean(),
    "to_dict": lambda lib, td: td.to_dict(),
    "lazy_stack get": lambda lib, td: lib.lazy_stack([td, td]).get("u"),
    "lazy_stack index": lambda lib, td: lib.lazy_stack([td, td])[:, 0],
    "lazy_stack dense": lambda lib, td: lib.lazy_stack([td, td], -1).contiguous(),
    "pickle": lambda lib, td: pickle.loads(pickle.dumps(td)),
    "repeat": lambda lib, td: td.repeat(2, *([1] * (td.batch_dims - 1))),
    "flip": lambda lib, td: td.flip(0),
    "roll": lambda lib, td: td.roll(1, 0),
    "narrow": lambda lib, td: td.narrow(0, 0, 1),
    "gather": lambda lib, td: td.gather(0, torch.zeros((1,) + tuple(td.batch_size[1:]), dtype=torch.long)),
    "new_zeros": lambda lib, td: td.new_zeros(4),
    "view(dtype)": lambda lib, td: td.view(torch.int32),
    "clamp": lambda lib, td: td.clamp(-0.5, 0.5),
    "==": lambda lib, td: td == td.clone(),
    "detach": lambda lib, td: td.detach(),
    "detach_": lambda lib, td: td.detach_(),
    "zero_": lambda lib, td: td.zero_(),
    "apply_": lambda lib, td: td.apply_(lambda x: x.mul_(3)),
    "contiguous": lambda lib, td: td.contiguous(),
}


@pytest.mark.parametrize("name", sorted(OPS))
@settings(max_examples=15)
@given(batch=batches, payload=payloads)
def test_batch_op_matches_upstream(name: str, batch: tuple, payload: tuple) -> None:
    same_outcome(OPS[name], batch, payload)


@pytest.mark.parametrize("name", ["index int", "index tensor", "reshape", "permute", "unsqueeze", "expand", "stack",
                                  "cat", "unbind", "select", "lazy_stack get"])
def test_batch_ops_keep_the_payload(name: str) -> None:
    # Same data, same shape, the result's batch size: the source's storage, not a copy.
    td = build(torchdict, (2, 3), (4,))
    result = OPS[name](torchdict, td)
    for item in result if isinstance(result, tuple) else (result,):
        entry = item if isinstance(item, torch.Tensor) else item.get("u")
        assert type(entry) is UnbatchedTensor and entry.shape == (4,)
        assert entry.data_ptr() == td["u"].data_ptr()
        assert entry.batch_size == (item.batch_size if not isinstance(item, torch.Tensor) else entry.batch_size)


# --------------------------------------------------------------------------- writes give the batch size
WRITES: dict = {
    "constructor": lambda lib, u: lib.TensorDict(a=u, b=torch.zeros(3), batch_size=[3]),
    "constructor, first size equal to the batch's": lambda lib, u: lib.TensorDict(a=u[:3], batch_size=[3]),
    "constructor, nested dict": lambda lib, u: lib.TensorDict({"n": {"a": u}}, batch_size=[3]),
    "constructor, empty batch": lambda lib, u: lib.TensorDict(a=lib.TensorDict(a=u, batch_size=[5])["a"]),
    "setitem": lambda lib, u: _setitem(lib.TensorDict(batch_size=[3]), "a", u),
    "setitem, equal first size": lambda lib, u: _setitem(lib.TensorDict(batch_size=[3]), "a", u[:3]),
    "setitem, 2-d batch": lambda lib, u: _setitem(lib.TensorDict(batch_size=[3, 2]), "a", u),
    "setitem nested": lambda lib, u: _setitem(lib.TensorDict(n={}, batch_size=[3]), ("n", "a"), u),
    "set": lambda lib, u: lib.TensorDict(batch_size=[3]).set("a", u),
    "update from a dict": lambda lib, u: lib.TensorDict(batch_size=[3]).update({"a": u[:3]}),
    "update from a TensorDict": lambda lib, u: lib.TensorDict(batch_size=[3]).update(
        lib.TensorDict(a=u, batch_size=[3])),
    "from_dict": lambda lib, u: lib.TensorDict.from_dict({"a": u, "b": torch.zeros(3, 2)}),
}


def _setitem(td: Any, key: Any, value: Any) -> Any:
    td[key] = value
    return td


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_written_unbatched_tensor_takes_the_batch_size(name: str) -> None:
    results = []
    for lib in LIBS:
        u = lib.UnbatchedTensor(torch.arange(5.0))
        results.append(outcome(lambda: WRITES[name](lib, u), lambda: frozenset({u.data_ptr()})))
    assert results[1] == results[0], f"\nupstream:  {results[0]}\ntorchdict: {results[1]}"


def test_the_batch_size_follows_every_new_batch() -> None:
    # After these three, upstream leaves the entry's batch_size as it was (stale); torchdict gives it the new
    # one (docs/compat.md).
    td = TensorDict(a=UnbatchedTensor(torch.zeros(4)), b=torch.zeros(2, 3), batch_size=[2, 3])
    td.batch_size = [2]
    assert td["a"].batch_size == (2,) and td["a"].shape == (4,)
    td.batch_size = []
    assert td["a"].batch_size == ()
    # pad keeps it (as upstream) with the padded batch size.
    padded = torchdict.pad(TensorDict(a=UnbatchedTensor(torch.zeros(4)), b=torch.zeros(2), batch_size=[2]), [0, 1])
    assert padded["a"].shape == (4,) and padded["a"].batch_size == (3,)
    # auto_batch_size_ leaves it out of the count (as upstream), then gives it the batch size found.
    counted = TensorDict(a=UnbatchedTensor(torch.zeros(3)), b=torch.zeros(3, 2)).auto_batch_size_()
    assert counted.batch_size == (3, 2) and counted["a"].batch_size == (3, 2)
    assert upstream.TensorDict(a=upstream.UnbatchedTensor(torch.zeros(3)), b=torch.zeros(3, 2)).auto_batch_size_(
    ).batch_size == (3, 2)


# --------------------------------------------------------------------------- writes at an index
INDEXED_WRITES: dict = {
    "an UnbatchedTensor of its shape": lambda lib: lib.TensorDict(a=lib.UnbatchedTensor(torch.ones(3)),
                                                                  b=torch.ones(2), batch_size=[]),
    "an UnbatchedTensor of another dtype": lambda lib: lib.TensorDict(
        a=lib.UnbatchedTensor(torch.ones(3, dtype=torch.int64)), b=torch.ones(2), batch_size=[]),
    "an UnbatchedTensor of another shape": lambda lib: lib.TensorDict(a=lib.UnbatchedTensor(torch.ones(4)),
                                                                      b=torch.ones(2), batch_size=[]),
    "a plain tensor": lambda lib: lib.TensorDict(a=torch.ones(3), b=torch.ones(2), batch_size=[]),
    "no such key": lambda lib: lib.TensorDict(b=torch.ones(2), batch_size=[]),
    "a number": lambda lib: 5.0,
    "a dict": lambda lib: {"a": lib.UnbatchedTensor(torch.ones(3)), "b": torch.ones(2)},
}


@pytest.mark.parametrize("index", [0, -1, slice(0, 1)], ids=["int", "negative", "slice"])
@pytest.mark.parametrize("name", sorted(INDEXED_WRITES))
def test_writing_at_an_index(name: str, index: Any) -> None:
    def call(lib: Any) -> Any:
        td = lib.TensorDict(a=lib.UnbatchedTensor(torch.zeros(3)), b=torch.zeros(2, 2), batch_size=[2])
        value = INDEXED_WRITES[name](lib)
        if isinstance(index, slice) and isinstance(value, lib.TensorDict):
            value = value.unsqueeze(0)
        try:
            td[index] = value
        except Exception as error:  # noqa: BLE001
            return ("raises", exception_kind(error), reduce(td))  # and nothing was written
        return ("value", reduce(td))

    assert call(torchdict) == call(upstream)


def test_update_at_writes_the_payload_whole() -> None:
    for lib in LIBS:
        td = lib.TensorDict(a=lib.UnbatchedTensor(torch.zeros(3)), b=torch.zeros(2, 2), batch_size=[2])
        td.update_at_(lib.TensorDict(a=lib.UnbatchedTensor(torch.ones(3)), b=torch.ones(2), batch_size=[]), 1)
        assert td["a"].tolist() == [1.0, 1.0, 1.0] and td["b"].tolist() == [[0.0, 0.0], [1.0, 1.0]]


def test_in_place_ops_write_the_payload() -> None:
    for lib in LIBS:
        payload = torch.zeros(3)
        td = lib.TensorDict(a=lib.UnbatchedTensor(payload), b=torch.zeros(2), batch_size=[2])
        td.add_(1)
        td.apply_(lambda x: x * 3)
        assert payload.tolist() == [3.0, 3.0, 3.0] and type(td["a"]).__name__ == "UnbatchedTensor"


# --------------------------------------------------------------------------- saving, stacking warnings, compile
@pytest.mark.parametrize("save", ["memmap", "memmap_", "save", "nested", "lazy stack"])
def test_saving_is_refused_before_anything_is_written(save: str, tmp_path: Any) -> None:
    for lib in LIBS:
        folder = tmp_path / lib.__name__
        td = build(lib, (2,), (3,))
        before = reduce(td)
        with pytest.raises(NotImplementedError, match="UnbatchedTensor"):
            if save == "memmap":
                td.memmap(folder)
            elif save == "memmap_":
                td.memmap_(folder)
            elif save == "save":
                td.save(folder)
            elif save == "nested":
                td.select("n").memmap(folder)
            else:
                lib.lazy_stack([td, td]).memmap(folder)
        assert reduce(td) == before
    assert not any((tmp_path / "torchdict").rglob("*.memmap"))


def test_stacking_different_payloads_warns_and_keeps_the_first() -> None:
    for lib in LIBS:
        first = lib.TensorDict(a=lib.UnbatchedTensor(torch.zeros(2)), batch_size=[3])
        second = lib.TensorDict(a=lib.UnbatchedTensor(torch.ones(2)), batch_size=[3])
        with pytest.warns(UserWarning, match="different data storage"):
            stacked = torch.stack([first, second])
        assert stacked["a"].tolist() == [0.0, 0.0] and tuple(stacked["a"].batch_size) == (2, 3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.stack([first, first.clone(recurse=False)])  # the same storage: no warning


def test_an_unbatched_tensor_is_a_tensor() -> None:
    results = []
    for lib in LIBS:
        u = lib.UnbatchedTensor(torch.arange(6.0).view(2, 3), batch_size=[4])
        plain = torch.zeros(3, 2)
        results.append([reduce(x) for x in (u + 1, u.sum(), u.unbind(0), u.clone(), u.t(), plain.t() + u)]
                       + [repr(u), str(u), len(u), float(u[0, 1]), u.batch_size, lib.UnbatchedTensor(u) is u,
                          pickle.loads(pickle.dumps(u)).batch_size, isinstance(u, torch.Tensor),
                          lib.UnbatchedTensor([1, 2]).dtype, lib.UnbatchedTensor(torch.ones(2, requires_grad=True))
                          .requires_grad])
    assert results[1] == results[0]


def test_foreach_ops_keep_the_plain_leaves_plain() -> None:
    # torchdict runs torch._foreach_* on every leaf at once: only the unbatched inputs give unbatched outputs.
    out = torch._foreach_add([torch.zeros(2), UnbatchedTensor(torch.zeros(3), batch_size=[2])], 1)
    assert [type(t) for t in out] == [torch.Tensor, UnbatchedTensor] and out[1].batch_size == (2,)
    # Many small leaves of one shape (the foreach and one-kernel paths), one of them unbatched.
    source = {f"k{i}": torch.zeros(2, 3) for i in range(32)}
    td = TensorDict({**source, "u": UnbatchedTensor(torch.zeros(2, 3))}, batch_size=[2])
    for result in (td + 1, td * 2, td.exp(), td.clone(), td.double(), td.clamp(0, 1), td == td, td.clone().add_(1)):
        assert {type(value) for key, value in result.items() if key != "u"} == {torch.Tensor}
        assert type(result["u"]) is UnbatchedTensor and result["u"].batch_size == (2,)


def _implementations(name: str) -> list:
    from torchdict import _compile

    found = [getattr(_accel, "py_" + name), getattr(_compile, name)]
    return found + ([getattr(_accel._C, name)] if _accel._C is not None else [])


def test_no_batch_check_fits_an_unbatched_tensor() -> None:
    # The C checks, their pure-Python twins and the traceable twins: an UnbatchedTensor never fits, so a
    # write of one leaves the fast path for the one that gives it its batch size.
    u = UnbatchedTensor(torch.zeros(3, 2))
    plain = torch.zeros(3, 2)
    many = {f"k{i}": torch.zeros(3) for i in range(20)}
    for leaves_fit in _implementations("leaves_fit"):
        assert leaves_fit({"a": plain}, 3) and not leaves_fit({"a": plain, "u": u}, 3)
        assert not leaves_fit({**many, "u": u}, 3)  # (past the twin's type pass)
    for lengths_fit in _implementations("lengths_fit"):
        assert lengths_fit([plain], 3) and not lengths_fit([plain, u], 3) and not lengths_fit((u,), 3)
    for shape_fits in _implementations("shape_fits"):
        assert shape_fits(plain, (3, 2)) and not shape_fits(u, (3, 2)) and not shape_fits(u, ())
    for leaves_fit_batch in _implementations("leaves_fit_batch"):
        assert leaves_fit_batch({"a": plain}, (3, 2)) and not leaves_fit_batch({"a": plain, "u": u}, (3,))


def test_compiled_indexing_equals_eager() -> None:
    pytest.importorskip("torch._dynamo")
    td = TensorDict(u=UnbatchedTensor(torch.arange(6.0).view(2, 3)), x=torch.randn(4, 5), batch_size=[4])

    def index(data: Any) -> Any:
        return data[1:3]

    def shape_and_read(data: Any) -> Any:
        return data.reshape(2, 2), data["u"] + data["x"].sum()

    torch._dynamo.reset()
    compiled = torch.compile(index, fullgraph=True, backend="eager")(td)
    assert reduce(compiled, _sources(td)) == reduce(index(td), _sources(td))
    reshaped, read = torch.compile(shape_and_read, fullgraph=True, backend="eager")(td)
    eager_reshaped, eager_read = shape_and_read(td)
    assert reduce(reshaped, _sources(td)) == reduce(eager_reshaped, _sources(td))
    assert type(read) is UnbatchedTensor and torch.equal(read, eager_read) and read.batch_size == (4,)

