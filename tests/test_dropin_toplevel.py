"""Upstream's top level in torchdict: the behaviour toggles, the print options, ``torchdict.utils``,
``torchdict.functional`` and the top-level constructors, each checked against upstream ``tensordict`` (equal
results or the same exception kind) and against plain torch where it applies."""
from __future__ import annotations

import collections
import dataclasses
import os
import pickle
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdict
from _dropin_diff import build, outcome, plain, same_outcome, snapshot, specs, upstream, values_of

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

# Upstream's top-level names that other parts of the port own (not this test's business).
OWNED_ELSEWHERE = {
    "LazyStackedTensorDictStore", "TensorDictStore", "store",  # the key-value store (issue 17)
    "nn", "as_tensordict_module", "TensorClassModuleBase", "TensorClassModuleWrapper",  # torchdict.nn (issue 12)
    "persistent", "PersistentTensorDict", "from_h5", "from_zarr", "from_arrow", "to_arrow", "from_csv",
    "from_json", "from_pandas", "from_parquet", "from_safetensors", "to_safetensors", "from_struct_array",
    "from_consolidated",  # file formats and consolidation (issues 13-14)
    "save", "load", "load_memmap", "memmap", "append_memmap", "pack_memmap", "unpack_memmap",
    "is_memmap_archive", "refresh_archive_checksums", "PackLayout",  # persistence
    "base", "tensordict",  # upstream's implementation modules
}


def test_every_top_level_name_of_upstream_exists():
    upstream_names = {name for name in dir(upstream) if not name.startswith("_")}
    missing = sorted(name for name in upstream_names - OWNED_ELSEWHERE if not hasattr(torchdict, name))
    assert missing == []


def test_import_stays_lazy():
    import subprocess
    import sys

    code = ("import sys, torchdict; bad = [m for m in ('torchdict.utils', 'torchdict.functional', "
            "'torchdict.typedtensordict', 'torchdict._legacy_lazy', 'torchdict._compact_repr', 'torch._dynamo') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "src")})
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------------ toggles
LIST_VALUES = [["a", "b"], [1, 2], ("a", "b"), [[1, 2], [3, 4]], ["a"], [torch.zeros(1), torch.ones(1)],
               [None, "x"], [object, 1]]


@pytest.mark.parametrize("mode", [True, False])
@pytest.mark.parametrize("position", range(len(LIST_VALUES)))
def test_list_to_stack_decides_what_a_list_becomes(mode, position):
    value = LIST_VALUES[position]

    def write(lib):
        with lib.set_list_to_stack(mode):
            td = lib.TensorDict(batch_size=[2])
            td["x"] = value
            entry = td.get("x")
        return type(entry).__name__, plain(entry)

    same_outcome(write)


def test_list_to_stack_as_decorator_set_and_environment():
    for lib in (upstream, torchdict):
        assert lib.list_to_stack() is True
        assert lib.list_to_stack(allow_none=True) is None

        @lib.set_list_to_stack(False)
        def inside():
            return lib.list_to_stack(), os.environ.get("LIST_TO_STACK")

        assert inside() == (False, "False")
        assert lib.list_to_stack() is True and "LIST_TO_STACK" not in os.environ
        toggle = lib.set_list_to_stack(False)
        toggle.set()
        try:
            assert lib.list_to_stack() is False
        finally:
            toggle.__exit__(None, None, None)
        assert lib.list_to_stack() is True


def test_turning_list_to_stack_off_warns_as_upstream():
    for lib in (upstream, torchdict):
        with pytest.warns(DeprecationWarning, match="set_list_to_stack"):
            lib.set_list_to_stack(False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            lib.set_list_to_stack(True)


@pytest.mark.parametrize("values", [("a", "a"), ("a", "b"), (1, 1)])
def test_capture_non_tensor_stack(values):
    def stacked(lib, mode):
        with lib.set_capture_non_tensor_stack(mode):
            lone = torch.stack([lib.NonTensorData(value) for value in values])
            inside = torch.stack([lib.TensorDict(s=value) for value in values]).get("s")
        return type(lone).__name__, plain(lone), type(inside).__name__, plain(inside)

    for mode in (True, False):
        same_outcome(lambda lib: stacked(lib, mode))
    assert torchdict.capture_non_tensor_stack() is False


def test_get_defaults_to_none():
    def reads(lib, mode):
        lib.set_get_defaults_to_none(mode)
        try:
            td = lib.TensorDict(a=1)
            return [outcome(lambda: td.get("b")), outcome(lambda: td.get("b", 3)),
                    outcome(lambda: td.get(("c", "d"))), outcome(lambda: td.get_at("b", 0)),
                    outcome(lambda: td.get_at("b", 0, 5)), lib.get_defaults_to_none()]
        finally:
            lib.set_get_defaults_to_none(True)

    for mode in (True, False):
        same_outcome(lambda lib: reads(lib, mode))


def test_get_defaults_to_none_is_deprecated_as_upstream():
    for lib in (upstream, torchdict):
        with pytest.warns(DeprecationWarning, match="set_get_defaults_to_none"):
            lib.set_get_defaults_to_none(True)
        with pytest.warns(DeprecationWarning, match="get_defaults_to_none"):
            assert lib.get_defaults_to_none() is True


# ------------------------------------------------------------------------------------------------ legacy lazy
LEGACY_STEPS = [
    lambda lib, td: (type(td.permute(1, 0)).__name__, plain(td.permute(1, 0).get("a")),
                     type(td.permute(1, 0).get("b")).__name__),
    lambda lib, td: td.permute(1, 0).permute(1, 0) is td,
    lambda lib, td: (td.unsqueeze(-1).squeeze(-1) is td, td.unsqueeze(0).squeeze(0) is td),
    lambda lib, td: (type(td.view(-1)).__name__, td.view(-1).view(3, 4) is td, td.view(3, 4) is td),
    lambda lib, td: (type(td.transpose(0, 1)).__name__, td.transpose(0, 1).transpose(1, 0) is td),
    lambda lib, td: type(torch.stack([td, td], 0)).__name__,
    lambda lib, td: type(td.unsqueeze(0).unsqueeze(0)).__name__,
    lambda lib, td: td.unsqueeze(5),
    lambda lib, td: plain(td.permute(1, 0).to_tensordict()),
    lambda lib, td: plain(td.unsqueeze(1) + 1),
]


@pytest.mark.parametrize("step", range(len(LEGACY_STEPS)))
def test_lazy_legacy_views(step):
    def run(lib):
        td = lib.TensorDict(a=torch.arange(24.).view(3, 4, 2), b={"c": torch.zeros(3, 4)}, s="x", batch_size=[3, 4])
        with lib.set_lazy_legacy(True):
            return LEGACY_STEPS[step](lib, td)

    same_outcome(run)


def test_lazy_legacy_views_write_through():
    def run(lib):
        td = lib.TensorDict(a=torch.zeros(3, 4, 2), batch_size=[3, 4])
        with lib.set_lazy_legacy(True):
            view = td.permute(1, 0)
            view["a"] = torch.ones(4, 3, 2)
            view["new"] = torch.arange(12.).view(4, 3)
            first = plain(td)
            del view["new"]
            view.apply_(lambda x: x.zero_())
        return first, plain(td), type(td.permute(1, 0)).__name__

    same_outcome(run)


# ------------------------------------------------------------------------------------------------ printing
def _printed(lib, kwargs):
    @lib.tensorclass
    class Point:
        x: torch.Tensor
        s: str = "hi"
        y: torch.Tensor = None

    point = Point(x=torch.zeros(3, 2), batch_size=[3])
    samples = [
        lib.TensorDict(a=torch.arange(6.).view(3, 2), b={"c": torch.ones(3, dtype=torch.int64), "s": "hey"},
                       z=torch.zeros(3), batch_size=[3]),
        point, lib.TensorDict(p=point, batch_size=[3]),
        lib.lazy_stack([lib.TensorDict(a=torch.zeros(2), b=torch.zeros(3)), lib.TensorDict(a=torch.zeros(3))]),
        lib.TensorDict(n=lib.NonTensorStack("a", "b"), m=lib.NonTensorData(3), batch_size=[2]),
        lib.TensorDict({f"key_number_{i}": torch.zeros(4, 3) for i in range(8)}, batch_size=[4]),
        lib.TensorDict(a=lib.TensorDict(b=torch.zeros(2, 3), batch_size=[2, 3]), batch_size=[2], device="cpu"),
        lib.TensorDict(a=torch.zeros(2, 3, device="meta", dtype=torch.bfloat16), batch_size=[2]),
        lib.lazy_stack([lib.TensorDict(a=torch.zeros(2), b={"c": torch.zeros(2, 1)}),
                        lib.TensorDict(a=torch.zeros(2), b={"c": torch.zeros(2, 2)})]),
        lib.TensorDict(),
    ]
    with lib.set_printoptions(**kwargs):
        return [outcome(lambda: repr(sample)) for sample in samples]


PRINT_OPTIONS = [
    {"compact": True}, {"compact": True, "show_dtype": False}, {"compact": True, "show_batch_size": False},
    {"compact": True, "show_device": False}, {"compact": True, "sort_keys": None},
    {"compact": True, "sort_keys": lambda text: -len(text)},
]
DETAILED_OPTIONS = [
    {"compact": False}, {"compact": False, "verbose": False}, {"show_grad": True, "show_is_contiguous": True},
    {"show_is_view": True, "show_storage_size": True}, {"plain": True}, {"compact": False, "sort_keys": None},
    {"show_batch_size": False, "compact": False}, {"show_shape": False}, {"show_field_device": False},
]


@pytest.mark.parametrize("kwargs", PRINT_OPTIONS, ids=str)
def test_compact_repr_as_upstream(kwargs):
    assert _printed(torchdict, kwargs) == _printed(upstream, kwargs)


@pytest.mark.parametrize("kwargs", DETAILED_OPTIONS, ids=str)
def test_detailed_repr_options_as_upstream(kwargs):
    # Only the plain TensorDicts: upstream's detailed repr of tensorclasses and lazy stacks differs from the
    # seed's (a deliberate difference of torchdict's default repr, docs/compat.md).
    ours, theirs = _printed(torchdict, kwargs), _printed(upstream, kwargs)
    for position in (0, 5, 9):
        assert ours[position] == theirs[position]


def test_printoptions_are_restored_and_set_persists():
    default = torchdict.get_printoptions()
    assert default["compact"] is False  # the seed's repr stays torchdict's default
    assert set(default) == set(upstream.get_printoptions())
    assert {key: value for key, value in default.items() if key != "compact"} == {
        key: value for key, value in upstream.get_printoptions().items() if key != "compact"}
    with torchdict.set_printoptions(show_dtype=False):
        assert torchdict.get_printoptions()["show_dtype"] is False
    assert torchdict.get_printoptions() == default
    option = torchdict.set_printoptions(compact=True)
    option.set()
    try:
        assert repr(torchdict.TensorDict(a=torch.zeros(3), batch_size=[3])) == "TensorDict(batch_size=[3], fields={a: f32[]})"
    finally:
        option.__exit__(None, None, None)
    assert torchdict.get_printoptions() == default
    for lib in (upstream, torchdict):
        with pytest.raises(TypeError):
            lib.set_printoptions(bogus=True)


@given(spec=specs())
@settings(max_examples=25)
def test_parse_tensor_dict_string_reads_both_forms(spec):
    for compact in (True, False):
        def parsed(lib):
            with lib.set_printoptions(compact=compact):
                text = repr(build(lib, spec))
            rebuilt = lib.parse_tensor_dict_string(text)
            return {key: (tuple(value.shape), value.dtype) for key, value in rebuilt.items(True, True)}, \
                tuple(rebuilt.batch_size)

        same_outcome(parsed)
        with torchdict.set_printoptions(compact=compact):
            original = build(torchdict, spec)
            rebuilt = torchdict.parse_tensor_dict_string(repr(original))
        assert rebuilt.batch_size == original.batch_size
        for key, value in original.items(True, True):
            assert rebuilt[key].shape == value.shape and rebuilt[key].dtype == value.dtype
            assert not rebuilt[key].any()


@pytest.mark.parametrize("text", ["TensorDict(batch_size=[3], fields={s: str})", "nonsense",
                                  "TensorDict(fields={a: f32[2]})", "TensorDict(batch_size=[2], fields={a: f32[3]@meta})",
                                  "TensorDict(batch_size=[], fields={})"])
def test_parse_tensor_dict_string_edge_cases(text):
    same_outcome(lambda lib: lib.parse_tensor_dict_string(text))


# ------------------------------------------------------------------------------------------------ utils
def test_utils_module_has_upstream_helpers():
    import torchdict.utils as ours
    for name in ["NestedKey", "unravel_key", "unravel_key_list", "unravel_key_to_tuple", "_unravel_key_to_tuple",
                 "expand_as_right", "expand_right", "is_tensorclass", "is_non_tensor", "KEY_SEPARATOR", "is_bool",
                 "is_floating", "is_inexact", "is_integer", "assert_close", "assert_allclose_td", "isin",
                 "remove_duplicates", "set_lazy_legacy", "lazy_legacy", "set_list_to_stack", "list_to_stack",
                 "capture_non_tensor_stack", "set_capture_non_tensor_stack", "set_printoptions", "get_printoptions",
                 "parse_tensor_dict_string", "is_batchedtensor", "is_compiling", "print_directory_tree", "timeit",
                 "IndexType", "DeviceType"]:
        assert hasattr(ours, name), name
    assert torchdict.KEY_SEPARATOR == upstream.KEY_SEPARATOR


@pytest.mark.parametrize("key", ["a", ("a",), ("a", ("b", "c")), (("a",),), 1, ("a", 1), (), [("a",)], ("",)])
def test_unravel_key_to_tuple(key):
    same_outcome(lambda lib: lib.unravel_key_to_tuple(key))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool,
                                   torch.complex64])
def test_dtype_predicates(dtype):
    tensor = torch.zeros(2, dtype=dtype)
    same_outcome(lambda lib: [lib.is_bool(tensor), lib.is_floating(tensor), lib.is_inexact("key", tensor),
                              lib.is_integer(tensor)])


@given(lead=st.lists(st.integers(1, 3), min_size=0, max_size=2), extra=st.lists(st.integers(1, 3), max_size=2))
def test_expand_right_and_expand_as_right(lead, extra):
    import tensordict.utils as theirs
    import torchdict.utils as ours

    tensor = torch.arange(int(torch.tensor(lead).prod()) if lead else 1).view(lead)
    shape = tuple(lead) + tuple(extra)
    for helper in ("expand_right", "expand_as_right"):
        target = shape if helper == "expand_right" else torch.zeros(shape)
        a = outcome(lambda: getattr(theirs, helper)(tensor, target))
        b = outcome(lambda: getattr(ours, helper)(tensor, target))
        assert a == b
    wrong = torch.zeros(tuple(size + 1 for size in lead)) if lead else torch.zeros(())
    assert outcome(lambda: theirs.expand_as_right(tensor, wrong)) == outcome(lambda: ours.expand_as_right(tensor, wrong))


def test_is_non_tensor():
    same_outcome(lambda lib: [lib.is_non_tensor(lib.NonTensorData(1)), lib.is_non_tensor(lib.NonTensorStack(1, 2)),
                              lib.is_non_tensor(lib.NonTensorData), lib.is_non_tensor(lib.TensorDict()),
                              lib.is_non_tensor(1)])


def test_leaf_predicates():
    same_outcome(lambda lib: [(fn(torch.Tensor), fn(lib.NonTensorData), fn(lib.NonTensorStack), fn(lib.TensorDict),
                               fn(int), fn(lib.LazyStackedTensorDict))
                              for fn in (lib.default_is_leaf, lib.is_leaf_nontensor)])
    td = torchdict.TensorDict(a={}, b="text", c=torch.zeros(()))
    assert list(td.keys(leaves_only=True, is_leaf=torchdict.default_is_leaf)) == ["c"]
    assert sorted(td.keys(leaves_only=True, is_leaf=torchdict.is_leaf_nontensor)) == ["b", "c"]


@given(spec=specs(), shift=st.sampled_from([0.0, 1e-7, 0.5]), intersection=st.booleans())
@settings(max_examples=30)
def test_assert_close(spec, shift, intersection):
    def check(lib):
        actual = build(lib, spec)
        expected = build(lib, spec).apply(lambda x: x + shift if x.is_floating_point() else x)
        if intersection:
            expected["extra"] = torch.zeros(spec.batch)
        return lib.assert_close(actual, expected, intersection=intersection)

    same_outcome(check)


@pytest.mark.parametrize("case", [
    lambda lib: lib.assert_close(lib.TensorDict(x=torch.zeros(3)), {"x": torch.zeros(3)}),
    lambda lib: lib.assert_close(lib.TensorDict(x=torch.zeros(3)), lib.TensorDict(x=torch.zeros(3, dtype=torch.float64))),
    lambda lib: lib.assert_close(lib.TensorDict(x=torch.zeros(3)), lib.TensorDict(x=torch.zeros(4))),
    lambda lib: lib.assert_allclose_td(lib.TensorDict(a={"b": torch.zeros(2)}, s="x"),
                                       lib.TensorDict(a={"b": torch.zeros(2)}, s="y")),
    lambda lib: lib.assert_close(lib.lazy_stack([lib.TensorDict(a=torch.zeros(2)), lib.TensorDict(a=torch.zeros(3))]),
                                 lib.lazy_stack([lib.TensorDict(a=torch.zeros(2)), lib.TensorDict(a=torch.zeros(3))])),
    lambda lib: lib.assert_close(lib.TensorDict(x=torch.tensor([float("nan")])), lib.TensorDict(x=torch.tensor([float("nan")])),
                                 equal_nan=False),
])
def test_assert_close_edges(case):
    same_outcome(case)


def test_assert_close_names_the_key():
    with pytest.raises(AssertionError, match=r"key \('x',\) does not match"):
        torchdict.assert_close(torchdict.TensorDict(x=torch.zeros(3)), torchdict.TensorDict(x=torch.ones(3)))


@given(spec=specs(min_rank=1, max_rank=2), dim=st.integers(0, 1))
@settings(max_examples=25)
def test_isin_and_remove_duplicates(spec, dim):
    import tensordict.utils as theirs
    import torchdict.utils as ours

    key = spec.entries[0][0]
    for module, lib in ((theirs, upstream), (ours, torchdict)):
        pass
    a = outcome(lambda: theirs.isin(build(upstream, spec), build(upstream, spec)[:1], key, dim=dim))
    b = outcome(lambda: ours.isin(build(torchdict, spec), build(torchdict, spec)[:1], key, dim=dim))
    assert a == b
    a = outcome(lambda: theirs.remove_duplicates(build(upstream, spec), key, dim=dim, return_indices=True))
    b = outcome(lambda: ours.remove_duplicates(build(torchdict, spec), key, dim=dim, return_indices=True))
    assert a == b


def test_timeit_and_directory_tree(tmp_path, capsys):
    from torchdict.utils import print_directory_tree, timeit

    timeit.erase()

    @timeit("fn")
    def fn():
        return 1

    fn()
    with timeit("block"):
        fn()
    assert set(timeit.todict()) == {"fn", "block"} and timeit._REG["fn"][2] == 2
    assert "block took" in timeit.print()
    timeit.erase()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.bin").write_bytes(b"x" * 10)
    text = print_directory_tree(str(tmp_path), display_metadata=False)
    assert "sub/" in text and "f.bin" in text


# ------------------------------------------------------------------------------------------------ functional
COLLATE_CASES = [
    lambda lib: lib.collate([(lib.TensorDict(x=torch.arange(3.)), 0), (lib.TensorDict(x=torch.ones(3)), 1)]),
    lambda lib: lib.collate([lib.TensorDict(p=torch.zeros(2, 3)), lib.TensorDict(p=torch.zeros(4, 3))]),
    lambda lib: lib.collate([{"a": lib.TensorDict(x=torch.zeros(2)), "b": torch.ones(1)},
                             {"a": lib.TensorDict(x=torch.ones(2)), "b": torch.ones(1)}]),
    lambda lib: lib.collate([collections.namedtuple("Sample", "td y")(lib.TensorDict(x=torch.zeros(2)), 3)] * 2),
    lambda lib: lib.collate([lib.TensorDict(ids=torch.ones(n, dtype=torch.long), score=torch.tensor(float(n)))
                             for n in (2, 3)], pad_keys={"ids": 7}, mask_key="mask"),
    lambda lib: lib.collate([lib.TensorDict(ids=torch.ones(n, dtype=torch.long), pts=torch.ones(n + 1, 3))
                             for n in (2, 3)], nested_keys=["pts"], pad_keys={"ids": 0}),
    lambda lib: lib.collate([lib.TensorDict(ids=torch.ones(n)) for n in (2, 3)], mask_key="m"),
    lambda lib: lib.collate([lib.TensorDict(ids=torch.ones(2, n), batch_size=[2]) for n in (2, 3)], pad_keys={"ids": 0}),
    lambda lib: lib.collate([lib.TensorDict(ids=torch.ones(2))], pad_keys={"zz": 0}),
    lambda lib: lib.collate([lib.TensorDict(a=torch.ones(2))], pad_keys={"a": 0}, nested_keys=["a"]),
    lambda lib: lib.collate(lib.TensorDict(a=torch.zeros(2))),
    lambda lib: lib.collate([]),
    lambda lib: lib.collate([1, 2]),
]


@pytest.mark.parametrize("case", range(len(COLLATE_CASES)))
def test_collate(case):
    same_outcome(COLLATE_CASES[case])


def test_collate_with_a_dataloader():
    from torch.utils.data import DataLoader

    samples = [(torchdict.TensorDict(x=torch.full((3,), float(i))), i) for i in range(5)]
    td, label = next(iter(DataLoader(samples, batch_size=4, collate_fn=torchdict.collate)))
    assert td.batch_size == torch.Size([4]) and label.tolist() == [0, 1, 2, 3]
    assert torch.equal(td["x"], torch.stack([sample[0]["x"] for sample in samples[:4]]))


@given(spec=specs(max_rank=2), count=st.integers(1, 3), dim=st.integers(0, 2))
@settings(max_examples=25)
def test_dense_stack_tds(spec, count, dim):
    dim = min(dim, len(spec.batch))  # upstream lets one member through an out-of-range dim
    same_outcome(lambda lib: lib.dense_stack_tds([build(lib, spec) for _ in range(count)], dim=dim))
    same_outcome(lambda lib: lib.dense_stack_tds(lib.lazy_stack([build(lib, spec) for _ in range(count)], 0)))
    same_outcome(lambda lib: lib.dense_stack_tds([build(lib, spec)]))


@given(spec=specs(min_rank=1, max_rank=2), seed=st.integers(0, 100))
@settings(max_examples=25)
def test_group_by(spec, seed):
    keys = torch.randint(0, 3, spec.batch[:1], generator=torch.Generator().manual_seed(seed))

    def grouped(lib):
        td = build(lib, spec)
        td["uid"] = keys.view(spec.batch[:1] + (1,) * (len(spec.batch) - 1)).expand(spec.batch).clone()
        return lib.group_by(td, "uid")

    same_outcome(grouped)


@pytest.mark.parametrize("case", [
    lambda lib: lib.group_by(lib.TensorDict(s=lib.NonTensorStack("b", "a", "b"), r=torch.arange(3.0), batch_size=[3]), "s"),
    lambda lib: lib.group_by(lib.TensorDict(u=torch.tensor([[1, 0], [0, 1], [1, 0]]), r=torch.arange(3.0), batch_size=[3]), "u"),
    lambda lib: lib.group_by(lib.TensorDict(r=torch.arange(3.0), batch_size=[3]), "s"),
    lambda lib: lib.group_by(lib.TensorDict(r=torch.arange(3.0)), "r"),
    lambda lib: lib.group_by(lib.TensorDict(r={"a": torch.zeros(3)}, batch_size=[3]), "r"),
])
def test_group_by_edges(case):
    same_outcome(case)


@given(first=specs(max_rank=0), second=specs(max_rank=0), with_callback=st.booleans())
@settings(max_examples=25)
def test_merge_tensordicts(first, second, with_callback):
    callback = (lambda *values: torch.stack([value.float() for value in values]).sum(0)) if with_callback else None

    def merged(lib):
        inputs = [build(lib, first), build(lib, second)]
        before = [snapshot(td) for td in inputs]
        result = lib.merge_tensordicts(*inputs, callback_exist=callback)
        assert [snapshot(td) for td in inputs] == before  # the inputs are left as they were
        return result

    same_outcome(merged)


@pytest.mark.parametrize("case", [
    lambda lib: lib.merge_tensordicts(lib.TensorDict({"a": {"b0": 0}, "common": 0}),
                                      lib.TensorDict({"a": {"b1": 1}, "f": 1, "common": 1}),
                                      lib.TensorDict({"a": {"b2": 2}, "common": 2})),
    lambda lib: lib.merge_tensordicts(lib.TensorDict(a=0, s="x"), lib.TensorDict(b=1, s="y", t="z")),
    lambda lib: lib.merge_tensordicts(lib.TensorDict(a=0)),
    lambda lib: lib.merge_tensordicts(lib.TensorDict(a=0, c=1), lib.TensorDict(a=1, c=2),
                                      callback_exist={"a": lambda *v: sum(v)}),
])
def test_merge_tensordicts_edges(case):
    same_outcome(case)


@given(spec=specs(), auto=st.sampled_from([None, True, False]))
@settings(max_examples=25)
def test_make_tensordict(spec, auto):
    def made(lib):
        source = build(lib, spec).to_dict()
        return lib.make_tensordict(source, auto_batch_size=auto)

    same_outcome(made)
    same_outcome(lambda lib: lib.make_tensordict({"a": torch.zeros(3)}, a=torch.ones(3), batch_size=[3]))


UNPAD_CASES = [
    lambda lib: lib.unpad_sequence(lib.pad_sequence([lib.TensorDict({"a": torch.arange(n), "b": torch.zeros(n, 2)})
                                                     for n in (3, 5)], return_mask=True))[1],
    lambda lib: lib.unpad_sequence(lib.pad_sequence([lib.TensorDict({"a": torch.arange(n)}) for n in (3, 5)]),
                                   torch.tensor([[True] * 3 + [False] * 2, [True] * 5]))[0],
    lambda lib: lib.unpad_sequence(lib.TensorDict()),
    lambda lib: lib.unpad_sequence(lib.TensorDict(a=torch.zeros(2), batch_size=[2])),
    lambda lib: lib.unpad_sequence(lib.pad_sequence([lib.TensorDict({"a": torch.arange(n)}) for n in (3, 5)]),
                                   torch.ones(3, 5, dtype=torch.bool)),
    lambda lib: lib.unpad_sequence(lib.pad_sequence([lib.TensorDict({"a": torch.arange(n)}) for n in (3, 5)]),
                                   torch.tensor([[True, False, True, False, False], [True] * 5])),
]


@pytest.mark.parametrize("case", range(len(UNPAD_CASES)))
def test_unpad_sequence(case):
    same_outcome(UNPAD_CASES[case])


@given(lengths=st.lists(st.integers(0, 4), min_size=1, max_size=3), side=st.sampled_from(["left", "right"]))
@settings(max_examples=20)
def test_unpad_inverts_pad_sequence(lengths, side):
    samples = [torchdict.TensorDict(a=torch.arange(n), b=torch.ones(n, 2)) for n in lengths]
    unpadded = torchdict.unpad_sequence(torchdict.pad_sequence(samples, return_mask=True, padding_side=side))
    for position, sample in enumerate(samples):
        assert torch.equal(unpadded[position]["a"], sample["a"])
        assert torch.equal(unpadded[position]["b"], sample["b"])


# ------------------------------------------------------------------------------------------------ constructors
@given(spec=specs(), auto=st.booleans())
@settings(max_examples=25)
def test_top_level_constructors(spec, auto):
    def raw(lib):
        return {".".join(path): value for path, value in values_of(spec).items()}

    same_outcome(lambda lib: lib.from_dict(build(lib, spec).to_dict(), auto_batch_size=auto))
    same_outcome(lambda lib: lib.from_tuple(tuple(raw(lib).values()), auto_batch_size=auto))
    same_outcome(lambda lib: lib.from_any(build(lib, spec).to_dict(), auto_batch_size=auto))
    same_outcome(lambda lib: lib.fromkeys(list(raw(lib)), 1))
    same_outcome(lambda lib: lib.from_pytree(list(raw(lib).values()), auto_batch_size=auto))
    same_outcome(lambda lib: lib.from_pytree(build(lib, spec).to_dict()).to_pytree())


@pytest.mark.parametrize("case", [
    lambda lib: lib.TensorDict.from_tuple((torch.zeros(3), (torch.ones(3, 2), "x")), auto_batch_size=True),
    lambda lib: lib.TensorDict.from_tuple((torch.zeros(3, 4), 1), auto_batch_size=True),
    lambda lib: lib.TensorDict.from_tuple((torch.zeros(3),), auto_batch_size=True, batch_size=[3]),
    lambda lib: lib.TensorDict.from_list([{"a": torch.zeros(3)}, {"a": torch.ones(3)}], batch_size=[2, 3],
                                         names=["x", "y"]).names,
    lambda lib: lib.TensorDict.from_list([{"a": torch.zeros(3)}, {"a": torch.ones(4)}]),
    lambda lib: lib.TensorDict.from_list([{"a": torch.zeros(3)}, {"a": torch.ones(3)}], lazy=True),
    lambda lib: lib.TensorDict.from_list([{"a": torch.zeros(3)}], batch_size=[2]),
    lambda lib: lib.TensorDict.from_list([lib.TensorDict(a=torch.zeros(3)), lib.TensorDict(a=torch.ones(3))],
                                         batch_dims=2),
    lambda lib: lib.TensorDict.from_list([{"a": torch.zeros(3, 2)}, {"a": torch.ones(3, 2)}], batch_dims=2),
    lambda lib: lib.TensorDict.from_pytree([1, 2.0, {3: torch.ones(2), "k": [torch.zeros(1)]}]).to_pytree(),
    lambda lib: lib.TensorDict.from_pytree(collections.OrderedDict(a=torch.zeros(2))).to_pytree(),
    lambda lib: lib.TensorDict.from_pytree("x"),
    lambda lib: lib.TensorDict(a=torch.zeros(2)).to_pytree(),
    lambda lib: lib.from_pytree((torch.zeros(2),), batch_size=[2]),
    lambda lib: lib.from_module(torch.nn.Linear(2, 3)).is_locked,
    lambda lib: lib.from_modules(torch.nn.Linear(2, 3), torch.nn.Linear(2, 3)).batch_size,
])
def test_constructor_edges(case):
    same_outcome(case)


def test_from_pytree_round_trips_non_key_dict_keys():
    class Key:
        pass

    key = Key()
    tree = ([torch.arange(3), torch.zeros(2)], {"tensor": torch.ones(2), key: torch.arange(2)})
    rebuilt = torchdict.TensorDict.from_pytree(tree).to_pytree()
    assert type(rebuilt) is tuple and type(rebuilt[0]) is list and key in rebuilt[1]
    assert torch.equal(rebuilt[1][key], torch.arange(2))


def test_from_dataclass_top_level():
    @dataclasses.dataclass
    class X:
        a: int
        b: torch.Tensor

    def made(lib):
        instance = lib.from_dataclass(X(0, torch.zeros(3)), auto_batch_size=True)
        cls = lib.from_dataclass(X, autocast=True)
        return type(instance).__name__, plain(instance._tensordict), cls.__name__, \
            lib.is_tensorclass(cls), lib.from_dataclass(cls) is cls

    same_outcome(made)
    same_outcome(lambda lib: lib.from_dataclass(1))


def test_pickling_toggles_and_typed_helpers():
    toggle = torchdict.set_list_to_stack(True)
    assert pickle.loads(pickle.dumps(toggle)).mode is True


def test_non_tensor_data_base_and_tensor_attrs():
    same_outcome(lambda lib: [isinstance(lib.NonTensorData("a"), lib.NonTensorDataBase),
                              issubclass(lib.NonTensorStack, lib.NonTensorDataBase),
                              issubclass(lib.NonTensorData, lib.NonTensorDataBase)])

    def attrs(lib):
        described = lib.TensorAttrs.from_tensor(torch.zeros(2, 3, dtype=torch.int32), fields=("dtype", "shape"))
        return described.tgt_dtype, described.tgt_shape, described.tgt_device, lib.is_tensorclass(described)

    same_outcome(attrs)
