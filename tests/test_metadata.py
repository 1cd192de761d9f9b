"""``MetaData``: one Python value for the whole batch, kept as one value through indexing and stacking.

Each op runs on equal inputs in upstream ``tensordict`` and torchdict (batch ranks 1-3 drawn by hypothesis,
a ``MetaData`` at the top level and one in a sub-TensorDict) and must give the same result (the class of
every non-tensor entry, its batch size, its value, and whether the value is still the very object written)
or the same exception kind. Stacking keeps one ``MetaData`` only for the very same object (``is``); ``cat``
keeps the first one's value; ``MetaData[cls]`` checks the value's type. The suite runs with
``TORCHDICT_PURE_PYTHON=1`` too.
"""
from __future__ import annotations

import copy
import pickle
import warnings
from typing import Any, Callable

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import torchdict
from torchdict import MetaData, NonTensorData, TensorDict, _accel
from _dropin_diff import exception_kind, upstream

LIBS = (upstream, torchdict)
CONFIG = {"lr": 0.1}  # the object every MetaData below holds (identity is what stacking looks at)
NAME = ["run-1"]


# --------------------------------------------------------------------------- building and reducing
def build(lib: Any, batch: tuple, seed: int = 0) -> Any:
    """``{"c": MetaData(CONFIG), "x": batched, "n": {"m": MetaData(NAME), "y": batched}}`` in ``lib``."""
    generator = torch.Generator().manual_seed(seed)
    inner = lib.TensorDict(m=lib.MetaData(NAME, batch_size=batch), y=torch.randn(batch, generator=generator),
                           batch_size=batch)
    return lib.TensorDict(c=lib.MetaData(CONFIG, batch_size=batch), x=torch.randn(batch + (2,), generator=generator),
                          n=inner, batch_size=batch)


def _identity(data: Any) -> str:
    return "CONFIG" if data is CONFIG else "NAME" if data is NAME else "other"


def reduce(value: Any) -> Any:
    """A library-independent form of a result; a MetaData shows its class name, batch size, value and whether
    the value is the object first written (``CONFIG`` / ``NAME``)."""
    name = type(value).__name__
    if name.startswith("MetaData"):
        return ("metadata", name, tuple(value.batch_size), repr(value.data), _identity(value.data))
    if any(type(value) is lib.NonTensorData for lib in LIBS):
        return ("nontensor", tuple(value.batch_size), repr(value.data))
    if any(isinstance(value, lib.NonTensorStack) for lib in LIBS):
        return ("stack", tuple(value.batch_size), repr(value.tolist()))
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), _rounded(value.detach().tolist()))
    if isinstance(value, torch.Size):
        return ("size", tuple(value))
    if hasattr(value, "batch_size") and hasattr(value, "keys") and callable(value.keys):
        return ("collection", type(value).__name__, tuple(value.batch_size),
                {key: reduce(value.get(key)) for key in value.keys()})
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [reduce(item) for item in value])
    if isinstance(value, dict):
        return ("dict", repr(value), _identity(value))
    return (repr(value), _identity(value))


def _rounded(values: Any) -> Any:
    if isinstance(values, list):
        return [_rounded(item) for item in values]
    return round(values, 4) if isinstance(values, float) else values


def outcome(make: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ("value", reduce(make()))
        except Exception as error:  # noqa: BLE001 - the kind is what is compared
            return ("raises", exception_kind(error))


def same_outcome(call: Callable[[Any], Any]) -> Any:
    theirs, ours = outcome(lambda: call(upstream)), outcome(lambda: call(torchdict))
    assert ours == theirs, f"\nupstream:  {theirs}\ntorchdict: {ours}"
    return ours


batches = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)


def _mask(batch: tuple) -> torch.Tensor:
    return (torch.arange(torch.Size(batch).numel()) % 2 == 0).view(batch)


def _setitem(td: Any, index: Any, value: Any) -> Any:
    td[index] = value
    return td


def _other(lib: Any, td: Any, value: Any) -> Any:
    """``td`` with its MetaData entries holding ``value`` (an equal dict, but another object)."""
    return lib.TensorDict(c=lib.MetaData(value, batch_size=td.batch_size), x=td["x"],
                          n=lib.TensorDict(m=lib.MetaData(NAME, batch_size=td.batch_size), y=td["n", "y"],
                                           batch_size=td.batch_size), batch_size=td.batch_size)


# --------------------------------------------------------------------------- the batch ops, differential
OPS: dict = {
    "td[key]": lambda lib, td: td["c"],
    "td[nested key]": lambda lib, td: td["n", "m"],
    "get": lambda lib, td: td.get("c"),
    "index int": lambda lib, td: td[0],
    "index slice": lambda lib, td: td[:1],
    "index ellipsis": lambda lib, td: td[..., -1],
    "index tensor": lambda lib, td: td[torch.tensor([0, 0])],
    "index mask": lambda lib, td: td[_mask(tuple(td.batch_size))],
    "index None": lambda lib, td: td[None],
    "view": lambda lib, td: td.view(-1),
    "reshape": lambda lib, td: td.reshape(1, -1),
    "permute": lambda lib, td: td.permute(*reversed(range(td.batch_dims))),
    "unsqueeze": lambda lib, td: td.unsqueeze(0),
    "squeeze": lambda lib, td: td.unsqueeze(1).squeeze(1),
    "flatten": lambda lib, td: td.flatten(0, -1),
    "unflatten": lambda lib, td: td.unflatten(0, (td.batch_size[0], 1)),
    "expand": lambda lib, td: td.expand(2, *td.batch_size),
    "stack": lambda lib, td: torch.stack([td, td], 0),
    "stack last": lambda lib, td: torch.stack([td, td], -1),
    "stack a clone": lambda lib, td: torch.stack([td, td.clone()], 0),
    "stack an equal value": lambda lib, td: torch.stack([td, _other(lib, td, {"lr": 0.1})], 0),
    "cat": lambda lib, td: torch.cat([td, td], 0),
    "cat another value": lambda lib, td: torch.cat([td, _other(lib, td, {"lr": 0.5})], -1),
    "unbind": lambda lib, td: td.unbind(0),
    "split": lambda lib, td: td.split(1, 0),
    "chunk": lambda lib, td: td.chunk(2, -1),
    "clone": lambda lib, td: td.clone(),
    "to dtype": lambda lib, td: td.to(torch.float64),
    "apply": lambda lib, td: td.apply(lambda x: x + 1),
    "apply new batch": lambda lib, td: td.apply(lambda x: x.reshape(-1, *x.shape[td.batch_dims:]),
                                                batch_size=[td.batch_size.numel()]),
    "select": lambda lib, td: td.select("c", ("n", "m")),
    "exclude": lambda lib, td: td.exclude("x"),
    "update": lambda lib, td: lib.TensorDict(batch_size=td.batch_size).update(td),
    "where": lambda lib, td: td.where(_mask(tuple(td.batch_size)), _other(lib, td, 5)),
    "sum": lambda lib, td: td.sum(0),
    "==": lambda lib, td: td == td.clone(),
    "== another value": lambda lib, td: td == _other(lib, td, 5),
    "lazy_stack get": lambda lib, td: lib.lazy_stack([td, td]).get("c"),
    "lazy_stack read": lambda lib, td: lib.lazy_stack([td, td])["c"],
    "lazy_stack of a clone": lambda lib, td: lib.lazy_stack([td, td.clone()]).get("c"),
    "lazy_stack index": lambda lib, td: lib.lazy_stack([td, td])[:, 0],
    "lazy_stack dense": lambda lib, td: lib.lazy_stack([td, td], -1).contiguous(),
    "to_dict": lambda lib, td: td.to_dict(),
    "tolist": lambda lib, td: td.tolist(),
    "non_tensor_items": lambda lib, td: sorted(td.non_tensor_items(True)),
    "is_non_tensor": lambda lib, td: td.is_non_tensor("c"),
    "set at an index, the same value": lambda lib, td: _setitem(td, 0, td[0].clone(recurse=False)),
    "set at an index, another value": lambda lib, td: _setitem(td, 0, _other(lib, td, 5)[0]),
    "set at an index, a new key": lambda lib, td: _setitem(td.exclude("c"), 0, td[0].select("c")),
    "set_ keeps the class": lambda lib, td: td.set_("c", "new"),
    "set replaces it": lambda lib, td: td.set("c", "new"),
    "pickle": lambda lib, td: pickle.loads(pickle.dumps(td)),
}


@pytest.mark.parametrize("name", sorted(OPS))
@settings(max_examples=12)
@given(batch=batches)
def test_batch_op_matches_upstream(name: str, batch: tuple) -> None:
    if name == "set at an index, another value":
        # A write covering a whole batch of one element: torchdict keeps one value (a NonTensorData), as it
        # does for any non-tensor entry, where upstream makes a one-element stack; upstream's stacks of 2+
        # dims refuse a write at an index (NotImplementedError), torchdict's take it.
        assume(len(batch) == 1 and batch[0] > 1)
    same_outcome(lambda lib: OPS[name](lib, build(lib, batch)))


# --------------------------------------------------------------------------- a MetaData on its own
ALONE: dict = {
    "repr": lambda lib: repr(lib.MetaData(CONFIG, batch_size=[3])),
    "data": lambda lib: lib.MetaData(CONFIG, batch_size=[3]).data,
    "unwraps a NonTensorData": lambda lib: lib.MetaData(lib.NonTensorData(CONFIG)),
    "unwraps a MetaData": lambda lib: lib.MetaData(lib.MetaData(CONFIG, batch_size=[2])),
    "a NonTensorData of it": lambda lib: lib.NonTensorData(lib.MetaData(CONFIG)),
    "keywords": lambda lib: lib.MetaData(data=3, batch_size=[2], names=["x"]),
    "index": lambda lib: lib.MetaData(CONFIG, batch_size=[3])[0],
    "slice": lambda lib: lib.MetaData(CONFIG, batch_size=[3])[1:],
    "unsqueeze": lambda lib: lib.MetaData(CONFIG, batch_size=[3]).unsqueeze(0),
    "torch.unsqueeze": lambda lib: torch.unsqueeze(lib.MetaData(CONFIG, batch_size=[3]), 0),
    "expand": lambda lib: lib.MetaData(CONFIG, batch_size=[3]).expand(2, 3),
    "reshape": lambda lib: lib.MetaData(CONFIG, batch_size=[2, 2]).reshape(-1),
    "permute": lambda lib: lib.MetaData(CONFIG, batch_size=[2, 3]).permute(1, 0),
    "squeeze": lambda lib: lib.MetaData(CONFIG, batch_size=[1, 2]).squeeze(0),
    "split": lambda lib: lib.MetaData(CONFIG, batch_size=[4]).split(2),
    "unbind": lambda lib: lib.MetaData(CONFIG, batch_size=[2]).unbind(0),
    "stack": lambda lib: torch.stack([lib.MetaData(CONFIG, batch_size=[3])] * 2),
    "stack of equal values": lambda lib: torch.stack([lib.MetaData([1], batch_size=[2]),
                                                      lib.MetaData([1], batch_size=[2])]),
    "stack of other values": lambda lib: torch.stack([lib.MetaData(1, batch_size=[2]),
                                                      lib.MetaData(2, batch_size=[2])]),
    "cat": lambda lib: torch.cat([lib.MetaData(1, batch_size=[2]), lib.MetaData(2, batch_size=[2])]),
    "clone": lambda lib: lib.MetaData(CONFIG, batch_size=[3]).clone(),
    "copy": lambda lib: copy.deepcopy(lib.MetaData(CONFIG, batch_size=[3])),
    "where": lambda lib: lib.MetaData(1, batch_size=[2]).where(torch.tensor([True, False]),
                                                               lib.MetaData(2, batch_size=[2])),
    "==": lambda lib: lib.MetaData(1) == lib.MetaData(1),
    "== another value": lambda lib: lib.MetaData(1, batch_size=[2]) == lib.MetaData(2, batch_size=[2]),
    "== a NonTensorData": lambda lib: lib.MetaData(1) == lib.NonTensorData(1),
    "!=": lambda lib: lib.MetaData(1) != lib.MetaData(2),
    "tolist": lambda lib: lib.MetaData(CONFIG, batch_size=[2]).tolist(),
    "maybe_to_stack": lambda lib: lib.MetaData(1, batch_size=[2]).maybe_to_stack(),
    "assign data": lambda lib: _assign_data(lib.MetaData(1)),
    "hash": lambda lib: hash(lib.MetaData(1)),
    "bool": lambda lib: bool(lib.MetaData(0)),
    "no data": lambda lib: lib.MetaData(),
    "pickle": lambda lib: pickle.loads(pickle.dumps(lib.MetaData(3, batch_size=[2]))),
    "is_non_tensor": lambda lib: lib.is_non_tensor(lib.MetaData(1)),
    "a NonTensorDataBase": lambda lib: isinstance(lib.MetaData(1), lib.NonTensorDataBase),
    "typed": lambda lib: lib.MetaData[str]("x", batch_size=[2]),
    "typed, a value of another type": lambda lib: lib.MetaData[str](1),
    "typed, its name": lambda lib: (lib.MetaData[str].__name__, lib.MetaData[str].__qualname__),
    "typed, cached": lambda lib: lib.MetaData[int] is lib.MetaData[int],
    "typed, a subclass": lambda lib: issubclass(lib.MetaData[int], lib.MetaData),
    "typed twice": lambda lib: lib.MetaData[str][int],
    "typed, index": lambda lib: lib.MetaData[str]("x", batch_size=[2])[0],
    "typed, stack": lambda lib: torch.stack([lib.MetaData[str]("x")] * 2),
    "typed, clone": lambda lib: lib.MetaData[str]("x").clone(),
    "typed, in a TensorDict": lambda lib: lib.TensorDict(c=lib.MetaData[str]("x", batch_size=[2]),
                                                         batch_size=[2])[0],
    "typed, pickle": lambda lib: pickle.loads(pickle.dumps(lib.MetaData[str]("x", batch_size=[2]))),
    "typed, a generic alias": lambda lib: lib.MetaData[list](["x"]),
}


def _assign_data(leaf: Any) -> Any:
    leaf.data = 5
    return leaf


@pytest.mark.parametrize("name", sorted(ALONE))
def test_a_lone_metadata_matches_upstream(name: str) -> None:
    same_outcome(ALONE[name])


WRITES: dict = {
    "constructor": lambda lib: lib.TensorDict(c=lib.MetaData(CONFIG), batch_size=[3]),
    "constructor, nested dict": lambda lib: lib.TensorDict({"n": {"c": lib.MetaData(CONFIG)}}, batch_size=[3]),
    "setitem": lambda lib: _setitem(lib.TensorDict(batch_size=[3]), "c", lib.MetaData(CONFIG)),
    "setitem nested": lambda lib: _setitem(lib.TensorDict(batch_size=[3]), ("n", "c"), lib.MetaData(CONFIG)),
    "set": lambda lib: lib.TensorDict(batch_size=[3]).set("c", lib.MetaData(CONFIG, batch_size=[3])),
    "update": lambda lib: lib.TensorDict(c=lib.NonTensorData(1, batch_size=[2]), batch_size=[2]).update(
        {"c": lib.MetaData(CONFIG)}),
    "update_": lambda lib: lib.TensorDict(c=lib.MetaData(1, batch_size=[2]), batch_size=[2]).update_(
        {"c": lib.MetaData(CONFIG)}),
    "from_dict": lambda lib: lib.TensorDict.from_dict({"c": lib.MetaData(CONFIG), "x": torch.zeros(2)}),
    "batch size setter": lambda lib: _set_batch(lib.TensorDict(c=lib.MetaData(CONFIG, batch_size=[3]),
                                                               x=torch.zeros(3, 2), batch_size=[3]), [3, 2]),
}


def _set_batch(td: Any, batch: list) -> Any:
    td.batch_size = batch
    return td


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_written_metadata_stays_one(name: str) -> None:
    same_outcome(WRITES[name])


# --------------------------------------------------------------------------- reads, saves, the class
def test_reading_gives_the_value_on_every_path() -> None:
    # The C td[key] (when built) and the general Python __getitem__ both read a MetaData as its value.
    td = TensorDict(c=MetaData(CONFIG, batch_size=[2]), t=MetaData[str]("x", batch_size=[2]),
                    n={"c": MetaData(CONFIG)}, batch_size=[2])
    for key in ["c", "t", ("n", "c")]:
        assert td[key] is td.get(key).data
        assert _accel.python_getitem(td, key) is td.get(key).data
    assert td["c"] is CONFIG


def test_save_and_load_keep_the_class(tmp_path: Any) -> None:
    td = TensorDict(c=MetaData(CONFIG, batch_size=[3]), t=MetaData[str]("x", batch_size=[3]),
                    n=NonTensorData("s", batch_size=[3]), x=torch.zeros(3), batch_size=[3])
    for save, load in [(td.memmap, TensorDict.load_memmap), (td.save, torchdict.load)]:
        folder = tmp_path / save.__name__
        save(folder)
        loaded = load(folder)
        assert [type(loaded.get(key)).__name__ for key in "ctn"] == ["MetaData", "MetaData[str]", "NonTensorData"]
        assert loaded["c"] == CONFIG and loaded.get("t").batch_size == (3,)
    alone = tmp_path / "alone"
    MetaData[str]("x", batch_size=[2]).memmap(alone)
    assert type(torchdict.load_memmap(alone)) is MetaData[str]


def test_a_folder_upstream_saved_loads_as_metadata(tmp_path: Any) -> None:
    upstream.TensorDict(c=upstream.MetaData(CONFIG, batch_size=[3]), t=upstream.MetaData[str]("x", batch_size=[3]),
                        x=torch.zeros(3), batch_size=[3]).memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    assert type(loaded.get("c")) is MetaData and type(loaded.get("t")) is MetaData[str]
    assert loaded["c"] == CONFIG and loaded["t"] == "x"


def test_a_typed_metadata_checks_the_value() -> None:
    with pytest.raises(TypeError, match="Expected data of type str, got int"):
        MetaData[str](1)
    td = TensorDict(c=MetaData[str]("x", batch_size=[2]), batch_size=[2])
    with pytest.raises(TypeError, match="Expected data of type str, got object"):
        td.set_("c", object())  # the in-place write keeps the class, so the check
    assert td["c"] == "x" and type(td.get("c")) is MetaData[str]  # and nothing was written
    td.set_("c", "y")
    assert td["c"] == "y" and type(td.get("c")) is MetaData[str]


def test_metadata_is_a_nontensordata_in_torchdict() -> None:
    # A deliberate difference (docs/compat.md): upstream's MetaData and NonTensorData are siblings under
    # NonTensorDataBase; torchdict's MetaData subclasses NonTensorData, its one-value leaf.
    assert issubclass(MetaData, NonTensorData) and issubclass(MetaData, torchdict.NonTensorDataBase)
    assert not issubclass(upstream.MetaData, upstream.NonTensorData)
    assert isinstance(MetaData(1), torchdict.NonTensorDataBase) and isinstance(upstream.MetaData(1),
                                                                              upstream.NonTensorDataBase)
