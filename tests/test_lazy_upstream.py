"""LazyStackedTensorDict against upstream tensordict 0.15.3, member by member.

Every public member of upstream's ``LazyStackedTensorDict`` is called on equal lazy stacks built in both
libraries (hypothesis draws the members' batch shapes (ranks 0-2), their count, the stack dim, nested
keys, ragged leaves and exclusive keys), and the results must be equal: values, batch sizes, and the
kind of result (a lazy stack where upstream gives one, with the same stack dim and members; a dense
TensorDict where upstream gives one), or both calls raise errors of the same type, ours leaving the
stack unchanged. The stack after each call is compared too (in-place members).

Where upstream is plainly wrong (``UPSTREAM_WRONG``), the case states what torchdict does instead.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _lazy_diff import OURS, UP, Ctx, build_lazy, check_case, compare, norm, specs

EXAMPLES = int(os.environ.get("LAZY_DIFF_EXAMPLES", "12"))

Call = Callable[[Ctx], Any]


def nb(c: Ctx) -> int:
    return len(c.batch)


def sd(c: Ctx) -> int:
    return c.spec.stack_dim


def other_dim(c: Ctx) -> int:
    """A batch dim that is not the stack dim, or the stack dim when there is none."""
    return (sd(c) + 1) % nb(c)


# ------------------------------------------------------------------------------ the case table
CASES: dict = {}
#: Members whose non-tensor entries behave differently in torchdict's *dense* TensorDict (see
#: NONTENSOR_REASON): their cases draw no non-tensor entry.
NO_NONTENSOR: set = set()
NONTENSOR_REASON = ("the dense TensorDict differs from upstream's on NonTensorStack entries (reductions skip them, "
                    "new_* / rot90 / separates treat them otherwise): not a lazy-stack difference")


def plain(spec: Any) -> bool:
    """No ragged leaf, exclusive key or non-tensor entry: a dense operand then has every key."""
    return not (spec.ragged or spec.exclusive or spec.nontensor)


def case(member: str, *calls: Call, when: Callable[[Any], bool] = lambda spec: True,
         nontensor: bool = True) -> None:
    """Calls to compare for ``member`` (on specs where ``when`` holds; no non-tensor entries unless
    ``nontensor``)."""
    CASES.setdefault(member, []).extend((call, when) for call in calls)
    if not nontensor:
        NO_NONTENSOR.add(member)


UNARY = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
         "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "sigmoid", "sign", "sin", "sinh",
         "sqrt", "tan", "tanh", "trunc")
for _name in UNARY:
    case(_name, lambda c, n=_name: getattr(c.td, n)())
    case(f"{_name}_", lambda c, n=_name: getattr(c.td.float(), f"{n}_")(), lambda c, n=_name: getattr(c.td, f"{n}_")())
for _name in ("isfinite", "isnan", "isneginf", "isposinf", "isreal"):
    case(_name, lambda c, n=_name: getattr(c.td, n)())

BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "clamp_max", "clamp_min", "mod", "rsub",
          "bitwise_and", "logical_and")
OPERANDS: dict = {
    "number": lambda c: 2,
    "lazy": lambda c: c.lazy(),
    "dense": lambda c: c.dense(),
    "tensor": lambda c: c.tensor(),
}
for _name in BINARY:
    for _kind, _operand in OPERANDS.items():
        # A dense operand lacks the ragged, exclusive and non-tensor keys: the members' dense ops then
        # differ from upstream's in which error comes first (a dense-TensorDict matter).
        _when = plain if _kind == "dense" else (lambda spec: True)
        case(_name, lambda c, n=_name, o=_operand: getattr(c.td, n)(o(c)), when=_when)
        if f"{_name}_" in ("add_", "sub_", "mul_", "div_", "pow_", "maximum_", "minimum_", "clamp_max_", "clamp_min_"):
            case(f"{_name}_", lambda c, n=_name, o=_operand: getattr(c.td.float(), f"{n}_")(o(c)),
                 lambda c, n=_name, o=_operand: getattr(c.td, f"{n}_")(o(c)), when=_when)
case("add", lambda c: c.td.add(c.lazy(), alpha=2))
case("sub_", lambda c: c.td.float().sub_(1, alpha=2))
case("lerp", lambda c: c.td.lerp(c.lazy(), 0.5))
# A 0-d tensor weight on an int64 leaf: torchdict's dense lerp casts where upstream's raises (dense matter).
case("lerp", lambda c: c.td.float().lerp(c.dense().float(), c.tensor()), when=plain)
case("lerp_", lambda c: c.td.float().lerp_(c.lazy(), 0.5), lambda c: c.td.lerp_(c.lazy(), 0.5))
for _name in ("addcdiv", "addcmul"):
    case(_name, lambda c, n=_name: getattr(c.td, n)(c.lazy(), c.lazy(2), value=2))
    case(f"{_name}_", lambda c, n=_name: getattr(c.td.float(), f"{n}_")(c.lazy(), c.lazy(2), value=2))
case("clamp", lambda c: c.td.clamp(0.2, 0.8), lambda c: c.td.clamp(min=0.3), lambda c: c.td.clamp(c.lazy(), None))

CASTS = ("bfloat16", "bool", "complex128", "complex32", "complex64", "double", "float", "float16", "float32",
         "float64", "half", "int", "int16", "int32", "int64", "int8", "uint16", "uint32", "uint64", "uint8",
         "qint32", "qint8", "quint4x2", "quint8")
for _name in CASTS:
    case(_name, lambda c, n=_name: getattr(c.td, n)())
case("type", lambda c: c.td.type(torch.float64))

# ---- shape
case("view", lambda c: c.td.view(-1), lambda c: c.td.view(*c.batch), lambda c: c.td.view(1, *c.batch),
     lambda c: c.td.view(torch.float16))
case("reshape", lambda c: c.td.reshape(-1), lambda c: c.td.reshape(*c.batch), lambda c: c.td.reshape(1, *c.batch),
     lambda c: c.td.reshape(*c.batch[:-1], 1, c.batch[-1]))
case("flatten", lambda c: c.td.flatten(), lambda c: c.td.flatten(0, -1), lambda c: c.td.flatten(-2, -1))
case("unflatten", lambda c: c.td.unflatten(0, (c.batch[0], 1)), lambda c: c.td.unflatten(-1, (1, c.batch[-1])))
case("permute", lambda c: c.td.permute(*reversed(range(nb(c)))), lambda c: c.td.permute(list(range(nb(c)))))
for _name in ("transpose", "swapaxes", "swapdims"):
    case(_name, lambda c, n=_name: getattr(c.td, n)(0, -1), lambda c, n=_name: getattr(c.td, n)(sd(c), other_dim(c)))
for _name in ("moveaxis", "movedim"):
    case(_name, lambda c, n=_name: getattr(c.td, n)(0, -1), lambda c, n=_name: getattr(c.td, n)(sd(c), 0))
case("squeeze", lambda c: c.td.squeeze(), lambda c: c.td.squeeze(0), lambda c: c.td.squeeze(sd(c)))
case("unsqueeze", lambda c: c.td.unsqueeze(0), lambda c: c.td.unsqueeze(-1), lambda c: c.td.unsqueeze(sd(c)))
case("expand", lambda c: c.td.expand(2, *c.batch), lambda c: c.td.expand(*c.batch))
case("expand_as", lambda c: c.td.expand_as(torch.zeros(2, *c.batch)))
case("broadcast_to", lambda c: c.td.broadcast_to((2, *c.batch)))
case("repeat", lambda c: c.td.repeat(*([2] + [1] * (nb(c) - 1))), lambda c: c.td.repeat(*([1] * nb(c))))
case("repeat_interleave", lambda c: c.td.repeat_interleave(2, dim=0), lambda c: c.td.repeat_interleave(2, dim=sd(c)))
case("tile", lambda c: c.td.tile((2,)), lambda c: c.td.tile((1, 2)))
case("flip", lambda c: c.td.flip(0), lambda c: c.td.flip(sd(c)), lambda c: c.td.flip((0, -1)))
case("fliplr", lambda c: c.td.fliplr())
case("flipud", lambda c: c.td.flipud())
case("roll", lambda c: c.td.roll(1, 0), lambda c: c.td.roll(1, sd(c)), lambda c: c.td.roll(1, other_dim(c)))
case("rot90", lambda c: c.td.rot90(1, (0, 1)), nontensor=False)
case("narrow", lambda c: c.td.narrow(0, 0, 1), lambda c: c.td.narrow(sd(c), 0, 1))
case("split", lambda c: c.td.split(1, 0), lambda c: c.td.split(1, sd(c)), lambda c: c.td.split(2, other_dim(c)))
case("chunk", lambda c: c.td.chunk(2, 0), lambda c: c.td.chunk(2, sd(c)), lambda c: c.td.chunk(2, other_dim(c)))
# A piece with no member along the stack dim is an empty dense TensorDict here (upstream: a member-less lazy
# stack, which torchdict does not have): compared where every piece has a member.
case("tensor_split", lambda c: c.td.tensor_split(2, 0), lambda c: c.td.tensor_split(2, sd(c)),
     when=lambda spec: spec.count > 1)
case("unbind", lambda c: c.td.unbind(0), lambda c: c.td.unbind(sd(c)), lambda c: c.td.unbind(-1))
case("gather", lambda c: c.td.gather(sd(c), torch.zeros(c.batch, dtype=torch.long)),
     lambda c: c.td.gather(other_dim(c), torch.zeros(c.batch, dtype=torch.long)))
for _name in ("atleast_1d", "atleast_2d", "atleast_3d"):
    case(_name, lambda c, n=_name: getattr(c.td, n)())
case("masked_select", lambda c: c.td.masked_select(c.some_mask()))
case("masked_fill", lambda c: c.td.masked_fill(c.mask(), 0.5))
case("masked_fill_", lambda c: c.td.masked_fill_(c.mask(), 0.5))
case("where", lambda c: c.td.where(c.mask(), 0.5), lambda c: c.td.where(c.mask(), c.lazy()))
case("where", lambda c: c.td.where(c.mask(), c.dense()), when=plain)

# ---- reductions
for _name in ("sum", "mean", "nansum", "nanmean", "prod", "std", "var", "amax", "amin", "max", "min"):
    case(_name, lambda c, n=_name: getattr(c.td, n)(), lambda c, n=_name: getattr(c.td, n)(0),
         lambda c, n=_name: getattr(c.td, n)(sd(c)), lambda c, n=_name: getattr(c.td, n)(other_dim(c)),
         lambda c, n=_name: getattr(c.td, n)(-1, keepdim=True), lambda c, n=_name: getattr(c.td, n)(reduce=True),
         nontensor=False)
for _name in ("all", "any"):
    case(_name, lambda c, n=_name: getattr(c.td > 0.5, n)(), lambda c, n=_name: getattr(c.td > 0.5, n)(0),
         lambda c, n=_name: getattr(c.td > 0.5, n)(sd(c)), nontensor=False)
case("logsumexp", lambda c: c.td.logsumexp(0), lambda c: c.td.float().logsumexp(sd(c)), nontensor=False)
case("norm", lambda c: c.td.float().norm(), nontensor=False)
case("quantile", lambda c: c.td.float().quantile(0.5), lambda c: c.td.float().quantile(0.5, 0), nontensor=False)
for _name in ("cummax", "cummin"):
    case(_name, lambda c, n=_name: getattr(c.td, n)(0), lambda c, n=_name: getattr(c.td, n)(sd(c)))
case("softmax", lambda c: c.td.float().softmax(0), lambda c: c.td.float().softmax(sd(c)))

# ---- keys and entries
for _name in ("keys", "values", "items", "valid_keys"):
    case(_name, lambda c, n=_name: list(getattr(c.td, n)()), lambda c, n=_name: list(getattr(c.td, n)(True)),
         lambda c, n=_name: list(getattr(c.td, n)(True, True)), lambda c, n=_name: list(getattr(c.td, n)(True, sort=True)))
case("sorted_keys", lambda c: c.td.sorted_keys)
case("select", lambda c: c.td.select("a"), lambda c: c.td.select("a", ("n", "c")), lambda c: c.td.select("e0"),
     lambda c: c.td.select("e0", strict=False), lambda c: c.td.select("a", inplace=True),
     lambda c: c.td.select("missing"))
case("exclude", lambda c: c.td.exclude("a"), lambda c: c.td.exclude(("n", "b"), "e0"),
     lambda c: c.td.exclude("a", inplace=True))
case("flatten_keys", lambda c: c.td.flatten_keys(), lambda c: c.td.flatten_keys("_"),
     lambda c: c.td.flatten_keys(inplace=True))
case("unflatten_keys", lambda c: c.td.flatten_keys().unflatten_keys(), lambda c: c.td.unflatten_keys())
case("rename_key_", lambda c: c.td.rename_key_("a", "z"), lambda c: c.td.rename_key_(("n", "b"), ("n", "z")),
     lambda c: c.td.rename_key_("missing", "z"))
case("rename_keys", lambda c: c.td.rename_keys({"a": "z"}))
case("split_keys", lambda c: c.td.split_keys(["a"]), lambda c: c.td.split_keys(["a"], ["n"]))
case("separates", lambda c: c.td.separates("a"), nontensor=False)
case("set", lambda c: c.td.set("z", c.tensor()), lambda c: c.td.set("a", c.tensor((*c.batch, 2)), inplace=True),
     lambda c: c.td.set(("n", "z"), c.tensor()), lambda c: c.td.set("z", c.tensor((2, 2, 2, 2))))
case("set_", lambda c: c.td.set_("a", c.tensor((*c.batch, 2))), lambda c: c.td.set_("missing", c.tensor()))
case("set_at_", lambda c: c.td.set_at_("a", 0.5, 0), lambda c: c.td.set_at_("a", torch.zeros(2), (0,) * nb(c)))
case("set_non_tensor", lambda c: c.td.set_non_tensor("t", "hello"))
case("get", lambda c: c.td.get("a"), lambda c: c.td.get("missing", None), lambda c: c.td.get("r"),
     lambda c: c.td.get("e0", "default"), lambda c: c.td.get(("n", "b")), lambda c: c.td.get("r", as_list=True),
     lambda c: c.td.get("r", as_padded_tensor=True), lambda c: c.td.get("s"))
case("get_at", lambda c: c.td.get_at("a", 0), lambda c: c.td.get_at("r", 0))
case("get_item_shape", lambda c: c.td.get_item_shape("a"), lambda c: c.td.get_item_shape("r"))
case("get_nestedtensor", lambda c: c.td.get_nestedtensor("a"), lambda c: c.td.get_nestedtensor("r"))
case("get_non_tensor", lambda c: c.td.get_non_tensor("s"), lambda c: c.td.get_non_tensor("a"))
case("setdefault", lambda c: c.td.setdefault("z", c.tensor()), lambda c: c.td.setdefault("a", c.tensor()))
case("pop", lambda c: c.td.pop("a"), lambda c: c.td.pop("missing", None), lambda c: c.td.pop("e0"))
case("popitem", lambda c: c.td.popitem())
case("del_", lambda c: c.td.del_("a"), lambda c: c.td.del_("e0"), lambda c: c.td.del_("missing"))
case("clear", lambda c: c.td.clear())
case("create_nested", lambda c: c.td.create_nested("z"), lambda c: c.td.create_nested(("n", "z")))
case("update", lambda c: c.td.update({"z": c.tensor()}), lambda c: c.td.update(c.lazy()),
     lambda c: c.td.update(c.dense()), lambda c: c.td.update(c.dense(), inplace=True))
case("update_", lambda c: c.td.float().update_(c.dense()), lambda c: c.td.update_(c.dense()),
     lambda c: c.td.update_(c.lazy()))
case("update_at_", lambda c: c.td.update_at_(c.dense()[0], 0))
case("fill_", lambda c: c.td.fill_("a", 1.0), lambda c: c.td.fill_(("n", "b"), 3))
case("filter_empty_", lambda c: c.td.filter_empty_())
case("filter_non_tensor_data", lambda c: c.td.filter_non_tensor_data())
case("is_non_tensor", lambda c: c.td.is_non_tensor("s"), lambda c: c.td.is_non_tensor("a"))
case("non_tensor_items", lambda c: list(c.td.non_tensor_items()))
case("entry_class", lambda c: c.td.entry_class("a").__name__, lambda c: c.td.entry_class("n").__name__)
case("is_empty", lambda c: c.td.is_empty(), lambda c: c.td.select().is_empty())
case("empty", lambda c: c.td.empty(), lambda c: c.td.empty(recurse=True))
for _name in ("cat_tensors", "stack_tensors"):
    case(_name, lambda c, n=_name: getattr(c.td, n)("a", "a", out_key="z", dim=-1),
         lambda c, n=_name: getattr(c.td.set("b", c.tensor((*c.batch, 2))), n)("a", "b", out_key="z", dim=-1),
         lambda c, n=_name: getattr(c.td, n)("a", "a", out_key="z", dim=-1, keep_entries=True))
case("cat_from_tensordict", lambda c: c.td.select("a").cat_from_tensordict(dim=-1))
case("stack_from_tensordict", lambda c: c.td.select("a").stack_from_tensordict(dim=-1))
case("densify", lambda c: c.td.densify())
case("to_padded_tensor", lambda c: c.td.to_padded_tensor())

# ---- apply
case("apply", lambda c: c.td.apply(lambda x: x + 1), lambda c: c.td.apply(lambda x, y: x + y, c.lazy()),
     lambda c: c.td.apply(lambda x: x.sum(-1) if x.dim() > nb(c) else x),
     lambda c: c.td.apply(lambda x: x * 2, inplace=True))
case("apply_", lambda c: c.td.apply_(lambda x: x * 2))
case("named_apply", lambda c: c.td.named_apply(lambda key, x: x + 1),
     lambda c: c.td.named_apply(lambda key, x: x + len(key), nested_keys=True))

# ---- copies, moves, state
case("clone", lambda c: c.td.clone(), lambda c: c.td.clone(False))
case("copy", lambda c: c.td.copy())
case("copy_", lambda c: c.td.copy_(c.lazy()), lambda c: c.td.copy_(c.dense()))
case("copy_at_", lambda c: c.td.copy_at_(c.dense()[0], 0))
case("contiguous", lambda c: c.td.contiguous())
case("to", lambda c: c.td.to(torch.float64), lambda c: c.td.to("cpu"))
case("to_tensordict", lambda c: c.td.to_tensordict())
case("detach", lambda c: c.td.detach())
case("detach_", lambda c: c.td.detach_())
case("cpu", lambda c: c.td.cpu())
for _name in ("data", "grad", "requires_grad", "is_cpu", "is_cuda", "is_meta", "dtype", "device", "batch_size",
              "shape", "names", "ndim", "batch_dims", "depth", "is_locked"):
    case(_name, lambda c, n=_name: getattr(c.td, n))
case("requires_grad_", lambda c: c.td.float().requires_grad_())
case("zero_", lambda c: c.td.zero_())
case("zero_grad", lambda c: c.td.zero_grad())
# Upstream shares non-tensor data through a multiprocessing.Manager process that outlives the test (and
# trips the tests that check for leftover children): no non-tensor entries here.
case("share_memory_", lambda c: c.td.share_memory_(), nontensor=False)
for _name in ("is_shared", "is_memmap", "is_contiguous", "is_floating_point", "dim", "ndimension", "numel", "size",
              "bytes", "param_count"):
    case(_name, lambda c, n=_name: getattr(c.td, n)())
case("size", lambda c: c.td.size(0), lambda c: c.td.size(-1))
case("data_ptr", lambda c: type(c.td.data_ptr()).__name__)
case("lock_", lambda c: c.td.lock_(), lambda c: c.td.lock_().set("z", c.tensor()))
case("unlock_", lambda c: c.td.lock_().unlock_().set("z", c.tensor()))

# ---- conversions
case("to_dict", lambda c: c.td.to_dict())
case("tolist", lambda c: c.td.tolist())
case("numpy", lambda c: c.td.numpy())
case("to_namedtuple", lambda c: c.td.to_namedtuple())
case("state_dict", lambda c: c.td.state_dict())
case("load_state_dict", lambda c: c.td.load_state_dict(c.lazy().state_dict()))
case("to_lazystack", lambda c: c.td.to_lazystack(0), lambda c: c.td.to_lazystack(sd(c)))
case("as_tensor", lambda c: c.td.as_tensor())
case("new_tensor", lambda c: c.td.new_tensor(torch.ones(2)), nontensor=False)
for _name in ("new_empty", "new_ones", "new_zeros"):
    case(_name, lambda c, n=_name: (lambda r: norm_shape(r))(getattr(c.td, n)(2)), nontensor=False)
case("new_full", lambda c: c.td.new_full((2,), 1.5), nontensor=False)

# ---- classmethods
case("from_dict", lambda c: c.L.LazyStackedTensorDict.from_dict({"a": torch.zeros(2, 3)}, batch_size=[2]))
case("from_list", lambda c: c.L.LazyStackedTensorDict.from_list([{"a": 1}, {"a": 2}]))
case("fromkeys", lambda c: c.L.LazyStackedTensorDict.fromkeys(["a", "b"], 1))
case("from_any", lambda c: c.L.LazyStackedTensorDict.from_any({"a": torch.zeros(2, 3)}))
case("from_tuple", lambda c: c.L.LazyStackedTensorDict.from_tuple((torch.zeros(2), torch.ones(2))))
case("from_namedtuple", lambda c: c.L.LazyStackedTensorDict.from_namedtuple(
    __import__("collections").namedtuple("P", "x y")(torch.zeros(2), torch.ones(2))))
case("from_dataclass", lambda c: c.L.LazyStackedTensorDict.from_dataclass(_Point(torch.zeros(2), torch.ones(2))))
case("from_module", lambda c: c.L.LazyStackedTensorDict.from_module(_module()))
case("from_modules", lambda c: c.L.LazyStackedTensorDict.from_modules(_module(), _module()))
case("from_schema", lambda c: c.L.LazyStackedTensorDict.from_schema({"a": ([3], torch.float32)}, batch_size=[2]))
case("from_dict_instance", lambda c: c.td.from_dict_instance({"a": torch.zeros(2)}))
case("lazy_stack", lambda c: c.L.LazyStackedTensorDict.lazy_stack(c.td.tensordicts if sd(c) == 0 else [c.td], 0),
     lambda c: c.L.LazyStackedTensorDict.lazy_stack([c.td, c.lazy()], 0),
     lambda c: c.L.LazyStackedTensorDict.lazy_stack([c.dense(), c.dense(2)], -1))
case("maybe_dense_stack", lambda c: c.L.LazyStackedTensorDict.maybe_dense_stack([c.dense(), c.dense(2)]),
     lambda c: c.L.LazyStackedTensorDict.maybe_dense_stack([c.td, c.lazy()]))
case("stack", lambda c: c.L.LazyStackedTensorDict.stack([c.td, c.lazy()]),
     lambda c: c.L.LazyStackedTensorDict.stack([c.td, c.lazy()], sd(c)))
case("cat", lambda c: c.L.LazyStackedTensorDict.cat([c.td, c.lazy()]),
     lambda c: c.L.LazyStackedTensorDict.cat([c.td, c.lazy()], sd(c)),
     lambda c: c.L.LazyStackedTensorDict.cat([c.td, c.lazy()], other_dim(c)))

# ---- members of the stack
case("append", lambda c: c.td.append(c.td.tensordicts[0].clone()),
     lambda c: c.td.append(c.L.TensorDict(batch_size=[5, 5, 5])))
case("insert", lambda c: c.td.insert(0, c.td.tensordicts[-1].clone()))
case("extend", lambda c: c.td.extend([m.clone() for m in c.td.tensordicts]))

# ---- names
case("refine_names", lambda c: c.td.refine_names(*[f"d{i}" for i in range(nb(c))]))
case("rename", lambda c: c.td.rename(*[f"d{i}" for i in range(nb(c))]))
case("rename_", lambda c: c.td.rename_(*[f"d{i}" for i in range(nb(c))]))

# ---- other members
case("auto_batch_size_", lambda c: c.td.auto_batch_size_(), nontensor=False)
case("auto_device_", lambda c: c.td.auto_device_())
case("clear_device_", lambda c: c.td.clear_device_())
case("clear_refs_for_compile_", lambda c: c.td.clear_refs_for_compile_())
case("hook_in", lambda c: c.td.hook_in)
case("hook_out", lambda c: c.td.hook_out)
case("replace", lambda c: c.td.replace({"a": c.tensor((*c.batch, 2))}))
case("pad", lambda c: c.td.pad([0, 1] * nb(c)))
case("backward", lambda c: _backward(c), lambda c: _backward(c, with_gradient=True), nontensor=False)
case("to_module", lambda c: _to_module(c))


# ---- persistence (each library reads what it wrote)
def _memmap_case(method: str) -> Call:
    def call(c: Ctx) -> Any:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            result = getattr(c.td, method)(folder)
            return result.clone()  # its values, read before the folder goes
    return call


case("memmap", _memmap_case("memmap"))
case("memmap_", _memmap_case("memmap_"))
case("memmap_like", _memmap_case("memmap_like"))
case("save", _memmap_case("save"))
case("dumps", _memmap_case("dumps"))


def _round_trip(load: str) -> Call:
    def call(c: Ctx) -> Any:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            c.td.memmap(folder)
            return getattr(c.L.LazyStackedTensorDict, load)(folder).clone()
    return call


case("load", _round_trip("load"))
case("load_memmap", _round_trip("load_memmap"))
case("saved_path", lambda c: c.td.saved_path)
case("is_consolidated", lambda c: c.td.is_consolidated())


class _Point:
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y


_Point = __import__("dataclasses").dataclass(_Point)


def _module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(2, 3)


def norm_shape(result: Any) -> Any:
    """An uninitialised result (``new_empty``): its structure, not its values."""
    return result.apply(torch.zeros_like)


def _backward(c: Ctx, with_gradient: bool = False) -> Any:
    td = c.td.float().requires_grad_()
    if with_gradient:
        out = td * 2
        out.backward(out.detach().apply(torch.ones_like))
    else:
        (td * 2).sum(reduce=True).reshape(1).squeeze().backward()
    return td.grad


def _to_module(c: Ctx) -> Any:
    """Stacked parameters through torch.vmap into a module (an ensemble's forward)."""
    module = _module()
    params = c.L.TensorDict.from_module(module).detach()
    stacked = c.L.LazyStackedTensorDict(params.clone(), params.clone() + 1)

    def forward(p: Any, x: torch.Tensor) -> torch.Tensor:
        with p.to_module(module):
            return module(x)

    return torch.vmap(forward, (0, None))(stacked, torch.ones(2))


#: Members not compared, with the reason.
SKIPPED = {
    **{name: "not provided: torch.distributed on a lazy stack (skipped: needs process groups)" for name in (
        "all_gather", "all_reduce", "arecv", "asend", "broadcast", "gather_and_stack", "init_remote", "irecv",
        "isend", "recv", "reduce", "scatter", "send", "from_remote_init")},
    **{name: "needs CUDA (cuda() and pin_memory() run on the dense stack)" for name in ("cuda", "pin_memory")},
    **{name: "needs CUDA (member by member): tested with stand-ins in tests/test_devices.py"
       for name in ("pin_memory_", "record_stream")},
    **{name: "file formats (formats.FormatsMixin, generic over TensorDictBase): compared in tests/test_formats_*.py"
       for name in ("from_csv", "to_csv", "from_pandas", "to_pandas", "from_h5", "to_h5", "from_zarr", "to_zarr",
                    "from_parquet", "to_parquet", "to_mds", "from_json", "to_json", "from_struct_array",
                    "to_struct_array")},
    "to_store": "key-value stores (generic over TensorDictBase): compared in tests/test_store*.py (needs a server)",
    "pack": "packing into one tensor: compared in tests/test_pack.py (against upstream and the dense form)",
    **{name: "on the dense form (TensorDictBase): compared in tests/test_consolidate.py and "
             "tests/test_dropin_members.py" for name in ("attrs", "to_pytree")},
    "consolidate": "one storage for every member: compared in tests/test_consolidate.py",
    **{name: f"not provided: {why}" for name, why in {
        "from_consolidated": "consolidated (single-storage) TensorDicts are not implemented in torchdict",
        "memmap_refresh_": "re-reading a saved lazy stack in place (load it again with load_memmap)",
        "load_": "reading a folder into an existing lazy stack (use LazyStackedTensorDict.load_memmap)",
        "load_memmap_": "reading a folder into an existing lazy stack (use LazyStackedTensorDict.load_memmap)",
        "make_memmap": "allocating file-backed entries in a saved lazy stack (use each member's)",
        "make_memmap_from_storage": "allocating file-backed entries in a saved lazy stack (use each member's)",
        "make_memmap_from_tensor": "allocating file-backed entries in a saved lazy stack (use each member's)",
        "map": "worker-process map over a lazy stack (map its contiguous() form)",
        "map_iter": "worker-process map over a lazy stack (map its contiguous() form)",
        "from_pytree": "from_pytree / to_pytree are not implemented in torchdict's TensorDict",
    }.items()},
}

#: Where torchdict does better than upstream on valid input (listed in docs/compat.md): the specs on
#: which the comparison is skipped, with the reason; a test below states what torchdict does instead.
UPSTREAM_WRONG = {
    "repeat": (lambda spec: spec.member_batch == (),
               "upstream calls member.repeat() with no repeats when the members have no batch dim (TypeError)"),
    "densify": (lambda spec: spec.stack_dim == 0 and spec.count > 1 and (
        spec.ragged or (spec.exclusive and spec.member_batch != ())),
                "NOT upstream-wrong: upstream stores strided nested tensors, which torchdict's TensorDict can't hold"),
}


def test_no_process_is_left_behind():
    """Upstream starts a Manager process for shared non-tensor data; no case here may trigger it."""
    import multiprocessing

    assert multiprocessing.active_children() == []


def test_every_upstream_member_is_compared_or_skipped_with_a_reason():
    import tensordict

    upstream = {name for name in dir(tensordict.LazyStackedTensorDict) if not name.startswith("_")}
    assert len(upstream) == 363
    assert upstream - set(CASES) - set(SKIPPED) == set()
    assert set(CASES) & set(SKIPPED) == set()


@pytest.mark.parametrize("member", sorted(CASES))
@settings(max_examples=EXAMPLES)
@given(data=st.data())
def test_member_matches_upstream(member, data):
    spec = data.draw(specs(nontensor=False if member in NO_NONTENSOR else None), label="spec")
    skip = UPSTREAM_WRONG.get(member)
    if skip is not None and skip[0](spec):
        return  # stated by its own test below
    for call, when in CASES[member]:
        if when(spec):
            check_case(spec, call)


def test_not_provided_members_are_absent():
    """The members listed as not provided are not there (AttributeError), rather than half-working."""
    from torchdict import LazyStackedTensorDict

    for name, why in SKIPPED.items():
        if why.startswith("not provided"):
            assert not hasattr(LazyStackedTensorDict, name), name


def test_repeat_of_members_without_batch_dims():
    """Upstream raises TypeError (it calls member.repeat() with nothing); torchdict repeats the members."""
    import torchdict

    tds = [torchdict.TensorDict(a=torch.tensor(float(i))) for i in range(2)]
    td = torchdict.lazy_stack(tds)
    result = td.repeat(3)
    assert isinstance(result, torchdict.LazyStackedTensorDict) and result.batch_size == (6,)
    assert torch.equal(result["a"], torch.stack([t["a"] for t in tds]).repeat(3))


def test_densify_of_ragged_members_is_refused():
    """Upstream gives strided nested-tensor leaves, which a torchdict TensorDict can't hold."""
    import torchdict

    td = torchdict.lazy_stack([torchdict.TensorDict(r=torch.zeros(3, i + 1), batch_size=[3]) for i in range(2)])
    with pytest.raises(NotImplementedError, match="as_nested_tensor"):
        td.densify()


def test_zz_no_process_is_left_behind_after_the_cases():
    test_no_process_is_left_behind()


# ------------------------------------------------------------------------------ indexing
INDEXES = {
    "int": lambda c: c.td[0],
    "stack int": lambda c: c.td[(slice(None),) * sd(c) + (0,)],
    "stack slice": lambda c: c.td[(slice(None),) * sd(c) + (slice(0, None, 2),)],
    "stack list": lambda c: c.td[(slice(None),) * sd(c) + ([0] * 2,)],
    "last int": lambda c: c.td[..., 0],
    "mask": lambda c: c.td[c.some_mask()],
    "none": lambda c: c.td[None],
}


@pytest.mark.parametrize("index", sorted(INDEXES))
@settings(max_examples=EXAMPLES)
@given(spec=specs(nontensor=None))
def test_indexing_matches_upstream(index, spec):
    """An int along the stack dim gives the member itself (compared as a dense member), slices and lists a
    lazy stack of the selected members, a mask over several dims a lazy stack of the selected elements."""
    check_case(spec, INDEXES[index])


@settings(max_examples=EXAMPLES)
@given(spec=specs())
def test_an_int_along_the_stack_dim_is_the_member_object(spec):
    import torchdict

    td = build_lazy(OURS, spec)
    position = spec.count - 1
    assert td[(slice(None),) * spec.stack_dim + (position,)] is td.tensordicts[position]
    assert isinstance(td[(slice(None),) * spec.stack_dim + (slice(None),)], torchdict.LazyStackedTensorDict)


# ------------------------------------------------------------------------------ torch.stack / torch.cat
STACK_CAT = {
    "stack lazies 0": lambda c: torch.stack([c.td, c.lazy()], 0),
    "stack lazies after": lambda c: torch.stack([c.td, c.lazy()], -1),
    "stack lazy then dense": lambda c: torch.stack([c.td, c.dense()], 0),
    "stack dense then lazy": lambda c: torch.stack([c.dense(), c.td], 0),
    "cat lazies along the stack dim": lambda c: torch.cat([c.td, c.lazy()], sd(c)),
    "cat lazies along another dim": lambda c: torch.cat([c.td, c.lazy()], other_dim(c)),
    "cat lazy then dense": lambda c: torch.cat([c.td, c.dense()], 0),
    "cat lazies of two stack dims": lambda c: torch.cat([c.td, c.td.contiguous().to_lazystack(other_dim(c))], 0),
}


@pytest.mark.parametrize("name", sorted(STACK_CAT))
@settings(max_examples=EXAMPLES)
@given(spec=specs(min_rank=1))
def test_torch_stack_and_cat_match_upstream(name, spec):
    """Lazy stacks stay lazy through torch.stack (of lazy stacks) and torch.cat (with a lazy stack first;
    the dense items are split along its stack dim); a lazy stack stacked with a dense TensorDict is dense."""
    check_case(spec, STACK_CAT[name])


def test_cat_with_a_dense_tensordict_first_is_dense():
    """TensorDict's torch.cat runs first and stacks the lazy stack densely (upstream: a lazy stack)."""
    import torchdict

    members = [torchdict.TensorDict(a=torch.full((3,), float(i)), batch_size=[3]) for i in range(2)]
    td = torchdict.lazy_stack(members)
    joined = torch.cat([td.contiguous(), td], 0)
    assert type(joined) is torchdict.TensorDict and torch.equal(joined["a"], torch.cat([td["a"]] * 2))


# ------------------------------------------------------------------------------ torch.vmap
def _double(td: Any) -> Any:
    return td.set("b", td["a"] * 2)


VMAPS = {
    "over another dim": lambda c: torch.vmap(_double, (other_dim(c),))(c.td),
    "over another dim, out_dims=1": lambda c: torch.vmap(_double, (other_dim(c),), out_dims=1)(c.td),
    "to a tensor": lambda c: torch.vmap(lambda td: td["a"].sum(), (sd(c),))(c.td),
    "a lazy output": lambda c: torch.vmap(lambda x: c.L.LazyStackedTensorDict(c.L.TensorDict(a=x), c.L.TensorDict(a=x + 1)))(
        c.tensor((3,))),
    "a lazy output, out_dims=1": lambda c: torch.vmap(
        lambda x: c.L.LazyStackedTensorDict(c.L.TensorDict(a=x), c.L.TensorDict(a=x + 1)), out_dims=1)(c.tensor((3,))),
    "is a lazy stack inside": lambda c: torch.vmap(
        lambda td: torch.tensor(float(type(td).__name__ == "LazyStackedTensorDict")), (other_dim(c),))(c.td),
}


@st.composite
def distinct_size_specs(draw: Callable) -> Any:
    """Specs whose batch dims all have different sizes (and none of 3, the vmapped tensor's size)."""
    from _lazy_diff import Spec

    sizes = draw(st.permutations([1, 2, 4]))
    rank = draw(st.integers(1, 2))
    return Spec(member_batch=tuple(sizes[:rank]), count=sizes[rank], stack_dim=draw(st.integers(0, rank)),
                nested=draw(st.booleans()), ragged=False, exclusive=False, nontensor=False,
                seed=draw(st.integers(0, 2 ** 16)))


@pytest.mark.parametrize("name", sorted(VMAPS))
@settings(max_examples=EXAMPLES)
@given(spec=distinct_size_specs())
def test_vmap_matches_upstream(name, spec):
    """A lazy stack vmapped over a dim other than its stack dim is a lazy stack inside the function and
    comes out as one; a lazy stack returned from the function comes out lazy, its stack dim moved.

    (The stack dim is found again from the leaves' shapes: with neighbouring batch dims of one size it may
    land on another of them than upstream's, with the same values; the batch sizes here all differ.)"""
    check_case(spec, VMAPS[name])


def test_vmap_over_the_stack_dim_gives_a_dense_tensordict_inside():
    """torchdict's pytree node is the dense stack: vmapped over the stack dim, the function sees a dense
    TensorDict and the result is dense (upstream keeps a lazy stack with a hidden stack dim); ragged
    members can't be vmapped (the ragged-read error)."""
    import torchdict

    members = [torchdict.TensorDict(a=torch.arange(3.0) + 10 * i, batch_size=[3]) for i in range(2)]
    td = torchdict.lazy_stack(members)
    seen = []
    result = torch.vmap(lambda inner: seen.append(type(inner)) or _double(inner))(td)
    assert seen == [torchdict.TensorDict] and type(result) is torchdict.TensorDict
    assert torch.equal(result["b"], td["a"] * 2)
    ragged = torchdict.lazy_stack([torchdict.TensorDict(r=torch.zeros(i + 1)) for i in range(2)])
    with pytest.raises(RuntimeError, match="as_padded_tensor=True"):
        torch.vmap(lambda inner: inner)(ragged)


# ------------------------------------------------------------------------------ a failed call changes nothing
FAILING_IN_PLACE = {
    "add_ with a member lacking a key": lambda td, other: td.add_(other.exclude("a")),
    "update_ with a wrong shape": lambda td, other: td.update_({"a": torch.zeros(3)}),
    "apply_ failing on the last member": lambda td, other: td.apply_(
        lambda x: x if x.shape[0] != td.tensordicts[-1]["a"].shape[0] or x.sum() < 0 else 1 / 0),
    "set_ of a wrong shape": lambda td, other: td.set_("a", torch.zeros(7)),
    "rename_key_ of a missing key": lambda td, other: td.rename_key_("missing", "z"),
    "fill_ of a missing key": lambda td, other: td.fill_("missing", 1.0),
    "exp_ of an int leaf": lambda td, other: td.exp_(),
    "masked_fill_ with a wrong mask": lambda td, other: td.masked_fill_(torch.ones(7, dtype=torch.bool), 0.0),
    "update with a lazy source failing on the last member": lambda td, other: td.update(
        td.apply(lambda x: x).set("a", [torch.zeros(1)] * (len(td.tensordicts) - 1) + [torch.zeros(5, 5, 5)])),
    "cat_tensors of a repeated key": lambda td, other: td.cat_tensors("a", "a", out_key="z"),
}


@pytest.mark.parametrize("name", sorted(FAILING_IN_PLACE))
@settings(max_examples=EXAMPLES)
@given(spec=specs(min_rank=1, min_count=2, nontensor=False))
def test_a_failed_in_place_call_changes_nothing(name, spec):
    td = build_lazy(OURS, spec)
    td.set(("n", "k"), torch.ones(spec.batch, dtype=torch.int64))
    other = build_lazy(OURS, spec, 1)
    before = norm(td)
    with pytest.raises(Exception):
        FAILING_IN_PLACE[name](td, other)
    compare(before, norm(td), "the stack after a failed call")


# ------------------------------------------------------------------------------ folders across libraries
@settings(max_examples=EXAMPLES)
@given(spec=specs(nontensor=False))
def test_folders_saved_by_upstream_load(spec, tmp_path_factory):
    """A lazy stack saved by upstream loads as the same lazy stack (members in 0/, 1/, ...). The other way
    round the members' folders are in torchdict's own TensorDict format, which upstream does not read."""
    folder = tmp_path_factory.mktemp("lazy")
    build_lazy(UP, spec).memmap(folder)
    loaded = OURS.LazyStackedTensorDict.load_memmap(folder)
    compare(norm(build_lazy(OURS, spec)), norm(loaded.clone()), "upstream's folder loaded by torchdict")
