"""Tensor semantics benchmarks (issue 3), second half: apply, arithmetic, reductions, copies and moves.

Data: 100 flat leaves of shape ``(16, 3)`` (batch ``[16]``), or a nested tree of 93
leaves (31 per level over three levels). The floor is the hand-written dict code
doing the same job: a dict comprehension over the leaves, a recursion for the
nested tree, a plain ``for`` loop for in-place updates.
"""
from __future__ import annotations

import torch

from _harness import FLOOR, Case, for_libraries

BATCH = 16
FEATURES = 3
FLAT_LEAVES = 100
PER_LEVEL = 31
LEVELS = 3


def flat_source() -> dict:
    return {f"key{i}": torch.randn(BATCH, FEATURES) for i in range(FLAT_LEAVES)}


def nested_source() -> dict:
    """31 leaves per level and a ``"sub"`` dict below, three levels: 93 leaves."""
    level: dict = {}
    for _ in range(LEVELS):
        leaves = {f"x{i}": torch.randn(BATCH, FEATURES) for i in range(PER_LEVEL)}
        level = {**leaves, "sub": level} if level else leaves
    return level


def leafwise(fn):
    """The floor: ``fn`` on every leaf of a nested dict."""

    def walk(node: dict) -> dict:
        return {key: walk(value) if type(value) is dict else fn(value) for key, value in node.items()}

    return walk


def _td(lib, source: dict, **kwargs):
    return lib.TensorDict(source, batch_size=[BATCH], **kwargs)


def _plus_one(tensor: torch.Tensor) -> torch.Tensor:
    return tensor + 1


def _apply_cases() -> list:
    def apply(lib, source):
        td = _td(lib, source)
        return lambda: td.apply(_plus_one)

    def floor(source):
        walk = leafwise(_plus_one)
        return lambda: walk(source)

    def checked_plus_one(tensor: torch.Tensor) -> torch.Tensor:
        result = tensor + 1
        if result.shape[0] != BATCH:  # what apply checks of each result (the cheapest correct test)
            raise RuntimeError("batch mismatch")
        return result

    def checked_floor(source):
        walk = leafwise(checked_plus_one)
        return lambda: walk(source)

    return [
        Case("apply (100 flat leaves)", setup=flat_source, impls={**for_libraries(apply), FLOOR: floor},
             target="<= 1.1x floor"),
        Case("apply (93 nested leaves)", setup=nested_source, impls={**for_libraries(apply), FLOOR: floor},
             target="<= 1.1x floor"),
        Case("apply (93 nested leaves), floor checks each result", setup=nested_source,
             impls={**for_libraries(apply), FLOOR: checked_floor},
             note="the floor also checks each result's leading dim, as apply (and upstream) do: where the "
                  "remaining cost of the row above goes."),
    ]


def _arithmetic_cases() -> list:
    def plus_one(lib, source):
        td = _td(lib, source)
        return lambda: td + 1

    def floor_plus_one(source):
        return lambda: {key: value + 1 for key, value in source.items()}

    def add_in_place(lib, source):
        td = _td(lib, {key: value.clone() for key, value in source.items()})

        def run():
            td.__iadd__(1)

        return run

    def floor_add_in_place(source):
        values = [value.clone() for value in source.values()]

        def run():
            for value in values:
                value += 1

        return run

    def plus_td(lib, source):
        td = _td(lib, source)
        other = _td(lib, {key: value * 2 for key, value in source.items()})
        return lambda: td + other

    def floor_plus_td(source):
        other = {key: value * 2 for key, value in source.items()}
        return lambda: {key: value + other[key] for key, value in source.items()}

    def nested_plus_one(lib, source):
        td = _td(lib, source)
        return lambda: td + 1

    def floor_nested_plus_one(source):
        walk = leafwise(_plus_one)
        return lambda: walk(source)

    def equal(lib, source):
        td = _td(lib, source)
        other = _td(lib, {key: value.clone() for key, value in source.items()})
        return lambda: td == other

    def floor_equal(source):
        other = {key: value.clone() for key, value in source.items()}
        return lambda: {key: value == other[key] for key, value in source.items()}

    def scale_rows(lib, source):
        td = _td(lib, source)
        rows = torch.arange(float(BATCH))
        return lambda: td * rows

    def floor_scale_rows(source):
        rows = torch.arange(float(BATCH))[:, None]
        return lambda: {key: value * rows for key, value in source.items()}

    def exp(lib, source):
        td = _td(lib, source)
        return lambda: td.exp()

    def floor_exp(source):
        return lambda: {key: value.exp() for key, value in source.items()}

    return [
        Case("td + 1", setup=flat_source, impls={**for_libraries(plus_one), FLOOR: floor_plus_one},
             target="<= 0.75x floor"),
        Case("td += 1", setup=flat_source, impls={**for_libraries(add_in_place), FLOOR: floor_add_in_place},
             target="<= 0.75x floor"),
        Case("td + td", setup=flat_source, impls={**for_libraries(plus_td), FLOOR: floor_plus_td},
             target="<= 1.1x floor"),
        Case("td + 1 (93 nested leaves)", setup=nested_source,
             impls={**for_libraries(nested_plus_one), FLOOR: floor_nested_plus_one}),
        Case("td == td", setup=flat_source, impls={**for_libraries(equal), FLOOR: floor_equal}),
        Case("td * (16,) row tensor", setup=flat_source, impls={**for_libraries(scale_rows), FLOOR: floor_scale_rows},
             note="The row tensor broadcast over the batch dim (one value per row, whatever the feature dims)."),
        Case("td.exp()", setup=flat_source, impls={**for_libraries(exp), FLOOR: floor_exp}),
    ]


def _reduction_cases() -> list:
    def sum0(lib, source):
        td = _td(lib, source)
        return lambda: td.sum(0)

    def floor_sum0(source):
        return lambda: {key: value.sum(0) for key, value in source.items()}

    return [Case("td.sum(0)", setup=flat_source, impls={**for_libraries(sum0), FLOOR: floor_sum0})]


def _move_cases() -> list:
    def to_cpu(lib, source):
        td = _td(lib, source, device="cpu")
        return lambda: td.to("cpu")

    def floor_to_cpu(source):
        return lambda: {key: value.to("cpu") for key, value in source.items()}

    def to_double(lib, source):
        td = _td(lib, source)
        return lambda: td.to(torch.float64)

    def floor_to_double(source):
        return lambda: {key: value.to(torch.float64) for key, value in source.items()}

    def clone(lib, source):
        td = _td(lib, source)
        return lambda: td.clone()

    def floor_clone(source):
        return lambda: {key: value.clone() for key, value in source.items()}

    def nested_clone(lib, source):
        td = _td(lib, source)
        return lambda: td.clone()

    def floor_nested_clone(source):
        walk = leafwise(torch.Tensor.clone)
        return lambda: walk(source)

    return [
        Case('to("cpu") on CPU data', setup=flat_source, impls={**for_libraries(to_cpu), FLOOR: floor_to_cpu},
             target="< 2 us", note='The TensorDict has device="cpu": nothing moves.'),
        Case("to(float64)", setup=flat_source, impls={**for_libraries(to_double), FLOOR: floor_to_double}),
        Case("clone (100 flat leaves)", setup=flat_source, impls={**for_libraries(clone), FLOOR: floor_clone}),
        Case("clone (93 nested leaves)", setup=nested_source,
             impls={**for_libraries(nested_clone), FLOOR: floor_nested_clone}),
    ]


def cases() -> list:
    return _apply_cases() + _arithmetic_cases() + _reduction_cases() + _move_cases()
