"""torch.compile over TensorDicts and tensorclasses: every core op traces with ``fullgraph=True``.

Each op is compiled with Dynamo (the "eager" backend: tracing is what is under test; a few
run with inductor too, marked slow) and must give what the same call gives eagerly, also
for what it changes in its inputs. The C helpers step aside under tracing (see
docs/compile.md); the suite runs again with TORCHDICT_PURE_PYTHON=1, which traces the
pure-Python twins instead.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Callable

import pytest
import torch

torch_dynamo = pytest.importorskip("torch._dynamo")

from torchdict import TensorDict, TensorDictBase, _accel, is_tensor_collection, tensorclass  # noqa: E402


@tensorclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


def _td(seed: int = 0) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    return TensorDict({"a": torch.randn(3, 4, generator=generator),
                       "b": {"c": torch.randn(3, generator=generator),
                             "d": torch.randint(0, 5, (3, 2), generator=generator)}}, batch_size=[3])


def _flat(seed: int = 0) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    return TensorDict({"a": torch.randn(3, 4, generator=generator), "c": torch.randn(3, generator=generator)},
                      batch_size=[3])


def _pair(seed: int = 0) -> Any:
    generator = torch.Generator().manual_seed(seed)
    return Pair(torch.randn(3, 4, generator=generator), torch.randn(3, generator=generator), batch_size=[3])


def _images(seed: int = 0) -> TensorDict:
    """A 4-D leaf (what ``memory_format`` applies to) beside a 2-D one."""
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(image=torch.randn(2, 3, 4, 5, generator=generator), flat=torch.randn(2, 3, generator=generator),
                      batch_size=[2])


def _tensors(seed: int = 0) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(3, 4, generator=generator), torch.randn(3, generator=generator)


def assert_same(got: Any, expected: Any, exact: bool = True) -> None:
    """Same type, structure, batch, device, lock and values (bit for bit unless ``exact=False``)."""
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape and got.device == expected.device
        if exact:
            assert torch.equal(got, expected)
        else:
            torch.testing.assert_close(got, expected)
    elif is_tensor_collection(expected):
        got_td = got if isinstance(got, TensorDictBase) else got._tensordict
        expected_td = expected if isinstance(expected, TensorDictBase) else expected._tensordict
        assert got_td.batch_size == expected_td.batch_size and got_td.device == expected_td.device
        assert got_td.is_locked == expected_td.is_locked
        keys = list(expected_td.keys(True, True))
        assert list(got_td.keys(True, True)) == keys
        for key in keys:
            assert_same(got_td.get(key), expected_td.get(key), exact)
        if not isinstance(expected, TensorDictBase):  # a tensorclass: its fields read as the TensorDict holds them
            assert got.__dict__ is got._tensordict._tensordict
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for got_item, expected_item in zip(got, expected):
            assert_same(got_item, expected_item, exact)
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same(got[key], expected[key], exact)
    else:
        assert got == expected


# ---------------------------------------------------------------------------- the ops
def _set_key(td: Any, value: torch.Tensor) -> Any:
    td["e"] = value
    return td


def _set_nested(td: Any, value: torch.Tensor) -> Any:
    td["b", "e"] = value
    td.set(("f", "g"), value * 2)
    return td


def _set_index(td: Any, row: Any) -> Any:
    td[0] = row
    return td


def _set_mask(td: Any, mask: torch.Tensor) -> Any:
    td[mask] = 0
    return td


def _clone_then_set(td: Any) -> Any:
    out = td.clone()
    out["e"] = out["a"].sum(-1)
    return out


def _inplace_ops(td: Any) -> Any:
    td.add_(1)
    td.mul_(2)
    td += 1
    return td


def _update(td: Any, other: Any) -> Any:
    return td.update(other)


def _update_dict(td: Any, value: torch.Tensor) -> Any:
    return td.update({"z": value, "b": {"w": value}})


def _lock(td: Any) -> Any:
    td.lock_()
    return td, td.is_locked


def _lock_unlock(td: Any) -> Any:
    return td.lock_().unlock_().is_locked


def _items(td: Any) -> list:
    return [(key, value + 1) for key, value in td.items(True, True)]


def _keys(td: Any) -> list:
    return [td[key] * 2 for key in td.keys(True, True)]


def _build(x: torch.Tensor, y: torch.Tensor) -> Any:
    td = TensorDict({"a": x, "b": {"c": y}}, batch_size=[3])
    return td["b", "c"] + td.get("a").sum(-1), td


def _build_kwargs(x: torch.Tensor, y: torch.Tensor) -> Any:
    return TensorDict(a=x, b=y, batch_size=[3])


def _local_td(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    td = TensorDict({"a": x, "c": y}, batch_size=[3])  # a local only: the output is a tensor
    return (td * 2).apply(torch.sin)["a"].sum()


def _named_apply(td: Any) -> Any:
    return td.named_apply(lambda key, value: value * 2 if key == "a" else value)


def _apply_nested(td: Any) -> Any:
    return td.apply(lambda value: value.float() * 2)


def _apply_two(td: Any, other: Any) -> Any:
    return td.apply(lambda a, b: a + b, other)


def _pair_setattr(pair: Any, value: torch.Tensor) -> Any:
    pair.x = value
    return pair


def _pair_build(x: torch.Tensor, y: torch.Tensor) -> Any:
    return Pair(x, y, batch_size=[3])


def _pair_build_kwargs(x: torch.Tensor, y: torch.Tensor) -> Any:
    return Pair(x=x, y=y, batch_size=[3])


def _pair_local(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    pair = Pair(x, y, batch_size=[3])
    return pair[1].x + pair[1:].y.sum()


def _pair_in_td(pair: Any) -> Any:
    return TensorDict({"pair": pair, "z": pair.y}, batch_size=[3])["pair"].x


def _stack_view(td: Any) -> Any:
    return torch.stack([td, td]).view(-1)


CASES: dict = {
    # construction, as output and as a local
    "construct": (_build, lambda: _tensors()),
    "construct_kwargs": (_build_kwargs, lambda: _tensors()),
    "local_only": (_local_td, lambda: _tensors()),
    # get / set, flat and nested
    "get": (lambda td: td.get("a") + 1, lambda: (_td(),)),
    "get_nested": (lambda td: td.get(("b", "c")) + td["b"]["c"], lambda: (_td(),)),
    "get_default": (lambda td: td.get("missing", None) is None, lambda: (_td(),)),
    "getitem_key": (lambda td: td["a"] * 2, lambda: (_td(),)),
    "getitem_nested_key": (lambda td: td["b", "c"] * 2, lambda: (_td(),)),
    "set_key": (_set_key, lambda: (_td(), torch.ones(3))),
    "set_nested": (_set_nested, lambda: (_td(), torch.ones(3))),
    # td[idx] and td[idx] = v
    "index_int": (lambda td: td[0], lambda: (_td(),)),
    "index_negative": (lambda td: td[-1], lambda: (_td(),)),
    "index_slice": (lambda td: td[1:], lambda: (_td(),)),
    "index_tensor": (lambda td, index: td[index], lambda: (_td(), torch.tensor([0, 2]))),
    "index_mask": (lambda td, mask: td[mask], lambda: (_td(), torch.tensor([True, False, True]))),
    "index_tuple": (lambda td: td.unsqueeze(-1)[1:, 0], lambda: (_td(),)),
    "setitem_int": (_set_index, lambda: (_td(), _td(1)[1])),
    "setitem_mask": (_set_mask, lambda: (_flat(), torch.tensor([True, False, True]))),
    # arithmetic and comparisons
    "add_number": (lambda td: td + 1, lambda: (_td(),)),
    "radd": (lambda td: 1 + td, lambda: (_flat(),)),
    "mul_td": (lambda td, other: td * other, lambda: (_flat(), _flat(1))),
    "sub_tensor_method": (lambda td, t: td.sub(t), lambda: (_flat(), torch.arange(3.0))),
    "div_neg": (lambda td: -(td / 2), lambda: (_flat(),)),
    "inplace": (_inplace_ops, lambda: (_flat(),)),
    "eq": (lambda td, other: td == other, lambda: (_flat(), _flat(1))),
    "gt_number": (lambda td: td > 0, lambda: (_flat(),)),
    "le_ne": (lambda td, other: (td <= other, td != other), lambda: (_flat(), _flat(1))),
    "unary": (lambda td: td.abs().exp().sqrt(), lambda: (_flat(),)),
    # apply / named_apply
    "apply": (lambda td: td.apply(lambda value: value * 2), lambda: (_td(),)),
    "apply_nested_cast": (_apply_nested, lambda: (_td(),)),
    "apply_two": (_apply_two, lambda: (_flat(), _flat(1))),
    "apply_torch_fn": (lambda td: td.apply(torch.sin), lambda: (_flat(),)),
    "named_apply": (_named_apply, lambda: (_td(),)),
    # stack / cat
    "stack": (lambda td: torch.stack([td, td], 0), lambda: (_td(),)),
    "stack_dim1": (lambda td: torch.stack([td, td], 1), lambda: (_td(),)),
    "cat": (lambda td, other: torch.cat([td, other], 0), lambda: (_td(), _td(1))),
    "stack_view": (_stack_view, lambda: (_td(),)),
    # shape ops
    "view": (lambda td: td.view(-1), lambda: (_td(),)),
    "view_shape": (lambda td: td.unsqueeze(0).view(3, 1), lambda: (_td(),)),
    "reshape": (lambda td: td.reshape(3, 1), lambda: (_td(),)),
    "permute": (lambda td: td.unsqueeze(0).permute(1, 0), lambda: (_td(),)),
    "unsqueeze": (lambda td: td.unsqueeze(-1), lambda: (_td(),)),
    "squeeze": (lambda td: td.unsqueeze(0).squeeze(0), lambda: (_td(),)),
    "transpose": (lambda td: td.unsqueeze(1).transpose(0, 1), lambda: (_td(),)),
    "flatten": (lambda td: td.unsqueeze(1).flatten(0, 1), lambda: (_td(),)),
    # copies and moves
    "clone": (lambda td: td.clone(), lambda: (_td(),)),
    "clone_then_set": (_clone_then_set, lambda: (_td(),)),
    "to_cpu": (lambda td: td.to("cpu"), lambda: (_td(),)),
    "to_dtype": (lambda td: td.to(torch.float64), lambda: (_td(),)),
    "to_memory_format": (lambda td: td.to(memory_format=torch.channels_last), lambda: (_images(),)),
    "to_dtype_memory_format": (lambda td: td.to(torch.float64, memory_format=torch.channels_last),
                               lambda: (_images(),)),
    "to_other": (lambda td: td.to(other=TensorDict(x=torch.zeros(1, dtype=torch.float16))), lambda: (_td(),)),
    "to_cast_filter": (lambda td: td.to(torch.float64, cast_filter=lambda key, leaf: leaf.is_floating_point()),
                       lambda: (_td(),)),
    "to_inplace": (lambda td: td.to(torch.float64, inplace=True), lambda: (_td(),)),
    "to_batch_size": (lambda td: td.to(torch.float64, batch_size=[3]), lambda: (_td(),)),
    "float": (lambda td: td.float(), lambda: (_td(),)),
    "detach": (lambda td: td.detach(), lambda: (_td(),)),
    # update
    "update": (_update, lambda: (_td(), TensorDict({"z": torch.ones(3), "b": {"c": torch.zeros(3)}}, [3]))),
    "update_dict": (_update_dict, lambda: (_td(), torch.ones(3))),
    # keys
    "select": (lambda td: td.select("a", ("b", "c")), lambda: (_td(),)),
    "exclude": (lambda td: td.exclude(("b", "d")), lambda: (_td(),)),
    "keys": (_keys, lambda: (_td(),)),
    "keys_list": (lambda td: list(td.keys(True, True)), lambda: (_td(),)),
    "items": (_items, lambda: (_flat(),)),
    "values": (lambda td: [value.sum() for value in td.values()], lambda: (_flat(),)),
    "contains": (lambda td: ("a" in td.keys(), ("b", "c") in td.keys(True)), lambda: (_td(),)),
    "len_batch": (lambda td: (len(td), td.batch_size, td.shape[0], td.ndim), lambda: (_td(),)),
    # lock
    "lock": (_lock, lambda: (_td(),)),
    "lock_unlock": (_lock_unlock, lambda: (_td(),)),
    # tensorclass
    "tc_construct": (_pair_build, lambda: _tensors()),
    "tc_construct_kwargs": (_pair_build_kwargs, lambda: _tensors()),
    "tc_local": (_pair_local, lambda: _tensors()),
    "tc_getattr": (lambda pair: pair.x * 2 + pair.y.unsqueeze(-1), lambda: (_pair(),)),
    "tc_setattr": (_pair_setattr, lambda: (_pair(), torch.ones(3, 4))),
    "tc_index": (lambda pair: pair[0], lambda: (_pair(),)),
    "tc_slice": (lambda pair: pair[1:], lambda: (_pair(),)),
    "tc_index_tensor": (lambda pair, index: pair[index], lambda: (_pair(), torch.tensor([2, 0]))),
    "tc_arithmetic": (lambda pair: pair * 2 + 1, lambda: (_pair(),)),
    "tc_clone_apply": (lambda pair: pair.clone().apply(torch.cos), lambda: (_pair(),)),
    "tc_stack": (lambda pair: torch.stack([pair, pair]), lambda: (_pair(),)),
    "tc_in_td": (_pair_in_td, lambda: (_pair(),)),
    "tc_to_tensordict": (lambda pair: pair.to_tensordict(), lambda: (_pair(),)),
}


def _compile(fn: Callable, backend: str = "eager") -> Callable:
    return torch.compile(fn, fullgraph=True, backend=backend)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch_dynamo.reset()
    yield
    torch_dynamo.reset()


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_compiles_with_fullgraph_and_equals_eager(name: str) -> None:
    fn, make_inputs = CASES[name]
    eager_inputs, compiled_inputs = make_inputs(), make_inputs()
    expected = fn(*eager_inputs)
    got = _compile(fn)(*compiled_inputs)
    assert_same(got, expected)
    assert_same(list(compiled_inputs), list(eager_inputs))  # what the op changed in its inputs


def test_module_forwards_compile() -> None:
    from torchdict.nn import TensorDictModule, TensorDictSequential

    torch.manual_seed(0)
    first = TensorDictModule(torch.nn.Linear(4, 5), in_keys=["a"], out_keys=["h"])
    second = TensorDictModule(torch.nn.Linear(5, 2), in_keys=["h"], out_keys=[("out", "y")])
    model = TensorDictSequential(first, second)
    for module in (first, model):
        torch_dynamo.reset()
        expected = module(_td())
        assert_same(_compile(module)(_td()), expected)


# ---------------------------------------------------------------------------- graph breaks, recompiles
def _pipeline(td: Any, pair: Any) -> Any:
    out = (td[1:] * 2).apply(torch.relu)
    out["s"] = out["a"].sum(-1) + out["b", "c"]
    joined = torch.stack([out, out.clone()], 0).view(-1)
    moved = pair[0].to(torch.float64)
    return joined.select("s", ("b", "c")), moved.x.sum(), TensorDict(total=out["s"].sum())


def test_a_pipeline_has_no_graph_break() -> None:
    explanation = torch_dynamo.explain(_pipeline)(_td(), _pair())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_new_tensor_values_do_not_recompile() -> None:
    graphs: list = []

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(graph)
        return graph.forward

    compiled = torch.compile(_pipeline, fullgraph=True, backend=counting_backend)
    with torch_dynamo.config.patch(error_on_recompile=True):
        for seed in range(3):
            assert_same(compiled(_td(seed), _pair(seed)), _pipeline(_td(seed), _pair(seed)))
    assert len(graphs) == 1


def test_eager_fast_paths_stay_after_compiling() -> None:
    _compile(lambda td: td["a"] + td[0]["b", "c"])(_td())
    if _accel.USING_C:
        assert "__getitem__" in _accel.fronted_slots(TensorDict)
        assert set(_accel.fronted_slots(Pair)) == {"__getitem__", "__init__"}
    td = _td()
    assert td["a"] is td._tensordict["a"] and torch.equal(Pair(*_tensors(), batch_size=[3])[1].y, _tensors()[1][1])


def test_the_twins_are_registered_with_dynamo() -> None:
    from torchdict import _compile as compile_support

    registered = compile_support.registered()
    assert _accel.py_tensor_len in registered
    from torchdict.tensorclass._fields import set_instance_dict, set_td

    assert set_td in registered and set_instance_dict in registered
    if _accel.USING_C:
        assert _accel._C.leaves_fit in registered and _accel._C.collect_tree in registered


@pytest.mark.parametrize("original, twin_name", [("leaves_fit", "leaves_fit"), ("lengths_fit", "lengths_fit")])
def test_traceable_twins_answer_as_the_helpers(original: str, twin_name: str) -> None:
    from torchdict import _compile as compile_support

    helper, twin = getattr(_accel, original), getattr(compile_support, twin_name)
    samples = [torch.zeros(3, 2), torch.zeros(3), torch.zeros(4), torch.tensor(1.0), torch.zeros(0), 3, None]
    for first in (-1, 0, 3, 4):
        for left in samples:
            for right in samples:
                if original == "leaves_fit":
                    source = {"a": left, "b": right}
                    assert twin(source, first) == helper(source, first), (left, right, first)
                    assert twin({}, first) == helper({}, first)
                else:
                    assert twin([left, right], first) == helper([left, right], first), (left, right, first)
                    assert twin((), first) == helper((), first)
    for value in samples:
        if isinstance(value, torch.Tensor):
            assert compile_support.tensor_len(value) == _accel.tensor_len(value)
        else:
            with pytest.raises(TypeError):
                compile_support.tensor_len(value)
    assert compile_support.zip_dict({"a": 0, "b": 1, "c": 2}, [5, 6, 7, 8], 1, 2) == _accel.zip_dict(
        {"a": 0, "b": 1, "c": 2}, [5, 6, 7, 8], 1, 2)


@pytest.mark.slow  # a fresh interpreter imports torch and torch._dynamo (~10 s on 2 busy cores)
def test_registration_waits_for_dynamo_and_happens_when_it_is_imported() -> None:
    code = "\n".join([
        "import sys, torch, torchdict",
        "from torchdict import _accel",
        "assert 'torch._dynamo' not in sys.modules",
        "assert any(type(f).__name__ == '_DynamoWatcher' for f in sys.meta_path)",
        "assert 'torchdict._compile' not in sys.modules",
        "import torch._dynamo",
        "from torchdict import _compile",
        "assert _compile.registered(), 'nothing registered'",
        "assert not any(type(f).__name__ == '_DynamoWatcher' for f in sys.meta_path)",
        "td = torchdict.TensorDict(a=torch.ones(3), batch_size=[3])",
        "out = torch.compile(lambda td: td[0]['a'] + td['a'].sum(), fullgraph=True, backend='eager')(td)",
        "assert out.item() == 4.0",
        "print('ok')",
    ])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


# ---------------------------------------------------------------------------- inductor (CPU)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["index_int", "apply_torch_fn", "stack_view", "tc_arithmetic", "update_dict"])
def test_inductor_matches_eager(name: str) -> None:
    fn, make_inputs = CASES[name]
    expected = fn(*make_inputs())
    got = _compile(fn, backend="inductor")(*make_inputs())
    assert_same(got, expected, exact=False)


@pytest.mark.slow
def test_inductor_pipeline_matches_eager() -> None:
    expected = _pipeline(_td(), _pair())
    assert_same(_compile(_pipeline, backend="inductor")(_td(), _pair()), expected, exact=False)


TENSOR_OPERAND_OPS = {
    "td + t": lambda td, t: td + t,
    "t + td": lambda td, t: t + td,
    "t - td": lambda td, t: t - td,
    "td * t": lambda td, t: td * t,
    "t / td": lambda td, t: t / (td + 1),
    "td == t": lambda td, t: td == t,
    "t < td": lambda td, t: t < td,
    "td >= t": lambda td, t: td >= t,
    "t != td": lambda td, t: t != td,
    "td - t": lambda td, t: td - t,
    "td / t": lambda td, t: td / t,
    # torch.Tensor writes these in Python (torch/_tensor.py): they reach __torch_function__ as functions
    "td ** t": lambda td, t: td.abs() ** t,
    "t ** td": lambda td, t: t.abs() ** td,
    "torch.pow(td, t)": lambda td, t: torch.pow(td.abs(), t),
    "torch.pow(t, td)": lambda td, t: torch.pow(t.abs(), td),
    "td // t": lambda td, t: td // t,
    "t // td": lambda td, t: t // td,
    "td % t": lambda td, t: td % t,
    "t % td": lambda td, t: t % td,
}
INTEGER_TENSOR_OPERAND_OPS = {
    "td & t": lambda td, t: td & t,
    "t & td": lambda td, t: t & td,
    "t | td": lambda td, t: t | td,
    "td ^ t": lambda td, t: td ^ t,
    "t ^ td": lambda td, t: t ^ td,
}


@pytest.mark.parametrize("name", sorted(TENSOR_OPERAND_OPS))
@pytest.mark.parametrize("operand_shape", [(), (3,)], ids=["scalar-tensor", "batch-tensor"])
def test_operators_with_a_plain_tensor_compile(name: str, operand_shape: tuple) -> None:
    # Dynamo reaches TensorDict.__torch_function__ with the tensor's method (torch._C.TensorBase.add, ...),
    # where eager Python would fall back to the TensorDict's reflected operator.
    op = TENSOR_OPERAND_OPS[name]
    td = TensorDict(a=torch.randn(3, 2), b={"c": torch.randn(3)}, batch_size=[3])
    t = torch.randn(operand_shape)
    expected = op(td, t)
    got = _compile(op)(td, t)
    assert_same(got, expected)


@pytest.mark.parametrize("name", sorted(INTEGER_TENSOR_OPERAND_OPS))
@pytest.mark.parametrize("operand_shape", [(), (3,)], ids=["scalar-tensor", "batch-tensor"])
def test_bitwise_operators_with_an_integer_tensor_compile(name: str, operand_shape: tuple) -> None:
    op = INTEGER_TENSOR_OPERAND_OPS[name]
    td = TensorDict(a=torch.randint(0, 8, (3, 2)), b={"c": torch.randint(0, 8, (3,))}, batch_size=[3])
    t = torch.randint(0, 8, operand_shape)
    assert_same(_compile(op)(td, t), op(td, t))


def _operand_collection(kind: str, integer: bool, seed: int = 0) -> Any:
    """A TensorDict, a tensorclass instance or a lazy stack, with batch size [3] and values away from 0."""
    generator = torch.Generator().manual_seed(seed)

    def values(*shape: int) -> torch.Tensor:
        if integer:
            return torch.randint(1, 8, shape, generator=generator)
        return torch.rand(shape, generator=generator) + 0.5

    if kind == "TensorDict":
        return TensorDict(a=values(3, 2), b={"c": values(3)}, batch_size=[3])
    if kind == "tensorclass":
        return Pair(values(3, 4), values(3), batch_size=[3])
    from torchdict import lazy_stack

    return lazy_stack([TensorDict(a=values(2), b={"c": values()}) for _ in range(3)])


COLLECTION_KINDS = ["TensorDict", "tensorclass", "lazy stack"]


@pytest.mark.parametrize("kind", COLLECTION_KINDS)
@pytest.mark.parametrize("expression", ["c + t", "t - c", "c ** t", "t ** c", "t // c", "c % t", "t < c"])
def test_every_collection_kind_takes_a_tensor_operand_under_compile(kind: str, expression: str) -> None:
    op = eval(f"lambda c, t: {expression}")  # noqa: S307 - a fixed expression, one code object per case
    t = torch.rand(3) + 0.5
    expected = op(_operand_collection(kind, integer=False), t)
    got = _compile(op)(_operand_collection(kind, integer=False), t)
    assert_same(got, expected)


IN_PLACE_OPERATORS = ["+=", "-=", "*=", "/=", "//=", "%=", "**=", "&=", "|=", "^="]


def _in_place_function(operator_text: str, collection_first: bool) -> Callable:
    """``f(c, t)`` running ``c op= t`` (or ``t op= c``), returning an alias taken before and the name's new value."""
    target, operand = ("c", "t") if collection_first else ("t", "c")
    namespace: dict = {}
    exec(f"def f(c, t):\n    alias = {target}\n    {target} {operator_text} {operand}\n"  # noqa: S102
         f"    return alias, {target}\n", namespace)
    return namespace["f"]


@pytest.mark.parametrize("kind", COLLECTION_KINDS)
@pytest.mark.parametrize("operator_text", IN_PLACE_OPERATORS)
@pytest.mark.parametrize("collection_first", [True, False], ids=["c op= t", "t op= c"])
def test_in_place_operators_with_a_tensor_update_the_collection_under_compile(
        kind: str, operator_text: str, collection_first: bool) -> None:
    # Dynamo would trace ``td -= t`` as ``Tensor.__rsub__(t, td)``, the same call as ``td - t``: right values,
    # but ``td`` itself unchanged. The in-place route (torchdict._compile_inplace) traces ``td.__isub__(t)``.
    integer = operator_text in ("&=", "|=", "^=")
    fn = _in_place_function(operator_text, collection_first)
    operand = torch.randint(1, 4, (3,)) if integer else torch.rand(3) + 0.5
    eager_collection, compiled_collection = _operand_collection(kind, integer), _operand_collection(kind, integer)
    eager_alias, eager_result = fn(eager_collection, operand.clone())
    compiled_operand = operand.clone()
    got_alias, got_result = _compile(fn)(compiled_collection, compiled_operand)
    assert_same(got_result, eager_result)
    assert_same(got_alias, eager_alias)
    assert_same(compiled_collection, eager_collection)  # written in place exactly when eager writes in place
    assert (got_alias is compiled_collection) == (eager_alias is eager_collection)
    assert (got_result is compiled_collection) == (eager_result is eager_collection)
    assert torch.equal(compiled_operand, operand)  # ``t op= c`` rebinds t to a collection; the tensor is kept


def test_the_in_place_route_leaves_other_operands_to_dynamo() -> None:
    from torchdict import _compile_inplace

    assert _compile_inplace.installed()

    def tensors(x: torch.Tensor, y: torch.Tensor) -> Any:
        alias = x
        x += y  # a tensor stays written in place
        number = 2
        number -= y  # a number becomes a tensor
        return alias, number

    x, y = torch.ones(3), torch.arange(3.0)
    alias, number = _compile(tensors)(x, y)
    assert alias is x and torch.equal(x, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(number, 2 - y)


def test_a_tensor_method_with_a_collection_answers_as_the_collections_operator() -> None:
    td = TensorDict(a=torch.rand(3, 2) + 0.5, batch_size=[3])
    t = torch.rand(3) + 0.5
    for method, expected in [(torch.Tensor.sub, td.__rsub__(t)), (torch.Tensor.lt, td.__gt__(t)),
                             (torch.Tensor.mul, td.__rmul__(t)), (torch.Tensor.__rsub__, td.__sub__(t)),
                             (torch.Tensor.__pow__, td.__rpow__(t)), (torch.Tensor.__rfloordiv__, td.__floordiv__(t)),
                             (torch.Tensor.__rtruediv__, td.__truediv__(t)), (torch.Tensor.__rmod__, td.__mod__(t))]:
        assert_same(method(t, td), expected)
    with pytest.raises(TypeError):
        torch.Tensor.add(t, td, alpha=2)  # not an operator: torch's own refusal
