"""@tensorclass benchmarks (issue 9): construction, field read and batch indexing.

The floor is what a careful user writes without either library: a ``@dataclass``
holding the same three tensors. Construction and field reads compare against that
dataclass; ``data[idx]`` compares against indexing each field by hand and putting the
results in a new dataclass (the same job: a new object holding the indexed fields).

Data: the seed's three fields (image, mask, label) with a batch of 100.
"""
from __future__ import annotations

import dataclasses

import torch

from _harness import FLOOR, Case, for_libraries

BATCH = 100


@dataclasses.dataclass
class PlainData:
    """The floor: a plain dataclass with the same fields."""

    image: torch.Tensor
    mask: torch.Tensor
    label: torch.Tensor


def _fields() -> tuple:
    image = torch.randn(BATCH, 3, 8, 8)
    mask = torch.zeros(BATCH, 1, 8, 8, dtype=torch.bool).bernoulli_()
    label = torch.randint(10, (BATCH,))
    return image, mask, label


_CLASSES: dict = {}


def _data_class(lib: object) -> type:
    """One tensorclass per library, with the seed's fields (made once)."""
    name = lib.__name__
    if name not in _CLASSES:
        @lib.tensorclass
        class MyData:
            image: torch.Tensor
            mask: torch.Tensor
            label: torch.Tensor

        _CLASSES[name] = MyData
    return _CLASSES[name]


def cases() -> list[Case]:
    def construct(lib: object, fields: tuple):
        cls = _data_class(lib)
        image, mask, label = fields
        batch_size = [BATCH]
        return lambda: cls(image, mask, label, batch_size=batch_size)

    def construct_floor(fields: tuple):
        image, mask, label = fields
        return lambda: PlainData(image, mask, label)

    def construct_unbatched(lib: object, fields: tuple):
        cls = _data_class(lib)
        image, mask, label = fields
        return lambda: cls(image, mask, label)

    def read(lib: object, fields: tuple):
        data = _data_class(lib)(*fields, batch_size=[BATCH])
        return lambda: data.image

    def read_floor(fields: tuple):
        data = PlainData(*fields)
        return lambda: data.image

    def index_with(index: object):
        def library(lib: object, fields: tuple):
            data = _data_class(lib)(*fields, batch_size=[BATCH])
            return lambda: data[index]

        def floor(fields: tuple):
            image, mask, label = fields
            return lambda: PlainData(image[index], mask[index], label[index])

        return {**for_libraries(library), FLOOR: floor}

    def stack(lib: object, fields: tuple):
        items = [_data_class(lib)(*fields, batch_size=[BATCH]) for _ in range(4)]
        return lambda: torch.stack(items)

    def stack_floor(fields: tuple):
        items = [PlainData(*fields) for _ in range(4)]
        return lambda: PlainData(*(torch.stack([getattr(item, name) for item in items])
                                   for name in ("image", "mask", "label")))

    rows = torch.tensor([3, 17, 42, 99])
    return [
        Case("construct (batch [100])", setup=_fields, target="<= 5x floor",
             impls={**for_libraries(construct), FLOOR: construct_floor},
             note="floor: a @dataclass with the same three fields"),
        Case("construct (no batch size)", setup=_fields, target="<= 5x floor",
             impls={**for_libraries(construct_unbatched), FLOOR: construct_floor}),
        Case("field read", setup=_fields, target="<= 3x floor",
             impls={**for_libraries(read), FLOOR: read_floor}),
        Case("data[int]", setup=_fields, target="<= 1.2x floor", impls=index_with(7),
             note="floor: index each field by hand into a new @dataclass"),
        Case("data[slice]", setup=_fields, target="<= 1.2x floor", impls=index_with(slice(10, 50))),
        Case("data[tensor of rows]", setup=_fields, target="<= 1.2x floor", impls=index_with(rows)),
        Case("torch.stack of 4", setup=_fields, impls={**for_libraries(stack), FLOOR: stack_floor}),
    ]
