"""TensorDictBase: a collection that provides only the primitives gets the whole API, and it agrees with
TensorDict's own (faster) code for the same entries."""
from __future__ import annotations

import pytest
import torch

import torchdict
from torchdict import LazyStackedTensorDict, TensorDict, TensorDictBase, TensorDictParams, lazy_stack
from torchdict import base as base_module


class DictCollection(TensorDictBase):
    """The smallest collection: a plain dict of entries and the six required primitives, nothing else."""

    def __init__(self, entries: dict, batch_size: list) -> None:
        self._entries = dict(entries)
        self._batch = torch.Size(batch_size)

    @property
    def batch_size(self) -> torch.Size:
        return self._batch

    @property
    def device(self):
        return None

    def _keys_str(self):
        return iter(list(self._entries))

    def _get_str(self, key, default):
        return self._entries.get(key, default)

    def _set_str(self, key, value, inplace):
        if inplace:
            self._entries[key].copy_(value)
        else:
            self._entries[key] = value

    def _del_str(self, key):
        del self._entries[key]


def _pair(batch=(3, 4)):
    """The same entries as a DictCollection (nested level a DictCollection too) and as a TensorDict."""
    torch.manual_seed(0)
    obs = torch.randn(*batch, 2)
    done = torch.rand(*batch) > 0.5
    inner = torch.randn(*batch, 5)
    collection = DictCollection({"obs": obs, "done": done, "next": DictCollection({"x": inner}, batch)}, batch)
    td = TensorDict({"obs": obs.clone(), "done": done.clone(), "next": {"x": inner.clone()}}, batch)
    return collection, td


def _assert_same(result, expected):
    if isinstance(expected, torch.Tensor):
        assert torch.equal(result, expected)
    elif isinstance(expected, TensorDictBase):
        assert isinstance(result, TensorDictBase)
        assert result.batch_size == expected.batch_size
        assert sorted(map(str, result.keys(True, True))) == sorted(map(str, expected.keys(True, True)))
        for key in expected.keys(True, True):
            _assert_same(result.get(key), expected.get(key))
    elif isinstance(expected, (tuple, list)):
        assert len(result) == len(expected)
        for got, want in zip(result, expected):
            _assert_same(got, want)
    else:
        assert result == expected


OPS = {
    "index int": lambda td: td[1],
    "index slice": lambda td: td[:, 1:3],
    "index mask": lambda td: td[torch.tensor([True, False, True])],
    "view": lambda td: td.view(-1),
    "reshape": lambda td: td.reshape(4, 3),
    "permute": lambda td: td.permute(1, 0),
    "unsqueeze": lambda td: td.unsqueeze(0),
    "expand": lambda td: td.expand(2, 3, 4),
    "split": lambda td: td.split(2, 1),
    "unbind": lambda td: td.unbind(1),
    "stack": lambda td: torch.stack([td, td], 0),
    "cat": lambda td: torch.cat([td, td], 1),
    "add": lambda td: td.float() + 1,
    "compare": lambda td: td == td,
    "neg": lambda td: -td.float(),
    "sum": lambda td: td.float().sum(dim=1),
    "mean": lambda td: td.float().mean(),
    "apply": lambda td: td.apply(lambda x: x * 2),
    "named_apply": lambda td: td.named_apply(lambda name, x: x.float() + len(name)),
    "select": lambda td: td.select("obs", ("next", "x")),
    "exclude": lambda td: td.exclude("done"),
    "flatten_keys": lambda td: td.flatten_keys(),
    "keys": lambda td: sorted(map(str, td.keys(include_nested=True))),
    "leaves": lambda td: sorted(map(str, td.keys(include_nested=True, leaves_only=True))),
    "get nested": lambda td: td["next", "x"],
    "contains": lambda td: (("next", "x") in td, "missing" in td),
    "len and numel": lambda td: (len(td), td.numel(), td.batch_dims, td.shape),
    "to_dict": lambda td: sorted(td.to_dict()),
    "tolist": lambda td: str(td.select("obs").tolist()),
    "clone": lambda td: td.clone(),
    "to_tensordict": lambda td: td.to_tensordict(),
    "float": lambda td: td.float(),
    "is_empty": lambda td: td.is_empty(),
}


@pytest.mark.parametrize("name", OPS)
def test_the_generic_path_agrees_with_tensordict(name):
    collection, td = _pair()
    _assert_same(OPS[name](collection), OPS[name](td))


IN_PLACE = {
    "apply_": lambda td: td.apply_(lambda x: x + 1 if x.dtype is not torch.bool else ~x),
    "clamp_": lambda td: td.exclude("done").clamp_(max=0.5),
    "zero_": lambda td: td.zero_(),
    "set new": lambda td: td.set(("next", "y"), torch.ones(3, 4)),
    "set nested new level": lambda td: td.set(("a", "b"), torch.ones(3, 4, 1)),
    "setitem index": lambda td: td.__setitem__(0, td[1].clone()),
    "update": lambda td: td.update({"obs": torch.zeros(3, 4, 2), "new": torch.ones(3, 4)}),
    "update_": lambda td: td.update_({"obs": torch.zeros(3, 4, 2)}),
    "del": lambda td: td.del_(("next", "x")),
    "pop": lambda td: td.pop("obs"),
    "rename_key_": lambda td: td.rename_key_("obs", "observation"),
    "masked_fill_": lambda td: td.select("obs").masked_fill_(torch.ones(3, 4, dtype=torch.bool), 0.0),
    "iadd": lambda td: td.select("obs").__iadd__(1),
}


@pytest.mark.parametrize("name", IN_PLACE)
def test_generic_writes_agree_with_tensordict(name):
    collection, td = _pair()
    IN_PLACE[name](collection)
    IN_PLACE[name](td)
    _assert_same(collection, td)


def test_in_place_ops_keep_the_tensor_objects():
    collection, _ = _pair()
    obs = collection["obs"]
    collection.apply_(lambda x: x * 0 if x.dtype is not torch.bool else x)
    assert collection["obs"] is obs and not obs.any()


def test_a_failing_in_place_op_changes_nothing():
    collection, _ = _pair()
    before = {key: value.clone() for key, value in collection.items(True, True)}

    def fails_on_the_last_leaf(x):
        if x.shape[-1] == 5:
            raise ValueError("boom")
        return x + 1 if x.dtype is not torch.bool else x

    with pytest.raises(ValueError):
        collection.apply_(fails_on_the_last_leaf)
    with pytest.raises(RuntimeError):
        collection.update({"obs": torch.zeros(3, 4, 2), "bad": torch.zeros(2)})
    assert "bad" not in collection
    for key, value in collection.items(True, True):
        assert torch.equal(value, before[key]), key


def test_a_context_manager_writes_back_to_the_collection():
    collection, _ = _pair()
    with collection.flatten_keys() as flat:
        flat["next.x"] = torch.zeros(3, 4, 5)
        flat["made"] = torch.ones(3, 4)
    assert not collection["next", "x"].any()
    assert torch.equal(collection["made"], torch.ones(3, 4))


def test_memmap_round_trip(tmp_path):
    collection, td = _pair()
    collection.memmap(tmp_path)
    _assert_same(TensorDict.load_memmap(tmp_path), td)


def test_missing_primitives_name_the_method_and_the_type():
    class Bare(TensorDictBase):
        pass

    with pytest.raises(NotImplementedError, match=r"Bare\.batch_size"):
        Bare().batch_size
    with pytest.raises(NotImplementedError, match=r"Bare\._keys_str"):
        Bare().keys()


def test_a_read_only_collection_refuses_writes_and_changes_nothing():
    class ReadOnly(DictCollection):
        def _set_str(self, key, value, inplace):
            raise NotImplementedError(f"{type(self).__name__} is read-only")

    collection = ReadOnly({"a": torch.zeros(2)}, [2])
    with pytest.raises(NotImplementedError, match="ReadOnly"):
        collection.set("b", torch.ones(2))
    assert list(collection.keys()) == ["a"]


def test_every_collection_is_a_tensordictbase():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    assert isinstance(td, TensorDictBase)
    assert isinstance(lazy_stack([td, td]), TensorDictBase)
    assert isinstance(TensorDictParams(td), TensorDictBase)
    assert issubclass(LazyStackedTensorDict, TensorDictBase)
    assert torchdict.base.TensorDictBase is TensorDictBase


def test_is_tensor_collection_answers_as_upstream():
    upstream = pytest.importorskip("tensordict")

    @torchdict.tensorclass
    class Ours:
        x: torch.Tensor

    @upstream.tensorclass
    class Theirs:
        x: torch.Tensor

    pairs = [
        (TensorDict(), upstream.TensorDict()),
        (Ours(x=torch.zeros(2), batch_size=[2]), Theirs(x=torch.zeros(2), batch_size=[2])),
        (Ours, Theirs), (TensorDict, upstream.TensorDict), (torch.zeros(1), torch.zeros(1)), (dict, dict),
        (lazy_stack([TensorDict()]), upstream.lazy_stack([upstream.TensorDict()])),
    ]
    for ours, theirs in pairs:
        assert torchdict.is_tensor_collection(ours) == upstream.is_tensor_collection(theirs), ours
    for ours, theirs in pairs[:1] + pairs[-1:]:
        assert isinstance(ours, TensorDictBase) == isinstance(theirs, upstream.TensorDictBase)


def test_tensordict_defines_every_generic_member_itself():
    """TensorDict's own code serves every name: the generic layer adds nothing to its hot paths (and a
    generic method on TensorDict, whose dense form is itself, would call itself)."""
    generic = [name for name in vars(TensorDictBase) if not name.startswith("__") or name in
               base_module.DENSE_OPERATORS + base_module.IN_PLACE_OPERATORS]
    for name in generic:
        if name in {"_assign_from", "_scratch", "_set_at", "_walk", "_walk_keys", "_index"}:
            continue  # helpers of the generic layer itself
        owner = next(cls for cls in TensorDict.__mro__ if name in vars(cls))
        assert owner is not TensorDictBase, name


def test_lazy_stacks_get_the_generic_members():
    members = [TensorDict({"a": torch.full((3,), float(i))}, [3]) for i in range(2)]
    stacked = lazy_stack(members)
    dense = torch.stack(members)
    _assert_same(stacked.reshape(-1), dense.reshape(-1))
    _assert_same(stacked.permute(1, 0), dense.permute(1, 0))
    stacked.clamp_(max=0.5)
    assert members[1]["a"].max() == 0.5  # written back into the members
    assert isinstance(stacked.float(), LazyStackedTensorDict)  # member-wise, as upstream


def test_non_tensor_entries_read_as_their_values():
    collection, td = _pair()
    for target in (collection, td):
        target.set("name", "run-1")
        target.set("per_row", torchdict.NonTensorStack.from_list([[f"{i}{j}" for j in range(4)] for i in range(3)]))
    assert collection["name"] == td["name"] == "run-1"
    assert collection["per_row"] == td["per_row"] == [[f"{i}{j}" for j in range(4)] for i in range(3)]
    assert type(collection.get("name")) is type(td.get("name")) is torchdict.NonTensorData
