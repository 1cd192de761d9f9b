"""Lazy stacks of members whose batch sizes differ (episodes of different lengths), against upstream.

The stack's batch size holds -1 where the members differ; member-wise ops keep it lazy, indexing along the
stack dim gives a member back, and ops needing every size refuse it with a clear error (or, for a whole
flatten, list every element)."""
from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdict

tensordict = pytest.importorskip("tensordict")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def episodes(lib, lengths, rest=()):
    return [lib.TensorDict({"obs": torch.arange(float(n * 4 * max(1, len(rest)))).view(n, *rest, 4) if rest else
                            torch.arange(n * 4.).view(n, 4),
                            "next": {"r": torch.full((n, *rest, 1), float(i))}}, [n, *rest])
            for i, n in enumerate(lengths)]


def summary(value):
    """A comparable form of a result: tensors by value, collections by type name, batch size and leaves."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.tolist())
    if isinstance(value, (torchdict.TensorDictBase, tensordict.TensorDictBase)):
        leaves = {}
        for key in value.keys(True, True):
            leaf = value.get(key, as_list=True) if hasattr(value, "tensordicts") else value.get(key)
            leaves[key] = [summary(x) for x in leaf] if isinstance(leaf, list) else summary(leaf)
        return (type(value).__name__, tuple(value.batch_size), leaves)
    if isinstance(value, (list, tuple)):
        return [summary(item) for item in value]
    if isinstance(value, torch.Size):
        return tuple(value)
    return value


def outcome(lib, build, op):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "ok", summary(op(build(lib), lib))
    except Exception as error:  # noqa: BLE001 - compared by type
        return "error", type(error)


OPS = {
    "batch_size": lambda lz, lib: lz.batch_size,
    "len": lambda lz, lib: len(lz),
    "member": lambda lz, lib: lz[1],
    "stack slice": lambda lz, lib: lz[1:],
    "row of each member": lambda lz, lib: lz[:, 0],
    "rows of each member": lambda lz, lib: lz[:, 1:3],
    "last row": lambda lz, lib: lz[:, -1],
    "element": lambda lz, lib: lz[0, 0],
    "stack mask": lambda lz, lib: lz[torch.tensor([True, False] + [True] * (len(lz) - 2))],
    "padded": lambda lz, lib: lz.get("obs", as_padded_tensor=True),
    "nested get as list": lambda lz, lib: lz.get(("next", "r"), as_list=True),
    "item shape": lambda lz, lib: lz.get_item_shape("obs"),
    "apply": lambda lz, lib: lz.apply(lambda x: x * 2),
    "unbind": lambda lz, lib: lz.unbind(0),
    "clone": lambda lz, lib: lz.clone(),
    "eq": lambda lz, lib: lz == lz.clone(),
    "add": lambda lz, lib: lz + 1,
    "zero_": lambda lz, lib: lz.clone().zero_(),
    "update_": lambda lz, lib: lz.clone().update_(lz.apply(lambda x: x + 1)),
    "select": lambda lz, lib: lz.select("obs"),
    "exclude": lambda lz, lib: lz.exclude("obs"),
    "to dtype": lambda lz, lib: lz.to(torch.float64),
    "unsqueeze 0": lambda lz, lib: lz.unsqueeze(0),
    "unsqueeze -1": lambda lz, lib: lz.unsqueeze(-1),
    "permute": lambda lz, lib: lz.permute(1, 0),
    "transpose": lambda lz, lib: lz.transpose(0, 1),
    "split": lambda lz, lib: lz.split(1, 0),
    "cat": lambda lz, lib: torch.cat([lz, lz], 0),
    "flatten": lambda lz, lib: lz.flatten(),
    "reshape -1": lambda lz, lib: lz.reshape(-1),
    "view": lambda lz, lib: lz.view(-1),
    "expand": lambda lz, lib: lz.expand(2, *lz.batch_size),
    "expand sized": lambda lz, lib: lz.expand(2, len(lz), 4),
    "dense stack": lambda lz, lib: torch.stack(lz.tensordicts),
    "all": lambda lz, lib: lz.all(),
    "keys": lambda lz, lib: sorted(map(str, lz.keys(True))),
    "member written": lambda lz, lib: (lambda s: (s.__setitem__(1, s[1].clone().zero_()), s)[1])(lz.clone()),
    "memmap": lambda lz, lib: lz.memmap(),
    "stack of ragged stacks": lambda lz, lib: lib.lazy_stack([lz, lz]).batch_size,
}
# Deliberate differences (docs/compat.md): errors where upstream is wrong or answers something else.
DIFFERENT = {
    "view": "both refuse; the wording differs",
    "expand sized": "both refuse; torchdict says why",
}


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("lengths", [(5, 3, 7), (2, 4)])
def test_ragged_stack_matches_upstream(name, lengths):
    build = lambda lib: lib.LazyStackedTensorDict.lazy_stack(episodes(lib, lengths), dim=0)  # noqa: E731
    ours, theirs = outcome(torchdict, build, OPS[name]), outcome(tensordict, build, OPS[name])
    if name in DIFFERENT:
        assert ours[0] == theirs[0] == "error" and issubclass(ours[1], RuntimeError)
    else:
        assert ours == theirs


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 5), min_size=2, max_size=4), rest=st.sampled_from([(), (2,), (2, 3)]),
       dim=st.integers(0, 1))
def test_ragged_batch_sizes_and_members_match_upstream(lengths, rest, dim):
    dim = min(dim, len(rest) + 1)
    build = lambda lib: lib.LazyStackedTensorDict.lazy_stack(episodes(lib, lengths, rest), dim=dim)  # noqa: E731
    for op in (OPS["batch_size"], OPS["item shape"], OPS["apply"], OPS["unbind"] if dim == 0 else OPS["clone"],
               lambda lz, lib: lz.unsqueeze(-1), lambda lz, lib: lz.get("obs", as_padded_tensor=True)):
        assert outcome(torchdict, build, op) == outcome(tensordict, build, op)


def test_rank_mismatch_and_strict_shape_raise_as_upstream():
    for lib in (torchdict, tensordict):
        with pytest.raises(RuntimeError, match="batch sizes in tensordicts differs"):
            lib.lazy_stack([lib.TensorDict(batch_size=[3]), lib.TensorDict(batch_size=[3, 2])])
        with pytest.raises(RuntimeError, match="congruent batch sizes"):
            lib.LazyStackedTensorDict.lazy_stack([lib.TensorDict(batch_size=[3]), lib.TensorDict(batch_size=[2])],
                                                 strict_shape=True)


def test_an_op_needing_every_size_names_itself_and_changes_nothing():
    stack = torchdict.lazy_stack(episodes(torchdict, (5, 3)))
    before = [member["obs"].clone() for member in stack.tensordicts]
    for op, call in (("expand", lambda: stack.expand(2, 2, 5)), ("repeat", lambda: stack.repeat(1, 2)),
                     ("view", lambda: stack.view(2, 4)), ("reshape", lambda: stack.reshape(4, 2))):
        with pytest.raises(RuntimeError, match=rf"{op}\(\) needs the sizes of every batch dim"):
            call()
    assert all(torch.equal(member["obs"], old) for member, old in zip(stack.tensordicts, before))
    assert stack.batch_size == torch.Size([2, -1])
