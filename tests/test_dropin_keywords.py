"""The keywords upstream's members accept, in torchdict: a signature diff (every keyword of a shared member or
top-level function exists here, unless listed below with its reason) and, for each keyword added for drop-in
parity, the same results as upstream (or the same exception kind) and nothing changed by a failed call."""
from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdict
from _dropin_diff import build, outcome, plain, same_outcome, snapshot, specs, upstream

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

# Keywords upstream accepts that torchdict does not, each with its reason. Keep this list short: an entry is
# a gap to close (or a deliberate difference documented in docs/compat.md).
ALLOWED_MISSING: dict = {}

# Members owned by other parts of the port (persistence, device moves, formats, the store): their keywords are
# checked by those parts' own tests.
OWNED_ELSEWHERE = {
    "memmap", "memmap_", "memmap_like", "save", "dumps", "load", "load_", "load_memmap", "load_memmap_",
    "make_memmap", "make_memmap_from_storage", "make_memmap_from_tensor", "memmap_refresh_", "consolidate",
    "from_consolidated", "is_consolidated", "pin_memory", "pin_memory_", "record_stream", "cuda", "cpu", "to",
    "to_h5", "from_h5", "to_zarr", "from_zarr", "to_csv", "from_csv", "to_json", "from_json", "to_pandas",
    "from_pandas", "to_parquet", "from_parquet", "to_struct_array", "from_struct_array", "to_mds", "to_store",
    "from_arrow", "to_arrow", "from_safetensors", "to_safetensors", "append_memmap", "pack_memmap",
    "unpack_memmap", "refresh_archive_checksums", "is_memmap_archive", "from_schema", "pack",
}


def _named_parameters(function) -> set:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return set()
    return {name for name, parameter in parameters.items()
            if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)}


def _missing_keywords(upstream_owner, our_owner, names, label):
    gaps = {}
    for name in names:
        if name in OWNED_ELSEWHERE:
            continue
        theirs = _named_parameters(getattr(upstream_owner, name))
        ours = _named_parameters(getattr(our_owner, name))
        if not ours and theirs:
            ours_function = getattr(our_owner, name)
            try:
                inspect.signature(ours_function)
            except (TypeError, ValueError):
                continue  # a C or generated member without a signature: checked by behaviour instead
        missing = theirs - ours - ALLOWED_MISSING.get((label, name), set())
        if missing:
            gaps[name] = sorted(missing)
    return gaps


def test_tensordict_members_accept_upstreams_keywords():
    shared = sorted({name for name in dir(upstream.TensorDict) if not name.startswith("_")}
                    & {name for name in dir(torchdict.TensorDict) if not name.startswith("_")})
    assert _missing_keywords(upstream.TensorDict, torchdict.TensorDict, shared, "TensorDict") == {}


def test_top_level_functions_accept_upstreams_keywords():
    shared = sorted(name for name in dir(upstream) if not name.startswith("_") and callable(getattr(upstream, name))
                    and hasattr(torchdict, name) and not isinstance(getattr(upstream, name), type))
    assert _missing_keywords(upstream, torchdict, shared, "top") == {}


def test_tensorclass_decorator_accepts_upstreams_options():
    assert _named_parameters(upstream.tensorclass) - _named_parameters(torchdict.tensorclass) == set()


def _decorated_class(lib):
    @lib.tensorclass
    class Point:
        x: torch.Tensor
        tag: str = "a"

    return Point


def _tensorclass_subclass(lib):
    # A subclass, as users call them (on upstream's base class itself from_tensordict is a plain function
    # whose ``cls`` shows as a parameter).
    class Record(lib.TensorClass):
        x: torch.Tensor

    return Record


# The public classes of upstream's census that torchdict implements, each as ``lib -> class``.
CLASSES = {
    "LazyStackedTensorDict": lambda lib: lib.LazyStackedTensorDict,
    "NonTensorData": lambda lib: lib.NonTensorData,
    "NonTensorStack": lambda lib: lib.NonTensorStack,
    "TensorDictParams": lambda lib: lib.TensorDictParams,
    "MemoryMappedTensor": lambda lib: lib.MemoryMappedTensor,
    "PersistentTensorDict": lambda lib: lib.PersistentTensorDict,
    "tensorclass": _decorated_class,
    "TensorClass": _tensorclass_subclass,
    **{f"nn.{name}": (lambda lib, name=name: getattr(lib.nn, name)) for name in (
        "TensorDictModuleBase", "TensorDictModule", "TensorDictSequential", "ProbabilisticTensorDictModule",
        "ProbabilisticTensorDictSequential", "EnsembleModule", "CompositeDistribution")},
}


def _public(owner) -> set:
    return {name for name in dir(owner) if not name.startswith("_")}


@pytest.mark.parametrize("label", sorted(CLASSES))
def test_class_members_accept_upstreams_keywords(label):
    theirs, ours = CLASSES[label](upstream), CLASSES[label](torchdict)
    shared = sorted(_public(theirs) & _public(ours))
    assert _missing_keywords(theirs, ours, shared, label) == {}


def test_the_class_diff_sees_a_forwarder_without_a_signature():
    # A member written as ``(self, *args, **kwargs)`` hides its keywords: the diff reports them all.
    class Theirs:
        def op(self, other, *, alpha=1):
            return other

    class Ours:
        def op(self, *args, **kwargs):
            return args

    assert _missing_keywords(Theirs, Ours, ["op"], "test") == {"op": ["alpha", "other"]}


# ------------------------------------------------------------------------------------------------ default=
DEFAULT_OPS = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "clamp_min", "clamp_max", "rsub",
               "logical_and"]


@pytest.mark.parametrize("op", DEFAULT_OPS)
@pytest.mark.parametrize("default", ["intersection", "zero", "row", "bogus", None])
def test_binary_default(op, default):
    if op == "logical_and" and default == "bogus":
        pytest.skip("upstream's logical_and calls a method of the bogus str (AttributeError); the others and "
                    "torchdict raise TypeError for an unknown default")

    def run(lib):
        td = lib.TensorDict(a=torch.arange(6.).view(2, 3) + 1, b=torch.ones(2) * 2, n={"x": torch.ones(2)}, s="str",
                            batch_size=[2])
        other = lib.TensorDict(b=torch.ones(2) * 3, c=torch.ones(2), n={"y": torch.ones(2)}, batch_size=[2])
        value = {"zero": torch.zeros(()), "row": torch.tensor([5.0, 6.0])}.get(default, default)
        before = snapshot(td)
        result = outcome(lambda: getattr(td, op)(other, default=value))
        assert snapshot(td) == before
        return result, list(getattr(td, op)(other, default="intersection").keys(True, True))

    same_outcome(run)


@given(first=specs(float_only=True), keep=st.integers(0, 3), extra=st.booleans(),
       default=st.sampled_from(["intersection", 0.5]))
@settings(max_examples=25)
def test_binary_default_on_drawn_tensordicts(first, keep, extra, default):
    # The second operand: some of the first's entries (same shapes), maybe one of its own.
    entries = first.entries[:keep] + ((("z",), torch.float32, ()),) * extra
    second = type(first)(first.batch, entries, first.seed + 1)

    def run(lib):
        value = torch.tensor(default) if isinstance(default, float) else default
        return build(lib, first).add(build(lib, second), default=value)

    same_outcome(run)


# ------------------------------------------------------------------------------------------------ cast_filter
CASTS = ["bfloat16", "bool", "complex128", "complex64", "double", "float", "float16", "float32", "float64", "half",
         "int", "int16", "int32", "int64", "int8", "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("cast", CASTS)
@pytest.mark.parametrize("which", ["is_inexact", "is_integer", "nested_only", "not_callable"])
def test_cast_filter(cast, which):
    def run(lib):
        td = lib.TensorDict(x=torch.arange(3.), i=torch.arange(3), n={"y": torch.ones(3)}, s="x", batch_size=[3])
        td.lock_()
        predicate = {"is_inexact": lib.is_inexact, "is_integer": lib.is_integer,
                     "nested_only": lambda key, value: key[0] == "n", "not_callable": "x"}[which]
        result = getattr(td, cast)(cast_filter=predicate)
        return plain(result), result.is_locked

    same_outcome(run)


@pytest.mark.parametrize("dst_type", [torch.int32, "torch.IntTensor", torch.float64])
def test_type_with_cast_filter(dst_type):
    same_outcome(lambda lib: lib.TensorDict(x=torch.arange(3.), i=torch.arange(3), batch_size=[3]).type(
        dst_type, cast_filter=lib.is_inexact))
    same_outcome(lambda lib: lib.TensorDict(x=torch.arange(3.), batch_size=[3]).type(dst_type=dst_type))


@given(spec=specs())
@settings(max_examples=25)
def test_cast_filter_keys_are_tuples_on_drawn_tensordicts(spec):
    def run(lib):
        seen = []
        result = build(lib, spec).float64(cast_filter=lambda key, value: (seen.append(key), value.ndim > 1)[1])
        return seen, result

    same_outcome(run)


# ------------------------------------------------------------------------------------------------ reductions
@pytest.mark.parametrize("reduction", ["sum", "mean", "std", "var", "norm"])
@pytest.mark.parametrize("reduce", [False, True])
def test_key_transform(reduction, reduce):
    def run(lib):
        td = lib.TensorDict(a=torch.arange(6.).view(3, 2), n={"b": torch.arange(3.)}, batch_size=[3])
        kwargs = {} if reduction == "norm" else {"dim": 0}
        if reduce and reduction != "norm":
            kwargs = {"reduce": True}
        return getattr(td, reduction)(key_transform=lambda key: f"{reduction}_{key}", **kwargs)

    same_outcome(run)
    same_outcome(lambda lib: lib.TensorDict(a=torch.arange(3.), batch_size=[3]).quantile(
        0.5, 0, key_transform=str.upper))


def test_logsumexp_and_norm_out():
    def run(lib):
        td = lib.TensorDict(a=torch.arange(6.).view(3, 2), n={"b": torch.arange(3.)}, batch_size=[3])
        out = lib.TensorDict(a=torch.zeros(5), n={"b": torch.zeros(())})
        first = out["a"]
        result = td.logsumexp(0, out=out)
        norm_out = lib.TensorDict(a=torch.zeros(()))
        norms = td.norm(out=norm_out)
        return result is out, out["a"] is first, plain(out), norms is norm_out, plain(norm_out)

    same_outcome(run)


@given(spec=specs(min_rank=1, float_only=True))
@settings(max_examples=20)
def test_logsumexp_out_matches_torch(spec):
    td = build(torchdict, spec)
    out = td.logsumexp(0).apply(torch.zeros_like)
    td.logsumexp(0, out=out)
    for key, leaf in td.items(True, True):
        torch.testing.assert_close(out[key], torch.logsumexp(leaf, 0))


# ------------------------------------------------------------------------------------------------ shape keywords
INPLACE_CASES = ["td.roll(1, 0, inplace=True)", "td.repeat(2, inplace=True)",
                 "td.gather(0, torch.tensor([2, 0]), inplace=True)",
                 "td.masked_select(torch.tensor([True, False, True]), inplace=True)",
                 "td.repeat_interleave(2, 0, inplace=True)", "td.contiguous(inplace=True)",
                 "td.contiguous(canonical=True)", "td.gather(0, torch.tensor([2, 0]), out=td.clone()[:2], inplace=True)",
                 "td.flip(dims=0)", "td.flip(0)", "td.tile(dims=(2,))", "td.tile(2)", "td.swapaxes(axis0=0, axis1=0)",
                 "td.swapdims(axis0=0, axis1=0)", "td.clamp(0, 2, out=td.clone())", "td.clamp(0, 2, out=td[:2].clone())",
                 "td.select('a', as_tensordict=True)", "td.new_zeros(2, dtype=torch.int32, device=None)",
                 "td.new_ones(2, requires_grad=True)", "td.new_empty(2, layout=torch.strided, pin_memory=False, empty_lazy=True).batch_size",
                 "td.new_full((2,), 3, dtype=torch.int64)",
                 "td.where(torch.tensor([True, False, True]), 0, out=td.clone(), update_batch_size=True)"]


@pytest.mark.parametrize("expression", INPLACE_CASES)
@pytest.mark.parametrize("locked", [False, True])
def test_shape_keywords(expression, locked):
    def run(lib):
        td = lib.TensorDict(a=torch.arange(6.).view(3, 2), n={"b": torch.arange(3)}, s="x", batch_size=[3])
        nested = td.get("n")
        if locked:
            td.lock_()
        before = snapshot(td)
        result = outcome(lambda: eval(expression))
        kept = td.get("n") is nested
        if result[0] == "raises":
            assert snapshot(td) == before
        return result, plain(td), kept

    same_outcome(run)


@given(spec=specs(min_rank=1), shift=st.integers(-2, 2))
@settings(max_examples=25)
def test_inplace_roll_and_repeat_match_the_new_result(spec, shift):
    td = build(torchdict, spec)
    expected = td.roll(shift, 0)
    assert td.roll(shift, 0, inplace=True) is td
    assert plain(td) == plain(expected)
    expected = td.repeat(*([2] + [1] * (td.batch_dims - 1)))
    td.repeat(*([2] + [1] * (td.batch_dims - 1)), inplace=True)
    assert plain(td) == plain(expected)


# ------------------------------------------------------------------------------------------------ the rest
COPY_CASES = [
    "td.copy_at_(src, 0)", "td.copy_at_({'a': torch.ones(2), 'n': {'b': torch.ones(())}}, 0)",
    "td.copy_at_(src, torch.tensor([0, 1]))", "td.copy_at_(src, slice(0, 2))",
    "td.copy_at_(lib.TensorDict(a=torch.ones(()), n={'b': torch.ones(())}), 0)",
    "td.copy_at_(lib.TensorDict(a=torch.ones(2)), 0)", "td.copy_at_({'a': torch.ones(2)}, 0, fast=False)",
    "td.copy_at_(lib.TensorDict(a=torch.ones(2), z=torch.ones(())), 0)", "td.copy_(tensordict=td.clone() + 1)",
]


@pytest.mark.parametrize("expression", COPY_CASES)
def test_copy_keywords(expression):
    def run(lib):
        td = lib.TensorDict(a=torch.zeros(3, 2), n={"b": torch.zeros(3)}, batch_size=[3])
        src = lib.TensorDict(a=torch.ones(2), n={"b": torch.ones(())}, batch_size=[])  # noqa: F841
        before = snapshot(td)
        result = outcome(lambda: eval(expression))
        if result[0] == "raises":
            assert snapshot(td) == before
        return result, plain(td)

    same_outcome(run)


@pytest.mark.parametrize("kwargs", [dict(batch_dims=2), dict(batch_dims=2, keep_compliant_size=True),
                                    dict(keep_compliant_size=True)])
def test_auto_batch_size_keep_compliant_size(kwargs):
    same_outcome(lambda lib: lib.TensorDict(
        a=torch.zeros(3, 4, 5), n=lib.TensorDict(b=torch.zeros(3, 4, 5, 6), batch_size=[3, 4, 5]),
        o=lib.TensorDict(c=torch.zeros(3, 4, 5), batch_size=[3])).auto_batch_size_(**kwargs))


def test_stack_out_and_input_names():
    def run(lib):
        members = [lib.TensorDict(a=torch.zeros(2)), lib.TensorDict(a=torch.ones(2))]
        lazy_out = lib.lazy_stack([lib.TensorDict(a=torch.zeros(2)), lib.TensorDict(a=torch.zeros(2))])
        first = lib.lazy_stack(members, out=lazy_out) is lazy_out
        dense_out = lib.TensorDict(a=torch.zeros(2, 2), batch_size=[2])
        second = lib.maybe_dense_stack(members, out=dense_out) is dense_out
        named = lib.TensorDict.lazy_stack(input=members, dim=0)
        wrong = outcome(lambda: lib.lazy_stack(members, out=lib.TensorDict(a=torch.zeros(3, 2), batch_size=[3])))
        return first, plain(lazy_out), second, plain(dense_out), type(named).__name__, wrong

    same_outcome(run)


def test_from_modules_lazy_stack_and_from_dataclass_as_tensorclass():
    import dataclasses

    @dataclasses.dataclass
    class Point:
        x: torch.Tensor
        label: int = 3

    def run(lib):
        first, second = torch.nn.Linear(2, 3), torch.nn.Linear(2, 3)
        stacked = lib.TensorDict.from_modules(first, second, lazy_stack=True)
        same_objects = stacked[0]["weight"] is first.weight
        refused = outcome(lambda: lib.TensorDict.from_modules(first, second, lazy_stack=True, as_module=True))
        instance = lib.TensorDict.from_dataclass(Point(torch.zeros(3)), as_tensorclass=True)
        cls = lib.TensorDict.from_dataclass(Point, as_tensorclass=True)
        return (type(stacked).__name__, stacked.is_locked, same_objects, refused, type(instance).__name__,
                lib.is_tensorclass(cls), cls.__name__)

    same_outcome(run)


@pytest.mark.parametrize("preserve", [True, False])
def test_to_module_preserve_module_state(preserve):
    def run(lib):
        module = torch.nn.Linear(2, 3)
        zeros = lib.TensorDict.from_module(module).apply(lambda x: torch.zeros_like(x).detach())
        with zeros.to_module(module, preserve_module_state=preserve):
            inside = ("weight" in dict(module.named_parameters()), float(module(torch.ones(2)).sum()))
        after = (type(module.weight).__name__, "weight" in dict(module.named_parameters()),
                 "weight" in module.__dict__)
        return inside, after

    same_outcome(run)
