"""The seed's multi-line repr, exactly."""
import torch

from torchdict import TensorDict

SEED_FLAT = """TensorDict(
    fields={
        a: Tensor(shape=torch.Size([]), device=cpu, dtype=torch.int64, is_shared=False),
        b: Tensor(shape=torch.Size([]), device=cpu, dtype=torch.int64, is_shared=False)},
    batch_size=torch.Size([]),
    device=None,
    is_shared=False)"""

SEED_MODULE = """TensorDict(
    fields={
        0: TensorDict(
            fields={
                bias: Parameter(shape=torch.Size([4]), device=cpu, dtype=torch.float32, is_shared=False),
                weight: Parameter(shape=torch.Size([4, 3]), device=cpu, dtype=torch.float32, is_shared=False)},
            batch_size=torch.Size([]),
            device=None,
            is_shared=False)},
    batch_size=torch.Size([]),
    device=None,
    is_shared=False)"""


def test_flat_repr_matches_the_seed():
    assert repr(TensorDict(a=0, b=1)) == SEED_FLAT
    assert str(TensorDict({"b": 1, "a": 0})) == SEED_FLAT  # fields are sorted


def test_nested_parameters_repr_matches_the_seed():
    linear = torch.nn.Linear(3, 4)
    td = TensorDict({"0": {"weight": linear.weight, "bias": linear.bias}})
    assert repr(td) == SEED_MODULE


def test_empty_and_non_tensor_and_device():
    assert repr(TensorDict()) == (
        "TensorDict(\n    fields={\n    },\n    batch_size=torch.Size([]),\n    device=None,\n    is_shared=False)"
    )
    text = repr(TensorDict({"s": "hello", "x": torch.zeros(2, 3)}, batch_size=[2], device="cpu"))
    assert "        s: NonTensorData(data=hello, batch_size=torch.Size([2]), device=cpu)," in text
    assert "x: Tensor(shape=torch.Size([2, 3]), device=cpu, dtype=torch.float32, is_shared=False)" in text
    assert "    batch_size=torch.Size([2]),\n    device=cpu,\n" in text


def test_shared_memory_is_reported():
    tensor = torch.zeros(2).share_memory_()
    text = repr(TensorDict(x=tensor))
    assert "is_shared=True)}," in text and text.endswith("is_shared=True)")
