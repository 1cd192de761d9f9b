"""Operations as context managers (issue 4): the write-back on exit, and what recording it costs.

In this suite the **floor** column is not always plain dict code:

- ``with flatten_keys()`` cases: the floor is the same job done by hand *with torchdict*
  (``flatten_keys``, the edit, ``unflatten_keys``, ``update``), the reference of the issue's
  target ("<= 2x the by-hand version"). The plain-dict version of the job is its own row.
- ``... (no with)`` cases: the floor is torchdict's own op function called directly, without the
  write-back decorator, so the ratio is the price every plain call pays for being usable in ``with``.
"""
from __future__ import annotations

import torch

from _harness import FLOOR, Case, flatten_tree, for_libraries, unflatten_tree

BATCH = torch.Size([16])
FEATURES = 3
NESTED_DEPTH = 5
LEAVES_PER_LEVEL = 4
DEEP_KEY = ".".join(["sub"] * NESTED_DEPTH + ["x0"])


def _leaf() -> torch.Tensor:
    return torch.randn(*BATCH, FEATURES)


def nested_source(depth: int = NESTED_DEPTH, width: int = LEAVES_PER_LEVEL) -> dict:
    """``width`` leaves per level and a ``"sub"`` dict, ``depth`` levels below the root."""
    level = {f"x{i}": _leaf() for i in range(width)}
    for _ in range(depth):
        level = {**{f"x{i}": _leaf() for i in range(width)}, "sub": level}
    return level


def _copy_tree(tree: dict) -> dict:
    return {key: _copy_tree(value) if isinstance(value, dict) else value for key, value in tree.items()}


def _update(target: dict, source: dict) -> None:
    for key, value in source.items():
        if isinstance(value, dict):
            _update(target[key], value)
        else:
            target[key] = value


def _flatten_keys_cases() -> list[Case]:
    def with_block(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)

        def run():
            with td.flatten_keys() as flat:
                flat[DEEP_KEY] += 1

        return run

    def by_hand_with_torchdict(source):
        from torchdict import TensorDict

        td = TensorDict(source, batch_size=BATCH)

        def run():
            flat = td.flatten_keys()
            flat[DEEP_KEY] += 1
            td.update(flat.unflatten_keys())

        return run

    def by_hand_plain(source):
        tree = _copy_tree(source)  # its own dicts: the job rewrites them

        def run():
            flat = flatten_tree(tree)
            flat[DEEP_KEY] += 1
            _update(tree, unflatten_tree(flat))

        return run

    def with_block_new_key(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        value = _leaf()

        def run():
            with td.flatten_keys() as flat:
                flat[DEEP_KEY] += 1
                flat["sub.sub.new"] = value

        return run

    def by_hand_new_key(source):
        from torchdict import TensorDict

        td = TensorDict(source, batch_size=BATCH)
        value = _leaf()

        def run():
            flat = td.flatten_keys()
            flat[DEEP_KEY] += 1
            flat["sub.sub.new"] = value
            td.update(flat.unflatten_keys())

        return run

    note = (f"Nested depth {NESTED_DEPTH}, {LEAVES_PER_LEVEL} leaves per level, batch {list(BATCH)}. "
            "floor = the same job by hand with torchdict: flatten_keys, the edit, unflatten_keys, update.")
    return [
        Case(f"with flatten_keys(): f[k] += 1 (depth {NESTED_DEPTH})", setup=nested_source,
             impls={**for_libraries(with_block), FLOOR: by_hand_with_torchdict},
             target="<= 2x floor", note=note),
        Case(f"with flatten_keys(): f[k] += 1, add a key (depth {NESTED_DEPTH})", setup=nested_source,
             impls={**for_libraries(with_block_new_key), FLOOR: by_hand_new_key},
             fresh=True, target="<= 2x floor"),
        Case(f"flatten, edit, unflatten, update: plain dicts (depth {NESTED_DEPTH})", setup=nested_source,
             impls={**for_libraries(with_block), FLOOR: by_hand_plain},
             note="The same `with` job against its plain-dict floor."),
    ]


def _grid_source() -> dict:
    return {f"key{i}": torch.randn(8, 6, FEATURES) for i in range(20)} | {
        "nested": {f"key{i}": torch.randn(8, 6) for i in range(5)}}


def _shape_cases() -> list[Case]:
    value = torch.randn(6, 8, FEATURES)

    def permute_block(lib, source):
        td = lib.TensorDict(source, batch_size=[8, 6])

        def run():
            with td.permute(1, 0) as permuted:
                permuted["key0"] += 1
                permuted["new"] = value

        return run

    def permute_by_hand(source):
        from torchdict import TensorDict

        td = TensorDict(source, batch_size=[8, 6])

        def run():
            permuted = td.permute(1, 0)
            permuted["key0"] += 1
            permuted["new"] = value
            td.update(permuted.permute(1, 0))

        return run

    def to_block(lib, source):
        td = lib.TensorDict(source, batch_size=[8, 6])

        def run():
            with td.to(torch.float64) as wide:
                wide["key0"] += 1

        return run

    def to_by_hand(source):
        from torchdict import TensorDict

        td = TensorDict(source, batch_size=[8, 6])

        def run():
            wide = td.to(torch.float64)
            wide["key0"] += 1
            td.update(wide.to(torch.float32))

        return run

    note = "20 leaves (8, 6, 3) and 5 nested; floor = the same job by hand with torchdict (op, edit, inverse op, update)."
    return [
        Case("with permute(1, 0): edit + new key", setup=_grid_source, fresh=True,
             impls={**for_libraries(permute_block), FLOOR: permute_by_hand}, target="<= 2x floor", note=note),
        Case("with to(float64): edit", setup=_grid_source,
             impls={**for_libraries(to_block), FLOOR: to_by_hand}, target="<= 2x floor"),
    ]


def _recording_cases() -> list[Case]:
    """A plain call (no ``with``) records its inverse; the floor calls the undecorated function."""

    def permute(lib, source):
        td = lib.TensorDict(source, batch_size=[8, 6])
        return lambda: td.permute(1, 0)

    def permute_undecorated(source):
        from torchdict import TensorDict
        from torchdict import _shape

        td = TensorDict(source, batch_size=[8, 6])
        return lambda: _shape.permute(td, (1, 0))

    def flatten_keys(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td.flatten_keys()

    def flatten_keys_undecorated(source):
        from torchdict import TensorDict
        from torchdict import _keyops

        td = TensorDict(source, batch_size=BATCH)
        return lambda: _keyops.flatten_keys(td, ".", False, None)

    note = "floor = torchdict's op function without the write-back decorator (the price of being usable in `with`)."
    return [
        Case("permute(1, 0) (no with)", setup=_grid_source,
             impls={**for_libraries(permute), FLOOR: permute_undecorated}, target="<= 1.15x floor", note=note),
        Case(f"flatten_keys() (no with, depth {NESTED_DEPTH})", setup=nested_source,
             impls={**for_libraries(flatten_keys), FLOOR: flatten_keys_undecorated}, target="<= 1.15x floor"),
    ]


def cases() -> list[Case]:
    return _flatten_keys_cases() + _shape_cases() + _recording_cases()
