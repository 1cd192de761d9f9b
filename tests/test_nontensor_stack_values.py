"""torch.stack of NonTensorData leaves takes a direct path (nontensor/_stack_values.py): it must give what the
general palette path gives, and what upstream gives, for every batch rank, stack dim and size of result."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tensordict
import torchdict
from torchdict import NonTensorData, NonTensorStack, TensorDict
from torchdict.nontensor import combine_non_tensor
from torchdict.nontensor._stack_values import stack_single_values

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

batches = st.lists(st.integers(1, 4), min_size=0, max_size=3)


def _leaves(module, count: int, batch: list) -> list:
    return [module.NonTensorData(f"v{i}", batch_size=batch) for i in range(count)]


@settings(max_examples=60, deadline=None)
@given(batch=batches, count=st.integers(2, 5), data=st.data(), big=st.booleans())
def test_direct_stack_equals_the_general_path(batch, count, data, big):
    if big:  # past the flat-result limit: the palette form
        batch = batch + [100]
    dim = data.draw(st.integers(0, len(batch)))
    direct = stack_single_values(_leaves(torchdict, count, batch), dim)
    general = combine_non_tensor(_leaves(torchdict, count, batch), lambda grids: torch.stack(grids, dim))
    assert type(direct) is type(general) is NonTensorStack
    assert direct.batch_size == general.batch_size
    assert direct.tolist() == general.tolist()
    assert (direct._codes is None) == (general._codes is None)
    # indexing back along the new dim gives each leaf's value whole, as on the general path
    index = (slice(None),) * dim + (count - 1,)
    assert type(direct[index]) is type(general[index])
    assert direct[index].tolist() == general[index].tolist()


@settings(max_examples=40, deadline=None)
@given(batch=batches, count=st.integers(2, 4), data=st.data())
def test_stack_of_values_matches_upstream(batch, count, data):
    dim = data.draw(st.integers(0, len(batch)))
    ours = torch.stack(_leaves(torchdict, count, batch), dim)
    theirs = torch.stack(_leaves(tensordict, count, batch), dim)
    assert type(ours).__name__ == type(theirs).__name__
    assert ours.batch_size == theirs.batch_size
    assert ours.tolist() == theirs.tolist()


def test_other_leaves_take_the_general_path():
    mixed = [NonTensorData("a", batch_size=[2]), NonTensorStack("b", "c")]
    assert stack_single_values(mixed, 0) is None
    assert stack_single_values([NonTensorData("a", batch_size=[2])], 0) is None
    uneven = [NonTensorData("a", batch_size=[2]), NonTensorData("b", batch_size=[3])]
    assert stack_single_values(uneven, 0) is None
    with pytest.raises(RuntimeError):  # torch's error for unequal sizes, from the general path
        torch.stack([TensorDict(s="a", batch_size=[2]), TensorDict(s="b", batch_size=[3])])


def test_tensorclass_with_a_string_field_stacks_its_names():
    from torchdict import tensorclass

    @tensorclass
    class Step:
        x: torch.Tensor
        name: str

    steps = [Step(x=torch.zeros(3, 2), name=f"n{i}", batch_size=[3, 2]) for i in range(3)]
    stacked = torch.stack(steps, 1)
    assert stacked.batch_size == torch.Size([3, 3, 2])
    assert stacked.name[0][2] == ["n2", "n2"]
    assert stacked[:, 1].name == "n1"
