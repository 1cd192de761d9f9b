"""@tensorclass and TensorClass: fields, construction, errors, and every op keeping the class.

Behaviour is stated against plain torch: an op on a tensorclass equals the same op on
each field. Ops provided by other modules that are not there yet are skipped with the
missing method named (see ``needs``).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle
from typing import Any, ClassVar, Optional

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchdict import TensorClass, TensorDict, is_tensor_collection, is_tensorclass, tensorclass
from torchdict.prototype import tensorclass as prototype_tensorclass


def needs(*methods: str) -> Any:
    """Skip while TensorDict lacks one of ``methods`` (implemented by another module)."""
    missing = [name for name in methods if not hasattr(TensorDict, name)]
    return pytest.mark.skipif(bool(missing), reason=f"TensorDict has no {missing} yet")


# Module-level classes (pickling finds classes by name).
@tensorclass
class MyData:
    image: torch.Tensor
    mask: torch.Tensor
    label: torch.Tensor

    def mask_image(self) -> torch.Tensor:
        return self.image[self.mask.expand_as(self.image)].view(*self.batch_size, -1)

    def select_label(self, label: int) -> "MyData":
        return self[self.label == label]


@tensorclass
class Inner:
    x: torch.Tensor


@tensorclass
class Outer:
    value: torch.Tensor
    inner: Inner
    tag: str = "none"
    count: int = 3
    extra: Optional[torch.Tensor] = None


class Typed(TensorClass):
    obs: torch.Tensor
    name: str = "typed"


def make_seed_data(n: int = 100) -> tuple:
    torch.manual_seed(0)
    images = torch.randn(n, 3, 8, 8)
    label = torch.randint(10, (n,))
    mask = torch.zeros(1, 8, 8, dtype=torch.bool).bernoulli_().expand(n, 1, 8, 8)
    return images, mask, label


def make_outer(n: int = 4) -> Outer:
    inner = Inner(torch.arange(n * 2.0).view(n, 2), batch_size=[n])
    return Outer(torch.arange(float(n)), inner, tag="t", batch_size=[n])


# ------------------------------------------------------------------------ the seed's example
def test_seed_example_import_paths_are_the_same_decorator():
    assert prototype_tensorclass is tensorclass
    assert is_tensorclass(MyData)


def test_seed_example_fields_are_the_given_tensors():
    images, mask, label = make_seed_data()
    data = MyData(images, mask, label=label, batch_size=[100])
    assert data.image is images and data.mask is mask and data.label is label
    assert data.batch_size == torch.Size([100])


def test_seed_select_label_equals_masking_each_field():
    images, mask, label = make_seed_data()
    data = MyData(images, mask, label=label, batch_size=[100])
    selected = data.select_label(1)
    keep = label == 1
    assert type(selected) is MyData
    assert selected.batch_size == torch.Size([int(keep.sum())])
    assert torch.equal(selected.image, images[keep])
    assert torch.equal(selected.mask, mask[keep])
    assert torch.equal(selected.label, label[keep])


def test_seed_mask_image_shape():
    images, mask, label = make_seed_data()
    data = MyData(images, mask, label=label, batch_size=[100])
    expected = images[mask.expand_as(images)].view(100, -1)
    assert torch.equal(data.mask_image(), expected)


def test_seed_reshape_reshapes_every_field():
    images, mask, label = make_seed_data()
    data = MyData(images, mask, label=label, batch_size=[100])
    reshaped = data.reshape(10, 10)
    assert type(reshaped) is MyData
    assert reshaped.batch_size == torch.Size([10, 10])
    assert torch.equal(reshaped.image, images.reshape(10, 10, 3, 8, 8))
    assert torch.equal(reshaped.label, label.reshape(10, 10))


def test_seed_print_format():
    data = MyData(torch.zeros(4, 3), torch.zeros(4, 1, dtype=torch.bool), torch.zeros(4, dtype=torch.int64),
                  batch_size=[4])
    assert repr(data) == (
        "MyData(\n"
        "    image=Tensor(shape=torch.Size([4, 3]), device=cpu, dtype=torch.float32, is_shared=False),\n"
        "    label=Tensor(shape=torch.Size([4]), device=cpu, dtype=torch.int64, is_shared=False),\n"
        "    mask=Tensor(shape=torch.Size([4, 1]), device=cpu, dtype=torch.bool, is_shared=False),\n"
        "    batch_size=torch.Size([4]),\n"
        "    device=None,\n"
        "    is_shared=False)"
    )


def test_print_nested_non_tensor_and_missing_fields():
    outer = Outer(torch.zeros(2), Inner(torch.zeros(2, 1), batch_size=[2]), batch_size=[2])
    text = repr(outer)
    assert text.startswith("Outer(\n    count=NonTensorData(data=3, batch_size=torch.Size([2]), device=None),\n")
    assert "    inner=Inner(\n        x=Tensor(shape=torch.Size([2, 1])" in text
    assert "        batch_size=torch.Size([2]),\n        device=None,\n        is_shared=False),\n" in text
    assert text.endswith("    extra=None,\n    batch_size=torch.Size([2]),\n    device=None,\n    is_shared=False)")


def test_a_tensordict_prints_a_tensorclass_entry_indented():
    td = TensorDict(sub=Inner(torch.zeros(2), batch_size=[2]), batch_size=[2])
    assert "        sub: Inner(\n            x=Tensor(shape=torch.Size([2])" in repr(td)


# ------------------------------------------------------------------------ construction
def test_positional_and_keyword_fields_and_defaults():
    a = Outer(torch.zeros(3), Inner(torch.ones(3), batch_size=[3]), batch_size=[3])
    b = Outer(value=torch.zeros(3), inner=Inner(x=torch.ones(3), batch_size=[3]), batch_size=[3])
    for data in (a, b):
        assert torch.equal(data.value, torch.zeros(3))
        assert torch.equal(data.inner.x, torch.ones(3))
        assert data.tag == "none" and data.count == 3 and data.extra is None


def test_batch_size_defaults_to_empty_and_accepts_int_and_size():
    assert Inner(torch.zeros(2)).batch_size == torch.Size([])
    assert Inner(torch.zeros(2), batch_size=2).batch_size == torch.Size([2])
    assert Inner(torch.zeros(2), batch_size=torch.Size([2])).batch_size == torch.Size([2])


def test_batch_size_is_a_torch_size_and_is_checked_exactly():
    data = Inner(torch.zeros(2), batch_size=[2])
    assert type(data.batch_size) is torch.Size and data.shape == torch.Size([2])
    assert type(data[0].batch_size) is torch.Size
    assert Inner(torch.zeros(0, 3), batch_size=[0]).batch_size == torch.Size([0])
    for value, batch_size in [(torch.tensor(1.0), [0]), (torch.tensor(1.0), [1]), (torch.zeros(2, 3), [2, 2])]:
        with pytest.raises(RuntimeError, match="batch dimension mismatch"):
            Inner(value, batch_size=batch_size)
    with pytest.raises(RuntimeError, match="non-negative"):
        Inner(torch.zeros(2), batch_size=[-1])


def test_tensor_subclasses_are_stored_as_they_are():
    parameter = torch.nn.Parameter(torch.zeros(3))
    assert Inner(parameter, batch_size=[3]).x is parameter
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        Inner(parameter, batch_size=[2])


def test_classvar_is_not_a_field():
    @tensorclass
    class WithConstant:
        x: torch.Tensor
        scale: ClassVar[float] = 2.0

    assert WithConstant._tc_field_names == ("x",)
    assert WithConstant(torch.ones(1)).scale == 2.0


def test_device_and_names():
    data = Inner(torch.zeros(2, 3), batch_size=[2, 3], device="cpu", names=["a", "b"])
    assert data.device == torch.device("cpu")
    assert data.x.device == torch.device("cpu")
    assert data.names == ["a", "b"]


def test_missing_field_is_a_type_error_like_a_dataclass():
    with pytest.raises(TypeError, match=r"MyData.__init__\(\) missing 1 required positional argument: 'label'"):
        MyData(torch.zeros(2), torch.zeros(2))
    with pytest.raises(TypeError, match="missing 2 required positional arguments: 'mask' and 'label'"):
        MyData(torch.zeros(2))


def test_unknown_keyword_is_an_attribute_error_listing_the_fields():
    message = "Cannot set the attribute 'zzz': MyData has no such field. Its fields are ['image', 'label', 'mask']."
    with pytest.raises(AttributeError) as info:
        MyData(torch.zeros(2), torch.zeros(2), torch.zeros(2), zzz=1)
    assert str(info.value) == message


def test_wrong_batch_is_the_batch_error():
    with pytest.raises(RuntimeError, match=r"batch dimension mismatch.*for key 'x'"):
        Inner(torch.zeros(3), batch_size=[2])


def test_non_default_after_default_is_rejected_at_class_creation():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @tensorclass
        class Bad:
            a: torch.Tensor = None
            b: torch.Tensor


def test_kw_only_fields():
    @tensorclass(kw_only=True)
    class KW:
        a: torch.Tensor = None
        b: torch.Tensor

    with pytest.raises(TypeError):
        KW(torch.zeros(1))
    assert torch.equal(KW(b=torch.ones(1)).b, torch.ones(1))


def test_default_factory_runs_per_instance():
    @tensorclass
    class WithList:
        entries: list = dataclasses.field(default_factory=list)

    first, second = WithList(), WithList()
    first.entries.append(1)
    assert second.entries == []


def test_post_init_runs_after_the_fields_are_set():
    @tensorclass
    class Normalised:
        x: torch.Tensor

        def __post_init__(self):
            self.x = self.x / self.x.sum()

    assert torch.allclose(Normalised(torch.tensor([1.0, 3.0])).x, torch.tensor([0.25, 0.75]))


def test_hand_written_init_runs_on_an_empty_instance():
    @tensorclass
    class Custom:
        x: torch.Tensor

        def __init__(self, n):
            self.x = torch.arange(n)

    data = Custom(3, batch_size=[3])
    assert data.batch_size == torch.Size([3]) and torch.equal(data.x, torch.arange(3))


def test_zero_argument_super_works_in_a_decorated_class():
    class Base:
        def describe(self):
            return "base"

    @tensorclass
    class Child(Base):
        x: torch.Tensor

        def describe(self):
            return "child of " + super().describe()

    assert Child(torch.zeros(1)).describe() == "child of base"


def test_tensorclass_base_class_and_options():
    class NoCast(TensorClass["nocast"]):
        n: int

    class Sub(NoCast):
        m: int = 5

    assert type(NoCast(n=3).n) is int
    sub = Sub(1)
    assert type(sub.n) is int and sub.m == 5
    assert Sub._tc_field_names == ("n", "m")
    assert is_tensorclass(Sub) and is_tensorclass(sub)


def test_class_keyword_options():
    class Frozen(TensorClass, frozen=True):
        x: torch.Tensor

    with pytest.raises(dataclasses.FrozenInstanceError):
        Frozen(torch.zeros(1)).x = torch.ones(1)


def test_unknown_option_is_rejected():
    with pytest.raises(ValueError, match="Unknown tensorclass option 'sparkly'"):
        TensorClass["sparkly"]


# ------------------------------------------------------------------------ fields
def test_setting_a_field_validates_the_batch_and_keeps_the_old_value():
    data = make_outer()
    before = data.value
    with pytest.raises(RuntimeError, match=r"batch dimension mismatch.*for key 'value'"):
        data.value = torch.zeros(5)
    assert data.value is before


def test_setting_a_field_to_none_removes_it():
    data = make_outer()
    data.extra = torch.ones(4)
    assert torch.equal(data.extra, torch.ones(4))
    data.extra = None
    assert data.extra is None and "extra" not in data.keys()


def test_unknown_attribute_is_refused_and_nothing_changes():
    data = make_outer()
    keys_before = list(data.keys())
    for name in ("zzz", "_private"):
        with pytest.raises(AttributeError, match=f"Cannot set the attribute '{name}': Outer has no such field. "
                                                 r"Its fields are \['count', 'extra', 'inner', 'tag', 'value'\]"):
            setattr(data, name, 1)
    assert list(data.keys()) == keys_before


def test_reading_an_unknown_attribute_names_the_class():
    with pytest.raises(AttributeError, match="'Outer' object has no attribute 'nope'"):
        make_outer().nope


def test_string_index_is_a_value_error():
    data = make_outer()
    message = ("Invalid indexing arguments: 'value'. A tensorclass is indexed along its batch dimensions; "
               "to read a field, use the attribute or get('value').")
    with pytest.raises(ValueError) as info:
        data["value"]
    assert str(info.value) == message
    with pytest.raises(ValueError, match="Invalid indexing arguments"):
        data["value"] = torch.zeros(4)


def test_get_keys_set_and_update():
    data = make_outer()
    assert data.get("tag") == "t"
    assert data.get("missing", "default") == "default"
    assert torch.equal(data.get(("inner", "x")), data.inner.x)
    assert set(data.keys()) == {"value", "inner", "tag", "count"}
    data.set("value", torch.ones(4))
    assert torch.equal(data.value, torch.ones(4))
    data.update({"value": torch.full((4,), 2.0)})
    assert torch.equal(data.value, torch.full((4,), 2.0))
    with pytest.raises(AttributeError, match="Cannot set the attribute 'zz'"):
        data.set("zz", 1)
    with pytest.raises(ValueError, match=r"Keys from the tensordict \(\{'zz'\}\)"):
        data.update({"zz": torch.zeros(4)})
    assert "zz" not in data.keys()


def test_delete_a_field():
    data = make_outer()
    del data.value
    assert data.value is None
    with pytest.raises(AttributeError, match="no such field"):
        del data.nothing


def test_locked_tensorclass_refuses_field_writes():
    data = make_outer()
    data.lock_()
    assert data.is_locked
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        data.value = torch.ones(4)
    assert torch.equal(data.value, torch.arange(4.0))


def test_frozen_forbids_assignment_and_locks_content():
    @tensorclass(frozen=True)
    class Frozen:
        x: torch.Tensor

    data = Frozen(torch.zeros(2), batch_size=[2])
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'x'"):
        data.x = torch.ones(2)
    assert data.is_locked
    assert data[0].is_locked


def test_reserved_field_names_need_shadow():
    with pytest.raises(AttributeError, match="Attribute name to can't be used with @tensorclass"):
        @tensorclass
        class Bad:
            to: torch.Tensor

    @tensorclass(shadow=True)
    class Shadowing:
        to: torch.Tensor

    assert torch.equal(Shadowing(to=torch.ones(1)).to, torch.ones(1))
    with pytest.raises(AttributeError, match="batch_size can't be used"):
        @tensorclass(shadow=True)
        class Never:
            batch_size: torch.Tensor


def test_unhashable_like_a_tensordict_result_of_eq():
    with pytest.raises(TypeError, match="unhashable"):
        hash(make_outer())


# ------------------------------------------------------------------------ non-tensor fields and casting
def test_non_tensor_defaults_are_raw_python_values():
    data = make_outer()
    assert data.tag == "t" and type(data.count) is int and data.count == 3
    assert data[0].tag == "t" and data[1:3].count == 3


def test_default_mode_casting():
    @tensorclass
    class Anything:
        t: torch.Tensor = None
        i: int = None
        a: Any = None

    assert torch.equal(Anything(t=[1, 2]).t, torch.tensor([1, 2]))
    assert torch.equal(Anything(i=3).i, torch.tensor(3))
    assert Anything(a="x").a == "x"
    assert Anything(a={"k": 1}).a == {"k": 1}  # a dict stays a dict
    assert Anything(a=(1, 2)).a == (1, 2)


def test_a_string_in_a_tensor_field_reads_back_raw():
    data = Inner("not a tensor")
    assert data.x == "not a tensor"
    assert Inner(torch.zeros(1)).x.shape == torch.Size([1])


def test_nocast_keeps_python_numbers():
    @tensorclass(nocast=True)
    class Raw:
        n: Any = None
        t: torch.Tensor = None

    data = Raw(n=3, t=2.5)
    assert type(data.n) is int and data.n == 3
    assert type(data.t) is float
    assert torch.equal(Raw(n=[1, 2]).n, torch.tensor([1, 2]))


def test_autocast_casts_to_the_annotations():
    @tensorclass(autocast=True)
    class Cast:
        t: torch.Tensor = None
        i: int = None
        s: str = None
        inner: Inner = None
        td: TensorDict = None

    data = Cast(t=[1, 2], i=torch.tensor(3), s=5, inner={"x": torch.zeros(2)}, td={"a": torch.zeros(2)},
                batch_size=[2])
    assert torch.equal(data.t, torch.tensor([1, 2]))
    assert type(data.i) is int and data.i == 3
    assert data.s == "5"
    assert type(data.inner) is Inner and data.inner.batch_size == torch.Size([2])
    assert type(data.td) is TensorDict
    with pytest.raises(TypeError, match="Failed to cast the value t to the type annotation"):
        Cast(t="text")


def test_a_dict_for_a_tensorclass_field_stays_a_dict_without_autocast():
    data = Outer(torch.zeros(2), {"x": torch.zeros(2)}, batch_size=[2])
    assert type(data.inner) is dict


# ------------------------------------------------------------------------ nesting
def test_nested_tensorclass_and_tensordict_fields():
    @tensorclass
    class Holder:
        inner: Inner
        td: TensorDict

    holder = Holder(Inner(torch.arange(6.0).view(3, 2), batch_size=[3, 2]),
                    TensorDict(a=torch.zeros(3, 5), batch_size=[3]), batch_size=[3])
    item = holder[1]
    assert type(item) is Holder and type(item.inner) is Inner and type(item.td) is TensorDict
    assert item.inner.batch_size == torch.Size([2])
    assert torch.equal(item.inner.x, torch.arange(6.0).view(3, 2)[1])
    assert torch.equal(item.td["a"], torch.zeros(5))


def test_tensordict_holding_a_tensorclass():
    td = TensorDict(data=make_outer(), batch_size=[4])
    assert type(td["data"]) is Outer
    assert type(td[1:3]["data"]) is Outer
    assert torch.equal(td[1:3]["data"].value, torch.arange(4.0)[1:3])


# ------------------------------------------------------------------------ ops keep the class
INDICES = [0, slice(1, 3), torch.tensor([0, 2]), torch.tensor([True, False, True, True]), (Ellipsis,), None]


@pytest.mark.parametrize("index", INDICES, ids=lambda index: repr(index))
def test_indexing_equals_indexing_each_field(index):
    data = make_outer()
    result = data[index]
    assert type(result) is Outer and type(result.inner) is Inner
    assert torch.equal(result.value, data.value[index])
    assert torch.equal(result.inner.x, data.inner.x[index])
    assert result.tag == "t"


@pytest.mark.parametrize("index", [1, -1, slice(1, 3), slice(None, None, 2), slice(3, 1)], ids=repr)
@pytest.mark.parametrize("materialised", [False, True])
def test_int_and_slice_index_match_torch_on_a_multi_dim_batch(index, materialised):
    # int and slice take a shortcut (no TensorDict built): same answer as torch, and the
    # result behaves like any instance (batch size, names, TensorDict view of its fields).
    x = torch.arange(24.0).view(4, 3, 2)
    data = Inner(x, batch_size=[4, 3])
    if materialised:
        data._tensordict  # the instance now holds a TensorDict rather than the lazy (batch, device)
    result = data[index]
    assert type(result) is Inner
    assert torch.equal(result.x, x[index])
    assert result.batch_size == x[index].shape[:-1] and type(result.batch_size) is torch.Size
    assert result._tensordict.batch_size == result.batch_size
    assert result._tensordict["x"] is result.x
    assert result.names == [None] * result.batch_dims and not result.is_locked


def test_int_and_slice_index_keep_names_and_errors():
    data = Inner(torch.zeros(4, 3), batch_size=[4, 3], names=["n", "m"])
    assert data[0].names == ["m"] and data[1:3].names == ["n", "m"]
    scalar = Inner(torch.zeros(()))
    before = scalar.x.clone()
    with pytest.raises(RuntimeError, match="batch_dims==0"):
        scalar[0]
    with pytest.raises(RuntimeError, match="batch_dims==0"):
        scalar[:1]
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
        data[4]
    with pytest.raises(ValueError, match="step must be greater than zero"):
        data[::-1]
    assert torch.equal(scalar.x, before) and data.batch_size == torch.Size([4, 3])


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_indexing_matches_fields_property(draw):
    shape = draw.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    data = Inner(torch.randn(*shape, 2), batch_size=shape)
    def one_dim(size: int) -> Any:
        position = st.integers(-size, size - 1)
        return st.one_of(position, st.builds(slice, st.integers(0, size), st.integers(0, size), st.integers(1, 2)))

    dim_index = tuple(draw.draw(one_dim(size)) for size in shape)
    assert torch.equal(data[dim_index].x, data.x[dim_index])


def test_setitem_writes_into_the_fields():
    data = make_outer()
    data[1:3] = Outer(torch.full((2,), 9.0), Inner(torch.zeros(2, 2), batch_size=[2]), tag="t", batch_size=[2])
    assert data.value.tolist() == [0.0, 9.0, 9.0, 3.0]
    assert data.inner.x[1:3].eq(0).all()


def test_shape_ops_keep_the_class():
    data = make_outer(6)
    assert type(data.reshape(2, 3)) is Outer
    assert torch.equal(data.reshape(2, 3).value, data.value.reshape(2, 3))
    assert torch.equal(data.reshape(2, 3).inner.x, data.inner.x.reshape(2, 3, 2))
    assert type(data.unsqueeze(0)) is Outer and data.unsqueeze(0).batch_size == torch.Size([1, 6])
    parts = data.unbind(0)
    assert len(parts) == 6 and all(type(part) is Outer for part in parts)
    assert torch.equal(parts[2].value, data.value[2])
    assert [type(item) for item in data] == [Outer] * 6
    assert len(data) == 6


def test_stack_and_cat_keep_the_class():
    first, second = make_outer(), make_outer()
    second.value = second.value + 10
    stacked = torch.stack([first, second], 0)
    assert type(stacked) is Outer and type(stacked.inner) is Inner
    assert torch.equal(stacked.value, torch.stack([first.value, second.value]))
    assert torch.equal(stacked.inner.x, torch.stack([first.inner.x, second.inner.x]))
    assert stacked[1, 2].tag == "t"
    joined = torch.cat([first, second], 0)
    assert type(joined) is Outer and joined.batch_size == torch.Size([8])
    assert torch.equal(joined.value, torch.cat([first.value, second.value]))


def test_apply_select_exclude_keep_the_class():
    data = make_outer()
    doubled = data.apply(lambda tensor: tensor * 2)
    assert type(doubled) is Outer and torch.equal(doubled.value, data.value * 2)
    assert torch.equal(doubled.inner.x, data.inner.x * 2) and doubled.tag == "t"
    selected = data.select("value")
    assert type(selected) is Outer and selected.inner is None and torch.equal(selected.value, data.value)
    excluded = data.exclude("value")
    assert type(excluded) is Outer and excluded.value is None


@needs("clone")
def test_clone_copies_and_keeps_the_class():
    data = make_outer()
    cloned = data.clone()
    assert type(cloned) is Outer and torch.equal(cloned.value, data.value)
    cloned.value.add_(1)
    assert torch.equal(data.value, torch.arange(4.0))


@needs("to")
def test_to_keeps_the_class():
    data = make_outer()
    moved = data.to(torch.float64)
    assert type(moved) is Outer and moved.value.dtype == torch.float64
    assert type(data.to("cpu")) is Outer


@needs("__add__")
def test_arithmetic_keeps_the_class():
    data = make_outer()
    result = data + 1
    assert type(result) is Outer and torch.equal(result.value, data.value + 1)
    assert torch.equal(result.inner.x, data.inner.x + 1)
    result = data * data
    assert torch.equal(result.value, data.value * data.value)


@needs("__eq__")
def test_comparison_keeps_the_class():
    data = make_outer()
    other = make_outer()
    other.value = torch.tensor([0.0, 9.0, 2.0, 9.0])
    equal = data == other
    assert type(equal) is Outer
    assert equal.value.tolist() == [True, False, True, False]
    assert equal.inner.x.all()


@needs("__iadd__")
def test_inplace_arithmetic_returns_the_same_object():
    data = make_outer()
    value = data.value
    same = data
    same += 1
    assert same is data and data.value is value and data.value.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_to_tensordict_and_from_tensordict():
    data = make_outer()
    if hasattr(TensorDict, "clone"):
        td = data.to_tensordict()
        assert type(td) is TensorDict and set(td.keys()) == set(data.keys())
        td["value"].add_(100)
        assert torch.equal(data.value, torch.arange(4.0))
    source = TensorDict(value=torch.zeros(4), batch_size=[4])
    wrapped = Outer.from_tensordict(source)
    assert type(wrapped) is Outer and wrapped.value is source["value"] and wrapped.inner is None
    with pytest.raises(ValueError, match=r"Keys from the tensordict \(\{'zz'\}\)"):
        Outer.from_tensordict(TensorDict(zz=torch.zeros(4), batch_size=[4]))


def test_type_checks():
    data = make_outer()
    assert is_tensorclass(Outer) and is_tensorclass(data)
    assert not is_tensorclass(TensorDict) and not is_tensorclass(TensorDict())
    assert not is_tensorclass(TensorClass) and not is_tensorclass(torch.zeros(1))
    assert not isinstance(data, TensorDict)
    assert is_tensor_collection(data)


# ------------------------------------------------------------------------ persistence, pickling
def test_pickle_round_trip():
    data = make_outer()
    loaded = pickle.loads(pickle.dumps(data))
    assert type(loaded) is Outer and type(loaded.inner) is Inner
    assert torch.equal(loaded.value, data.value) and torch.equal(loaded.inner.x, data.inner.x)
    assert loaded.tag == "t" and loaded.count == 3 and loaded.extra is None


def test_pickle_keeps_frozen_and_locked_state():
    data = make_outer()
    data.lock_()
    loaded = pickle.loads(pickle.dumps(data))
    assert loaded.is_locked
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        loaded.value = torch.ones(4)


def test_copy_and_deepcopy():
    data = make_outer()
    shallow = copy.copy(data)
    assert type(shallow) is Outer and shallow.value is data.value
    shallow.value = torch.zeros(4)
    assert torch.equal(data.value, torch.arange(4.0))
    deep = copy.deepcopy(data)
    assert type(deep) is Outer and deep.value is not data.value and torch.equal(deep.value, data.value)


def test_memmap_round_trip_records_the_class(tmp_path):
    data = make_outer()
    saved = data.memmap(tmp_path / "saved")
    assert type(saved) is Outer and saved.is_locked
    loaded = TensorDict.load_memmap(tmp_path / "saved")
    assert type(loaded) is Outer and type(loaded.inner) is Inner
    assert torch.equal(loaded.value, data.value) and torch.equal(loaded.inner.x, data.inner.x)
    assert loaded.tag == "t" and loaded.count == 3
    assert type(Outer.load_memmap(tmp_path / "saved")) is Outer


def test_memmap_in_place_keeps_the_object(tmp_path):
    data = make_outer()
    assert data.memmap_(tmp_path / "inplace") is data
    assert type(data.value).__name__ == "MemoryMappedTensor"
    assert torch.equal(Outer.load_memmap(tmp_path / "inplace").value, torch.arange(4.0))


def test_loading_an_unknown_class_imports_nothing(tmp_path):
    make_outer().memmap(tmp_path / "saved")
    meta_path = tmp_path / "saved" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["class"] = "module_that_must_not_be_imported:Outer"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(RuntimeError, match="never imports modules"):
        TensorDict.load_memmap(tmp_path / "saved")
    assert "module_that_must_not_be_imported" not in os.sys.modules


# ------------------------------------------------------------------------ pytree and vmap
def test_pytree_tree_map_keeps_the_class():
    from torch.utils._pytree import tree_flatten, tree_map

    data = make_outer()
    leaves, _ = tree_flatten(data)
    assert len(leaves) == 2
    mapped = tree_map(lambda tensor: tensor + 1, data)
    assert type(mapped) is Outer and torch.equal(mapped.value, data.value + 1) and mapped.tag == "t"


def test_vmap_over_a_tensorclass():
    data = Outer(torch.arange(4.0), Inner(torch.arange(8.0).view(4, 2), batch_size=[4]), batch_size=[4])

    def total(item: Outer) -> torch.Tensor:
        assert item.batch_size == torch.Size([])
        return item.value + item.inner.x.sum()

    expected = data.value + data.inner.x.sum(-1)
    assert torch.equal(torch.vmap(total)(data), expected)

    def scaled(item: Outer) -> Outer:
        return item.apply(lambda tensor: tensor * 2)

    result = torch.vmap(scaled)(data)
    assert type(result) is Outer and result.batch_size == torch.Size([4])
    assert torch.equal(result.inner.x, data.inner.x * 2)


def test_docstring_examples_run():
    import doctest
    import sys

    module = sys.modules["torchdict.tensorclass"]  # ``torchdict.tensorclass`` is also the decorator's name
    failures, attempted = doctest.testmod(module, extraglobs={"torch": torch, "TensorDict": TensorDict})
    assert attempted > 5 and failures == 0


def test_autocast_keeps_a_declared_default_of_a_python_type():
    from torchdict import TensorClass

    class WithDefault(TensorClass, autocast=True):
        x: torch.Tensor
        n: int = 3

    data = WithDefault([1.0])
    assert data.n == 3 and isinstance(data.n, int)
    assert torch.equal(data.x, torch.tensor([1.0]))
    assert WithDefault([1.0], n=torch.tensor(4)).n == 4
