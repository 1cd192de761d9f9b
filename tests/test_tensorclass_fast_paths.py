"""The one-dim shortcuts of a tensorclass: ``data[i]`` / ``data[a:b]`` and ``Cls(*tensors, batch_size=[n])``.

A tensorclass with a one-dim batch indexes its fields through a per-class unrolled
indexer and builds through a first branch of its generated ``__init__``; each test
states that the result equals indexing (or storing) each field by hand, in every state
the shortcuts must tell apart, and that bad input gets the same error as a TensorDict.
"""
from __future__ import annotations

import pytest
import torch

from torchdict import TensorDict, tensorclass
from torchdict.tensorclass._indexing import _is_generated


@tensorclass
class MyData:
    image: torch.Tensor
    mask: torch.Tensor
    label: torch.Tensor


def make_seed_data(n: int) -> tuple:
    torch.manual_seed(0)
    images = torch.randn(n, 3, 8, 8)
    label = torch.randint(10, (n,))
    mask = torch.zeros(1, 8, 8, dtype=torch.bool).bernoulli_().expand(n, 1, 8, 8)
    return images, mask, label


def _one_dim_variants() -> dict:
    """A one-dim MyData in each state the data[i] shortcut must tell apart."""
    images, mask, label = make_seed_data(6)
    plain = MyData(images, mask, label, batch_size=[6])
    missing = MyData(images, mask, label, batch_size=[6])
    missing.mask = None  # a field that holds nothing
    parameter = MyData(torch.nn.Parameter(images), mask, label, batch_size=[6])  # a tensor subclass
    materialised = MyData(images, mask, label, batch_size=[6])
    materialised._tensordict  # holds a TensorDict rather than the lazy (batch, device)
    reordered = MyData(images, mask, label, batch_size=[6])
    del reordered.image
    reordered.image = images  # the storage order differs from the field order
    return {"plain": plain, "missing": missing, "parameter": parameter, "materialised": materialised,
            "reordered": reordered}


@pytest.mark.parametrize("state", sorted(_one_dim_variants()))
@pytest.mark.parametrize("index", [0, 5, -6, slice(1, 4), slice(None, None, 2), slice(4, 1), slice(-2, None)],
                         ids=repr)
def test_one_dim_int_and_slice_index_equal_indexing_each_field(state, index):
    data = _one_dim_variants()[state]
    result = data[index]
    assert type(result) is MyData
    assert sorted(result.keys()) == sorted(data.keys())
    for name in ("image", "mask", "label"):
        field = getattr(data, name)
        if field is None:
            assert getattr(result, name) is None
        else:
            assert torch.equal(getattr(result, name), field[index])
            assert type(getattr(result, name)) is type(field[index])
    assert result.batch_size == data.label[index].shape and type(result.batch_size) is torch.Size
    assert result._tensordict.batch_size == result.batch_size


def test_one_dim_index_errors_change_nothing():
    data = _one_dim_variants()["plain"]
    before = data.label.clone()
    with pytest.raises(IndexError, match="index 6 is out of bounds for dimension 0 with size 6"):
        data[6]
    with pytest.raises(IndexError, match="index -7 is out of bounds"):
        data[-7]
    with pytest.raises(ValueError, match="step must be greater than zero"):
        data[::-1]
    with pytest.raises(TypeError, match="slice indices must be integers"):
        data[[1]:3]
    assert torch.equal(data.label, before) and data.batch_size == torch.Size([6])


def test_frozen_one_dim_index_result_is_locked():
    @tensorclass(frozen=True)
    class Frozen:
        x: torch.Tensor

    data = Frozen(torch.arange(4.0), batch_size=[4])
    for index in (1, slice(0, 2)):
        result = data[index]
        assert torch.equal(result.x, torch.arange(4.0)[index]) and result.is_locked


@pytest.mark.parametrize("batch_size", [[6], torch.Size([6]), (6,), 6])
def test_construction_spellings_of_a_one_dim_batch_agree(batch_size):
    images, mask, label = make_seed_data(6)
    data = MyData(images, mask, label, batch_size=batch_size)
    assert data.batch_size == torch.Size([6]) and type(data.batch_size) is torch.Size
    assert data.image is images and data.mask is mask and data.label is label


@pytest.mark.parametrize("case", ["short field", "0-d field", "bool size", "zero size", "device", "int field"])
def test_one_dim_list_batch_construction_validates_every_field(case):
    images, mask, label = make_seed_data(6)
    kwargs = {"batch_size": [6]}
    if case == "short field":
        label = label[:5]
    elif case == "0-d field":
        label = torch.tensor(3)
    elif case == "bool size":
        kwargs["batch_size"] = [True]
    elif case == "zero size":
        kwargs["batch_size"] = [0]
    elif case == "device":
        kwargs["device"] = "cpu"
    elif case == "int field":
        label = 7
    try:
        expected = TensorDict({"image": images, "mask": mask, "label": label}, **kwargs)
    except Exception as error:  # the TensorDict refuses it: so must the tensorclass, with the same error
        with pytest.raises(type(error)):
            MyData(images, mask, label, **kwargs)
        return
    data = MyData(images, mask, label, **kwargs)
    assert data.batch_size == expected.batch_size and data.device == expected.device
    for name in ("image", "mask", "label"):
        assert torch.equal(getattr(data, name), expected[name])


def test_each_class_gets_a_generated_getitem_unless_it_writes_its_own():
    assert _is_generated(MyData.__dict__["__getitem__"])

    @tensorclass
    class Own:
        x: torch.Tensor

        def __getitem__(self, index):
            return ("own", index)

    @tensorclass
    class Child(Own):
        y: torch.Tensor

    data = Child(torch.zeros(3), torch.ones(3), batch_size=[3])
    assert Own(torch.zeros(3), batch_size=[3])[1] == ("own", 1)
    assert data[1] == ("own", 1) and data[0:2] == ("own", slice(0, 2))


def test_frozen_by_option_after_the_class_is_built_uses_the_locking_path():
    from torchdict import TensorClass

    class Point(TensorClass):
        x: torch.Tensor

    assert _is_generated(Point.__dict__["__getitem__"])
    frozen = tensorclass(frozen=True)(Point)
    assert "__getitem__" not in frozen.__dict__
    result = frozen(torch.arange(4.0), batch_size=[4])[1:3]
    assert torch.equal(result.x, torch.arange(4.0)[1:3]) and result.is_locked


def test_an_entry_beyond_the_fields_is_indexed_too():
    images, mask, label = make_seed_data(6)
    data = MyData(images, mask, label, batch_size=[6])
    extra = torch.arange(6)
    data._tensordict["extra"] = extra
    for index in (2, slice(1, 5)):
        result = data[index]
        assert torch.equal(result._tensordict["extra"], extra[index])
        assert torch.equal(result.image, images[index]) and result.batch_size == label[index].shape


def test_construction_with_one_batch_dim_stores_like_the_general_path():
    # Cls(*values, batch_size=[n]) has a fast path; whatever it takes must come out as the
    # general path (batch_size given as a torch.Size) makes it, and what it refuses too.
    param = torch.nn.Parameter(torch.zeros(4, 2))
    fast = MyData(param, torch.zeros(4), torch.zeros(4), batch_size=[4])
    general = MyData(param, torch.zeros(4), torch.zeros(4), batch_size=torch.Size([4]))
    assert fast.image is param and general.image is param
    values = ([1.0, 2.0, 3.0, 4.0], TensorDict(a=torch.ones(4, 3), batch_size=[4]), "text")
    fast = MyData(*values, batch_size=[4])
    general = MyData(*values, batch_size=torch.Size([4]))
    assert type(fast.image) is type(general.image) is torch.Tensor and torch.equal(fast.image, general.image)
    assert torch.equal(fast.mask["a"], general.mask["a"]) and fast.label == general.label == "text"
    assert fast.batch_size == general.batch_size == torch.Size([4])
    for batch_size in ([1], torch.Size([1])):  # a 0-d tensor has no first dim to match
        with pytest.raises(RuntimeError, match=r"batch dimension mismatch.*for key 'image'"):
            MyData(torch.tensor(1.0), torch.zeros(1), torch.zeros(1), batch_size=batch_size)
    with pytest.raises(RuntimeError, match=r"batch dimension mismatch.*for key 'label'"):
        MyData(torch.zeros(4), torch.zeros(4), torch.zeros(3), batch_size=[4])
