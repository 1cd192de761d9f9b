"""TensorDictModule / TensorDictModuleBase / wrappers / dispatch / skip_existing, differential against
upstream ``tensordict.nn`` (same weights and inputs -> same outputs, same keys written, same error types)."""
from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

import torchdict
from torchdict import TensorDict
from torchdict.nn import (
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictModuleWrapper,
    WrapModule,
    as_tensordict_module,
    dispatch,
    make_tensordict,
    set_skip_existing,
    skip_existing,
)

from _helpers import assert_same_snapshot, snapshot
from _nn_helpers import assert_same_outcome, assert_same_output, assert_same_td, both, leaves, pair

BATCHES = [(), (4,), (2, 3), (2, 1, 3)]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


# ------------------------------------------------------------------ outputs equal to upstream's
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("out_key", ["y", ("out", "y"), ("a", "b", "c")])
def test_linear_module_matches_upstream(batch, out_key):
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(_mlp(), in_keys=["x"], out_keys=[out_key]))
    x = torch.randn(*batch, 3)
    td_up, td_ours = pair({"x": x}, batch)
    result_up, result_ours = up(td_up), ours(td_ours)
    assert result_up is td_up and result_ours is td_ours
    assert_same_td(td_up, td_ours)
    # plain torch: the wrapped network on the tensor
    torch.manual_seed(0)
    assert torch.equal(td_ours[out_key], _mlp()(x))


@pytest.mark.parametrize("in_keys,kwargs", [
    ("x", {}),
    (["x", ("nested", "z")], {}),
    ({"a": "x", "b": ("nested", "z")}, {}),
    ({"x": "a", ("nested", "z"): "b"}, {"out_to_in_map": False}),
    ({"a": "x", "b": "x"}, {}),
])
def test_in_keys_forms(in_keys, kwargs):
    def fn(*args, **named):
        values = list(args) + [named[k] for k in sorted(named)]
        return sum(value * (i + 1) for i, value in enumerate(values))

    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(fn, in_keys=in_keys, out_keys=["o"], **kwargs))
    assert up.in_keys == ours.in_keys and up.out_keys == ours.out_keys
    data = {"x": torch.randn(3), "nested": {"z": torch.randn(3)}}
    td_up, td_ours = pair(data, [3])
    assert_same_outcome(lambda: up(td_up), lambda: ours(td_ours))


def test_empty_in_keys_and_discarded_output():
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda: (torch.ones(2), torch.zeros(2)), in_keys=[],
                                                           out_keys=["_", "kept"]))
    td_up, td_ours = pair({}, [2])
    assert_same_outcome(lambda: up(td_up), lambda: ours(td_ours))
    assert list(td_ours.keys()) == ["kept"]


@pytest.mark.parametrize("kind", ["dict", "td", "dict_reordered", "dict_missing"])
def test_mapping_outputs_are_read_by_key(kind):
    def build(lib, lnn):
        def fn(x):
            if kind == "td":
                return lib.TensorDict(b=x * 2, a=x + 1)
            if kind == "dict_missing":
                return {"a": x + 1}
            if kind == "dict_reordered":
                return {("n", "b"): x * 2, "a": x + 1}
            return {"a": x + 1, "b": x * 2}

        out_keys = ["a", ("n", "b")] if kind == "dict_reordered" else (["a", "b"] if kind != "dict_missing"
                                                                       else ["a", "b"])
        return lnn.TensorDictModule(fn, in_keys=["x"], out_keys=out_keys)

    up, ours = both(build)
    td_up, td_ours = pair({"x": torch.randn(2)}, [2])
    assert_same_outcome(lambda: up(td_up), lambda: ours(td_ours))


@pytest.mark.parametrize("value", [3, 2.5, "label", None])
def test_non_tensor_outputs(value):
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda: value, in_keys=[], out_keys=["v"]))
    td_up, td_ours = pair({}, [])
    if value is None:  # no output at all: one out key too many
        assert_same_outcome(lambda: up(td_up), lambda: ours(td_ours))
        return
    up(td_up)
    ours(td_ours)
    assert td_up["v"] == td_ours["v"]


def test_non_tensor_input_is_passed_as_its_value():
    seen = []
    module = TensorDictModule(lambda label: seen.append(label) or torch.zeros(()), in_keys=["label"],
                              out_keys=["z"])
    td = TensorDict(label="hello")
    module(td)
    assert seen == ["hello"]


@pytest.mark.parametrize("inplace", [True, False, "empty"])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_inplace_modes(inplace, batch):
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"],
                                                           inplace=inplace))
    td_up, td_ours = pair({"x": torch.randn(*batch, 2)}, batch)
    result_up, result_ours = up(td_up), ours(td_ours)
    assert (result_up is td_up) == (result_ours is td_ours)
    assert_same_td(result_up, result_ours)
    assert_same_td(td_up, td_ours)
    assert type(result_ours) is TensorDict


@pytest.mark.parametrize("inplace", [True, False, "empty"])
def test_tensordict_out_wins(inplace):
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"],
                                                           inplace=inplace))
    td_up, td_ours = pair({"x": torch.randn(3)}, [3])
    out_up, out_ours = pair({"other": torch.zeros(3)}, [3])
    assert up(td_up, tensordict_out=out_up) is out_up
    assert ours(td_ours, tensordict_out=out_ours) is out_ours
    assert_same_td(out_up, out_ours)
    assert_same_td(td_up, td_ours)


def test_method_and_method_kwargs():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(3.0))

        def shifted(self, x, *, shift):
            return x * self.scale + shift

    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(Net(), in_keys=["x"], out_keys=["y"], method="shifted",
                                                           method_kwargs={"shift": 2}))
    td_up, td_ours = pair({"x": torch.arange(3.0)}, [3])
    assert_same_outcome(lambda: up(td_up), lambda: ours(td_ours))
    assert [name for name, _ in ours.named_parameters()] == [name for name, _ in up.named_parameters()]


def test_extra_call_kwargs_reach_the_module():
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda x, scale=1: x * scale, in_keys=["x"],
                                                           out_keys=["y"]))
    td_up, td_ours = pair({"x": torch.ones(2)}, [2])
    assert_same_outcome(lambda: up(td_up, scale=5), lambda: ours(td_ours, scale=5))


_KEYS = st.sampled_from(["y", ("out", "y"), ("a", "b", "c"), "x"])


@settings(max_examples=40)
@given(batch=st.lists(st.integers(1, 3), min_size=0, max_size=3),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
       out_keys=st.lists(_KEYS, min_size=1, max_size=3, unique=True),
       inplace=st.sampled_from([True, False, "empty"]),
       selected=st.booleans())
def test_property_matches_upstream(batch, dtype, out_keys, inplace, selected):
    def fn(x):
        outputs = tuple(x * (i + 2) + 1 for i in range(len(out_keys)))
        return outputs if len(outputs) > 1 else outputs[0]

    def build(lib, lnn):
        module = lnn.TensorDictModule(fn, in_keys=["x"], out_keys=list(out_keys), inplace=inplace)
        if selected:
            module.select_out_keys(out_keys[-1])
        return module

    up, ours = both(build)
    x = (torch.randn(*batch, 2) * 10).to(dtype)
    td_up, td_ours = pair({"x": x, "kept": torch.zeros(tuple(batch))}, batch)
    result_up, result_ours = up(td_up), ours(td_ours)
    assert_same_td(result_up, result_ours)
    assert_same_td(td_up, td_ours)
    assert_same_outcome(lambda: up(x), lambda: ours(x))


def test_dispatch_switched_off():
    from torchdict.nn.utils import _set_dispatch_td_nn_modules

    module = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
    with _set_dispatch_td_nn_modules(False):
        with pytest.raises(TypeError):
            module(x=torch.zeros(1))
        assert module(TensorDict(x=torch.zeros(1)))["y"] == 1
    assert module(x=torch.zeros(1)) == 1


# ------------------------------------------------------------------ errors
def test_missing_in_key_raises_key_error_and_changes_nothing():
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"]))
    td_up, td_ours = pair({"z": torch.randn(3)}, [])
    before = snapshot(td_ours)
    _, err = assert_same_outcome(lambda: up(td_up), lambda: ours(td_ours))
    assert isinstance(err, KeyError) and "'x'" in str(err) and "Linear" in str(err)
    assert_same_snapshot(before, snapshot(td_ours))


def test_missing_in_key_strict():
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(nn.Linear(3, 2), in_keys=[("a", "x")], out_keys=["y"],
                                                           strict=True))
    td_up, td_ours = pair({"z": torch.randn(3)}, [])
    _, err = assert_same_outcome(lambda: up(td_up), lambda: ours(td_ours))
    assert isinstance(err, KeyError) and "('a', 'x')" in str(err) and "Linear" in str(err)


@pytest.mark.parametrize("outputs,out_keys", [
    (2, ["y"]),
    (1, ["y", "z"]),
    (3, ["y", ("n", "z")]),
])
def test_wrong_number_of_outputs(outputs, out_keys):
    def fn(x):
        return tuple(x + i for i in range(outputs)) if outputs > 1 else x

    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(fn, in_keys=["x"], out_keys=out_keys))
    td_up, td_ours = pair({"x": torch.randn(2)}, [2])
    before = snapshot(td_ours)
    _, err = assert_same_outcome(lambda: up(td_up), lambda: ours(td_ours))
    assert isinstance(err, RuntimeError) and "out_keys" in str(err)
    assert_same_snapshot(before, snapshot(td_ours))


def test_failed_second_write_is_undone():
    # the second output does not fit the batch size: the first write is taken back
    module = TensorDictModule(lambda x: (x + 1, torch.zeros(5)), in_keys=["x"], out_keys=[("new", "a"), "b"])
    td = TensorDict(x=torch.randn(3), batch_size=[3])
    before = snapshot(td)
    with pytest.raises(RuntimeError):
        module(td)
    assert_same_snapshot(before, snapshot(td))
    td = TensorDict(x=torch.randn(3), y=torch.ones(3), batch_size=[3])
    module = TensorDictModule(lambda x: (x + 1, torch.zeros(5)), in_keys=["x"], out_keys=["y", "b"])
    before = snapshot(td)
    with pytest.raises(RuntimeError):
        module(td)
    assert torch.equal(td["y"], torch.ones(3)) and "b" not in td.keys()


@pytest.mark.parametrize("args", [
    dict(module=nn.Linear(2, 2), in_keys=3, out_keys=["y"]),
    dict(module=nn.Linear(2, 2), in_keys=["x"], out_keys=3),
    dict(module=nn.Linear(2, 2), in_keys=[3], out_keys=["y"]),
    dict(module=nn.Linear(2, 2), in_keys=["x"], out_keys=[("a", 1)]),
    dict(module=nn.Linear, in_keys=["x"], out_keys=["y"]),
    dict(module=3, in_keys=["x"], out_keys=["y"]),
    dict(module=nn.Linear(2, 2), in_keys=["x"], out_keys=["y"], inplace="yes"),
])
def test_bad_constructor_arguments(args):
    assert_same_outcome(lambda: tensordict_nn().TensorDictModule(**args),
                        lambda: torchdict.nn.TensorDictModule(**args))


def tensordict_nn():
    import tensordict.nn

    return tensordict.nn


def test_constructor_warnings():
    with pytest.warns(UserWarning, match="out_to_in_map"):
        TensorDictModule(lambda x: x, in_keys=["x"], out_keys=["y"], out_to_in_map=True)
    with pytest.warns(UserWarning, match='"_"'):
        TensorDictModule(lambda x: x, in_keys=["_"], out_keys=["y"])


def test_extra_positional_argument_is_refused():
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda x: x, in_keys=["x"], out_keys=["y"]))
    td_up, td_ours = pair({"x": torch.ones(1)}, [1])
    assert_same_outcome(lambda: up(td_up, torch.ones(1)), lambda: ours(td_ours, torch.ones(1)))


# ------------------------------------------------------------------ out key selection
def test_select_and_reset_out_keys():
    def build(lib, lnn):
        return lnn.TensorDictModule(lambda x: (x + 1, x + 2, x + 3), in_keys=["x"],
                                    out_keys=["a", ("n", "b"), ("n", "c")])

    up, ours = both(build)
    for module in (up, ours):
        assert module.select_out_keys("a", ("n", "c")) is module
    assert up.out_keys == ours.out_keys and up.out_keys_source == ours.out_keys_source
    td_up, td_ours = pair({"x": torch.randn(2)}, [2])
    assert_same_td(up(td_up), ours(td_ours))
    assert_same_outcome(lambda: up(torch.ones(2)), lambda: ours(torch.ones(2)))
    for module in (up, ours):
        module.select_out_keys("a")
    td_up, td_ours = pair({"x": torch.randn(2)}, [2])
    assert_same_td(up(td_up), ours(td_ours))
    assert sorted(leaves(td_ours)) == [("a",), ("x",)]  # the emptied "n" went too
    for module in (up, ours):
        assert module.reset_out_keys() is module
    assert up.out_keys == ours.out_keys == ["a", ("n", "b"), ("n", "c")]
    td_up, td_ours = pair({"x": torch.randn(2)}, [2])
    assert_same_td(up(td_up), ours(td_ours))
    assert not ours._forward_hooks


@pytest.mark.parametrize("keys", [("z",), ("a", "z"), (["a", "b"],)])
def test_select_unknown_out_key(keys):
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda x: (x, x), in_keys=["x"], out_keys=["a", "b"]))
    _, err = assert_same_outcome(lambda: up.select_out_keys(*keys), lambda: ours.select_out_keys(*keys))
    assert isinstance(err, ValueError) and isinstance(err, RuntimeError)
    assert ours.out_keys == ["a", "b"] and not ours._forward_hooks


def test_selection_keeps_inputs():
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda x: (x + 1, x * 2), in_keys=["x"],
                                                           out_keys=["x", "y"]))
    for module in (up, ours):
        module.select_out_keys("y")
    td_up, td_ours = pair({"x": torch.ones(2)}, [2])
    assert_same_td(up(td_up), ours(td_ours))


# ------------------------------------------------------------------ keyword calls (dispatch)
@pytest.mark.parametrize("call", ["positional", "keyword", "mixed", "td_keyword"])
def test_module_called_with_tensors(call):
    def build(lib, lnn):
        return lnn.TensorDictModule(lambda a, b: (a + b, a - b), in_keys=["a", ("n", "b")],
                                    out_keys=["s", ("n", "d")])

    up, ours = both(build)
    a, b = torch.randn(3), torch.randn(3)

    def run(module, lib):
        if call == "positional":
            return module(a, b)
        if call == "keyword":
            return module(a=a, n_b=b)
        if call == "mixed":
            return module(a, n_b=b)
        return module(tensordict=lib.TensorDict({"a": a, ("n", "b"): b}))

    assert_same_outcome(lambda: run(up, tensordict_lib()), lambda: run(ours, torchdict))


def tensordict_lib():
    import tensordict

    return tensordict


def test_duplicated_argument():
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda a: a, in_keys=["a"], out_keys=["b"]))
    _, err = assert_same_outcome(lambda: up(torch.ones(1), a=torch.ones(1)),
                                 lambda: ours(torch.ones(1), a=torch.ones(1)))
    assert isinstance(err, RuntimeError)


@pytest.mark.parametrize("auto_batch_size", [True, False])
@pytest.mark.parametrize("separator", ["_", "__"])
def test_dispatch_decorator_on_functions_and_methods(auto_batch_size, separator):
    def build(lib, lnn):
        @lnn.dispatch(source=[("obs", "x"), "y"], dest=["z", "batch"], separator=separator,
                      auto_batch_size=auto_batch_size)
        def fn(tensordict):
            tensordict["z"] = tensordict["obs", "x"] + tensordict["y"]
            tensordict["batch"] = torch.tensor(list(tensordict.batch_size))
            return tensordict

        class Holder(nn.Module):
            in_keys = [("obs", "x"), "y"]
            out_keys = ["z"]

            @lnn.dispatch(separator=separator, auto_batch_size=auto_batch_size)
            def forward(self, tensordict):
                tensordict["z"] = tensordict["obs", "x"] * tensordict["y"]
                return tensordict

        return fn, Holder()

    (fn_up, holder_up), (fn_ours, holder_ours) = both(build)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    name = f"obs{separator}x"
    assert_same_outcome(lambda: fn_up(**{name: x, "y": y}), lambda: fn_ours(**{name: x, "y": y}))
    assert_same_outcome(lambda: fn_up(x, y), lambda: fn_ours(x, y))
    assert_same_outcome(lambda: holder_up(**{name: x, "y": y}), lambda: holder_ours(**{name: x, "y": y}))
    td_up, td_ours = pair({"obs": {"x": x}, "y": y}, [2])
    assert_same_outcome(lambda: holder_up(td_up), lambda: holder_ours(td_ours))


def test_bare_dispatch_and_bad_signature():
    @dispatch
    def fn(tensordict):
        return tensordict

    plain = fn.__wrapped__

    class Holder:
        in_keys = ["a"]
        out_keys = ["a"]
        method = dispatch(lambda self, tensordict: plain(tensordict))

    assert torch.equal(Holder().method(torch.ones(2)), torch.ones(2))
    with pytest.raises(RuntimeError, match="tensordict"):
        dispatch(lambda data: data)
    with pytest.raises(RuntimeError):
        fn(torch.ones(1))  # a function has no in_keys to read: the keys must be given


def test_dispatch_signature_matches_upstream():
    import inspect

    import tensordict.nn as upstream

    assert str(inspect.signature(TensorDictModule.forward)) .replace("'Any'", "") .replace(": ", "") \
        .replace("TensorDictBase | None", "") == str(inspect.signature(upstream.TensorDictModule.forward)) \
        .replace("'TensorDictBase | None'", "").replace("'Any'", "").replace(": ", "")


def test_make_tensordict_matches_upstream():
    import tensordict

    for kwargs in [dict(auto_batch_size=True), dict(batch_size=[2]), dict()]:
        up = tensordict.nn.make_tensordict({"a": torch.zeros(2, 3)}, b=torch.ones(2, 3, 4), **kwargs)
        ours = make_tensordict({"a": torch.zeros(2, 3)}, b=torch.ones(2, 3, 4), **kwargs)
        assert_same_td(up, ours)


# ------------------------------------------------------------------ hooks
def test_forward_hooks_see_the_tensordict():
    module = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
    seen = []
    module.register_forward_pre_hook(lambda mod, args: seen.append(("pre", sorted(args[0].keys()))))
    handle = module.register_forward_hook(lambda mod, args, out: out.set("hooked", out["y"] * 10))
    td = module(TensorDict(x=torch.ones(2), batch_size=[2]))
    assert seen == [("pre", ["x"])]
    assert torch.equal(td["hooked"], torch.full((2,), 20.0))
    handle.remove()
    assert "hooked" not in module(TensorDict(x=torch.ones(2), batch_size=[2])).keys()


def test_forward_hook_output_replacement_matches_upstream():
    def build(lib, lnn):
        module = lnn.TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        module.register_forward_hook(lambda mod, args, out: out.select("y"))
        return module

    up, ours = both(build)
    td_up, td_ours = pair({"x": torch.ones(2)}, [2])
    assert_same_td(up(td_up), ours(td_ours))


# ------------------------------------------------------------------ skip_existing
def test_skip_existing_matches_upstream():
    calls = []

    def build(lib, lnn):
        return lnn.TensorDictModule(lambda x: calls.append(1) or x + 1, in_keys=["x"], out_keys=["y"])

    up, ours = both(build)
    for module, lib, lnn in [(up, tensordict_lib(), tensordict_nn()), (ours, torchdict, torchdict.nn)]:
        td = lib.TensorDict(x=torch.zeros(2), y=torch.zeros(2), batch_size=[2])
        calls.clear()
        with lnn.set_skip_existing():
            assert lnn.skip_existing() is True
            assert torch.equal(module(td)["y"], torch.zeros(2))
        with lnn.set_skip_existing(["y"]):
            module(td)
        with lnn.set_skip_existing(["other"]):
            module(td)
        assert len(calls) == 1
        assert lnn.skip_existing() is False
        module(td)
        assert len(calls) == 2


def test_skip_existing_decorator_and_self_reading_module():
    class Counter(TensorDictModuleBase):
        in_keys = []
        out_keys = ["out"]

        def __init__(self):
            super().__init__()
            self.calls = 0

        @set_skip_existing()
        def forward(self, tensordict):
            self.calls += 1
            return tensordict.set("out", torch.zeros(()))

    class FollowsBlock(Counter):
        @set_skip_existing(None)
        def forward(self, tensordict):
            self.calls += 1
            return tensordict

    counter = Counter()
    counter(TensorDict(out=torch.zeros(())))
    counter(TensorDict())
    assert counter.calls == 1
    follows = FollowsBlock()
    follows(TensorDict(out=torch.zeros(())))
    with set_skip_existing(True):
        follows(TensorDict(out=torch.zeros(())))
    assert follows.calls == 1
    reads_itself = TensorDictModule(lambda out: out + 1, in_keys=["out"], out_keys=["out"])
    with set_skip_existing():
        assert reads_itself(TensorDict(out=torch.zeros(())))["out"] == 1
    with pytest.raises(RuntimeError):
        with set_skip_existing(None):
            pass
    with pytest.raises(RuntimeError, match="tensordict"):
        set_skip_existing()(lambda self, data: data)


def test_skip_existing_thread_local():
    import threading

    seen = {}
    with set_skip_existing(True, thread_local=True):
        thread = threading.Thread(target=lambda: seen.setdefault("other", skip_existing()))
        thread.start()
        thread.join()
        seen["here"] = skip_existing()
    assert seen == {"other": False, "here": True}
    assert skip_existing() is False


# ------------------------------------------------------------------ subclassing, wrappers
def test_subclass_with_class_level_keys_and_properties():
    def build(lib, lnn):
        class Mod(lnn.TensorDictModuleBase):
            in_keys = ["a"]
            out_keys = ["b", ("n", "c")]

            def forward(self, tensordict):
                b = tensordict["a"] + 1
                return tensordict.set("b", b).set(("n", "c"), b * 2)

        class ByProperty(lnn.TensorDictModuleBase):
            def __init__(self, key):
                super().__init__()
                self.key = key

            @property
            def in_keys(self):
                return [self.key]

            @property
            def out_keys(self):
                return [self.key + "_out"]

            def forward(self, tensordict):
                return tensordict.set(self.key + "_out", tensordict[self.key] * 3)

        return Mod(), ByProperty("a")

    (mod_up, prop_up), (mod_ours, prop_ours) = both(build)
    assert mod_up.in_keys == mod_ours.in_keys and mod_up.out_keys == mod_ours.out_keys
    td_up, td_ours = pair({"a": torch.ones(2)}, [2])
    assert_same_td(mod_up(td_up), mod_ours(td_ours))
    assert_same_td(prop_up(td_up), prop_ours(td_ours))
    for module in (mod_up, mod_ours):
        module.select_out_keys(("n", "c"))
    td_up, td_ours = pair({"a": torch.ones(2)}, [2])
    assert_same_td(mod_up(td_up), mod_ours(td_ours))
    # a read-only out_keys property: selecting what it already gives is accepted, by both
    assert prop_up.select_out_keys("a_out") is prop_up and prop_ours.select_out_keys("a_out") is prop_ours
    assert TensorDictModuleBase.is_tdmodule_compatible(mod_ours)
    assert not TensorDictModuleBase.is_tdmodule_compatible(nn.Linear(1, 1))


def test_subclass_with_dispatched_forward():
    class Scale(TensorDictModuleBase):
        in_keys = ["x"]
        out_keys = ["y"]

        @dispatch(auto_batch_size=False)
        def forward(self, tensordict):
            return tensordict.set("y", tensordict["x"] * 2)

    assert torch.equal(Scale()(x=torch.ones(2)), torch.full((2,), 2.0))
    assert torch.equal(Scale()(TensorDict(x=torch.ones(2)))["y"], torch.full((2,), 2.0))


def test_wrapper_and_wrap_module_match_upstream():
    def build(lib, lnn):
        class TimesTen(lnn.TensorDictModuleWrapper):
            def forward(self, tensordict):
                tensordict = self.td_module(tensordict)
                tensordict["y"] = tensordict["y"] * 10
                return tensordict

        inner = lnn.TensorDictModule(nn.Linear(2, 2), in_keys=["x"], out_keys=["y"])
        return TimesTen(inner), lnn.WrapModule(lambda td: td.reshape(-1)), lnn.WrapModule(
            lambda td: td.apply(lambda t: t * 2), inplace=True, in_keys=["x"], out_keys=["x"])

    (wrap_up, reshape_up, double_up), (wrap_ours, reshape_ours, double_ours) = both(build)
    assert wrap_up.in_keys == wrap_ours.in_keys and wrap_up.out_keys == wrap_ours.out_keys
    assert wrap_ours.weight is wrap_ours.td_module.module.weight
    assert [n for n, _ in wrap_up.named_parameters()] == [n for n, _ in wrap_ours.named_parameters()]
    td_up, td_ours = pair({"x": torch.randn(2, 3, 2)}, [2, 3])
    assert_same_td(wrap_up(td_up), wrap_ours(td_ours))
    assert_same_td(reshape_up(td_up), reshape_ours(td_ours))
    assert double_ours(td_ours) is td_ours
    double_up(td_up)
    assert_same_td(td_up, td_ours)
    assert (reshape_ours.in_keys, reshape_ours.out_keys) == ([], [])
    assert (double_ours.in_keys, double_ours.out_keys) == (["x"], ["x"])
    wrap_ours.out_keys = ["z"]
    assert wrap_ours.td_module.out_keys == ["z"]


def test_module_attribute_fallback_and_repr():
    module = TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
    assert module.weight is module.module.weight and module.in_features == 3
    with pytest.raises(AttributeError):
        module._private_missing
    with pytest.raises(AttributeError):
        module.missing_everywhere
    text = repr(module)
    assert text.startswith("TensorDictModule(") and "in_keys=['x']" in text and "Linear" in text
    fn_module = TensorDictModule(abs, in_keys=["x"], out_keys=["y"])
    assert "module=<built-in function abs>" in repr(fn_module)


def test_deprecated_properties_warn():
    module = TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
    with pytest.warns(DeprecationWarning):
        assert module.device == torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert module.is_functional is False


def test_as_tensordict_module_matches_upstream():
    def build(lib, lnn):
        @lnn.as_tensordict_module(in_keys="c", out_keys=["d"])
        def add_one(c):
            return c + 1

        class Holder:
            offset = 10

            @lnn.as_tensordict_module(in_keys=["c"], out_keys="d")
            def shifted(self, c):
                return c + self.offset

        return add_one, Holder()

    (fn_up, holder_up), (fn_ours, holder_ours) = both(build)
    td_up, td_ours = pair({"c": torch.zeros(2)}, [2])
    assert_same_td(fn_up(td_up), fn_ours(td_ours))
    assert_same_outcome(lambda: fn_up(c=torch.ones(2)), lambda: fn_ours(c=torch.ones(2)))
    td_up, td_ours = pair({"c": torch.zeros(2)}, [2])
    assert_same_td(holder_up.shifted(td_up), holder_ours.shifted(td_ours))
    assert torch.equal(holder_ours.shifted(c=torch.zeros(1)), torch.full((1,), 10.0))


def test_reset_parameters_recursive():
    module = TensorDictModule(nn.Sequential(nn.Linear(2, 3), nn.ReLU()), in_keys=["x"], out_keys=["y"])
    before = module.module[0].weight.detach().clone()
    assert module.reset_parameters_recursive() is None
    assert not torch.equal(before, module.module[0].weight)
    params = TensorDict.from_module(module).clone()
    kept = params.clone()
    weight = module.module[0].weight.detach().clone()
    reset = module.reset_parameters_recursive(params)
    assert not torch.equal(params["module", "0", "weight"], kept["module", "0", "weight"])
    assert torch.equal(module.module[0].weight, weight)
    assert reset["module", "0", "weight"].requires_grad
    with pytest.raises(RuntimeError):
        module.reset_parameters_recursive(params.expand(2))
    with pytest.warns(UserWarning):
        TensorDictModule(lambda x: x, in_keys=["x"], out_keys=["y"]).reset_parameters_recursive()


# ------------------------------------------------------------------ other collections
def test_tensorclass_input_matches_upstream():
    def build(lib, lnn):
        @lib.tensorclass
        class Data:
            x: torch.Tensor
            y: torch.Tensor = None

        return Data, lnn.TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])

    (cls_up, mod_up), (cls_ours, mod_ours) = both(build)
    x = torch.randn(3)
    data_up, data_ours = cls_up(x=x.clone(), batch_size=[3]), cls_ours(x=x.clone(), batch_size=[3])
    assert mod_up(data_up) is data_up and mod_ours(data_ours) is data_ours
    assert torch.equal(data_up.y, data_ours.y)
    assert torch.equal(mod_ours(x), x + 1)


def test_lazy_stack_and_generic_collections():
    from torchdict import lazy_stack

    module = TensorDictModule(lambda x: x * 2, in_keys=["x"], out_keys=["y"])
    stack = lazy_stack([TensorDict(x=torch.ones(2)), TensorDict(x=torch.zeros(2))])
    out = module(stack)
    assert out is stack and torch.equal(stack["y"], torch.tensor([[2.0, 2.0], [0.0, 0.0]]))
    empty = TensorDictModule(lambda x: x * 2, in_keys=["x"], out_keys=["y"], inplace="empty")(stack)
    assert type(empty) is type(stack) and list(empty.keys()) == ["y"]


# ------------------------------------------------------------------ torch transforms and autograd
def test_vmap_over_inputs_and_parameters():
    torch.manual_seed(0)
    module = TensorDictModule(_mlp(), in_keys=["x"], out_keys=["y"])
    td = TensorDict(x=torch.randn(5, 3), batch_size=[5])
    out = torch.vmap(module)(td.clone())
    assert torch.allclose(out["y"], module.module(td["x"]))
    params = TensorDict.from_modules(*[TensorDictModule(_mlp(), in_keys=["x"], out_keys=["y"]) for _ in range(3)])

    def call(p, data):
        with p.to_module(module):
            return module(data)

    stacked = torch.vmap(call, (0, None))(params, td)
    for i in range(3):
        with params[i].to_module(module):
            assert torch.allclose(stacked["y"][i], module.module(td["x"]), atol=1e-6)


def test_functional_call_and_grads():
    torch.manual_seed(0)
    module = TensorDictModule(_mlp(), in_keys=["x"], out_keys=["y"])
    td = TensorDict(x=torch.randn(4, 3), batch_size=[4])
    zeros = {name: torch.zeros_like(p) for name, p in module.named_parameters()}
    out = torch.func.functional_call(module, zeros, (td.clone(),))
    assert torch.equal(out["y"], torch.zeros(4, 2))
    params = {name: p.detach().clone().requires_grad_() for name, p in module.named_parameters()}
    grads = torch.func.grad(lambda p: torch.func.functional_call(module, p, (td.clone(),))["y"].sum())(params)
    module(td.clone())["y"].sum().backward()
    for name, p in module.named_parameters():
        assert torch.allclose(grads[name], p.grad)


def test_params_swap_with_to_module():
    module = TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
    params = TensorDict.from_module(module)
    with params.apply(torch.zeros_like).to_module(module):
        assert torch.equal(module(TensorDict(x=torch.ones(3)))["y"], torch.zeros(2))
    assert module(TensorDict(x=torch.ones(3)))["y"].abs().sum() > 0


_OLD_TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13)
# On torch 2.11 Dynamo does not trace core TensorDict construction (object.__new__ in TensorDict._new_unsafe, used
# when a nested out key creates its sub-TensorDict): a core limitation, not the module layer's.
_CORE_TRACING = pytest.mark.xfail(_OLD_TORCH, strict=False,
                                  reason="core TensorDict ops do not trace on torch < 2.13 (object.__new__)")


@pytest.mark.slow
@_CORE_TRACING
def test_compile_fullgraph():
    torch.manual_seed(0)
    module = TensorDictModule(_mlp(), in_keys=["x"], out_keys=[("out", "y")])
    td = TensorDict(x=torch.randn(4, 3), batch_size=[4])
    # tracing without graph breaks is what is under test: the "eager" backend skips code generation
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    out = compiled(td.clone())
    assert torch.allclose(out["out", "y"], module.module(td["x"]))


def test_pickle_round_trip():
    module = TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
    copy = pickle.loads(pickle.dumps(module))
    td = TensorDict(x=torch.ones(3))
    assert torch.equal(copy(td.clone())["y"], module(td.clone())["y"])
    lam = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        pytest.skip("cloudpickle is needed to pickle a lambda")
    assert torch.equal(pickle.loads(pickle.dumps(lam))(x=torch.zeros(1)), torch.ones(1))


@pytest.mark.slow
def test_import_torchdict_does_not_import_nn():
    import subprocess
    import sys

    code = "import sys, torchdict; print('torchdict.nn.common' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": "src"})
    assert out.stdout.strip() == "False"


def test_top_level_names():
    assert torchdict.as_tensordict_module is as_tensordict_module
    assert torchdict.TensorClassModuleBase is torchdict.nn.TensorClassModuleBase
    assert torchdict.TensorClassModuleWrapper is torchdict.nn.TensorClassModuleWrapper
    assert WrapModule in TensorDictModuleBase.__subclasses__()
    assert issubclass(TensorDictModuleWrapper, TensorDictModuleBase)
