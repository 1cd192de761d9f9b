"""``td.pack()`` and ``PackLayout``, against upstream tensordict 0.15 and plain torch."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdict
from torchdict import PackLayout, TensorDict

tensordict = pytest.importorskip("tensordict")


def build(lib, batch, dtype=torch.float32):
    numel = torch.Size(batch).numel()
    return lib.TensorDict(
        p=torch.arange(numel, dtype=dtype).view(batch),
        v=torch.arange(numel * 3, dtype=dtype).view(*batch, 3),
        nested={"stress": torch.arange(numel * 4, dtype=dtype).view(*batch, 2, 2),
                "inner": lib.TensorDict(q=torch.ones(*batch, 2, 1, dtype=dtype), batch_size=[*batch, 2])},
        batch_size=batch,
    )


def layout_fields(layout) -> tuple:
    return (layout.keys, layout.shapes, layout.dim, tuple((k, s) for k, s, _ in layout.nested), layout.offsets,
            layout.numel)


@settings(max_examples=25)
@given(batch=st.lists(st.integers(0, 3), min_size=0, max_size=3), data=st.data())
def test_pack_matches_upstream(batch, data):
    dim = data.draw(st.integers(-len(batch) - 1, len(batch)))
    ours, ours_layout = build(torchdict, batch).pack(dim)
    theirs, their_layout = build(tensordict, batch).pack(dim)
    assert torch.equal(ours, theirs) and ours.is_contiguous()
    assert layout_fields(ours_layout) == layout_fields(their_layout)
    back = ours_layout.unpack(ours)
    for key in build(torchdict, batch).keys(True, True):
        assert torch.equal(back[key], build(torchdict, batch)[key])


def test_pack_is_a_concatenation_of_flattened_leaves():
    td = build(torchdict, (4,))
    flat, layout = td.pack()
    expected = torch.cat([td[key].reshape(4, -1) for key in layout.keys], -1)
    assert torch.equal(flat, expected)


def test_unpack_gives_views_and_follows_the_batch_of_the_tensor():
    td = build(torchdict, (5,))
    flat, layout = td.pack()
    out = layout.unpack(flat.index_select(0, torch.tensor([0, 2])))
    assert out.batch_size == (2,) and out["nested", "inner"].batch_size == (2, 2)
    full = layout.unpack(flat)
    assert all(full[key].untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for key in layout.keys)


def test_packing_into_a_layout_follows_its_order():
    td = build(torchdict, (3,))
    flat, layout = td.pack()
    reordered = PackLayout(keys=tuple(reversed(layout.keys)), shapes=tuple(reversed(layout.shapes)))
    repacked, same = td.pack(layout=reordered)
    assert same.keys == reordered.keys
    assert torch.equal(reordered.unpack(repacked)["v"], td["v"])


def test_layout_is_frozen_hashable_and_compared_by_value():
    layout = PackLayout(keys=("a",), shapes=([2, 3],))
    assert layout == PackLayout(keys=("a",), shapes=(torch.Size([2, 3]),)) and hash(layout) == hash(
        PackLayout(keys=("a",), shapes=((2, 3),)))
    assert layout.numel == 6 and layout.offsets == (0,)
    with pytest.raises(Exception):
        layout.dim = 0


def test_tensorclass_pack_unpacks_to_the_class():
    @torchdict.tensorclass
    class Point:
        x: torch.Tensor
        y: torch.Tensor

    from torchdict.formats.pack import pack

    point = Point(x=torch.zeros(4, 2), y=torch.ones(4), batch_size=[4])
    flat, layout = pack(point)
    assert layout.cls is Point and flat.shape == (4, 3)
    back = layout.unpack(flat)
    assert type(back) is Point and torch.equal(back.y, point.y)


ERRORS = {
    "dim out of range": lambda lib: build(lib, (2,)).pack(3),
    "mixed dtypes": lambda lib: lib.TensorDict(a=torch.zeros(2), b=torch.zeros(2, dtype=torch.int64),
                                               batch_size=[2]).pack(),
    "non-tensor data": lambda lib: lib.TensorDict(a=torch.zeros(2), s="x", batch_size=[2]).pack(),
    "layout of other keys": lambda lib: build(lib, (2,)).pack(layout=lib.PackLayout(keys=("z",), shapes=((1,),))),
    "layout of another dim": lambda lib: build(lib, (2,)).pack(0, layout=build(lib, (2,)).pack()[1]),
    "unpack a wrong width": lambda lib: build(lib, (2,)).pack()[1].unpack(torch.zeros(2, 3)),
    "unpack a dim out of range": lambda lib: lib.PackLayout(keys=(), shapes=(), dim=-3).unpack(torch.zeros(2, 0)),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_match_upstream(case):
    outcomes = []
    for lib in (torchdict, tensordict):
        try:
            ERRORS[case](lib)
        except Exception as error:  # noqa: BLE001 - the type is what is compared
            outcomes.append(type(error))
        else:
            outcomes.append(None)
    assert outcomes[0] == outcomes[1] and outcomes[0] is not None
