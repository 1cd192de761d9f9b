"""The optional C helpers (torchdict._speedups) against their pure-Python twins and plain torch.

Every helper of ``_accel`` must give the answer of a plain-torch reference, in C and in
Python alike, and raise the same error types; the C ``TensorDict.__getitem__`` must give
what the general Python one gives, for every kind of index. The whole suite also runs
with ``TORCHDICT_PURE_PYTHON=1`` (scripts/test.sh), so the twins carry the library too.
"""
from __future__ import annotations

import operator
import os

import pytest
import torch

from torchdict import NonTensorData, NonTensorStack, TensorDict, _accel

C = _accel._C
_BY_VALUE = (torch.Tensor, NonTensorData, NonTensorStack)
needs_c = pytest.mark.skipif(C is None, reason="the C extension is not in use")


def test_the_extension_is_built_and_used() -> None:
    # pip builds it wherever a C compiler is present (CI included); a silent build failure
    # would leave the library on its slower twins, so the test suite says so.
    if os.environ.get("TORCHDICT_PURE_PYTHON", "") not in ("", "0"):
        assert not _accel.USING_C and C is None
    else:
        assert _accel.USING_C, "torchdict._speedups was not built: is a C compiler installed?"


class Refusing(torch.Tensor):
    """A tensor class whose __torch_function__ refuses to give its length."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.Tensor.__len__ or getattr(func, "__name__", "") == "__len__":
            raise RuntimeError("no length for you")
        return super().__torch_function__(func, types, args, kwargs or {})


class Key(str):
    """A str subclass, accepted as a key as a str is."""


def reference_fits(values: list, first: int) -> bool:
    """The plain-torch statement of every check: a non-empty run of tensors of first size n > 0."""
    return first > 0 and bool(values) and all(
        isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == first for v in values)


def _values() -> list:
    return [torch.zeros(3, 2), torch.zeros(3), torch.zeros(4, 3), torch.tensor(3.0), torch.zeros(0, 3),
            torch.nn.Parameter(torch.zeros(3, 1)), 3, [1, 2, 3], "abc", None, TensorDict(batch_size=[3])]


def _sources() -> list:
    sources: list = [{}]
    for value in _values():
        sources.append({"a": value})
        sources.append({"a": torch.ones(3), "b": value})
        # Past 16 entries the Python twin skips its type pass: the other branch.
        sources.append({**{f"k{i}": torch.ones(3, 2) for i in range(20)}, "z": value})
    sources += [{"a": torch.ones(3), 1: torch.ones(3)}, {Key("a"): torch.ones(3)},
                {**{f"k{i}": torch.ones(3) for i in range(20)}, 7: torch.ones(3)}]
    return sources


def _implementations(name: str) -> list:
    twins = [getattr(_accel, "py_" + name)]
    return twins + ([getattr(C, name)] if C is not None else [])


@pytest.mark.parametrize("first", [-1, 0, 1, 3, 4])
def test_leaves_fit_is_the_reference(first: int) -> None:
    for source in _sources():
        expected = reference_fits(list(source.values()), first) and all(isinstance(k, str) for k in source)
        for leaves_fit in _implementations("leaves_fit"):
            assert leaves_fit(source, first) is expected, (leaves_fit, source)


@pytest.mark.parametrize("first", [-1, 0, 3, 4])
def test_lengths_fit_is_the_reference(first: int) -> None:
    runs = [list(source.values()) for source in _sources()]
    for values in runs + [tuple(run) for run in runs]:
        for lengths_fit in _implementations("lengths_fit"):
            assert lengths_fit(values, first) is reference_fits(list(values), first), (lengths_fit, values)


BATCHES = [torch.Size([]), torch.Size([3]), torch.Size([3, 2]), torch.Size([3, 2, 1]), torch.Size([0]),
           torch.Size([0, 3]), torch.Size([4, 3]), (3, 2)]


def reference_shape_fits(value: object, batch: tuple) -> bool:
    """The plain-torch statement of shape_fits: a tensor whose leading dims are the batch."""
    return isinstance(value, torch.Tensor) and tuple(value.shape[:len(batch)]) == tuple(batch)


@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_shape_fits_is_the_reference(batch: tuple) -> None:
    values = _values() + [torch.zeros(3, 2, 1, 5), torch.zeros(0, 3, 1), torch.zeros(3, 2).t()]
    for value in values:
        for shape_fits in _implementations("shape_fits"):
            assert shape_fits(value, batch) is reference_shape_fits(value, batch), (shape_fits, value, batch)


@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_leaves_fit_batch_is_the_reference(batch: tuple) -> None:
    for source in _sources() + [{"a": torch.zeros(3, 2, 1), "b": torch.ones(3, 2)}]:
        expected = bool(source) and all(isinstance(k, str) for k in source) and all(
            reference_shape_fits(value, batch) for value in source.values())
        for leaves_fit_batch in _implementations("leaves_fit_batch"):
            assert leaves_fit_batch(source, batch) is expected, (leaves_fit_batch, source, batch)


def test_batch_checks_refuse_what_is_not_a_batch() -> None:
    for name, args in [("shape_fits", (torch.zeros(3), [3])), ("leaves_fit_batch", ({"a": torch.zeros(3)}, [3])),
                       ("leaves_fit_batch", ([torch.zeros(3)], (3,)))]:
        for implementation in _implementations(name):
            with pytest.raises(TypeError):
                implementation(*args)


def test_tensor_len_is_the_first_size() -> None:
    for tensor in [torch.zeros(3, 2), torch.zeros(0), torch.tensor(1.0), torch.nn.Parameter(torch.zeros(5))]:
        for tensor_len in _implementations("tensor_len"):
            assert tensor_len(tensor) == (tensor.shape[0] if tensor.dim() else 0)


@pytest.mark.parametrize("name, args", [
    ("tensor_len", (3,)), ("tensor_len", ([1, 2],)), ("tensor_len", (None,)),
    ("leaves_fit", ([torch.ones(3)], 3)), ("leaves_fit", ({"a": torch.ones(3)}, "3")),
    ("lengths_fit", ({"a": torch.ones(3)}, 3)), ("lengths_fit", ([torch.ones(3)], None)),
])
def test_bad_arguments_raise_type_error(name: str, args: tuple) -> None:
    for function in _implementations(name):
        with pytest.raises(TypeError):
            function(*args)


def test_an_error_from_torch_is_not_swallowed() -> None:
    refusing = torch.zeros(3, 2).as_subclass(Refusing)
    for name, args in [("tensor_len", (refusing,)), ("leaves_fit", ({"a": torch.ones(3), "b": refusing}, 3)),
                       ("lengths_fit", ([torch.ones(3), refusing], 3))]:
        for function in _implementations(name):
            with pytest.raises(RuntimeError, match="no length for you"):
                function(*args)


class Clearing(torch.Tensor):
    """A tensor class that empties a container while its length is asked for."""

    target: object = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") == "__len__" and cls.target is not None:
            cls.target.clear()  # type: ignore[attr-defined]
            cls.target = None
        return super().__torch_function__(func, types, args, kwargs or {})


@needs_c
def test_a_container_changed_during_the_check_is_walked_safely() -> None:
    # The length of a tensor subclass runs Python code, which may drop the container's
    # references: the C walk must neither crash nor read freed memory.
    for make in (dict, list):
        for _ in range(50):
            tensors = [torch.zeros(3, 2).as_subclass(Clearing) for _ in range(30)]
            container = make((f"k{i}", t) for i, t in enumerate(tensors)) if make is dict else list(tensors)
            Clearing.target = container
            del tensors
            result = C.leaves_fit(container, 3) if make is dict else C.lengths_fit(container, 3)
            assert result in (True, False)
            assert len(container) == 0


# ------------------------------------------------------------------ TensorDict.__getitem__
class SubDict(TensorDict):
    """A TensorDict subclass: its tuple keys take the general path."""

    __slots__ = ()


def _tree(cls: type = TensorDict) -> TensorDict:
    td = cls({"a": torch.arange(6.0).reshape(3, 2), "n": {"x": torch.ones(3), "m": {"y": torch.zeros(3, 1)}}},
             batch_size=[3])
    td["s"] = "text"
    td["n", "s"] = "inner"
    td["n", "sub"] = SubDict({"z": torch.ones(3)}, batch_size=[3])
    return td


_INDICES = ["a", "n", "s", ("n", "x"), ("n", "m", "y"), ("n", "s"), ("n",), (), ("n", "sub"), ("n", "sub", "z"),
            Key("a"), ("n", Key("x")), 0, -1, slice(0, 2), (0, "a"), ("n", 0), "missing", ("n", "missing"),
            ("a", "x"), ("missing", "x"), torch.tensor([0, 2]), torch.tensor([True, False, True]), ..., None,
            [0, 1], 3, 1.5]


def _outcome(getitem, td: TensorDict, index: object) -> tuple:  # type: ignore[no-untyped-def]
    try:
        value = getitem(td, index)
    except Exception as error:  # noqa: BLE001 - the error is the outcome compared
        return ("raised", type(error), str(error))
    if isinstance(value, torch.Tensor):
        return ("tensor", type(value), value.tolist())
    if isinstance(value, TensorDict):
        return ("td", type(value), value.batch_size, sorted(map(str, value.keys(True, True))),
                [leaf.tolist() for leaf in value.values(True, True) if isinstance(leaf, torch.Tensor)])
    return ("value", value)


@pytest.mark.parametrize("cls", [TensorDict, SubDict])
def test_getitem_equals_the_general_python_getitem(cls: type) -> None:
    general = _accel.python_getitem
    assert general is not None
    td = _tree(cls)
    for index in _INDICES:
        # td[index] (the C type slot) and the class's Python __getitem__ (what torch.compile traces).
        assert _outcome(operator.getitem, td, index) == _outcome(general, td, index), index
        assert _outcome(type(td).__getitem__, td, index) == _outcome(general, td, index), index


def test_getitem_reads_each_entry_as_plain_dict_code_does() -> None:
    td = _tree()
    assert td["a"] is td._tensordict["a"]
    assert td["n", "m", "y"] is td._tensordict["n"]._tensordict["m"]._tensordict["y"]
    assert td["s"] == "text" and td["n", "s"] == "inner"
    assert td[()] is td
    with pytest.raises(KeyError, match="missing"):
        td["missing"]
    with pytest.raises(KeyError, match="missing"):
        td["n", "missing"]


@needs_c
def test_getitem_runs_in_c_from_the_type_slot() -> None:
    # The class keeps a Python __getitem__ (for torch.compile and inspect); td[index] runs C from the slot.
    method = TensorDict.__dict__["__getitem__"]
    assert type(method).__name__ == "function" and method.__wrapped__ is _accel.python_getitem
    assert "__getitem__" in _accel.fronted_slots(TensorDict)
    assert "__getitem__" not in _accel.fronted_slots(SubDict)  # a subclass: CPython's slot, the Python path


# ------------------------------------------------------------------ tensorclass data[i]
def _python_twin_getitem(cls: type):  # type: ignore[no-untyped-def]
    """The generated Python ``__getitem__`` of ``cls``, the twin of the C FieldIndexer."""
    from torchdict.tensorclass import _indexing as indexing
    from torchdict.tensorclass._fields import TD_STATE

    saved, indexing.field_indexer = indexing.field_indexer, None
    try:
        return indexing.make_getitem(cls, cls._tc_field_names, indexing._inherited_getitem(cls), TD_STATE)
    finally:
        indexing.field_indexer = saved


def _tc_outcome(getitem, data, index: object) -> tuple:  # type: ignore[no-untyped-def]
    try:
        result = getitem(data, index)
    except Exception as error:  # noqa: BLE001 - the error is the outcome compared
        return ("raised", type(error), str(error))
    # Tensors and non-tensor leaves compare by value (``==`` on a non-tensor leaf answers per element).
    fields = {name: (type(value), value.tolist()) if isinstance(value, _BY_VALUE) else value
              for name, value in result._tensordict.items()}
    return (type(result), result.batch_size, result.device, fields, result.is_locked)


@pytest.mark.filterwarnings("ignore:An index runs past the batch dims:FutureWarning")
def test_tensorclass_indexing_equals_its_python_twin() -> None:
    from test_tensorclass_fast_paths import MyData, _one_dim_variants

    twin = _python_twin_getitem(MyData)
    on_cpu = MyData(*[getattr(_one_dim_variants()["plain"], n) for n in ("image", "mask", "label")],
                    batch_size=[6], device="cpu")
    two_dim = MyData(torch.zeros(2, 3, 4), torch.ones(2, 3), torch.arange(6).reshape(2, 3), batch_size=[2, 3])
    extra = MyData(*[getattr(on_cpu, n) for n in ("image", "mask", "label")], batch_size=[6])
    extra.__dict__["extra"] = torch.arange(6)  # storage beyond the fields, the lazy state kept
    variants = {**_one_dim_variants(), "on_cpu": on_cpu, "two_dim": two_dim, "extra": extra}
    for name, data in variants.items():
        for index in [0, 1, -1, 5, 6, -7, slice(1, 4), slice(None, None, 2), slice(4, 1), slice(None, None, -1),
                      (0, 1), torch.tensor([0, 1]), True, None, ..., 1.5]:
            assert _tc_outcome(MyData.__getitem__, data, index) == _tc_outcome(twin, data, index), (name, index)


@needs_c
def test_field_indexer_is_a_method() -> None:
    from test_tensorclass_fast_paths import MyData, _one_dim_variants

    data = _one_dim_variants()["plain"]
    indexer = getattr(MyData.__dict__["__getitem__"], _accel.C_HELPER)
    assert type(indexer) is C.FieldIndexer and "__getitem__" in _accel.fronted_slots(MyData)
    assert torch.equal(indexer(data, 2).label, data.label[2])
    assert torch.equal(data.__getitem__(2).label, data.label[2])  # bound through the descriptor
    with pytest.raises(TypeError):
        indexer(data)
    with pytest.raises(TypeError):
        indexer(data, 1, index=2)


# ------------------------------------------------------------------ tensorclass Cls(*tensors, batch_size=[n])
def _init_outcome(init, cls: type, args: tuple, kwargs: dict) -> tuple:  # type: ignore[no-untyped-def]
    data = object.__new__(cls)
    try:
        init(data, *args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the error is the outcome compared
        return ("raised", type(error), str(error))
    # Tensors and non-tensor leaves compare by value (``==`` on a non-tensor leaf answers per element).
    fields = {name: (type(value), value.tolist()) if isinstance(value, _BY_VALUE) else value
              for name, value in data._tensordict.items()}
    return (data.batch_size, type(data.batch_size), data.device, fields, list(data._tensordict.keys()))


def _init_calls() -> list:
    image, mask, label = torch.randn(4, 3), torch.zeros(4, 1, dtype=torch.bool), torch.arange(4)
    return [
        ((image, mask, label), {"batch_size": [4]}),
        ((image, mask, label), {"batch_size": [3]}),
        ((image, mask, label), {"batch_size": [0]}),
        ((image, mask, label), {"batch_size": [-1]}),
        ((torch.tensor(1.0), torch.tensor(True), torch.tensor(3)), {"batch_size": [0]}),  # C length 0, yet no fit
        ((image[:0], mask[:0], label[:0]), {"batch_size": [0]}),
        ((image, mask, label), {"batch_size": [True]}),
        ((image, mask, label), {"batch_size": [2 ** 70]}),
        ((image, mask, label), {"batch_size": [4, 1]}),
        ((image, mask, label), {"batch_size": (4,)}),
        ((image, mask, label), {"batch_size": torch.Size([4])}),
        ((image, mask, label), {}),
        ((image, mask, label), {"batch_size": [4], "device": "cpu"}),
        ((image, mask, label), {"batch_size": [4], "names": ["n"]}),
        ((image, mask, label), {"batch_size": [4], "other": 1}),
        ((image, mask), {"batch_size": [4]}),
        ((image, mask, label, label), {"batch_size": [4]}),
        ((image, mask), {"label": label, "batch_size": [4]}),
        ((torch.nn.Parameter(image), mask, label), {"batch_size": [4]}),
        ((image, mask, torch.tensor(3)), {"batch_size": [4]}),
        ((image, mask, [0, 1, 2, 3]), {"batch_size": [4]}),
        ((image, mask, 7), {"batch_size": [4]}),
        ((image, mask, None), {"batch_size": [4]}),
        ((image, mask, "text"), {"batch_size": [4]}),
        ((image, mask, TensorDict(batch_size=[4])), {"batch_size": [4]}),
    ]


def test_tensorclass_construction_equals_its_python_twin() -> None:
    from test_tensorclass_fast_paths import MyData

    twin = MyData.__dict__["__init__"]
    init = getattr(twin, _accel.C_HELPER, twin)  # the C FieldInit, called directly

    def through_the_slot(data, *args, **kwargs):  # type: ignore[no-untyped-def]
        built = MyData(*args, **kwargs)  # the type's tp_init: the C FieldInit when it is in use
        object.__setattr__(data, "__dict__", built.__dict__)
        object.__setattr__(data, "_td", built._td)

    for args, kwargs in _init_calls():
        assert _init_outcome(init, MyData, args, kwargs) == _init_outcome(twin, MyData, args, kwargs), (args, kwargs)
        assert (_init_outcome(through_the_slot, MyData, args, kwargs)
                == _init_outcome(twin, MyData, args, kwargs)), (args, kwargs)


def test_tensorclass_construction_error_from_torch_is_not_swallowed() -> None:
    from test_tensorclass_fast_paths import MyData

    refusing = torch.zeros(4, 2).as_subclass(Refusing)
    with pytest.raises(RuntimeError, match="no length for you"):
        MyData(torch.zeros(4), refusing, torch.zeros(4), batch_size=[4])


@needs_c
def test_field_init_fronts_only_the_classes_it_can_finish() -> None:
    import inspect

    from test_tensorclass_fast_paths import MyData

    from torchdict import tensorclass

    init = MyData.__dict__["__init__"]
    assert type(getattr(init, _accel.C_HELPER)) is C.FieldInit and "__init__" in _accel.fronted_slots(MyData)
    assert init._tc_generated and init.__qualname__ == "MyData.__init__"
    assert list(inspect.signature(MyData).parameters)[:3] == ["image", "mask", "label"]

    @tensorclass
    class WithDefault:
        x: torch.Tensor
        y: torch.Tensor = None

    @tensorclass
    class WithPostInit:
        x: torch.Tensor

        def __post_init__(self) -> None:
            self.x = self.x + 1

    @tensorclass(frozen=True)
    class Frozen:
        x: torch.Tensor

    for cls in (WithDefault, WithPostInit, Frozen):
        assert not hasattr(cls.__dict__["__init__"], _accel.C_HELPER), cls
        assert "__init__" not in _accel.fronted_slots(cls), cls
    assert torch.equal(WithPostInit(torch.zeros(2), batch_size=[2]).x, torch.ones(2))
    assert Frozen(torch.zeros(2), batch_size=[2]).is_locked


# ------------------------------------------------------------------ apply on a plain tree
@pytest.mark.parametrize("keys", [{"a": 0, "b": 1, "c": 2, "d": 3}, ["a", "b", "c", "d"]], ids=["dict", "list"])
def test_zip_dict_is_dict_of_zip(keys: object) -> None:
    values = [torch.tensor(i) for i in range(6)]
    for start, count in [(0, 0), (0, 4), (1, 3), (2, 4), (5, 1), (0, 6)]:
        expected = dict(zip(keys, values[start:start + count]))  # type: ignore[call-overload]
        for zip_dict in _implementations("zip_dict"):
            result = zip_dict(keys, values, start, count)
            assert list(result) == list(expected) and all(result[k] is expected[k] for k in expected)


def test_zip_dict_refuses_bad_arguments() -> None:
    for zip_dict in _implementations("zip_dict"):
        with pytest.raises(TypeError):
            zip_dict(("a",), [1], 0, 1)
        with pytest.raises(ValueError):
            zip_dict(["a"], [1], 1, 1)


def _trees() -> dict:
    leaf = torch.zeros(3, 2)
    flat = TensorDict({f"k{i}": leaf.clone() for i in range(5)}, batch_size=[3])
    nested = TensorDict({"a": leaf, "b": leaf + 1, "sub": {"c": leaf, "deeper": {"d": leaf}}, "e": leaf},
                        batch_size=[3])  # "e" after a sub-TensorDict: an unordered level
    ordered = TensorDict({"a": leaf, "sub": {"c": leaf, "s2": {"d": leaf}}}, batch_size=[3])
    empty_sub = TensorDict({"a": leaf, "sub": {}}, batch_size=[3])
    with_text = ordered.clone()
    with_text["sub", "text"] = "not a tensor"
    with_param = ordered.clone()
    with_param["sub", "p"] = torch.nn.Parameter(torch.zeros(3))
    longer = ordered.clone()
    longer["sub", "wide"] = TensorDict({"w": torch.zeros(3, 4)}, batch_size=[3, 4])
    other_class = ordered.clone()
    other_class["sub", "other"] = SubDict({"z": torch.zeros(3)}, batch_size=[3])
    return {"flat": flat, "nested": nested, "ordered": ordered, "empty": TensorDict(batch_size=[3]),
            "empty_sub": empty_sub, "with_text": with_text, "with_param": with_param, "longer": longer,
            "other_class": other_class, "sub_root": SubDict({"a": leaf, "s": SubDict({"b": leaf}, [3])}, [3])}


def _comparable(collected: object) -> object:
    if collected is None:
        return None
    leaves, levels = collected  # type: ignore[misc]
    return ([id(leaf) for leaf in leaves],
            [(id(td), id(keys) if type(keys) is dict else list(keys), start, count,
              [(key, id(sub)) for key, sub in subs], ordered, path)
             for td, keys, start, count, subs, ordered, path in levels])


def test_collect_tree_equals_its_python_twin() -> None:
    from torchdict._apply_tree import py_collect_tree

    for name, td in _trees().items():
        expected = py_collect_tree(td, td.batch_size)
        assert (expected is None) == (name in {"with_text", "with_param", "longer", "other_class"}), name
        if C is not None:
            assert _comparable(C.collect_tree(td, td.batch_size, type(td)._batch_size)) == _comparable(expected), name


@pytest.mark.parametrize("name", sorted(_trees()))
def test_apply_on_every_tree_equals_per_leaf_torch(name: str) -> None:
    td = _trees()[name]
    result = td.apply(lambda tensor: tensor * 2 + 1)
    assert type(result) is type(td)
    assert list(result.keys(True, True)) == list(td.keys(True, True))
    for key, value in td.items(True, True):
        if isinstance(value, torch.Tensor):
            assert torch.equal(result[key], value * 2 + 1), key


def test_an_extension_that_refuses_this_torch_leaves_the_twins_in_use() -> None:
    import subprocess
    import sys

    # A stand-in module whose setup() refuses, as the real one does for a torch whose tensor
    # class has no C length slot: torchdict must import and run on the twins.
    code = ("import sys, types\n"
            "fake = types.ModuleType('torchdict._speedups')\n"
            "def refuse(*args):\n    raise TypeError('this class has no C length')\n"
            "fake.setup = refuse\n"
            "sys.modules['torchdict._speedups'] = fake\n"
            "import torch, torchdict\nfrom torchdict import _accel\n"
            "assert not _accel.USING_C and _accel.tensor_len is _accel.py_tensor_len\n"
            "td = torchdict.TensorDict({'a': torch.zeros(3)}, batch_size=[3])\n"
            "assert td['a'].shape == (3,) and type(torchdict.TensorDict.__getitem__).__name__ == 'function'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "TORCHDICT_PURE_PYTHON"})
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_tensorclass_with_many_fields_indexes_and_builds_as_its_fields() -> None:
    # Past the C indexer's 64-field buffer: the class still builds, indexes and constructs.
    import dataclasses

    from torchdict import tensorclass

    fields = [(f"f{i}", torch.Tensor) for i in range(70)]
    Wide = tensorclass(dataclasses.make_dataclass("Wide", fields))
    values = [torch.full((4, 2), float(i)) for i in range(70)]
    data = Wide(*values, batch_size=[4])
    assert data.batch_size == torch.Size([4])
    for index in (1, slice(1, 3)):
        row = data[index]
        assert all(torch.equal(getattr(row, f"f{i}"), values[i][index]) for i in range(70))
