import pytest
import torch
from hypothesis import given, strategies as st

from torchdict import TensorDict, unravel_key, unravel_key_list
from torchdict._keys import is_nested_key, key_to_tuple

names = st.text(min_size=0, max_size=5)


def nested_key_shapes():
    # Arbitrary nestings of tuples around strings.
    return st.recursive(names, lambda inner: st.lists(inner, min_size=1, max_size=3).map(tuple), max_leaves=6)


def flatten_reference(key):
    if isinstance(key, str):
        return [key]
    out = []
    for item in key:
        out.extend(flatten_reference(item))
    return out


@given(nested_key_shapes())
def test_any_nesting_unravels_to_the_flat_sequence_of_strings(key):
    expected = flatten_reference(key)
    assert list(key_to_tuple(key)) == expected
    unravelled = unravel_key(key)
    assert unravelled == (expected[0] if len(expected) == 1 else tuple(expected))


@given(nested_key_shapes())
def test_unravel_is_idempotent(key):
    assert unravel_key(unravel_key(key)) == unravel_key(key)


def test_seed_examples():
    assert unravel_key(("nested", ("supernested", ("key",)))) == ("nested", "supernested", "key")
    assert unravel_key((("a",),)) == "a"
    assert unravel_key_list(["a", ("b", ("c",))]) == ["a", ("b", "c")]


@pytest.mark.parametrize("bad", [1, None, (), ("a", 1), ("a", ()), [("a",)], b"a", 1.5])
def test_invalid_keys_raise_the_nested_key_error(bad):
    with pytest.raises(KeyError, match="Only NestedKeys are supported"):
        key_to_tuple(bad)
    assert not is_nested_key(bad)


@given(nested_key_shapes())
def test_every_normalised_key_reads_the_same_entry(key):
    flat = key_to_tuple(key)
    td = TensorDict()
    td[flat] = 1
    assert td[key] == 1
    assert key in td.keys(include_nested=True)
    assert td.get(key) is td[flat]


def test_str_subclass_keys_are_kept_and_equal_their_string_value():
    # As upstream: a key of a str subclass (an Enum mixing in str, whose str() is "Key.obs") is
    # stored as given, and reads back by it or by its string value, at any depth and batch size.
    import enum

    class Key(str, enum.Enum):
        OBS = "obs"

    for batch_size in ([], [3]):
        td = TensorDict({Key.OBS: torch.zeros(3), "n": {Key.OBS: torch.zeros(3)}}, batch_size=batch_size)
        assert list(td.keys()) == ["obs", "n"] and type(next(iter(td.keys()))) is Key
        assert td["obs"] is td[Key.OBS] and td["n", "obs"] is td["n", Key.OBS]
        td[Key.OBS] = torch.ones(3)
        td["n", Key.OBS] = torch.ones(3)
        assert td["obs"].sum() == 3 and td.get(("n", "obs")).sum() == 3
        assert td.pop(Key.OBS).sum() == 3 and "obs" not in td.keys()
