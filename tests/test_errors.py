"""The error catalogue: each bad input, the exception type and message users catch, and that nothing changed."""
import pytest
import torch

from torchdict import InplaceWriteError, KeyThroughLeafError, TensorDict

from _helpers import assert_same_snapshot, snapshot


def base():
    return TensorDict(
        {"key 1": torch.zeros(3, 4, 5), "key 2": torch.ones(3, 4), "n": {"x": torch.zeros(3, 4)}, "s": "text"},
        batch_size=[3, 4],
    )


E_BATCH = (r"batch dimension mismatch, got self\.batch_size=torch\.Size\(\[3, 4\]\) and "
           r"value\.shape=torch\.Size\(\[2, 4\]\) for key 'x'\. The leading dimensions of a value must match "
           r"the batch size\.")

CASES = [
    # (description, action, exception type, message regex)
    ("set wrong batch", lambda td: td.__setitem__("x", torch.zeros(2, 4)), RuntimeError, E_BATCH),
    ("set scalar into batch", lambda td: td.__setitem__("x", 1), RuntimeError,
     r"Python scalars are stored as 0-dim tensors"),
    ("nested set wrong batch", lambda td: td.__setitem__(("n", "y"), torch.zeros(2)), RuntimeError,
     r"batch dimension mismatch"),
    ("set nested dict wrong batch", lambda td: td.__setitem__("d", {"y": torch.zeros(2)}), RuntimeError,
     r"batch dimension mismatch"),
    ("sub-td incompatible", lambda td: td.__setitem__("t", TensorDict({"x": torch.zeros(3)}, [3])), RuntimeError,
     r"the Tensor x has shape torch\.Size\(\[3\]\) which is incompatible with the batch-size torch\.Size\(\[3, 4\]\)\."),
    ("batch_size setter", lambda td: setattr(td, "batch_size", [4]), RuntimeError,
     r"which is incompatible with the batch-size torch\.Size\(\[4\]\)"),
    ("missing key", lambda td: td["missing"], KeyError,
     r"key \"missing\" not found in TensorDict with keys \['key 1', 'key 2', 'n', 's'\]"),
    ("missing nested key", lambda td: td["n", "missing"], KeyError, r"not found in TensorDict with keys \['x'\]"),
    ("bad key type", lambda td: td.set(1, torch.zeros(3, 4)), KeyError,
     r"Only NestedKeys are supported: a key must be a string or a non-empty, possibly nested tuple of strings\. "
     r"Got key 1\."),
    ("int in key tuple", lambda td: td.set(("a", 1), torch.zeros(3, 4)), KeyError, r"Only NestedKeys are supported"),
    ("walk through leaf", lambda td: td["key 1", "a"], KeyThroughLeafError,
     r"'key 1' is a Tensor, not a tensordict, so it has no entry 'a'\."),
    ("walk through leaf with get", lambda td: td.get(("key 1", "a")), ValueError, r"not a tensordict"),
    ("set through leaf", lambda td: td.__setitem__(("key 1", "a"), torch.zeros(3, 4)), KeyError,
     r"The entry key 1 is already present in tensordict"),
    ("set_ missing", lambda td: td.set_("missing", torch.zeros(3, 4)), KeyError, r"not found in TensorDict"),
    ("set_ non tensor into tensor", lambda td: td.set_("key 2", "text"), InplaceWriteError,
     r"Failed to update 'key 2' in tensordict"),
    ("set_ tensor over sub-td", lambda td: td.set_("n", torch.zeros(3, 4)), InplaceWriteError, r"Failed to update"),
    ("set_ no broadcast", lambda td: td.set_("key 2", torch.zeros(1, 4)), RuntimeError, r"batch dimension mismatch"),
    ("update_ missing", lambda td: td.update_({"zz": torch.zeros(3, 4)}), KeyError,
     r"The key zz was not found in the dest tensordict\."),
    ("update_ bad shape", lambda td: td.update_({"key 2": torch.zeros(3, 5)}), RuntimeError,
     r"update_\(\) cannot copy the value of shape torch\.Size\(\[3, 5\]\) under the key 'key 2' into the entry of "
     r"shape torch\.Size\(\[3, 4\]\)"),
    ("update wrong batch", lambda td: td.update({"key 2": torch.zeros(2, 4)}), RuntimeError,
     r"batch dimension mismatch"),
    ("del missing", lambda td: td.__delitem__("missing"), KeyError, r"missing"),
    ("pop missing", lambda td: td.pop("missing"), KeyError, r"not found in TensorDict"),
    ("rename missing", lambda td: td.rename_key_("missing", "b"), KeyError, r"not found in TensorDict"),
    ("rename safe", lambda td: td.rename_key_("key 1", "key 2", safe=True), KeyError,
     r"key key 2 already present in TensorDict\."),
    ("select missing", lambda td: td.select("missing"), KeyError, r"not found in TensorDict"),
    ("set device", lambda td: setattr(td, "device", "cpu"), RuntimeError, r"device cannot be set"),
    ("bool", lambda td: bool(td), RuntimeError, r"Converting a tensordict to boolean value is not permitted"),
    ("names length", lambda td: setattr(td, "names", ["a"]), ValueError,
     r"the length of the dimension names must equate the tensordict batch_dims attribute"),
]


@pytest.mark.parametrize("description, action, exception, message", CASES, ids=[case[0] for case in CASES])
def test_bad_input_raises_and_changes_nothing(description, action, exception, message):
    td = base()
    before = snapshot(td)
    with pytest.raises(exception, match=message):
        action(td)
    assert_same_snapshot(before, snapshot(td))


LOCKED_CASES = [
    ("new key", lambda td: td.__setitem__("z", torch.zeros(3, 4))),
    ("replace", lambda td: td.__setitem__("key 2", torch.zeros(3, 4))),
    ("nested new key", lambda td: td.__setitem__(("n", "z"), torch.zeros(3, 4))),
    ("new nested level", lambda td: td.__setitem__(("m", "z"), torch.zeros(3, 4))),
    ("del", lambda td: td.__delitem__("key 2")),
    ("pop", lambda td: td.pop("key 2")),
    ("popitem", lambda td: td.popitem()),
    ("clear", lambda td: td.clear()),
    ("rename", lambda td: td.rename_key_("key 2", "k")),
    ("exclude inplace", lambda td: td.exclude("key 2", inplace=True)),
    ("setdefault missing", lambda td: td.setdefault("zz", torch.zeros(3, 4))),
    ("update new key", lambda td: td.update({"zz": torch.zeros(3, 4)})),
    ("update new key ignore_lock", lambda td: td.update({"zz": torch.zeros(3, 4)}, ignore_lock=True)),
]


@pytest.mark.parametrize("description, action", LOCKED_CASES, ids=[case[0] for case in LOCKED_CASES])
def test_locked_td_refuses_structural_changes(description, action):
    td = base().lock_()
    before = snapshot(td)
    with pytest.raises(RuntimeError, match=r"Cannot modify locked TensorDict"):
        action(td)
    assert_same_snapshot(before, snapshot(td))


@pytest.mark.parametrize(
    "args, kwargs, message",
    [(({"a": 0},), {"b": 1}, "Either a dictionary or a sequence of kwargs must be provided, not both."),
     (([1, 2],), {}, "A TensorDict source is expected to be a TensorDictBase sub-type or a Mapping"),
     ((3,), {}, "A TensorDict source is expected to be a TensorDictBase sub-type or a Mapping"),
     (({},), {"batch_size": "abc"}, "batch size was not specified when creating the TensorDict instance")],
)
def test_constructor_errors(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        TensorDict(*args, **kwargs)


def test_constructor_batch_mismatch():
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        TensorDict({"a": torch.zeros(3)}, batch_size=[-1])
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        TensorDict({"a": torch.zeros(3)}, batch_size=[4])
    with pytest.raises(KeyError, match="Only NestedKeys are supported"):
        TensorDict({1: torch.zeros(3)})
