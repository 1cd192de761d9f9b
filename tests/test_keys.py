import pytest
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
