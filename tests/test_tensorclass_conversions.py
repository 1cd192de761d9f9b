"""Tensorclass conversions: ``to_dict``, ``to_tensordict``, ``from_dict`` and ``from_tensordict``.

What is checked is what upstream tensordict 0.15 does: ``None`` fields in exports, nested
tensorclasses as plain dicts / TensorDicts, copies versus shared leaves, and how nested
dicts and TensorDicts are read back into the annotated tensorclasses.
"""
from __future__ import annotations

import warnings
from typing import Optional

import pytest
import torch

from _helpers import assert_same_snapshot, snapshot
from torchdict import NonTensorData, TensorDict, tensorclass


@tensorclass
class Leaf:
    x: torch.Tensor
    note: Optional[torch.Tensor] = None


@tensorclass
class Branch:
    a: torch.Tensor
    leaf: Leaf
    opt: Optional[torch.Tensor] = None
    tag: str = "hi"
    table: Optional[TensorDict] = None


@tensorclass
class Node:
    value: torch.Tensor
    child: Optional["Node"] = None


@tensorclass
class Plain:
    a: torch.Tensor
    b: torch.Tensor


def make_branch() -> Branch:
    leaf = Leaf(x=torch.arange(3.0).unsqueeze(-1).expand(3, 4).clone(), batch_size=[3])
    return Branch(a=torch.zeros(3, 2), leaf=leaf, table=TensorDict(y=torch.ones(3, 5)), batch_size=[3])


def assert_same_fields(left: Branch, right: Branch) -> None:
    assert type(left) is type(right) and type(right.leaf) is Leaf
    assert torch.equal(left.a, right.a) and torch.equal(left.leaf.x, right.leaf.x)
    assert left.opt is None and right.opt is None and left.leaf.note is None and right.leaf.note is None
    assert left.tag == right.tag
    assert type(right.table) is TensorDict and torch.equal(left.table["y"], right.table["y"])


# ------------------------------------------------------------------------ to_dict
def test_to_dict_keeps_none_fields_after_the_stored_ones_at_every_level():
    data = make_branch()
    exported = data.to_dict()
    # Stored fields in storage order (the constructor's business), then the None fields.
    assert list(exported) == list(data._tensordict.keys()) + ["opt"]
    assert set(exported) == {"a", "leaf", "tag", "table", "opt"}
    assert exported["opt"] is None
    assert list(exported["leaf"]) == ["x", "note"] and exported["leaf"]["note"] is None
    assert type(exported["leaf"]) is dict and type(exported["table"]) is dict
    assert exported["tag"] == "hi"


def test_to_dict_none_fields_in_declaration_order():
    exported = Branch(a=torch.zeros(2), leaf=None, tag=None, batch_size=[2]).to_dict()
    assert list(exported) == ["a", "leaf", "opt", "tag", "table"]
    assert [exported[key] for key in ("leaf", "opt", "tag", "table")] == [None] * 4


def test_to_dict_retain_none_false_leaves_them_out():
    data = make_branch()
    exported = data.to_dict(retain_none=False)
    assert list(exported) == list(data._tensordict.keys()) and list(exported["leaf"]) == ["x"]


def test_to_dict_shares_the_leaves_and_convert_tensors_gives_lists():
    data = make_branch()
    exported = data.to_dict()
    assert exported["a"] is data.a and exported["leaf"]["x"] is data.leaf.x
    as_lists = Leaf(x=torch.ones(2), batch_size=[2]).to_dict(convert_tensors=True)
    assert as_lists == {"x": [1.0, 1.0], "note": None}


def test_to_dict_reaches_a_tensorclass_inside_a_tensordict_field():
    data = make_branch()
    data.table = TensorDict(inner=Leaf(x=torch.zeros(3), batch_size=[3]), batch_size=[3])
    assert data.to_dict()["table"]["inner"] == {"x": data.table["inner"].x, "note": None}


def test_to_dict_keywords_only():
    with pytest.raises(TypeError):
        make_branch().to_dict(False)  # type: ignore[misc]


# ------------------------------------------------------------------------ to_tensordict
def test_to_tensordict_nested_tensorclasses_become_tensordicts():
    data = make_branch()
    td = data.to_tensordict()
    assert type(td) is TensorDict and type(td.get("leaf")) is TensorDict and type(td.get("table")) is TensorDict
    assert td.batch_size == torch.Size([3]) and td.get("leaf").batch_size == torch.Size([3])
    assert type(td.get("tag")) is NonTensorData and td["tag"] == "hi"
    assert list(td.keys()) == list(data._tensordict.keys())  # None fields left out by default
    assert "opt" not in td.keys()
    assert list(td.get("leaf").keys()) == ["x"]


def test_to_tensordict_copies_the_leaves():
    data = make_branch()
    td = data.to_tensordict()
    assert td["a"].data_ptr() != data.a.data_ptr()
    assert td["leaf", "x"].data_ptr() != data.leaf.x.data_ptr()
    td["leaf", "x"].add_(10)
    td["a"].add_(1)
    assert torch.equal(data.leaf.x, make_branch().leaf.x) and not data.a.any()


def test_to_tensordict_retain_none_writes_none_entries():
    data = make_branch()
    td = data.to_tensordict(retain_none=True)
    assert list(td.keys()) == list(data._tensordict.keys()) + ["opt"]
    assert type(td.get("opt")) is NonTensorData and td.get("opt").data is None
    assert td.get("opt").batch_size == torch.Size([3])
    assert list(td.get("leaf").keys()) == ["x", "note"] and td.get("leaf").get("note").data is None
    assert "opt" not in data.to_tensordict(retain_none=False).keys()


def test_to_tensordict_of_a_locked_instance_is_unlocked_and_leaves_it_alone():
    data = make_branch()
    data.lock_()
    td = data.to_tensordict(retain_none=True)
    assert not td.is_locked and data.is_locked
    assert "opt" not in data._tensordict.keys() and data.opt is None


def test_to_tensordict_then_from_tensordict_round_trip():
    data = make_branch()
    assert_same_fields(data, Branch.from_tensordict(data.to_tensordict()))


# ------------------------------------------------------------------------ from_dict
def test_from_dict_round_trip_nested():
    data = make_branch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every field is in the dict: nothing to warn about
        rebuilt = Branch.from_dict(data.to_dict(), batch_size=[3])
    assert_same_fields(data, rebuilt)
    assert rebuilt.batch_size == rebuilt.leaf.batch_size == rebuilt.table.batch_size == torch.Size([3])


def test_from_dict_shares_the_leaves():
    exported = make_branch().to_dict()
    rebuilt = Branch.from_dict(exported)
    assert rebuilt.a is exported["a"] and rebuilt.leaf.x is exported["leaf"]["x"]


def test_from_dict_batch_size_defaults_to_empty_at_every_level():
    rebuilt = Branch.from_dict(make_branch().to_dict())
    assert rebuilt.batch_size == rebuilt.leaf.batch_size == rebuilt.table.batch_size == torch.Size([])


def test_from_dict_auto_batch_size_per_level():
    exported = make_branch().to_dict()
    exported["tag"] = torch.zeros(3, 7)  # a str would give the top level no batch dim
    rebuilt = Branch.from_dict(exported, auto_batch_size=True)
    assert rebuilt.batch_size == torch.Size([3])
    assert rebuilt.leaf.batch_size == torch.Size([3, 4]) and rebuilt.table.batch_size == torch.Size([3, 5])
    capped = Branch.from_dict(exported, batch_dims=1)
    assert capped.batch_size == capped.leaf.batch_size == capped.table.batch_size == torch.Size([3])


def test_from_dict_nested_dict_becomes_the_annotated_class():
    rebuilt = Node.from_dict({"value": torch.zeros(2), "child": {"value": torch.ones(2)}}, batch_size=[2])
    assert type(rebuilt.child) is Node and rebuilt.child.child is None
    assert torch.equal(rebuilt.child.value, torch.ones(2))
    from_td = Branch.from_dict({"a": torch.zeros(3), "leaf": TensorDict(x=torch.ones(3)), "tag": "t"})
    assert type(from_td.leaf) is Leaf


def test_from_dict_nested_dict_with_an_unknown_key_stays_a_tensordict():
    rebuilt = Branch.from_dict({"a": torch.zeros(3), "leaf": {"x": torch.ones(3), "other": torch.ones(3)},
                                "tag": "t"})
    assert type(rebuilt.leaf) is TensorDict and set(rebuilt.leaf.keys()) == {"x", "other"}


def test_from_dict_none_values_are_none_fields():
    rebuilt = Branch.from_dict({"a": torch.zeros(3), "leaf": None, "opt": None, "tag": None, "table": None})
    assert rebuilt.leaf is None and rebuilt.opt is None and rebuilt.tag is None
    assert list(rebuilt._tensordict.keys()) == ["a"]


def test_from_dict_missing_fields_are_none_and_declared_defaults_warn():
    with pytest.warns(FutureWarning, match=r"sets the fields \['tag'\]"):
        rebuilt = Branch.from_dict({"a": torch.zeros(3), "leaf": {"x": torch.ones(3)}})
    assert rebuilt.tag is None and rebuilt.opt is None and rebuilt.table is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no field declares a non-None default
        partial = Plain.from_dict({"a": torch.zeros(1)})
    assert partial.b is None


def test_from_dict_scalars_stay_python_values_with_a_batch_size():
    exported = {"a": torch.zeros(3), "leaf": {"x": torch.zeros(3)}, "tag": "t", "opt": 4}
    with_batch = Branch.from_dict(exported, batch_size=[3])
    assert with_batch.opt == 4 and type(with_batch.opt) is int
    without = Branch.from_dict(exported)
    assert type(without.opt) is torch.Tensor and without.opt.item() == 4


def test_from_dict_is_not_driven_by_the_class_options():
    @tensorclass(nocast=True)
    class Counts:
        n: int

    assert type(Counts(n=3).n) is int
    assert type(Counts.from_dict({"n": 3}).n) is torch.Tensor  # as upstream: TensorDict conversion


def test_from_dict_tuple_keys_reach_nested_fields():
    rebuilt = Branch.from_dict({"a": torch.zeros(3), ("leaf", "x"): torch.ones(3), "tag": "t"})
    assert type(rebuilt.leaf) is Leaf and torch.equal(rebuilt.leaf.x, torch.ones(3))


def test_from_dict_works_through_an_instance():
    instance = Plain(a=torch.zeros(1), b=torch.zeros(1))
    rebuilt = instance.from_dict({"a": torch.zeros(2), "b": torch.ones(2)})
    assert type(rebuilt) is Plain and torch.equal(rebuilt.b, torch.ones(2))


def test_from_dict_unknown_key_raises_and_changes_nothing():
    source = {"a": torch.zeros(3), "leaf": {"x": torch.ones(3)}, "tag": "t", "zz": torch.zeros(3)}
    before = dict(source)
    with pytest.raises(ValueError, match=r"\{'zz'\}"):
        Branch.from_dict(source)
    assert source == before and source["leaf"] == {"x": before["leaf"]["x"]}


@pytest.mark.parametrize("kwargs, error", [
    ({"batch_size": [3], "batch_dims": 1}, ValueError),
    ({"batch_size": [4]}, RuntimeError),
])
def test_from_dict_bad_batch_arguments(kwargs, error):
    with pytest.raises(error):
        Plain.from_dict({"a": torch.zeros(3), "b": torch.zeros(3)}, **kwargs)


@pytest.mark.parametrize("bad", [[("a", torch.zeros(1))], TensorDict(a=torch.zeros(1))])
def test_from_dict_refuses_what_is_not_a_mapping(bad):
    with pytest.raises(TypeError, match="from_dict"):
        Plain.from_dict(bad)


def test_from_dict_keywords_only():
    with pytest.raises(TypeError):
        Plain.from_dict({"a": torch.zeros(3)}, [3])  # type: ignore[misc]


# ------------------------------------------------------------------------ from_tensordict
def test_from_tensordict_wraps_nested_tensordicts_in_a_copy():
    source = TensorDict(a=torch.zeros(3), leaf=TensorDict(x=torch.ones(3), batch_size=[3]), batch_size=[3])
    before = snapshot(source)
    wrapped = Branch.from_tensordict(source)
    assert type(wrapped.leaf) is Leaf
    assert wrapped.a is source["a"] and wrapped.leaf.x is source["leaf", "x"]  # leaves shared
    assert type(source.get("leaf")) is TensorDict and wrapped._tensordict is not source
    assert_same_snapshot(before, snapshot(source))


def test_from_tensordict_without_nested_fields_wraps_the_same_tensordict():
    source = TensorDict(a=torch.zeros(3), b=torch.ones(3), batch_size=[3])
    assert Plain.from_tensordict(source)._tensordict is source


def test_from_tensordict_keeps_the_lock():
    source = TensorDict(value=torch.zeros(2), child=TensorDict(value=torch.ones(2), batch_size=[2]),
                        batch_size=[2]).lock_()
    wrapped = Node.from_tensordict(source)
    assert wrapped.is_locked and type(wrapped.child) is Node and wrapped.child.is_locked


def test_from_tensordict_recurses_and_keeps_unfitting_entries():
    source = TensorDict(value=torch.zeros(2),
                        child=TensorDict(value=torch.ones(2),
                                         child=TensorDict(value=torch.ones(2), extra=torch.ones(2))))
    wrapped = Node.from_tensordict(source)
    assert type(wrapped.child) is Node and type(wrapped.child.child) is TensorDict
