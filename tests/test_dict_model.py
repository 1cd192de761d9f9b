"""Property tests: get / set / update / del on a TensorDict behave like the same edits on a nested plain dict."""
import torch
from hypothesis import given, settings, strategies as st

from torchdict import TensorDict

KEY_PARTS = st.sampled_from(["a", "b", "c"])
KEYS = st.lists(KEY_PARTS, min_size=1, max_size=3).map(tuple)
VALUES = st.integers(-5, 5).map(lambda v: torch.full((2,), v))

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, VALUES),
        st.tuples(st.just("update"), KEYS, VALUES),
        st.tuples(st.just("del"), KEYS, st.none()),
        st.tuples(st.just("set_"), KEYS, VALUES),
    ),
    max_size=12,
)


def model_get(model, key):
    node = model
    for part in key:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def model_apply(model, op, key, value):
    """Apply an op to the plain-dict model; return False when the op must fail (no change made)."""
    parent = model
    for part in key[:-1]:
        child = parent.get(part)
        if child is None:
            if op in ("del", "set_"):
                return False
            child = parent[part] = {}
        elif not isinstance(child, dict):
            return False
        parent = child
    last = key[-1]
    if op in ("set", "update"):
        if op == "update" and isinstance(parent.get(last), dict):
            return False  # skipped below: a tensor over a sub-dict replaces it in both, but keep the model simple
        parent[last] = value
    elif op == "del":
        if last not in parent:
            return False
        del parent[last]
    elif op == "set_":
        if not isinstance(parent.get(last), torch.Tensor):
            return False
        parent[last] = value
    return True


def model_leaves(model, prefix=()):
    for key, value in model.items():
        if isinstance(value, dict):
            yield from model_leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


@settings(max_examples=150, deadline=None)
@given(OPERATIONS)
def test_edits_match_a_plain_nested_dict(operations):
    td = TensorDict(batch_size=[2])
    model: dict = {}
    for op, key, value in operations:
        # Check feasibility on a throwaway copy of the model first: a failing op must fail on td too.
        trial = _deep_copy(model)
        feasible = model_apply(trial, op, key, value)
        if op == "update" and not feasible:
            continue
        try:
            if op == "set":
                td[key] = value
            elif op == "update":
                nested = value
                for part in reversed(key):
                    nested = {part: nested}
                td.update(nested)
            elif op == "del":
                del td[key]
            elif op == "set_":
                td.set_(key, value)
            succeeded = True
        except (KeyError, ValueError, RuntimeError):
            succeeded = False
        assert succeeded == feasible, (op, key)
        if feasible:
            model = trial
        expected = dict((k if len(k) > 1 else k[0], v) for k, v in model_leaves(model))
        actual = {k: v for k, v in td.items(include_nested=True, leaves_only=True)}
        assert actual.keys() == expected.keys()
        for k, v in expected.items():
            assert torch.equal(actual[k], v)
            assert torch.equal(td.get(k), v)


def _deep_copy(model):
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in model.items()}
