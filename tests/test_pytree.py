"""TensorDict as a torch.utils._pytree node: flatten / unflatten / tree_map, stated against plain tensors."""
import subprocess
import sys

import pytest
import torch
from torch.utils import _pytree as pytree

from torchdict import NonTensorData, NonTensorStack, TensorDict
from torchdict._base import TensorCollection
from torchdict._pytree import is_registered, register_collection_class


def _sample() -> TensorDict:
    td = TensorDict(
        {
            "a": torch.randn(2, 3, 4),
            "nested": {"b": torch.randn(2, 3), "deeper": {"c": torch.randn(2, 3, 5, 1)}},
            "z": torch.arange(6).view(2, 3),
        },
        batch_size=[2, 3],
        names=["x", "y"],
    )
    td["nested", "deeper"].batch_size = [2, 3, 5]
    td["label"] = "constant"
    return td


def _leaf_items(td):
    return list(td.items(True, True))


def test_registered_at_import_without_dynamo():
    assert TensorDict in pytree.SUPPORTED_NODES
    assert is_registered(TensorDict)
    code = "import sys, torchdict; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.strip() == "False"


def test_flatten_gives_the_tensor_leaves_in_key_order():
    td = _sample()
    leaves, spec = pytree.tree_flatten(td)
    expected = [leaf for key, leaf in _leaf_items(td) if isinstance(leaf, torch.Tensor)]
    assert len(leaves) == len(expected) == 4
    assert all(got is want for got, want in zip(leaves, expected))
    assert spec.num_leaves == 4


def test_round_trip_keeps_everything():
    td = _sample()
    leaves, spec = pytree.tree_flatten(td)
    back = pytree.tree_unflatten(leaves, spec)
    assert type(back) is TensorDict
    assert back.batch_size == td.batch_size and back.names == td.names and back.device == td.device
    assert back["nested"].batch_size == torch.Size([2, 3])
    assert back["nested", "deeper"].batch_size == torch.Size([2, 3, 5])
    assert back["label"] == "constant"
    for (key, leaf), (key2, leaf2) in zip(_leaf_items(td), _leaf_items(back)):
        assert key == key2
        if isinstance(leaf, torch.Tensor):
            assert leaf2 is leaf


def test_round_trip_with_device_and_non_tensor_stack():
    td = TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2], device="cpu")
    td["tags"] = NonTensorStack("u", "v")
    back = pytree.tree_unflatten(*pytree.tree_flatten(td))
    assert back.device == torch.device("cpu")
    assert back["tags"] == ["u", "v"]


def test_tree_map_equals_apply_per_leaf():
    td = _sample()
    mapped = pytree.tree_map(lambda t: t * 2 + 1, td)
    for key, leaf in _leaf_items(td):
        if isinstance(leaf, torch.Tensor):
            assert torch.equal(mapped[key], leaf * 2 + 1)
    assert mapped.batch_size == td.batch_size and mapped.names == td.names
    assert mapped["label"] == "constant"


def test_tree_map_over_two_tensordicts_and_structure_mismatch():
    first, second = _sample(), _sample()
    summed = pytree.tree_map(torch.add, first, second)
    assert torch.equal(summed["nested", "b"], first["nested", "b"] + second["nested", "b"])
    second["extra"] = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        pytree.tree_map(torch.add, first, second)


def test_tree_map_that_changes_batch_dims_infers_the_batch():
    td = _sample()
    reduced = pytree.tree_map(lambda t: t.sum(0), td)
    assert reduced.batch_size == torch.Size([3])
    assert reduced["nested", "deeper"].batch_size == torch.Size([3, 5])
    assert reduced.names == [None]
    assert reduced["label"] == "constant" and reduced._tensordict["label"].batch_size == torch.Size([3])
    grown = pytree.tree_map(lambda t: t.unsqueeze(0).expand(7, *t.shape), td)
    assert grown.batch_size == torch.Size([7, 2, 3])
    assert grown["nested", "deeper"].batch_size == torch.Size([7, 2, 3, 5])


def test_tree_map_to_another_device_drops_the_device():
    td = TensorDict({"a": torch.zeros(2)}, batch_size=[2], device="cpu")
    moved = pytree.tree_map(lambda t: t.to("meta"), td)
    assert moved.device is None and moved["a"].device.type == "meta"


def test_non_tensor_stack_cannot_follow_a_batch_change():
    td = TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2])
    td["tags"] = NonTensorStack("u", "v")
    with pytest.raises(ValueError, match="NonTensorStack at key 'tags'"):
        pytree.tree_map(lambda t: t[0], td)


def test_unflatten_with_placeholders_keeps_the_structure():
    # vmap broadcasts in_dims with tree_unflatten([0, 0, ...], spec) and flattens that again.
    td = _sample()
    leaves, spec = pytree.tree_flatten(td)
    shell = pytree.tree_unflatten([0] * len(leaves), spec)
    assert pytree.tree_flatten(shell)[0] == [0] * len(leaves)
    assert pytree.tree_structure(shell) == spec
    assert shell.batch_size == td.batch_size


def test_spec_equality_ignores_batch_sizes_not_structure():
    spec = pytree.tree_structure(TensorDict(a=torch.zeros(3), batch_size=[3]))
    assert spec == pytree.tree_structure(TensorDict(a=torch.zeros(5), batch_size=[5]))
    assert spec != pytree.tree_structure(TensorDict(a=torch.zeros(3)))
    assert spec != pytree.tree_structure(TensorDict(b=torch.zeros(3), batch_size=[3]))
    assert spec != pytree.tree_structure(TensorDict(a=torch.zeros(3), batch_size=[3], names=["n"]))
    with_data = TensorDict(a=torch.zeros(3), batch_size=[3])
    with_data["s"] = "one"
    other = TensorDict(a=torch.zeros(3), batch_size=[3])
    other["s"] = "two"
    assert pytree.tree_structure(with_data) != pytree.tree_structure(other)
    hash(pytree.tree_structure(with_data))


def test_flatten_with_path_names_nested_keys():
    td = _sample()
    pairs, _ = pytree.tree_flatten_with_path(td)
    paths = [path[0].key for path, _ in pairs]
    assert paths == ["a", ("nested", "b"), ("nested", "deeper", "c"), "z"]


def test_inside_other_containers():
    td = _sample()
    tree = {"params": td, "extra": [torch.ones(1), td["a"]]}
    leaves, spec = pytree.tree_flatten(tree)
    assert len(leaves) == 6
    back = pytree.tree_unflatten(leaves, spec)
    assert back["params"]["nested", "b"] is td["nested", "b"]


def test_empty_and_leafless_sub_tensordicts_follow_the_batch():
    td = TensorDict({"a": torch.zeros(4, 2), "empty": {}, "meta": {"note": NonTensorData("n")}}, batch_size=[4])
    reduced = pytree.tree_map(lambda t: t[0], td)
    assert reduced.batch_size == torch.Size([])
    assert reduced["empty"].batch_size == torch.Size([])
    assert reduced["meta"].batch_size == torch.Size([])
    assert reduced["meta", "note"] == "n"


class _Pair(TensorCollection):
    """A minimal non-TensorDict collection following the tensorclass protocol."""

    __slots__ = ("_tensordict",)

    def __init__(self, td):
        self._tensordict = td

    def _rewrap(self, td):
        return _Pair(td)

    @property
    def batch_size(self):
        return self._tensordict.batch_size

    @property
    def device(self):
        return self._tensordict.device


def test_register_collection_class_for_tensorclass_like_types():
    register_collection_class(_Pair)
    register_collection_class(_Pair)  # a second call is a no-op
    pair = _Pair(TensorDict({"x": torch.ones(3, 2)}, batch_size=[3]))
    mapped = pytree.tree_map(lambda t: t * 3, pair)
    assert type(mapped) is _Pair
    assert torch.equal(mapped._tensordict["x"], torch.full((3, 2), 3.0))
    # As a leaf of a TensorDict too.
    td = TensorDict({"pair": pair, "y": torch.zeros(3)}, batch_size=[3])
    leaves, spec = pytree.tree_flatten(td)
    assert len(leaves) == 2
    back = pytree.tree_unflatten([leaf + 1 for leaf in leaves], spec)
    assert type(back._tensordict["pair"]) is _Pair
    assert torch.equal(back._tensordict["pair"]._tensordict["x"], torch.full((3, 2), 2.0))
