"""The quick paths of the module layer keep the general paths' behaviour.

A ``TensorDictModule`` keeps a call plan (what a call on a plain TensorDict may take for granted) that any
attribute set drops; a ``TensorDictSequential`` runs a planned child without its ``nn.Module`` call when the
child has no hooks; an ``EnsembleModule`` hands vmap flat lists of tensors. Each test changes what the plan or
the shortcut relies on after a first call, and checks the result against upstream ``tensordict.nn`` (or the
general path) on the same inputs.
"""
import copy
import pickle

import pytest
import torch
from torch import nn

import torchdict
from torchdict import TensorDict, tensorclass
from torchdict.nn import EnsembleModule, TensorDictModule, TensorDictSequential, set_skip_existing

from _nn_helpers import assert_same_output, assert_same_td, both, outcome, pair


def _linear_module(lnn, **kwargs):
    return lnn.TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"], **kwargs)


class _Pair(nn.Module):
    def forward(self, x):
        return x, x + 1


def _three_step_sequence(lnn):
    return lnn.TensorDictSequential(
        lnn.TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["a"]),
        lnn.TensorDictModule(lambda a: a * 2, in_keys=["a"], out_keys=["b"]),
        lnn.TensorDictModule(lambda a, b: a + b, in_keys=["a", "b"], out_keys=["c"]),
    )


def _same_call(up_module, ours_module, data, batch=(4,)):
    td_up, td_ours = pair(data, batch)
    (status_up, out_up), (status_ours, out_ours) = outcome(lambda: up_module(td_up)), outcome(
        lambda: ours_module(td_ours))
    assert status_up == status_ours, (out_up, out_ours)
    if status_up == "ok":
        assert_same_output(out_up, out_ours)
        assert_same_td(td_up, td_ours)
    else:
        assert type(out_up) is type(out_ours)
    return out_ours


# ----------------------------------------------------------------------------------- a module's plan
@pytest.mark.parametrize("change", ["inplace_false", "inplace_empty", "out_keys", "in_keys_in_place",
                                    "method_kwargs_in_place", "strict", "module", "dict_in_keys",
                                    "get_kwargs_in_place", "two_out_keys"])
def test_module_follows_changes_made_after_a_first_call(change):
    up, ours = both(lambda lib, lnn: _linear_module(lnn))
    data = {"x": torch.randn(4, 3), "z": torch.randn(4, 3)}
    _same_call(up, ours, data)  # the plan is made here
    for module in (up, ours):
        if change == "inplace_false":
            module.inplace = False
        elif change == "inplace_empty":
            module.inplace = "empty"
        elif change == "out_keys":
            module.out_keys = ["w"]
        elif change == "in_keys_in_place":
            module.in_keys[0] = "z"
        elif change == "method_kwargs_in_place":
            module.method = "forward"
            module.method_kwargs["input"] = None  # refused by Linear.forward: a TypeError
        elif change == "strict":
            module.strict = True
            module.in_keys = ["missing"]
        elif change == "module":
            torch.manual_seed(1)
            module.module = nn.Linear(3, 5)
        elif change == "dict_in_keys":
            module._kwargs = ["input"]
        elif change == "get_kwargs_in_place":
            module._get_kwargs["default"] = None
            module.in_keys = ["missing"]
        elif change == "two_out_keys":
            module.module = _Pair()
            module.out_keys = ["p", "q"]
    _same_call(up, ours, data)


def test_method_kwargs_edited_in_place_are_passed():
    calls = []

    class Recorder(nn.Module):
        def forward(self, x, scale=1.0):
            calls.append(scale)
            return x * scale

    module = TensorDictModule(Recorder(), in_keys=["x"], out_keys=["y"])
    td = TensorDict(x=torch.ones(2), batch_size=[2])
    module(td)
    module.method_kwargs["scale"] = 3.0
    assert torch.equal(module(td)["y"], torch.full((2,), 3.0))
    assert calls == [1.0, 3.0]


def test_hooks_registered_after_a_first_call_run():
    for lnn_module in (torchdict.nn,):
        module = _linear_module(lnn_module)
        td = TensorDict(x=torch.randn(4, 3), batch_size=[4])
        module(td)
        seen = []
        handle = module.register_forward_hook(lambda mod, args, out: seen.append("hook"))
        pre = module.register_forward_pre_hook(lambda mod, args: seen.append("pre"))
        module(td)
        assert seen == ["pre", "hook"]
        handle.remove()
        pre.remove()
        module(td)
        assert seen == ["pre", "hook"]


def test_plan_is_not_copied_with_the_module():
    module = _linear_module(torchdict.nn)
    td = TensorDict(x=torch.randn(4, 3), batch_size=[4])
    module(td)
    assert "_call_plan" in module.__dict__
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert "_call_plan" not in clone.__dict__
        with torch.no_grad():
            clone.module.weight.zero_()
            clone.module.bias.fill_(1.0)
        assert torch.equal(clone(td.clone())["y"], torch.ones(4, 2))
        assert not torch.equal(module(td.clone())["y"], torch.ones(4, 2))


def test_subclass_changing_the_writes_is_not_planned():
    class Doubling(TensorDictModule):
        def _write_to_tensordict(self, tensordict, tensors, tensordict_out=None, out_keys=None):
            return super()._write_to_tensordict(tensordict, [t * 2 for t in tensors], tensordict_out, out_keys)

    assert TensorDictModule._plain_io and not Doubling._plain_io
    module = Doubling(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
    td = TensorDict(x=torch.zeros(3), batch_size=[3])
    assert torch.equal(module(td)["y"], torch.full((3,), 2.0))
    assert torch.equal(TensorDictSequential(module)(td.clone())["y"], torch.full((3,), 2.0))


def test_errors_of_a_planned_call_match_upstream():
    def failing(x):
        raise ValueError("bad input")

    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(failing, in_keys=["x"], out_keys=["y"]))
    _same_call(up, ours, {"x": torch.zeros(4)})
    td = TensorDict(x=torch.zeros(4), batch_size=[4])
    with pytest.raises(ValueError, match="bad input") as info:
        ours(td)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "in_keys=['x']" in str(info.value.__cause__)
    assert set(td.keys()) == {"x"}
    # Missing input: None is passed, and the error about it names the key.
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda x: x + 1, in_keys=["nope"], out_keys=["y"]))
    _same_call(up, ours, {"x": torch.zeros(4)})
    with pytest.raises(KeyError, match="nope"):
        ours(TensorDict(x=torch.zeros(4), batch_size=[4]))


def test_a_write_that_does_not_fit_is_refused_like_set():
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda x: x[:2], in_keys=["x"], out_keys=["y"]))
    _same_call(up, ours, {"x": torch.zeros(4, 3)})
    locked = TensorDict(x=torch.zeros(4, 3), batch_size=[4]).lock_()
    module = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
    with pytest.raises(RuntimeError):
        module(locked)
    assert set(locked.keys()) == {"x"}


def test_non_tensor_inputs_are_read_as_values():
    up, ours = both(lambda lib, lnn: lnn.TensorDictModule(lambda x, s: x * len(s), in_keys=["x", "s"],
                                                         out_keys=["y"]))
    td_up = __import__("tensordict").TensorDict(x=torch.ones(2), s="abc", batch_size=[2])
    td_ours = TensorDict(x=torch.ones(2), s="abc", batch_size=[2])
    assert_same_td(up(td_up), ours(td_ours))


# ------------------------------------------------------------------------------ a sequence's children
def test_sequence_children_changed_after_a_first_call():
    up, ours = both(lambda lib, lnn: _three_step_sequence(lnn))
    data = {"x": torch.randn(4, 3)}
    _same_call(up, ours, data)
    for seq in (up, ours):
        seq.module[1].inplace = False  # the child now returns a new tensordict holding only "b"
    _same_call(up, ours, data)
    for seq in (up, ours):
        seq.module[1].inplace = True
        seq.module[2].in_keys[1] = "x"
    _same_call(up, ours, data)


@pytest.mark.parametrize("hook", ["forward", "forward_pre", "global_forward", "global_pre", "instance_forward",
                                  "compiled_call"])
def test_sequence_runs_each_childs_hooks(hook):
    seq = _three_step_sequence(torchdict.nn)
    td = TensorDict(x=torch.zeros(2), batch_size=[2])
    seq(td.clone())
    child = seq.module[1]
    seen = []
    handles = []
    if hook == "forward":
        handles.append(child.register_forward_hook(lambda mod, args, out: seen.append(mod)))
    elif hook == "forward_pre":
        handles.append(child.register_forward_pre_hook(lambda mod, args: seen.append(mod)))
    elif hook == "global_forward":
        handles.append(nn.modules.module.register_module_forward_hook(
            lambda mod, args, out: seen.append(mod) if mod is child else None))
    elif hook == "global_pre":
        handles.append(nn.modules.module.register_module_forward_pre_hook(
            lambda mod, args: seen.append(mod) if mod is child else None))
    elif hook == "instance_forward":
        forward = child.forward
        child.forward = lambda tensordict, *a, **k: (seen.append(child), forward(tensordict, *a, **k))[1]
    elif hook == "compiled_call":
        call = child._call_impl
        child._compiled_call_impl = lambda *a, **k: (seen.append(child), call(*a, **k))[1]
    try:
        out = seq(td.clone())
    finally:
        for handle in handles:
            handle.remove()
    assert seen == [child]
    assert torch.equal(out["c"], torch.full((2,), 3.0))


def test_sequence_with_skip_existing_matches_upstream():
    up, ours = both(lambda lib, lnn: _three_step_sequence(lnn))
    data = {"x": torch.zeros(2), "b": torch.full((2,), 7.0)}
    td_up, td_ours = pair(data, (2,))
    with __import__("tensordict").nn.set_skip_existing(True):
        out_up = up(td_up)
    with set_skip_existing(True):
        out_ours = ours(td_ours)
    assert_same_td(out_up, out_ours)
    assert torch.equal(out_ours["c"], torch.full((2,), 8.0))


def test_sequence_failure_puts_the_input_back():
    def failing(c):
        raise RuntimeError("third step")

    seq = TensorDictSequential(
        TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["a"]),
        TensorDictModule(lambda a: a * 2, in_keys=["a"], out_keys=["x"]),  # replaces an input entry
        TensorDictModule(lambda a: a, in_keys=["a"], out_keys=[("nested", "b")]),
        TensorDictModule(failing, in_keys=["x"], out_keys=["d"]),
    )
    for data in ({"x": torch.zeros(2)}, {"x": torch.zeros(2), "a": torch.ones(2), "nested": {"b": torch.ones(2)}}):
        td = TensorDict(data, batch_size=[2])
        before = {key: value for key, value in td.items(True, True)}
        with pytest.raises(RuntimeError, match="third step") as info:
            seq(td)
        assert any("Failed while executing module '3'" in note for note in getattr(info.value, "__notes__", []))
        after = {key: value for key, value in td.items(True, True)}
        assert sorted(after, key=str) == sorted(before, key=str)
        assert all(after[key] is before[key] for key in before)


def test_sequence_failure_with_str_keys_only_puts_the_input_back():
    seq = TensorDictSequential(
        TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["a"]),
        TensorDictModule(lambda a: a * 2, in_keys=["a"], out_keys=["x"]),
        TensorDictModule(lambda a: a[:1], in_keys=["a"], out_keys=["b"]),  # does not fit the batch
    )
    td = TensorDict(x=torch.zeros(2), b=torch.ones(2), batch_size=[2])
    x, b = td["x"], td["b"]
    with pytest.raises(RuntimeError):
        seq(td)
    assert set(td.keys()) == {"x", "b"} and td["x"] is x and td["b"] is b


def test_sequence_of_mixed_children_matches_upstream():
    def build(lib, lnn):
        class Scale(lnn.TensorDictModuleBase):
            in_keys = ["a"]
            out_keys = ["s"]

            def forward(self, tensordict):
                tensordict.set("s", tensordict.get("a") * 3)
                return tensordict

        return lnn.TensorDictSequential(
            lnn.TensorDictModule(nn.Linear(3, 3), in_keys=["x"], out_keys=["a"]),
            Scale(),
            lambda td: td.set("t", td.get("s") + 1),
            lnn.TensorDictModule(lambda s, t: (s, t), in_keys=["s", "t"], out_keys=[("out", "s"), "_"]),
            lnn.TensorDictModule(nn.Linear(3, 1), in_keys=["a"], out_keys=["v"], inplace=False),
        )

    up, ours = both(build)
    _same_call(up, ours, {"x": torch.randn(5, 3)}, (5,))


def test_sequence_on_a_lazy_stack_and_a_tensorclass_input():
    up, ours = both(lambda lib, lnn: _three_step_sequence(lnn))
    import tensordict as upstream

    members = [{"x": torch.randn(3)}, {"x": torch.randn(3)}]
    out_up = up(upstream.lazy_stack([upstream.TensorDict(m, batch_size=[3]) for m in members]))
    out_ours = ours(torchdict.lazy_stack([TensorDict(m, batch_size=[3]) for m in members]))
    assert_same_td(out_up, out_ours)

    @tensorclass
    class Data:
        x: torch.Tensor
        a: torch.Tensor = None
        b: torch.Tensor = None
        c: torch.Tensor = None

    out = ours(Data(x=torch.zeros(2), batch_size=[2]))
    assert type(out) is Data and torch.equal(out.c, torch.full((2,), 3.0))


# --------------------------------------------------------------------------------------- ensembles
def _ensemble(num_copies=3, expand_input=True, module=None):
    torch.manual_seed(0)
    module = module if module is not None else TensorDictModule(
        nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), in_keys=["x"], out_keys=[("out", "y")])
    return EnsembleModule(module, num_copies=num_copies, expand_input=expand_input)


def _general_path(ensemble, tensordict):
    params = ensemble.params_td._param_td
    return ensemble.vmapped_forward(tensordict, [params[key] for key in ensemble._param_keys])


def _assert_same(a, b):
    assert type(a) is type(b) and a.batch_size == b.batch_size
    assert sorted(a.keys(True, True), key=str) == sorted(b.keys(True, True), key=str)
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y) and x.stride() == y.stride(), key
        else:
            assert x == y, key


@pytest.mark.parametrize("expand_input", [True, False])
@pytest.mark.parametrize("batch", [(), (5,), (2, 3)])
def test_ensemble_matches_its_general_path(expand_input, batch):
    ensemble = _ensemble(expand_input=expand_input)
    shape = batch if expand_input else (3, *batch)
    td = TensorDict(x=torch.randn(*shape, 3), meta={"z": torch.randn(*shape, 1)}, note="text",
                    batch_size=shape)
    _assert_same(ensemble(td), _general_path(ensemble, td))
    assert set(td.keys()) == {"x", "meta", "note"}  # the input is left as it was


def test_ensemble_grads_match_its_general_path():
    ensemble = _ensemble()
    td = TensorDict(x=torch.randn(4, 3, requires_grad=True), batch_size=[4])
    grads = []
    for run in (ensemble, lambda td: _general_path(ensemble, td)):
        ensemble.zero_grad()
        td["x"].grad = None
        out = run(td)
        (out["out", "y"].sum() + out["x"].pow(2).sum()).backward()
        copies = [p for name, p in ensemble.named_parameters() if name.startswith("params_td")]
        grads.append([p.grad.clone() for p in copies] + [td["x"].grad.clone()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_ensemble_with_a_tensorclass_input_and_a_tensor_output():
    @tensorclass
    class Obs:
        x: torch.Tensor
        y: torch.Tensor = None

    class Head(torchdict.nn.TensorDictModuleBase):
        in_keys = ["x"]
        out_keys = ["y"]

        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, tensordict):
            return self.linear(tensordict.x if isinstance(tensordict, Obs) else tensordict["x"])

    ensemble = _ensemble(module=Head())
    obs = Obs(x=torch.randn(5, 3), batch_size=[5])
    out = ensemble(obs)
    assert type(out) is torch.Tensor and out.shape == (3, 5, 2)
    assert torch.equal(out, _general_path(ensemble, obs))
    module = TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
    ensemble = _ensemble(module=module)
    out = ensemble(obs)
    assert type(out) is Obs and out.batch_size == (3, 5) and out.y.shape == (3, 5, 2)
    expected = _general_path(ensemble, obs)
    assert torch.equal(out.x, expected.x) and out.x.stride() == expected.x.stride()
    assert torch.equal(out.y, expected.y)


def test_ensemble_refuses_a_wrong_number_of_copies_like_vmap():
    ensemble = _ensemble(expand_input=False)
    td = TensorDict(x=torch.randn(2, 3), batch_size=[2])
    with pytest.raises(ValueError):
        ensemble(td)
    with pytest.raises(ValueError):
        _general_path(ensemble, td)


def test_ensemble_uses_a_submodule_replaced_after_a_call():
    ensemble = _ensemble()
    td = TensorDict(x=torch.randn(4, 3), batch_size=[4])
    ensemble(td)
    ensemble.module.module[1] = nn.ReLU()
    expected = _general_path(ensemble, td)
    _assert_same(ensemble(td), expected)


def test_ensemble_keeps_a_replaced_vmapped_forward():
    ensemble = _ensemble()
    calls = []
    general = torch.vmap(ensemble._func_module_call, (None, 0), chunk_size=1)

    def chunked(tensordict, params):
        calls.append(len(params))
        return general(tensordict, params)

    ensemble.vmapped_forward = chunked
    td = TensorDict(x=torch.randn(4, 3), batch_size=[4])
    out = ensemble(td)
    assert calls == [len(ensemble._param_keys)] and out["out", "y"].shape == (3, 4, 2)


@pytest.mark.slow
def test_compiled_module_and_sequence_trace_once_without_a_first_eager_call():
    import torch._dynamo as dynamo

    torch.manual_seed(0)
    first = TensorDictModule(nn.Linear(3, 4), in_keys=["x"], out_keys=["h"])
    second = TensorDictModule(nn.Linear(4, 2), in_keys=["h"], out_keys=["y"])
    for module in (TensorDictModule(nn.Linear(3, 2), in_keys=["x"], out_keys=["y"]),
                   TensorDictSequential(first, second)):
        dynamo.reset()
        graphs = []

        def backend(graph, example_inputs):
            graphs.append(graph)
            return graph.forward

        compiled = torch.compile(module, fullgraph=True, backend=backend)
        with dynamo.config.patch(error_on_recompile=True):
            for seed in range(3):
                torch.manual_seed(seed)
                td = TensorDict(x=torch.randn(5, 3), batch_size=[5])
                got = compiled(td.clone())["y"]  # traced before any eager call made a plan
                assert torch.allclose(got, module(td)["y"])
        assert len(graphs) == 1
