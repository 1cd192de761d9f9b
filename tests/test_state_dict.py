"""state_dict / load_state_dict, stated against plain torch, plain dicts and nn.Module's conventions."""
from collections import OrderedDict

import pytest
import torch
from torch import nn

from torchdict import NonTensorData, NonTensorStack, TensorDict
from torchdict._errors import InplaceWriteError

from _helpers import assert_same_snapshot, snapshot


def make_td():
    return TensorDict(
        {"a": torch.arange(6.0).view(2, 3), "n": {"b": torch.zeros(2, 1), "m": {"c": torch.ones(2, 1, dtype=torch.int64)}},
         "s": "hello", "e": {}},
        batch_size=[2], names=["t"],
    )


def tensor_leaves(td):
    """The tensor leaves under their dotted keys, in the TensorDict's own order (a plain dict)."""
    return {".".join(key) if isinstance(key, tuple) else key: value for key, value in td.items(True, True)}


def zeroed_like(td):
    """The same structure with other values everywhere (tensors zeroed, non-tensor data changed)."""
    other = td.clone()
    other.apply_(lambda x: x.zero_())
    other["s"] = "other"
    return other


def assert_same_leaves(td, expected):
    assert set(td.keys(True)) == set(expected.keys(True))
    for key, value in expected.items(True):
        got = td.get(key)
        if isinstance(value, torch.Tensor):
            assert torch.equal(got, value), key
        elif isinstance(value, TensorDict):
            assert got.batch_size == value.batch_size, key
        else:
            assert got.tolist() == value.tolist() and got.batch_size == value.batch_size, key


# ------------------------------------------------------------------------------ state_dict
def test_keys_are_the_flattened_leaf_keys_and_values_detached_leaves():
    td = make_td()
    td["p"] = nn.Parameter(torch.randn(2, 4))
    sd = td.state_dict()
    assert type(sd) is OrderedDict
    expected = tensor_leaves(td)
    assert list(sd) == list(expected) == ["a", "n.b", "n.m.c", "p"]
    for key, leaf in expected.items():
        assert sd[key] is not leaf and sd[key].data_ptr() == leaf.data_ptr()  # detached views, like nn.Module
        assert torch.equal(sd[key], leaf) and type(sd[key]) is torch.Tensor and not sd[key].requires_grad


def test_keep_vars_gives_the_leaves_themselves():
    td = make_td()
    td["p"] = nn.Parameter(torch.randn(2, 4))
    sd = td.state_dict(keep_vars=True)
    assert all(sd[key] is leaf for key, leaf in tensor_leaves(td).items())
    assert type(sd["p"]) is nn.Parameter


def test_non_tensor_data_batch_sizes_and_names_are_in_the_metadata():
    td = make_td()
    td["n"].batch_size = [2, 1]
    metadata = td.state_dict()._metadata
    assert metadata[""] == {"batch_size": torch.Size([2]), "device": None, "names": ["t"]}
    assert metadata["n"] == {"batch_size": torch.Size([2, 1]), "device": None}
    assert metadata["e"]["batch_size"] == torch.Size([2])
    assert metadata["s"]["_type"] == "NonTensorData" and metadata["s"]["_non_tensor"]["data"] == "hello"
    assert "s" not in td.state_dict()


def test_prefix_and_destination_follow_nn_module():
    td = make_td()
    sd = td.state_dict(prefix="td.")
    assert list(sd) == ["td." + key for key in tensor_leaves(td)]
    assert list(sd._metadata) == ["td", "td.n", "td.n.m", "td.s", "td.e"]  # nn.Module: the prefix without its dot
    destination = OrderedDict(x=torch.zeros(1))
    assert td.state_dict(destination, prefix="td.") is destination
    assert list(destination) == ["x"] + list(sd)
    with pytest.raises(TypeError, match="needs a mapping that takes attributes"):
        td.state_dict(destination={})


def test_flatten_false_gives_nested_dicts():
    td = make_td()
    sd = td.state_dict(flatten=False)
    assert list(sd) == ["a", "n", "s", "e"]
    assert sd["a"] is not td["a"] and torch.equal(sd["a"], td["a"])
    assert list(sd["n"]) == ["b", "m"] and torch.equal(sd["n"]["m"]["c"], td["n", "m", "c"])
    assert sd["n"]._metadata[""]["batch_size"] == torch.Size([2])
    # A non-tensor value is an empty mapping whose own metadata holds it (upstream's layout).
    assert sd["s"] == {} and sd["s"]._metadata[""]["_non_tensor"]["data"] == "hello"
    assert list(td.state_dict(prefix="td.", flatten=False)) == ["td.a", "td.n", "td.s", "td.e"]


def test_keys_that_collide_once_joined_are_refused():
    td = TensorDict({"n.b": torch.zeros(2), "n": {"b": torch.ones(2)}}, batch_size=[2])
    with pytest.raises(KeyError, match="'n.b' names two entries"):
        td.state_dict()
    assert list(td.state_dict(flatten=False)) == ["n.b", "n"]


# ------------------------------------------------------------------------------ round trips
def test_round_trip_copies_in_place_and_restores_non_tensor_data():
    td = make_td()
    target = zeroed_like(td)
    before = {key: leaf for key, leaf in tensor_leaves(target).items()}
    assert target.load_state_dict(td.state_dict()) is target
    assert_same_leaves(target, td)
    assert all(tensor_leaves(target)[key] is leaf for key, leaf in before.items())  # same tensors, new values
    assert target["s"] == "hello"


def test_round_trip_into_an_empty_tensordict_rebuilds_everything():
    td = make_td()
    td["n"].batch_size = [2, 1]
    td["stack"] = ["x", "y"]
    assert isinstance(td.get("stack"), NonTensorStack)
    restored = TensorDict().load_state_dict(td.state_dict(), strict=False)
    assert_same_leaves(restored, td)
    assert restored.batch_size == td.batch_size and restored.names == ["t"]
    assert restored["n"].batch_size == torch.Size([2, 1])
    assert restored["s"] == "hello" and restored["stack"] == ["x", "y"]
    assert isinstance(restored["e"], TensorDict) and restored["e"].is_empty()


def test_flatten_false_round_trip():
    td = make_td()
    restored = TensorDict().load_state_dict(td.state_dict(flatten=False), strict=False)
    assert_same_leaves(restored, td)
    target = zeroed_like(td)
    target.load_state_dict(td.state_dict(flatten=False))
    assert_same_leaves(target, td)


def test_torch_save_round_trip(tmp_path):
    td = make_td()
    torch.save(td.state_dict(), tmp_path / "td.pt")
    loaded = torch.load(tmp_path / "td.pt")  # weights_only (torch's default) keeps the metadata
    assert_same_leaves(TensorDict().load_state_dict(loaded, strict=False), td)
    target = zeroed_like(td)
    target.load_state_dict(loaded)
    assert_same_leaves(target, td)


def test_dotted_keys_round_trip():
    # flatten_keys() gives literal dotted keys: the metadata tells them from nested ones.
    td = TensorDict({"n": {"b": torch.zeros(2)}, "x": {"y": torch.ones(2)}}, batch_size=[2]).flatten_keys()
    td["sub"] = {"k.l": torch.full((2,), 3.0)}
    sd = td.state_dict()
    assert list(sd) == ["n.b", "x.y", "sub.k.l"]
    restored = TensorDict().load_state_dict(sd, strict=False)
    assert set(restored.keys(True, True)) == {"n.b", "x.y", ("sub", "k.l")}
    target = td.clone().zero_()
    target.load_state_dict(sd)
    assert_same_leaves(target, td)


# ------------------------------------------------------------------------------ load options
def test_assign_replaces_the_leaves():
    td = make_td()
    sd = td.state_dict()
    sd["a"] = torch.ones(2, 5, dtype=torch.float64)  # another shape and dtype: fine when replacing
    target = zeroed_like(td)
    target.load_state_dict(sd, assign=True)
    assert target["a"] is sd["a"] and target["n", "b"] is sd["n.b"]
    assert target["s"] == "hello"


def test_in_place_load_casts_the_dtype_and_writes_parameters():
    weight = nn.Parameter(torch.zeros(2, 3))
    td = TensorDict({"w": weight, "i": torch.zeros(2, dtype=torch.int64)}, batch_size=[2])
    td.load_state_dict({"w": torch.ones(2, 3, dtype=torch.float64), "i": torch.tensor([1.7, 2.2])})
    assert td["w"] is weight and weight.requires_grad and torch.equal(weight.detach(), torch.ones(2, 3))
    assert td["i"].dtype == torch.int64 and td["i"].tolist() == [1, 2]  # as Tensor.copy_


def test_strict_false_adds_extra_keys_and_keeps_missing_ones():
    td = make_td()
    sd = td.state_dict()
    del sd["n.b"]
    sd["extra"] = torch.full((2,), 5.0)
    sd["n.m.new"] = torch.full((2, 7), 6.0)
    target = zeroed_like(td)
    kept = target["n", "b"]
    target.load_state_dict(sd, strict=False)
    assert target["n", "b"] is kept and torch.equal(kept, torch.zeros(2, 1))
    assert torch.equal(target["extra"], sd["extra"]) and torch.equal(target["n", "m", "new"], sd["n.m.new"])
    assert torch.equal(target["a"], td["a"])


def test_batch_size_is_taken_from_the_state_dict():
    source = TensorDict({"a": torch.ones(2, 3), "n": {"b": torch.ones(2)}}, batch_size=[2])
    target = TensorDict({"a": torch.zeros(2, 3), "n": {"b": torch.zeros(2)}}, batch_size=[])
    target.load_state_dict(source.state_dict())
    assert target.batch_size == target["n"].batch_size == torch.Size([2])
    assert_same_leaves(target, source)


def test_locked_tensordict_loads_in_place():
    td = make_td()
    target = zeroed_like(td).lock_()
    target.load_state_dict(td.state_dict())
    assert target.is_locked
    assert_same_leaves(target, td)


def test_module_state_dict_loads_into_from_module():
    module = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    params = TensorDict.from_module(module).clone().zero_()
    params.load_state_dict(module.state_dict())
    for name, tensor in module.state_dict().items():
        assert torch.equal(params.get(tuple(name.split("."))), tensor)
    fresh = TensorDict().load_state_dict(module.state_dict(), strict=False)
    assert set(fresh.keys(True, True)) == set(params.keys(True, True))


def test_tensordict_state_dict_loads_into_a_module():
    module = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    params = TensorDict.from_module(module).clone().apply_(lambda x: x.fill_(2))
    other = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    result = other.load_state_dict(params.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert all(torch.equal(tensor, torch.full_like(tensor, 2)) for tensor in other.state_dict().values())


def test_plain_dict_keys_are_split_only_with_from_flatten():
    plain = {"a": torch.ones(2), "n.b": torch.zeros(2), "m": {"c": torch.ones(2)}}
    literal = TensorDict().load_state_dict(plain, strict=False)
    assert set(literal.keys(True, True)) == {"a", "n.b", ("m", "c")}
    split = TensorDict().load_state_dict(plain, strict=False, from_flatten=True)
    assert set(split.keys(True, True)) == {"a", ("n", "b"), ("m", "c")}
    assert split.batch_size == torch.Size([])  # nothing recorded: the TensorDict keeps its own


def test_upstream_layout_loads():
    # What upstream tensordict 0.15's state_dict() gives for {"n": {"b": ...}, "s": "hi"}, batch [2].
    sd = OrderedDict({"n.b": torch.ones(2, 3)})
    sd._metadata = OrderedDict({
        "": {"batch_size": torch.Size([2]), "device": None},
        "n": {"batch_size": torch.Size([2]), "device": None},
        "s": {"batch_size": torch.Size([2]), "device": None, "_type": "NonTensorData",
              "_non_tensor": {"data": "hi", "_metadata": None, "_is_non_tensor": True}},
    })
    td = TensorDict().load_state_dict(sd, strict=False)
    assert td.batch_size == torch.Size([2]) and td["s"] == "hi" and torch.equal(td["n", "b"], torch.ones(2, 3))
    assert isinstance(td.get("s"), NonTensorData)


# ------------------------------------------------------------------------------ refused loads
def _refused(target, state_dict, error, match, **kwargs):
    before = snapshot(target)
    with pytest.raises(error, match=match):
        target.load_state_dict(state_dict, **kwargs)
    assert_same_snapshot(before, snapshot(target))
    assert target["s"] == "other"


def test_strict_refuses_missing_and_extra_keys_without_writing():
    td = make_td()
    missing = td.state_dict()
    del missing["n.b"]
    _refused(zeroed_like(td), missing, RuntimeError, r"tensordict extra keys \['n.b'\]")
    extra = td.state_dict()
    extra["n.x"] = torch.zeros(2)
    _refused(zeroed_like(td), extra, RuntimeError, r"state_dict extra keys \['n.x'\]")
    _refused(zeroed_like(td), {"a": td["a"]}, RuntimeError, r"tensordict extra keys \['e', 'n', 's'\]")


def test_shape_mismatch_is_refused_without_writing():
    td = make_td()
    sd = td.state_dict()
    sd["n.m.c"] = torch.ones(2, 5)
    _refused(zeroed_like(td), sd, InplaceWriteError, "size mismatch for 'n.m.c'")
    sd["n.m.c"] = torch.ones(1)  # broadcastable, still not the entry's shape (as nn.Module)
    _refused(zeroed_like(td), sd, RuntimeError, "size mismatch for 'n.m.c'")


def test_locked_tensordict_refuses_replacements_and_new_keys():
    td = make_td()
    _refused(zeroed_like(td).lock_(), td.state_dict(), RuntimeError, "Cannot modify locked TensorDict", assign=True)
    sd = td.state_dict()
    sd["new"] = torch.zeros(2)
    _refused(zeroed_like(td).lock_(), sd, RuntimeError, "Cannot modify locked TensorDict", strict=False)


def test_structure_conflicts_are_refused():
    td = make_td()
    _refused(zeroed_like(td), {"n": torch.zeros(2)}, InplaceWriteError, "holds a sub-TensorDict", strict=False)
    _refused(zeroed_like(td), {"a": {"x": torch.zeros(2)}}, InplaceWriteError, "holds entries under 'a'",
             strict=False)
    _refused(zeroed_like(td), {"s": torch.zeros(2)}, InplaceWriteError, "Cannot load the Tensor at 's'",
             strict=False)


def test_batch_size_that_does_not_fit_is_refused():
    td = make_td()
    sd = td.state_dict()
    sd._metadata[""]["batch_size"] = torch.Size([3])
    sd._metadata[""].pop("names")
    _refused(zeroed_like(td), sd, RuntimeError, "incompatible with the batch-size")
    sd = td.state_dict()
    sd["n.b"] = torch.zeros(5, 1)
    _refused(zeroed_like(td), sd, RuntimeError, "batch dimension mismatch", assign=True)
