"""A lazy stack whose members hold a tensorclass under one key (issue 21), checked against upstream.

``lazy.get("p")`` gives an instance of the members' class, as upstream (whose instance wraps a lazy stack;
torchdict's holds the stacked fields: a copy, see docs/compat.md). What builds on it (indexing, stacking
members, the dense forms, memmap / pack_memmap / to_h5 / to_zarr / to_struct_array) gives what upstream
gives. Members of different classes give a lazy stack, as upstream.
"""
from __future__ import annotations

import warnings
from typing import Optional

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdict

from _format_helpers import assert_same

upstream = pytest.importorskip("tensordict")


@pytest.fixture(autouse=True)
def _quiet_upstream_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def declare(lib):
    @lib.tensorclass
    class Inner:
        a: torch.Tensor

    @lib.tensorclass
    class Particle:
        x: torch.Tensor
        inner: Optional[Inner] = None
        tag: str = "p"
        missing: Optional[torch.Tensor] = None

    @lib.tensorclass
    class Other:
        x: torch.Tensor

    return {"Inner": Inner, "Particle": Particle, "Other": Other}


CLASSES = {"tensordict": declare(upstream), "torchdict": declare(torchdict)}


def members(lib, batch: tuple, count: int = 3, widths: Optional[list] = None):
    """``count`` TensorDicts of batch ``batch``, each holding a Particle at ``"p"`` and a tensor at ``"y"``."""
    classes = CLASSES[lib.__name__]
    out = []
    for i in range(count):
        width = widths[i] if widths else 2
        x = torch.arange(i * 100, i * 100 + torch.Size(batch).numel() * width, dtype=torch.float32)
        inner = classes["Inner"](a=torch.full((*batch, 4), float(i)), batch_size=batch)
        particle = classes["Particle"](x=x.reshape(*batch, width), inner=inner, tag=f"t{i}", batch_size=batch)
        out.append(lib.TensorDict(p=particle, y=torch.full(batch, float(i)), batch_size=batch))
    return out


def stacks(batch: tuple, stack_dim: int, **kwargs):
    return tuple(lib.LazyStackedTensorDict(*members(lib, batch, **kwargs), stack_dim=stack_dim)
                 for lib in (upstream, torchdict))


def as_lists(value):
    """Nested sequences (upstream's non-tensor stacks give list subclasses) as plain lists."""
    if isinstance(value, (list, tuple)):
        return [as_lists(item) for item in value]
    return value


def assert_same_particle(up, ours):
    """The same class, batch size and fields; upstream's instance over a lazy stack vs torchdict's dense one."""
    assert type(up).__name__ == type(ours).__name__
    assert torchdict.is_tensorclass(ours)
    assert tuple(up.batch_size) == tuple(ours.batch_size)
    assert_same(up.x, ours.x, "x")
    assert type(up.inner).__name__ == type(ours.inner).__name__
    assert_same(up.inner.a, ours.inner.a, "inner.a")
    assert as_lists(up.tag) == as_lists(ours.tag)
    assert up.missing is None and ours.missing is None


batch_and_dim = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple).flatmap(
    lambda batch: st.tuples(st.just(batch), st.integers(0, len(batch))))


# ---------------------------------------------------------------------------- get and indexing
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batch_and_dim)
def test_get_gives_the_stacked_tensorclass_as_upstream(case):
    batch, stack_dim = case
    up, ours = stacks(batch, stack_dim)
    assert_same_particle(up.get("p"), ours.get("p"))
    assert_same_particle(up["p"], ours["p"])
    for key in (("p", "x"), ("p", "inner", "a")):
        assert_same(up.get(key), ours.get(key), str(key))
    assert [type(value).__name__ for _, value in up.items()] == [type(value).__name__ for _, value in ours.items()]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batch_and_dim, data=st.data())
def test_indexing_then_get_matches_upstream(case, data):
    batch, stack_dim = case
    up, ours = stacks(batch, stack_dim)
    full = ours.batch_size
    dim = data.draw(st.integers(0, len(full) - 1))
    position = data.draw(st.integers(0, full[dim] - 1))
    for index in [(slice(None),) * dim + (position,), (slice(None),) * dim + (slice(0, position + 1),),
                  (slice(None),) * dim + (torch.tensor([position, 0]),)]:
        left, right = up[index], ours[index]
        assert type(left).__name__ == type(right).__name__
        assert_same_particle(left.get("p"), right.get("p"))


def test_stacking_members_and_get_of_nested_stacks_match_upstream():
    up, ours = stacks((2,), 0)
    assert_same_particle(torch.stack([up[0], up[1]]).get("p"), torch.stack([ours[0], ours[1]]).get("p"))
    nested = [lib.LazyStackedTensorDict(stack, stack.clone(), stack_dim=1) for lib, stack in
              ((upstream, up), (torchdict, ours))]
    assert_same_particle(nested[0].get("p"), nested[1].get("p"))
    assert_same_particle(up.clone().get("p"), ours.clone().get("p"))


def test_members_of_different_classes_give_a_lazy_stack_as_upstream():
    results = []
    for lib in (upstream, torchdict):
        classes = CLASSES[lib.__name__]
        parts = [lib.TensorDict(p=classes["Particle"](x=torch.zeros(2, 1), batch_size=[2]), batch_size=[2]),
                 lib.TensorDict(p=classes["Other"](x=torch.ones(2, 1), batch_size=[2]), batch_size=[2]),
                 lib.TensorDict(p=lib.TensorDict(x=torch.full((2, 1), 2.0), batch_size=[2]), batch_size=[2])]
        results.append(lib.LazyStackedTensorDict(*parts, stack_dim=0).get("p"))
    assert type(results[0]).__name__ == type(results[1]).__name__ == "LazyStackedTensorDict"
    assert_same(results[0].get("x"), results[1].get("x"))


def test_get_of_a_ragged_tensorclass_is_refused_and_changes_nothing():
    """Deliberate difference: upstream gives an instance over the lazy stack; torchdict's tensorclass holds its
    fields densely, so ragged fields can't be stacked: a RuntimeError that says how to read them."""
    ours = torchdict.LazyStackedTensorDict(*members(torchdict, (2,), count=2, widths=[2, 3]), stack_dim=0)
    before = [member["p"].x.clone() for member in ours.tensordicts]
    with pytest.raises(RuntimeError, match="as_list=True"):
        ours.get("p")
    assert all(torch.equal(member["p"].x, old) for member, old in zip(ours.tensordicts, before))
    listed = ours.get("p", as_list=True)
    assert [type(item).__name__ for item in listed] == ["Particle", "Particle"]
    assert ours.get(("p", "x"), as_padded_tensor=True).shape == (2, 2, 3)
    up = upstream.LazyStackedTensorDict(*members(upstream, (2,), count=2, widths=[2, 3]), stack_dim=0)
    assert type(up.get("p")).__name__ == "Particle"


def test_the_stacked_instance_is_a_copy():
    """Deliberate difference: a write into the instance get() gives does not reach the members."""
    _, ours = stacks((2,), 0)
    stacked = ours.get("p")
    stacked.x.zero_()
    assert ours.tensordicts[1]["p"].x.abs().sum() > 0


# ---------------------------------------------------------------------------- writes
def test_setting_a_stacked_instance_writes_the_members_as_upstream():
    up, ours = stacks((3,), 1)
    for lib, stack in ((upstream, up), (torchdict, ours)):
        classes = CLASSES[lib.__name__]
        value = classes["Particle"](x=torch.full((3, 3, 2), 7.0), inner=classes["Inner"](
            a=torch.zeros(3, 3, 4), batch_size=[3, 3]), batch_size=[3, 3])
        stack.set("p", value)
        stack[1] = lib.TensorDict(p=classes["Particle"](x=torch.full((3, 2), -1.0), inner=classes["Inner"](
            a=torch.ones(3, 4), batch_size=[3]), batch_size=[3]), y=torch.zeros(3), batch_size=[3])
    assert_same(up.get(("p", "x")), ours.get(("p", "x")))
    assert_same(up.get(("p", "inner", "a")), ours.get(("p", "inner", "a")))
    assert type(ours.tensordicts[0]["p"]).__name__ == "Particle"


# ---------------------------------------------------------------------------- dense forms
@pytest.mark.parametrize("retain_none", [None, True, False])
@pytest.mark.parametrize("stack_dim", [0, 1])
def test_to_tensordict_turns_the_tensorclass_into_a_tensordict_as_upstream(stack_dim, retain_none):
    up, ours = stacks((2,), stack_dim)
    left, right = up.to_tensordict(retain_none=retain_none), ours.to_tensordict(retain_none=retain_none)
    assert type(right).__name__ == "TensorDict"
    for key in ("p", ("p", "inner")):
        assert type(left[key]).__name__ == type(right[key]).__name__ == "TensorDict"
    assert sorted(left["p"].keys()) == sorted(right["p"].keys())
    assert_same(left.exclude(("p", "tag")), right.exclude(("p", "tag")))
    assert not right.is_locked
    right["p", "x"].zero_()  # a copy
    assert ours.get(("p", "x")).abs().sum() > 0


def test_contiguous_and_densify_keep_the_tensorclass_as_upstream():
    up, ours = stacks((2,), 1)
    for method in ("contiguous", "densify"):
        assert_same_particle(getattr(up, method)()["p"], getattr(ours, method)()["p"])


# ---------------------------------------------------------------------------- files
def test_memmap_then_pack_memmap_round_trips_as_upstream(tmp_path):
    up, ours = stacks((3,), 1)
    loaded = []
    for lib, stack in ((upstream, up), (torchdict, ours)):
        folder = tmp_path / lib.__name__
        saved = stack.memmap(str(folder))
        assert type(saved).__name__ == "LazyStackedTensorDict"
        archive = lib.pack_memmap(str(folder), str(tmp_path / f"{lib.__name__}.tdz"))
        loaded.append(lib.TensorDict.load_memmap(str(archive)))
    assert type(loaded[0]).__name__ == type(loaded[1]).__name__
    assert_same_particle(loaded[0].get("p"), loaded[1].get("p"))
    assert_same(loaded[0].get("y"), loaded[1].get("y"))


@pytest.mark.parametrize("kind", ["h5", "zarr"])
def test_written_to_a_file_as_upstream(tmp_path, kind):
    pytest.importorskip("h5py" if kind == "h5" else "zarr")
    up, ours = stacks((3,), 0)
    files = []
    for lib, stack in ((upstream, up), (torchdict, ours)):
        written = getattr(stack.exclude(("p", "tag")), f"to_{kind}")(str(tmp_path / f"{lib.__name__}.{kind}"))
        files.append(written)
    left, right = (written.to_tensordict() for written in files)
    assert_same(left, right)
    assert torch.equal(right["p", "x"], ours.get(("p", "x")))
    if kind == "h5":
        for written in files:
            written.close()


def test_to_struct_array_and_pack_match_upstream():
    up, ours = stacks((3,), 1)
    left, right = up.exclude(("p", "tag")).to_struct_array(), ours.exclude(("p", "tag")).to_struct_array()
    assert left.dtype == right.dtype and left.tobytes() == right.tobytes()
    (up_packed, _), (our_packed, _) = up.exclude(("p", "tag")).pack(), ours.exclude(("p", "tag")).pack()
    assert torch.equal(up_packed, our_packed)


def test_get_of_a_tensorclass_compiles_with_fullgraph():
    # Tensor fields only: stacking non-tensor values does not trace yet (torch.stack of NonTensorData, any
    # collection), which is the compile suite's concern.
    other = CLASSES["torchdict"]["Other"]
    stack = torchdict.lazy_stack([torchdict.TensorDict(p=other(x=torch.full((3, 2), float(i)), batch_size=[3]),
                                                       batch_size=[3]) for i in range(2)], 1)
    for read in (lambda lazy: lazy.get("p").x * 2, lambda lazy: lazy.get(("p", "x")) + 1):
        torch._dynamo.reset()
        compiled = torch.compile(read, fullgraph=True, backend="eager")
        assert torch.equal(compiled(stack), read(stack))
