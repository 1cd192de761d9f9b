"""Sample tensors of every dtype a saved file must round-trip (shared by test_memmap and test_saving)."""
from __future__ import annotations

import torch

# Every storable dtype: both float8 formats, the unsigned 16-64 bit ints and complex included.
ALL_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.float8_e4m3fn, torch.float8_e5m2,
]


def sample(dtype: torch.dtype, shape=(3, 4)) -> torch.Tensor:
    """Distinct values of ``dtype`` (built through float64 so every dtype works)."""
    values = torch.arange(int(torch.Size(shape).numel()), dtype=torch.float64).view(shape)
    if dtype is torch.bool:
        return values.remainder(2) == 1
    if dtype.is_complex:
        return torch.complex(values, -values).to(dtype)
    return values.to(dtype)
