"""MemoryMappedTensor's constructors in upstream's call forms (empty / zeros / ones / full with positional sizes,
one sequence or ``shape=``; ``device=``, ``dtype=``, ``filename=``, ``existsok=``) and ``from_storage`` /
``from_handler``, against upstream tensordict 0.15 and plain torch."""
from __future__ import annotations

import mmap
import pickle
import warnings

import pytest
import torch

from torchdict import MemoryMappedTensor

tensordict = pytest.importorskip("tensordict")
Upstream = tensordict.MemoryMappedTensor


def describe(call):
    """What a call gives: (class name, dtype, shape, values) or the exception type."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = call()
    except Exception as error:  # noqa: BLE001 - the type is what is compared
        return type(error)
    return type(result).__name__, result.dtype, tuple(result.shape), result.flatten().tolist()


FORMS = {
    "ints": lambda cls, method: getattr(cls, method)(2, 3, **extra(method)),
    "one tuple": lambda cls, method: getattr(cls, method)((2, 3), **extra(method)),
    "one list": lambda cls, method: getattr(cls, method)([4], **extra(method)),
    "a Size": lambda cls, method: getattr(cls, method)(torch.Size([1, 2, 2]), **extra(method)),
    "shape=": lambda cls, method: getattr(cls, method)(shape=(3,), **extra(method)),
    "shape=()": lambda cls, method: getattr(cls, method)(shape=(), **extra(method)),
    "()": lambda cls, method: getattr(cls, method)((), **extra(method)),
    "dtype=": lambda cls, method: getattr(cls, method)(2, dtype=torch.int16, **extra(method)),
    "device=cpu": lambda cls, method: getattr(cls, method)(2, device="cpu", **extra(method)),
    "device=torch.device": lambda cls, method: getattr(cls, method)(2, device=torch.device("cpu"), **extra(method)),
    "device=meta": lambda cls, method: getattr(cls, method)(2, device="meta", **extra(method)),
    "no shape": lambda cls, method: getattr(cls, method)(**extra(method)),
    "a negative size": lambda cls, method: getattr(cls, method)(-1, **extra(method)),
    "a tuple inside a tuple": lambda cls, method: getattr(cls, method)(((2, 3),), **extra(method)),
}


def extra(method: str) -> dict:
    return {"fill_value": 7} if method == "full" else {}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("method", ["zeros", "ones", "full", "empty"])
def test_constructor_forms_match_upstream(method, form):
    ours = describe(lambda: FORMS[form](MemoryMappedTensor, method))
    theirs = describe(lambda: FORMS[form](Upstream, method))
    if method == "empty" and not isinstance(ours, type):
        ours, theirs = ours[:3], theirs[:3]  # uninitialised values
    assert ours == theirs


@pytest.mark.parametrize("method", ["zeros", "ones", "full", "empty"])
def test_constructors_match_torch(method):
    expected = getattr(torch, method)(2, 3, **extra(method)) if method != "full" else torch.full((2, 3), 7.0)
    made = getattr(MemoryMappedTensor, method)(2, 3, **extra(method))
    assert made.dtype == expected.dtype and made.shape == expected.shape
    if method != "empty":
        assert torch.equal(made, expected)


@pytest.mark.parametrize("method", ["zeros", "ones", "full", "empty"])
def test_filename_and_existsok(tmp_path, method):
    path = tmp_path / "x.memmap"
    made = getattr(MemoryMappedTensor, method)(shape=(3,), dtype=torch.int64, filename=path, **extra(method))
    assert made.filename == str(path) and path.stat().st_size == 24
    with pytest.raises(RuntimeError, match="already exists"):
        getattr(MemoryMappedTensor, method)(3, filename=path, **extra(method))
    again = getattr(MemoryMappedTensor, method)(4, dtype=torch.int64, filename=path, existsok=True, **extra(method))
    assert again.shape == (4,) and path.stat().st_size == 32


def test_full_defaults_to_the_default_dtype_as_upstream():
    assert MemoryMappedTensor.full((2,), fill_value=5).dtype == Upstream.full((2,), fill_value=5).dtype
    assert MemoryMappedTensor.full((2,), fill_value=True).tolist() == [1.0, 1.0]


def test_shape_given_twice_is_refused():
    with pytest.raises(TypeError, match="both"):
        MemoryMappedTensor.zeros(2, shape=(2,))


# ---------------------------------------------------------------- from_storage
STORAGE_CASES = {
    "untyped, default dtype": lambda cls: cls.from_storage(torch.arange(4.0).untyped_storage()),
    "untyped, dtype and shape": lambda cls: cls.from_storage(torch.arange(4.0).untyped_storage(),
                                                             dtype=torch.float32, shape=(2, 2)),
    "typed": lambda cls: cls.from_storage(torch.arange(4.0).storage()),
    "typed of another dtype": lambda cls: cls.from_storage(torch.arange(4).storage()),
    "index": lambda cls: cls.from_storage(torch.arange(4.0).untyped_storage(), dtype=torch.float32,
                                          index=slice(1, 3)),
    "int index": lambda cls: cls.from_storage(torch.arange(4.0).untyped_storage(), dtype=torch.float32,
                                              shape=(2, 2), index=1),
    "device=cpu": lambda cls: cls.from_storage(torch.arange(2.0).untyped_storage(), dtype=torch.float32,
                                               device="cpu"),
    "a bad shape": lambda cls: cls.from_storage(torch.arange(4.0).untyped_storage(), dtype=torch.float32,
                                                shape=(3,)),
}


@pytest.mark.parametrize("case", list(STORAGE_CASES))
def test_from_storage_matches_upstream(case):
    assert describe(lambda: STORAGE_CASES[case](MemoryMappedTensor)) == describe(
        lambda: STORAGE_CASES[case](Upstream))


def test_from_storage_views_without_copying():
    storage = torch.arange(4.0).untyped_storage()
    viewed = MemoryMappedTensor.from_storage(storage, dtype=torch.float32)
    viewed[0] = 100
    assert torch.tensor([], dtype=torch.float32).set_(storage)[0] == 100


def test_from_storage_of_a_file_keeps_the_file_and_pickles_by_name(tmp_path):
    path = tmp_path / "x.memmap"
    MemoryMappedTensor.from_tensor(torch.arange(6.0), filename=path)
    storage = torch.UntypedStorage.from_file(str(path), shared=True, nbytes=24)
    viewed = MemoryMappedTensor.from_storage(storage, dtype=torch.float32, shape=(2, 3))
    assert viewed.filename == str(path) and viewed[1].tolist() == [3.0, 4.0, 5.0]
    clone = pickle.loads(pickle.dumps(viewed))
    assert clone.filename == str(path) and torch.equal(clone, viewed)
    with pytest.raises(RuntimeError, match="differs"):
        MemoryMappedTensor.from_storage(storage, dtype=torch.float32, filename=tmp_path / "other.memmap")


# ---------------------------------------------------------------- from_handler
class _Handler:
    """What upstream 0.14 pickled for a MemoryMappedTensor in shared memory: an object with a ``buffer``."""

    def __init__(self, size: int) -> None:
        self.buffer = mmap.mmap(-1, size)


@pytest.mark.parametrize("index", [None, 1, slice(0, 1)])
def test_from_handler_matches_upstream(index):
    results = []
    for cls in (MemoryMappedTensor, Upstream):
        handler = _Handler(24)
        torch.frombuffer(memoryview(handler.buffer), dtype=torch.int32).copy_(torch.arange(6, dtype=torch.int32))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = cls.from_handler(handler, torch.int32, (2, 3), index=index)
        results.append((type(made).__name__, made.shape, made.tolist()))
    assert results[0] == results[1]


def test_from_handler_shares_the_buffer():
    handler = _Handler(16)
    made = MemoryMappedTensor.from_handler(handler, torch.int64, torch.Size([2]))
    made[1] = 9
    assert torch.frombuffer(memoryview(handler.buffer), dtype=torch.int64).tolist() == [0, 9]


# ---------------------------------------------------------------- parent_shape (deprecated, as upstream)
@pytest.mark.parametrize("index", [None, 1, slice(1, 3), (slice(None), 0)])
@pytest.mark.parametrize("with_file", [False, True])
def test_parent_shape_matches_upstream(tmp_path, index, with_file):
    shapes = []
    for cls in (MemoryMappedTensor, Upstream):
        filename = tmp_path / f"{cls.__module__}.memmap" if with_file else None
        made = cls.zeros(4, 3, filename=filename)
        view = made if index is None else made[index]
        with pytest.warns(DeprecationWarning, match="parent_shape"):
            shapes.append(view.parent_shape)
    assert shapes[0] == shapes[1]
