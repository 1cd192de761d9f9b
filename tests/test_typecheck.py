"""The package type-checks: mypy runs on ``src/torchdict`` with the ``[tool.mypy]`` configuration of pyproject.toml.

The members made at import time (the generic members of TensorDictBase, the generated ops, a tensorclass's
delegated members) are declared for type checkers in ``_collection_api.py``; the mixins are checked against
their hosts (``_host.py``, ``lazy/_host.py``, ``nontensor/_host.py``). The other tests here pin the
behaviour of the calls mypy found wrong (each against upstream tensordict).
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest
import torch

import tensordict
import torchdict
from torchdict import base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("mypy")


def test_mypy_passes_on_the_package(tmp_path):
    # A fresh cache: an old one can hide a change of a stub next to the compiled module (_speedups.pyi).
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def _declared_members() -> set:
    with open(os.path.join(ROOT, "src", "torchdict", "_collection_api.py")) as handle:
        tree = ast.parse(handle.read())
    api = next(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "CollectionAPI")
    return {node.name for node in api.body if isinstance(node, ast.FunctionDef)}


def test_every_member_made_at_import_is_declared_for_type_checkers():
    from torchdict._ops import OpsMixin

    generated_ops = {name for name, value in vars(OpsMixin).items() if callable(value)}
    made = set(base.GENERIC_METHODS) | set(base.DENSE_PROPERTIES) | (generated_ops - {"__pos__"})
    assert made - _declared_members() == set()


# ----------------------------------------------------------------------------------- what mypy found


@pytest.mark.parametrize("lib", [tensordict, torchdict], ids=["upstream", "torchdict"])
def test_tensorclass_update_takes_the_keyword_and_any_collection(lib):
    @lib.tensorclass
    class Pair:
        x: torch.Tensor
        y: torch.Tensor = None

    data = Pair(x=torch.zeros(2), batch_size=[2])
    data.update(input_dict_or_td={"x": torch.ones(2)})  # upstream's parameter name
    assert data.x.tolist() == [1.0, 1.0]
    stack = lib.lazy_stack([lib.TensorDict(x=torch.full((), 2.0)), lib.TensorDict(x=torch.full((), 3.0))])
    data.update(stack)  # a lazy stack (a collection that is not a TensorDict) as the source
    assert data.x.tolist() == [2.0, 3.0]


def test_tensorclass_update_from_a_lazy_stack_refuses_other_keys_and_changes_nothing():
    @torchdict.tensorclass
    class Pair:
        x: torch.Tensor

    data = Pair(x=torch.zeros(2), batch_size=[2])
    stack = torchdict.lazy_stack([torchdict.TensorDict(z=torch.ones(())), torchdict.TensorDict(z=torch.ones(()))])
    with pytest.raises(ValueError, match="no field named"):  # as a dict or a TensorDict source (upstream too)
        data.update(stack)
    assert data.x.tolist() == [0.0, 0.0] and set(data._tensordict.keys()) == {"x"}


@pytest.mark.parametrize("lib", [tensordict, torchdict], ids=["upstream", "torchdict"])
def test_lazy_stack_update__takes_the_entries_as_keywords(lib):
    stack = lib.lazy_stack([lib.TensorDict(a=torch.zeros(2), batch_size=[2]) for _ in range(2)])
    assert stack.update_() is stack
    assert stack.update_(a=torch.ones(2, 2)) is stack
    assert stack["a"].tolist() == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize("lib", [tensordict, torchdict], ids=["upstream", "torchdict"])
def test_params_cpu_takes_the_tensordict_keywords_and_clone_refuses_others(lib):
    params = lib.TensorDictParams(lib.TensorDict({"w": torch.ones(2)}, []))
    moved = params.cpu(non_blocking=False)
    assert isinstance(moved, lib.TensorDictParams) and torch.equal(moved["w"], torch.ones(2))
    with pytest.raises(TypeError, match="unexpected keyword argument 'device'"):
        params.clone(device="cpu")
    assert type(params["w"]).__name__ == "Parameter"


def test_params_cpu_with_keywords_moves_in_place_as_without():
    params = torchdict.TensorDictParams(torchdict.TensorDict({"w": torch.ones(2)}, []))
    weight = params["w"]
    assert params.cpu(non_blocking=False) is params and params["w"] is weight


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the legacy lazy mode's own warning
@pytest.mark.parametrize("lib", [tensordict, torchdict], ids=["upstream", "torchdict"])
def test_names_of_a_lazy_legacy_view_are_refused_and_left_alone(lib):
    td = lib.TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3])
    with lib.set_lazy_legacy(True):
        view = td.unsqueeze(0)
    with pytest.raises(RuntimeError):  # upstream's RuntimeError; torchdict's NotImplementedError is one
        view.names = ["x", "y", "z"]
    assert list(view.names) == [None, None, None]


def _nested_lazy(lib):
    members = [lib.TensorDict(x=torch.full((), float(i)), y=torch.zeros(())) for i in range(2)]
    return lib.TensorDict(n=lib.lazy_stack(members), batch_size=[2])


def _flat(td) -> dict:
    return {key if isinstance(key, str) else ".".join(key): value.tolist()
            for key, value in td.items(True, True)}


@pytest.mark.parametrize("call", ["select", "exclude", "split_keys"])
def test_key_selection_through_a_nested_lazy_stack_matches_upstream(call):
    # The lazy stack keeps no TensorDict inside: its own select / exclude answer for its part of the keys.
    results = []
    for lib in (tensordict, torchdict):
        td = _nested_lazy(lib)
        result = getattr(td, call)(("n", "x")) if call != "split_keys" else td.split_keys([("n", "x")])
        results.append([_flat(part) for part in result] if call == "split_keys" else _flat(result))
        assert _flat(td) == {"n.x": [0.0, 1.0], "n.y": [0.0, 0.0]}  # the source is left alone
    assert results[0] == results[1]


def test_update_from_a_lazy_stack_matches_upstream():
    results = []
    for lib in (tensordict, torchdict):
        stack = lib.lazy_stack([lib.TensorDict(x=torch.full((), float(i))) for i in range(2)])
        results.append(_flat(lib.TensorDict(z=torch.zeros(2), batch_size=[2]).update(stack)))
    assert results[0] == results[1] == {"z": [0.0, 0.0], "x": [0.0, 1.0]}
