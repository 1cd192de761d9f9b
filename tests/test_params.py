"""TensorDictParams, stated against plain torch.nn modules and Parameters."""
import copy
import pickle

import pytest
import torch
from torch import nn

from torchdict import TensorDict, is_tensor_collection
from torchdict._params import TensorDictParams

from _helpers import assert_same_snapshot, snapshot


def _td() -> TensorDict:
    torch.manual_seed(0)
    return TensorDict({
        "w": torch.randn(3),
        "steps": torch.zeros((), dtype=torch.long),
        "sub": {"x": torch.randn(2, 2), "deep": {"y": torch.randn(1)}},
    })


def _float_leaves(params) -> dict:
    return {".".join(key) if isinstance(key, tuple) else key: leaf
            for key, leaf in params.items(True, True) if leaf.is_floating_point()}


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


# ----------------------------------------------------------------------------------- registration


def test_float_leaves_are_the_named_parameters_same_objects_dotted_names():
    td = _td()
    storage = {key: leaf.data_ptr() for key, leaf in td.items(True, True)}
    params = TensorDictParams(td)
    named = dict(params.named_parameters())
    assert list(named) == ["w", "sub.x", "sub.deep.y"]
    for name, leaf in _float_leaves(params).items():
        assert named[name] is leaf, name
        assert type(leaf) is nn.Parameter and leaf.requires_grad and leaf.is_leaf
    assert dict(params.named_buffers()) == {"steps": params["steps"]}
    # The given TensorDict is the one held: its leaves became those Parameters, same storage.
    assert td["sub", "x"] is params["sub", "x"]
    assert {key: leaf.data_ptr() for key, leaf in td.items(True, True)} == storage
    assert list(params.keys()) == ["w", "steps", "sub"]
    assert params.w is params["w"]


@pytest.mark.parametrize("dtype, is_param", [
    (torch.float16, True), (torch.float32, True), (torch.float64, True),
    (torch.bfloat16, False), (torch.complex64, False), (torch.int32, False), (torch.bool, False)])
def test_which_dtypes_become_parameters(dtype, is_param):
    params = TensorDictParams(TensorDict(a=torch.zeros(2, dtype=dtype)))
    assert ("a" in dict(params.named_parameters())) is is_param
    assert ("a" in dict(params.named_buffers())) is not is_param
    assert (type(params["a"]) is nn.Parameter) is is_param


def test_parameters_and_buffers_are_kept_as_they_are():
    frozen = nn.Parameter(torch.ones(2), requires_grad=False)
    marked = nn.Buffer(torch.ones(2))
    params = TensorDictParams(TensorDict(p=frozen, b=marked, plain=torch.ones(2)))
    assert params["p"] is frozen and not frozen.requires_grad
    assert dict(params.named_buffers()) == {"b": params["b"]}
    # A plain float tensor that did not track gradients becomes a trainable Parameter (as upstream).
    assert params["plain"].requires_grad


def test_no_convert_registers_plain_tensors_as_buffers():
    weight, param = torch.randn(3), nn.Parameter(torch.ones(1))
    params = TensorDictParams(TensorDict(w=weight, p=param), no_convert=True)
    assert params["w"] is weight and params["p"] is param
    assert list(dict(params.named_parameters())) == ["p"]
    assert list(dict(params.named_buffers())) == ["w"]
    params["new"] = torch.ones(2)
    assert list(dict(params.named_buffers())) == ["w", "new"]


def test_setting_and_deleting_keys_registers_and_forgets_them():
    params = TensorDictParams(_td())
    old = params["w"]
    params["w"] = torch.zeros(3)
    params["sub", "z"] = torch.ones(2)
    params.set("count", torch.ones(1, dtype=torch.long))
    named = dict(params.named_parameters())
    assert named["w"] is params["w"] and named["w"] is not old and type(named["w"]) is nn.Parameter
    assert named["sub.z"] is params["sub", "z"]
    assert dict(params.named_buffers())["count"] is params["count"]
    assert params.update({"u": torch.ones(1)}) is params and "u" in dict(params.named_parameters())
    del params["sub", "z"]
    popped = params.pop("u")
    assert type(popped) is nn.Parameter
    assert list(dict(params.named_parameters())) == ["w", "sub.x", "sub.deep.y"]


def test_writes_into_a_nested_tensordict_are_not_registered():
    params = TensorDictParams(_td())
    params["sub"]["late"] = torch.ones(2)  # bypasses the module, as upstream
    assert "sub.late" not in dict(params.named_parameters())
    assert type(params["sub", "late"]) is torch.Tensor


def test_tensordict_side():
    params = TensorDictParams(_td())
    assert is_tensor_collection(params) and isinstance(params, nn.Module)
    assert params.batch_size == torch.Size([]) and ("sub", "deep", "y") in params
    assert len(params) == 0 and bool(params)  # len is the TensorDict's; truthiness the module's
    detached = params.detach()
    assert type(detached) is TensorDict and type(detached["w"]) is torch.Tensor
    assert not detached["w"].requires_grad and detached["w"].data_ptr() == params["w"].data_ptr()
    data = params.data
    assert type(data) is TensorDict and type(data["sub", "x"]) is torch.Tensor
    data.zero_()
    assert (params["sub", "x"] == 0).all()
    doubled = params.apply(lambda t: t * 2)
    assert type(doubled) is TensorDict and doubled["w"].grad_fn is not None
    assert "TensorDictParams(params=TensorDict(" in repr(params)


def test_clone_keeps_kinds_with_new_leaves():
    params = TensorDictParams(TensorDict(w=nn.Parameter(torch.ones(2), requires_grad=False), i=torch.ones(1).long(),
                                         sub={"x": torch.ones(3)}))
    clone = params.clone()
    assert type(clone) is TensorDictParams
    assert list(dict(clone.named_parameters())) == ["w", "sub.x"]
    assert list(dict(clone.named_buffers())) == ["i"]
    assert not clone["w"].requires_grad and clone["sub", "x"].requires_grad and clone["sub", "x"].is_leaf
    for key, leaf in params.items(True, True):
        assert clone[key] is not leaf and torch.equal(clone[key], leaf)
        assert clone[key].data_ptr() != leaf.data_ptr()


def test_lock():
    params = TensorDictParams(_td(), lock=True)
    assert params.is_locked
    before = snapshot(params._param_td)
    with pytest.raises(RuntimeError, match="locked"):
        params["new"] = torch.zeros(())
    assert_same_snapshot(before, snapshot(params._param_td))
    assert "new" not in dict(params.named_parameters())


# --------------------------------------------------------------------------------- module side


def test_sgd_step_updates_the_tensordict_like_plain_parameters():
    params = TensorDictParams(_td())
    reference = {name: nn.Parameter(leaf.detach().clone()) for name, leaf in params.named_parameters()}
    for named in (dict(params.named_parameters()), reference):
        loss = sum((leaf ** 2).sum() for leaf in named.values())
        loss.backward()
    torch.optim.SGD(params.parameters(), lr=0.1).step()
    torch.optim.SGD(reference.values(), lr=0.1).step()
    for name, leaf in _float_leaves(params).items():
        assert torch.equal(leaf, reference[name]), name
    params.zero_grad()
    assert all(leaf.grad is None for leaf in params.parameters())


def test_double_moves_both_views_in_place():
    params = TensorDictParams(_td())
    weight = params["w"]
    assert params.double() is params
    assert params["w"] is weight and params["w"].dtype == torch.float64  # Parameters keep their identity
    assert params["steps"].dtype == torch.long  # like nn.Module: integer buffers are not cast
    for name, tensor in [*params.named_parameters(), *params.named_buffers()]:
        key = tuple(name.split("."))
        assert params[key] is tensor, name
    plain = nn.Linear(2, 2).double()
    assert all(p.dtype == torch.float64 for p in plain.parameters())


def test_a_parent_modules_to_reaches_the_tensordict():
    parent = nn.Module()
    parent.params = TensorDictParams(_td(), no_convert=True)
    parent.to(torch.float16)
    for name, buffer in parent.params.named_buffers():
        assert parent.params[tuple(name.split("."))] is buffer, name  # buffers are new objects
    assert parent.params["sub", "x"].dtype == torch.float16
    assert [name for name, _ in parent.named_buffers()][:2] == ["params.w", "params.steps"]


def test_state_dict_round_trip():
    source, target = TensorDictParams(_td()), TensorDictParams(_td().apply(torch.zeros_like))
    state = source.state_dict()
    assert list(state) == ["w", "sub.x", "sub.deep.y", "steps"]
    kept = {key: leaf for key, leaf in target.items(True, True)}
    target.load_state_dict(state)
    for key, leaf in target.items(True, True):
        assert leaf is kept[key] and torch.equal(leaf, source[key]), key
    assigned = TensorDictParams(_td().apply(torch.zeros_like))
    assigned.load_state_dict(state, assign=True)
    named = dict(assigned.named_parameters())
    assert torch.equal(assigned["sub", "x"], source["sub", "x"]) and named["sub.x"] is assigned["sub", "x"]
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "extra"'):
        target.load_state_dict({**state, "extra": torch.zeros(1)})
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "sub.x"'):
        target.load_state_dict({key: value for key, value in state.items() if key != "sub.x"})


def test_deepcopy_and_pickle_keep_one_set_of_tensors():
    params = TensorDictParams(_td())
    for other in (copy.deepcopy(params), pickle.loads(pickle.dumps(params))):
        named = dict(other.named_parameters())
        assert named["sub.x"] is other["sub", "x"] and other["sub", "x"] is not params["sub", "x"]
        assert torch.equal(other["sub", "x"], params["sub", "x"])
        assert other.training and dict(other.named_buffers())["steps"] is other["steps"]


def test_train_eval_and_repr_inside_a_parent():
    parent = nn.Sequential(nn.Linear(2, 2))
    parent.add_module("params", TensorDictParams(TensorDict(a=torch.ones(1))))
    parent.eval()
    assert not parent.params.training
    assert "(params): TensorDictParams(params=TensorDict(" in repr(parent)


# ------------------------------------------------------------------------------ torchrl usage


def test_to_module_and_functional_call_match_a_module_with_those_weights():
    actor, twin = _mlp(0), _mlp(1)
    params = TensorDictParams(TensorDict.from_module(twin).apply(lambda t: t.detach().clone()))
    x = torch.randn(5, 3)
    expected = twin(x)
    with params.to_module(actor):
        assert actor[0].weight is params["0", "weight"]
        assert torch.equal(actor(x), expected)
    assert actor[0].weight is not params["0", "weight"]
    functional = torch.func.functional_call(actor, dict(params.named_parameters()), (x,))
    assert torch.equal(functional, expected)
    # Gradients reach the held Parameters.
    with params.to_module(actor):
        actor(x).sum().backward()
    assert params["0", "weight"].grad is not None and actor[0].weight.grad is None


def test_from_module_leaves_are_kept():
    actor = _mlp()
    params = TensorDictParams(TensorDict.from_module(actor))
    assert params["0", "weight"] is actor[0].weight
    assert list(dict(params.named_parameters())) == [name for name, _ in actor.named_parameters()]


def test_wrapping_another_tensordictparams_shares_leaves_not_the_tensordict():
    first = TensorDictParams(_td())
    second = TensorDictParams(first)
    assert second["sub", "x"] is first["sub", "x"] and second._param_td is not first._param_td
    second["extra"] = torch.ones(1)
    assert "extra" not in first


# ----------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("bad", [torch.zeros(2), nn.Linear(2, 2), [torch.zeros(1)]])
def test_non_tensordict_input_raises_type_error(bad):
    with pytest.raises(TypeError, match="TensorDictParams expects a TensorDict, got"):
        TensorDictParams(bad)


def test_dotted_or_empty_keys_are_refused_before_anything_changes():
    td = TensorDict({"w": torch.ones(2), "a.b": torch.zeros(1)})
    before = snapshot(td)
    with pytest.raises(ValueError, match="'a.b' cannot name a parameter"):
        TensorDictParams(td)
    assert_same_snapshot(before, snapshot(td))
    assert type(td["w"]) is torch.Tensor  # nothing was converted
    params = TensorDictParams(_td())
    before = snapshot(params._param_td)
    with pytest.raises(ValueError, match="cannot name a parameter"):
        params["x.y"] = torch.ones(1)
    assert_same_snapshot(before, snapshot(params._param_td))


def test_from_module_of_tensordictparams_nests_like_the_tensordict():
    module = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    params = TensorDict.from_module(module, as_module=True)
    again = TensorDict.from_module(params)
    assert type(again) is TensorDict and again["0", "weight"] is module[0].weight
    parent = nn.Module()
    parent.params, parent.lin = params, nn.Linear(1, 1)
    assert list(TensorDict.from_module(parent).keys(True, True))[:2] == [("params", "0", "weight"),
                                                                       ("params", "0", "bias")]
