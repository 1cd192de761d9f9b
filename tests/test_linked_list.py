"""``torchdict.utils.LinkedList`` (what ``td[key]`` of a non-tensor stack and ``tolist(as_linked_list=True)``
return) and ``torchdict.utils.TensorDictFuture`` (what ``return_early=True`` writes return), against
upstream's ``tensordict.utils``: equal results or the same exception kind, and a failed write changes
nothing."""
from __future__ import annotations

import concurrent.futures
import copy  # noqa: F401 - read by the expressions
import pickle  # noqa: F401 - read by the expressions
import tempfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdict
from _dropin_diff import outcome, plain, same_outcome, upstream

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def test_import_paths():
    import tensordict.utils
    import torchdict.utils

    for name in ("LinkedList", "TensorDictFuture"):
        assert hasattr(tensordict.utils, name) and hasattr(torchdict.utils, name)
        assert getattr(torchdict.utils, name).__module__ == "torchdict.utils"


def _values(batch):
    count = 1
    for size in batch:
        count *= size
    flat = [f"v{index}" for index in range(count)]

    def nest(items, sizes):
        if not sizes:
            return items[0]
        step = len(items) // sizes[0]
        return [nest(items[i * step:(i + 1) * step], sizes[1:]) for i in range(sizes[0])]

    return nest(flat, list(batch))


@given(batch=st.lists(st.integers(1, 3), min_size=1, max_size=3), data=st.data())
@settings(max_examples=40, deadline=None)
def test_reading_and_writing_a_stack_entry(batch, data):
    index = tuple(data.draw(st.integers(0, size - 1)) for size in batch)

    def run(lib):
        td = lib.TensorDict(batch_size=batch)
        # from_list: upstream's td[key] = list fails for three levels of nested lists
        td.set("s", lib.NonTensorStack.from_list(_values(batch)))
        values = td["s"]
        shown = (type(values).__name__, repr(values), values == _values(batch), values.tolist() == _values(batch))
        row = values
        for position in index[:-1]:
            row = row[position]
        row[index[-1]] = "new"
        return shown, type(row).__name__, td.get("s").tolist(), values.tolist(), type(td.to_dict()["s"]).__name__

    same_outcome(run)


@pytest.mark.parametrize("expression", [
    "values.__setitem__(slice(0, 2), ['x', 'y'])", "values.__setitem__(5, 'x')",
    "values.__setitem__(slice(0, 2), ['x'])", "values.__setitem__(-1, 'last')",
    "(values.append('q'), values.__setitem__(0, 'after'))", "(values.extend(['q']), values.__setitem__(0, 'a'))",
    "(values.insert(0, 'q'), values.__setitem__(1, 'a'))", "(values.pop(), values.__setitem__(0, 'a'))",
    "(values.remove('v1'), values.__setitem__(0, 'a'))", "(values.clear(), values.append('a'))",
    "(values.__delitem__(0), values.__setitem__(0, 'a'))", "(values.__iadd__(['q']), values.__setitem__(0, 'a'))",
    "(values.__imul__(2), values.__setitem__(0, 'a'))", "values[0:2]", "type(values[0:2]).__name__",
    "pickle.loads(pickle.dumps(values))", "(lambda other: (other.__setitem__(0, 'c'), type(other).__name__))("
    "pickle.loads(pickle.dumps(values)))", "copy.copy(values)", "values != ['v0', 'v1', 'v2']",
    "values == ('v0', 'v1', 'v2')", "torch.utils._pytree.tree_flatten(values)[0]",
    "lib.utils.LinkedList(['a', 'b'])", "(lambda free: (free.__setitem__(0, 'z'), free))(lib.utils.LinkedList('ab'))",
])
def test_linked_list_methods(expression):
    def run(lib):
        td = lib.TensorDict(batch_size=[3])
        td["s"] = ["v0", "v1", "v2"]
        values = td["s"]  # noqa: F841
        result = outcome(lambda: eval(expression))
        return result, td.get("s").tolist(), plain(list(values))

    same_outcome(run)


def test_a_refused_write_leaves_the_list_and_the_stack_as_they_were():
    def run(lib):
        td = lib.TensorDict(batch_size=[2])
        td["s"] = ["a", "b"]
        values = td["s"]
        result = outcome(lambda: values.__setitem__(slice(0, 2), ["only one"]))
        return result, list(values), td.get("s").tolist()

    same_outcome(run)


def test_a_list_outliving_its_stack_writes_only_itself():
    for lib in (upstream, torchdict):
        td = lib.TensorDict(batch_size=[2])
        td["s"] = ["a", "b"]
        values = td["s"]
        del td
        import gc

        gc.collect()
        values[0] = "z"
        assert values == ["z", "b"]


@pytest.mark.parametrize("kind", ["tensordict", "stack", "data", "lazy", "data_no_batch"])
def test_tolist_as_linked_list(kind):
    def make(lib):
        if kind == "tensordict":
            return lib.TensorDict(a=torch.arange(4.).view(2, 2), batch_size=[2, 2])
        if kind == "stack":
            return lib.NonTensorStack.from_list([["a", "b"], ["c", "d"]])
        if kind == "data":
            return lib.NonTensorData("x", batch_size=[2, 1])
        if kind == "data_no_batch":
            return lib.NonTensorData("x")
        return lib.lazy_stack([lib.TensorDict(a=torch.zeros(2)), lib.TensorDict(a=torch.ones(3))])

    def shape(value):
        if isinstance(value, list):
            return (type(value).__name__, [shape(item) for item in value])
        return type(value).__name__

    def run(lib):
        source = make(lib)
        result = source.tolist(as_linked_list=True)
        written = None
        if kind == "stack":
            result[1][0] = "Q"
            written = source.tolist()
        elif kind == "tensordict":
            result[0] = {"a": torch.tensor([9.0, 9.0])}
            written = source["a"].tolist()
        elif kind == "data":
            written = outcome(lambda: result.__setitem__(0, ["other"]))
        return shape(result), plain(source.tolist(as_linked_list=False)), written

    same_outcome(run)


def test_lazy_stack_entry_reads_as_a_linked_list():
    def run(lib):
        first, second = lib.TensorDict(batch_size=[2]), lib.TensorDict(batch_size=[2])
        first["s"], second["s"] = ["a", "b"], ["c", "d"]
        stack = lib.lazy_stack([first, second])
        values = stack["s"]
        return type(values).__name__, values, [type(row).__name__ for row in values]

    same_outcome(run)


# ------------------------------------------------------------------------------------------- TensorDictFuture
@pytest.mark.parametrize("method", ["memmap", "save", "memmap_like", "memmap_", "consolidate"])
def test_return_early_gives_a_tensordict_future(method):
    def run(lib):
        td = lib.TensorDict(a=torch.arange(3.), b={"c": torch.ones(3)}, batch_size=[3])
        with tempfile.TemporaryDirectory() as path:
            if method == "consolidate":
                future = td.consolidate(num_threads=2, return_early=True)
            else:
                future = getattr(td, method)(path, num_threads=2, return_early=True)
            result = future.result()
            return (type(future).__name__, isinstance(future.futures, list), plain(result.to_tensordict()),
                    future.result() is result)

    same_outcome(run)


@pytest.mark.parametrize("outcomes", [("ok", "ok"), ("fail", "ok"), ("ok", "fail"), ()])
def test_result_waits_for_every_write_and_raises_the_first_error(outcomes):
    def write(kind):
        if kind == "fail":
            raise KeyError("write failed")
        return kind

    def run(lib):
        td = lib.TensorDict(a=torch.zeros(2), batch_size=[2])
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(write, kind) for kind in outcomes]
            future = lib.utils.TensorDictFuture(futures, td)
            result = outcome(future.result)
        return result, future.futures == futures, future.resulting_td is td

    same_outcome(run)


def test_a_tensordict_future_is_a_concurrent_future():
    td = torchdict.TensorDict(a=torch.zeros(2), batch_size=[2])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = torchdict.utils.TensorDictFuture([pool.submit(lambda: None)], td)
        concurrent.futures.wait([future])
        assert future.done() and future.exception() is None and future.result() is td


def test_reading_a_stack_entry_under_compile():
    td = torchdict.TensorDict(a=torch.zeros(3), batch_size=[3])
    td["s"] = ["a", "b", "c"]

    @torch.compile(fullgraph=True)
    def step(data):
        return data["a"] + 1, data["s"]

    total, names = step(td)
    assert isinstance(names, torchdict.utils.LinkedList) and names == ["a", "b", "c"]
    names[0] = "q"
    assert td.get("s").tolist() == ["q", "b", "c"] and torch.equal(total, torch.ones(3))
