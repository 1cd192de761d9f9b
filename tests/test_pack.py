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


# ---------------------------------------------------------------------- lazy stacks and tensorclass methods
def lazy(lib, batch, stack_dim):
    members = [build(lib, batch, dtype=torch.float64) * (position + 1) for position in range(3)]
    return lib.lazy_stack(members, stack_dim)


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_lazy_stack_packs_like_upstream_and_like_its_dense_form(batch):
    for stack_dim in range(len(batch) + 1):
        for dim in range(-len(batch) - 2, len(batch) + 2):
            ours, ours_layout = lazy(torchdict, batch, stack_dim).pack(dim)
            theirs, their_layout = lazy(tensordict, batch, stack_dim).pack(dim)
            dense, dense_layout = lazy(torchdict, batch, stack_dim).to_tensordict().pack(dim)
            assert torch.equal(ours, theirs) and torch.equal(ours, dense)
            assert layout_fields(ours_layout) == layout_fields(their_layout) == layout_fields(dense_layout)
            assert ours_layout.cls is None and their_layout.cls is None
            back = ours_layout.unpack(ours)
            assert (back == lazy(torchdict, batch, stack_dim).to_tensordict()).all()
            again, _ = lazy(torchdict, batch, stack_dim).pack(dim, layout=ours_layout)
            assert torch.equal(again, ours)


LAZY_ERRORS = {
    "ragged members": lambda lib: lib.lazy_stack([lib.TensorDict(a=torch.zeros(2)),
                                                  lib.TensorDict(a=torch.zeros(3))]).pack(),
    "exclusive keys": lambda lib: lib.lazy_stack([lib.TensorDict(a=torch.zeros(2)),
                                                  lib.TensorDict(a=torch.zeros(2), b=torch.zeros(2))]).pack(),
    "non-tensor data": lambda lib: lib.lazy_stack([lib.TensorDict(a=torch.zeros(2), s="x"),
                                                   lib.TensorDict(a=torch.zeros(2), s="y")]).pack(),
    "dim out of range": lambda lib: lib.lazy_stack([lib.TensorDict(a=torch.zeros(2))]).pack(3),
}


@pytest.mark.parametrize("case", list(LAZY_ERRORS))
def test_lazy_stack_pack_errors_match_upstream(case):
    outcomes = []
    for lib in (torchdict, tensordict):
        try:
            LAZY_ERRORS[case](lib)
        except Exception as error:  # noqa: BLE001 - the type is what is compared
            outcomes.append(type(error))
        else:
            outcomes.append(None)
    assert outcomes[0] == outcomes[1] and outcomes[0] is not None


@torchdict.tensorclass
class _Ours:
    x: torch.Tensor
    y: torch.Tensor


@tensordict.tensorclass
class _Theirs:
    x: torch.Tensor
    y: torch.Tensor


@torchdict.tensorclass
class _OursOuter:
    inner: _Ours
    z: torch.Tensor


@tensordict.tensorclass
class _TheirsOuter:
    inner: _Theirs
    z: torch.Tensor


@pytest.mark.parametrize("dim", [-2, -1, 0, 1])
def test_tensorclass_pack_method_records_the_class_as_upstream(dim):
    def make(inner_cls, outer_cls):
        inner = inner_cls(x=torch.arange(8.0).view(4, 2), y=torch.ones(4), batch_size=[4])
        return inner, outer_cls(inner=inner, z=torch.zeros(4, 3), batch_size=[4])

    (ours, ours_outer), (theirs, theirs_outer) = make(_Ours, _OursOuter), make(_Theirs, _TheirsOuter)
    for mine, upstream, cls in ((ours, theirs, _Ours), (ours_outer, theirs_outer, _OursOuter)):
        flat, layout = mine.pack(dim)
        their_flat, their_layout = upstream.pack(dim)
        assert torch.equal(flat, their_flat)
        assert layout_fields(layout) == layout_fields(their_layout)
        assert layout.cls is cls and their_layout.cls.__name__ == cls.__name__.replace("Ours", "Theirs")
        assert [entry[2] for entry in layout.nested] == ([_Ours] if cls is _OursOuter else [])
        back = layout.unpack(flat)
        assert type(back) is cls
        if cls is _OursOuter:
            assert type(back.inner) is _Ours and torch.equal(back.inner.x, ours.x)
        again, _ = mine.pack(dim, layout=layout)
        assert torch.equal(again, flat)
