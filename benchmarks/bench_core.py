"""Core container benchmarks (issue 2): construction, get/set, update, key views,
select/exclude, flatten/unflatten, lock, and the import cost.

The floor is the plain dict-of-tensors code a careful user would write for the same
job; where torchdict validates (a write checks the leading dims against the batch
size), the floor validates too, with the cheapest correct check for a one-dim batch
(``value.shape[0] != 16``; slicing ``value.shape[:1]`` builds a torch.Size and costs
about twice as much).
"""
from __future__ import annotations

import os
import subprocess
import sys

import torch

from _harness import flatten_tree, unflatten_tree, FLOOR, TORCHDICT, UPSTREAM, Case, for_libraries

BATCH = torch.Size([16])
BATCH_LEN = BATCH[0]  # the floor's check: `value.shape[0] != BATCH_LEN` (cheapest correct test for 1 batch dim)
FEATURES = 3
NESTED_DEPTH = 5
LEAVES_PER_LEVEL = 4


def _leaf() -> torch.Tensor:
    return torch.randn(*BATCH, FEATURES)


def flat_source(count: int = 100) -> dict:
    """``{"key0": tensor, ..., "key99": tensor}``, all of shape (16, 3)."""
    return {f"key{i}": _leaf() for i in range(count)}


def nested_source(depth: int = NESTED_DEPTH, width: int = LEAVES_PER_LEVEL) -> dict:
    """``width`` leaves per level and a ``"sub"`` dict, ``depth`` levels below the root."""
    level = {f"x{i}": _leaf() for i in range(width)}
    for _ in range(depth):
        level = {**{f"x{i}": _leaf() for i in range(width)}, "sub": level}
    return level


# --- floor helpers: hand-written dict code ------------------------------------------


def _validated_copy(source: dict) -> dict:
    """Copy a nested dict, checking every leaf's leading dims (what construction does)."""
    result = {}
    for key, value in source.items():
        if isinstance(value, dict):
            result[key] = _validated_copy(value)
        else:
            if value.shape[0] != BATCH_LEN:
                raise RuntimeError(f"batch mismatch for {key!r}")
            result[key] = value
    return result


def _leaf_keys(tree: dict, prefix: tuple = ()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaf_keys(value, prefix + (key,))
        else:
            yield prefix + (key,) if prefix else key


def _visit_subdicts(tree: dict, seen: set) -> None:
    """Touch every nested dict once: the least work a recursive lock can do."""
    seen.add(id(tree))
    for value in tree.values():
        if type(value) is dict:
            _visit_subdicts(value, seen)


# --- cases ----------------------------------------------------------------------------


def _construction_cases() -> list[Case]:
    def empty(lib, data):
        return lambda: lib.TensorDict({}, batch_size=BATCH)

    def from_source(lib, source):
        return lambda: lib.TensorDict(source, batch_size=BATCH)

    return [
        Case("construct empty", impls={**for_libraries(empty), FLOOR: lambda data: dict}),
        Case(
            "construct 100 flat leaves",
            setup=flat_source,
            impls={**for_libraries(from_source), FLOOR: lambda source: lambda: _validated_copy(source)},
            target=">= 5x faster than upstream",
        ),
        Case(
            f"construct nested depth {NESTED_DEPTH}",
            setup=nested_source,
            impls={**for_libraries(from_source), FLOOR: lambda source: lambda: _validated_copy(source)},
            note=f"{LEAVES_PER_LEVEL} leaves per level, {NESTED_DEPTH} nested levels below the root.",
        ),
    ]


def _get_cases() -> list[Case]:
    def get(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td["key0"]

    def nested_get(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td["sub", "sub", "x0"]

    return [
        Case(
            "get",
            setup=flat_source,
            impls={**for_libraries(get), FLOOR: lambda source: lambda: source["key0"]},
            target="<= 2x floor",
        ),
        Case(
            "get nested (depth 3)",
            setup=nested_source,
            impls={**for_libraries(nested_get), FLOOR: lambda source: lambda: source["sub"]["sub"]["x0"]},
        ),
    ]


def _set_cases() -> list[Case]:
    value = _leaf()

    def set_existing(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)

        def run():
            td["key0"] = value

        return run

    def floor_set_existing(source):
        plain = dict(source)

        def run():
            if value.shape[0] != BATCH_LEN:
                raise RuntimeError("batch mismatch")
            plain["key0"] = value

        return run

    def small_source():
        return flat_source(4)

    def set_new(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)

        def run():
            td["new"] = value

        return run

    def floor_set_new(source):
        plain = dict(source)

        def run():
            if value.shape[0] != BATCH_LEN:
                raise RuntimeError("batch mismatch")
            plain["new"] = value

        return run

    def set_nested(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)

        def run():
            td["sub", "sub", "x0"] = value

        return run

    def floor_set_nested(source):
        plain = _validated_copy(source)

        def run():
            node = plain["sub"]["sub"]
            if value.shape[0] != BATCH_LEN:
                raise RuntimeError("batch mismatch")
            node["x0"] = value

        return run

    def set_new_path(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)

        def run():
            td["a", "b", "c"] = value

        return run

    def floor_set_new_path(source):
        plain = dict(source)

        def run():
            node = plain.setdefault("a", {}).setdefault("b", {})
            if value.shape[0] != BATCH_LEN:
                raise RuntimeError("batch mismatch")
            node["c"] = value

        return run

    def set_inplace(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td.set_("key0", value)

    def floor_set_inplace(source):
        return lambda: source["key0"].copy_(value)

    return [
        Case(
            "set existing key",
            setup=flat_source,
            impls={**for_libraries(set_existing), FLOOR: floor_set_existing},
            target="<= 2x floor",
        ),
        Case(
            "set new key",
            setup=small_source,
            impls={**for_libraries(set_new), FLOOR: floor_set_new},
            fresh=True,
            target="<= 2x floor",
            note="a fresh 4-leaf container per call, built outside the timed region.",
        ),
        Case(
            "set nested (depth 3, existing path)",
            setup=nested_source,
            impls={**for_libraries(set_nested), FLOOR: floor_set_nested},
            target="<= 2x floor",
        ),
        Case(
            "set nested (new path a.b.c)",
            setup=small_source,
            impls={**for_libraries(set_new_path), FLOOR: floor_set_new_path},
            fresh=True,
            note="creates the two intermediate levels; fresh container per call.",
        ),
        Case(
            "set_ (in place)",
            setup=flat_source,
            impls={**for_libraries(set_inplace), FLOOR: floor_set_inplace},
        ),
    ]


def _update_case() -> Case:
    def setup():
        return flat_source(), flat_source()

    def update(lib, data):
        source, new_values = data
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td.update(new_values)

    def floor_update(data):
        source, new_values = data
        plain = dict(source)

        def run():
            for key, value in new_values.items():
                if value.shape[0] != BATCH_LEN:
                    raise RuntimeError(f"batch mismatch for {key!r}")
                plain[key] = value

        return run

    return Case(
        "update (100 keys)",
        setup=setup,
        impls={**for_libraries(update), FLOOR: floor_update},
        target="<= 3x floor",
        note="overwrites 100 existing keys from a plain dict.",
    )


def _view_cases() -> list[Case]:
    def items(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: list(td.items())

    def nested_leaf_keys(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: list(td.keys(include_nested=True, leaves_only=True))

    return [
        Case(
            "items (100 leaves)",
            setup=flat_source,
            impls={**for_libraries(items), FLOOR: lambda source: lambda: list(source.items())},
        ),
        Case(
            "keys(include_nested, leaves_only)",
            setup=nested_source,
            impls={**for_libraries(nested_leaf_keys), FLOOR: lambda source: lambda: list(_leaf_keys(source))},
            note=f"nested depth {NESTED_DEPTH}; the result is materialised with list().",
        ),
    ]


def _restructure_cases() -> list[Case]:
    chosen = tuple(f"key{i}" for i in range(0, 100, 10))
    chosen_set = frozenset(chosen)

    def select(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td.select(*chosen)

    def exclude(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td.exclude(*chosen)

    def flatten_keys(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td.flatten_keys()

    def flat_dotted_source():
        return flatten_tree(nested_source())

    def unflatten_keys(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td.unflatten_keys()

    def lock_unlock(lib, source):
        td = lib.TensorDict(source, batch_size=BATCH)
        return lambda: td.lock_().unlock_()

    def floor_lock_unlock(source):
        def run():
            _visit_subdicts(source, set())
            _visit_subdicts(source, set())

        return run

    return [
        Case(
            "select (10 of 100)",
            setup=flat_source,
            impls={**for_libraries(select), FLOOR: lambda source: lambda: {k: source[k] for k in chosen}},
        ),
        Case(
            "exclude (10 of 100)",
            setup=flat_source,
            impls={
                **for_libraries(exclude),
                FLOOR: lambda source: lambda: {k: v for k, v in source.items() if k not in chosen_set},
            },
        ),
        Case(
            "flatten_keys (nested depth 5)",
            setup=nested_source,
            impls={**for_libraries(flatten_keys), FLOOR: lambda source: lambda: flatten_tree(source)},
        ),
        Case(
            "unflatten_keys (depth 5)",
            setup=flat_dotted_source,
            impls={**for_libraries(unflatten_keys), FLOOR: lambda source: lambda: unflatten_tree(source)},
        ),
        Case(
            "lock_ + unlock_ (nested depth 5)",
            setup=nested_source,
            impls={**for_libraries(lock_unlock), FLOOR: floor_lock_unlock},
            note="floor: two walks over the nested dicts (the least a recursive lock and unlock do).",
        ),
    ]


# --- import cost --------------------------------------------------------------------

_IMPORT_SNIPPET = (
    "import time, torch\n"
    "start = time.perf_counter_ns()\n"
    "import {module}\n"
    "print(time.perf_counter_ns() - start)\n"
)


def _import_cost(module: str):
    """A self-timed run: ns spent importing ``module`` in a fresh interpreter after torch."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    # Measure what users see: imports from cached bytecode (some environments disable writing it).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command = [sys.executable, "-c", _IMPORT_SNIPPET.format(module=module)]

    def prepare(data):
        __import__(module)  # ImportError here drops the column instead of failing per sample
        subprocess.run(command, env=env, capture_output=True, check=False)  # warm the bytecode cache

        def run() -> int:
            completed = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            return int(completed.stdout.strip().splitlines()[-1])

        return run

    return prepare


def _import_case() -> Case:
    return Case(
        "import (after import torch)",
        impls={TORCHDICT: _import_cost("torchdict"), UPSTREAM: _import_cost("tensordict")},
        self_timed=True,
        max_samples=5,
        target="<= 50 ms",
        note="fresh interpreter per sample; time of `import X` after `import torch`. No floor.",
    )


def cases() -> list[Case]:
    return [
        *_construction_cases(),
        *_get_cases(),
        *_set_cases(),
        _update_case(),
        *_view_cases(),
        *_restructure_cases(),
        _import_case(),
    ]
