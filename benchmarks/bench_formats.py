"""File formats (issue 21): torchdict and upstream against each format's library used by hand.

Each case does one whole job on the same data three ways: torchdict, upstream tensordict, and the
*floor*, the code a careful user writes with the format's own library and no collection library (an h5py
write loop, ``pyarrow.table`` over numpy views, ``safetensors.torch.save_file``...). The goal for
torchdict is to cost at most 1.2x the floor, and less than upstream.

Data (built once per case, untimed):

- a nested TensorDict of 21 leaves, ~100 MB, batch ``[10_000]`` (float32, int64, uint8, bool leaves,
  two nested levels) for HDF5 and safetensors;
- a flat TensorDict of 10 columns x 1M rows (float32, float64, int64, int32, ~58 MB) for Arrow and
  Parquet.

Files go to a temporary folder under ``TORCHDICT_BENCH_DIR`` (default: the system temp dir), removed at
exit. Writers write a new path on every call, through the page cache (no fsync, for anyone): see
``_new_path`` for why not over the previous file.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import torch

from _harness import FLOOR, Case, for_libraries

ROWS = 10_000
TABLE_ROWS = 1_000_000
PICKED_ROWS = 256
TARGET = "<= 1.2x floor"
WRITE_NOTE = ("Every call writes the whole file to a new path (the previous one is deleted before timing), "
              "through the page cache, without fsync.")

_ROOT: list = []


def _scratch(name: str) -> str:
    """A fresh folder for one case, under one temporary root removed at exit."""
    if not _ROOT:
        root = tempfile.mkdtemp(prefix="torchdict-bench-formats-", dir=os.environ.get("TORCHDICT_BENCH_DIR"))
        atexit.register(shutil.rmtree, root, True)
        _ROOT.append(root)
    path = os.path.join(_ROOT[0], name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _new_path(data: dict, label: str, suffix: str) -> str:
    """A path that does not exist yet; the one given to ``label`` before is deleted now (untimed).

    Writers get a new path per call: overwriting a file makes ext4 start writing the new data back at once
    (its "replace" heuristics: on a rename over a file, on closing a file truncated on open), a cost of the
    disk's state that would swamp the libraries' own differences.
    """
    paths = data.setdefault("paths", {})
    previous = paths.get(label)
    if previous is not None and os.path.exists(previous):
        os.remove(previous)
    count = data.setdefault("count", [0])
    count[0] += 1
    paths[label] = os.path.join(data["dir"], f"{label}-{count[0]}{suffix}")
    return paths[label]


# --------------------------------------------------------------------------- data
def _nested_leaves() -> dict:
    """21 leaves, ~100 MB, as ``{nested key tuple: tensor}`` (3 levels, 4 dtypes)."""
    generator = torch.Generator().manual_seed(0)
    leaves: dict = {}
    for i in range(8):
        leaves[(f"x{i}",)] = torch.randn(ROWS, 128, generator=generator)
    for i in range(5):
        leaves[("obs", f"feature{i}")] = torch.randn(ROWS, 128, generator=generator)
    leaves[("obs", "pixels")] = torch.randint(0, 256, (ROWS, 1024), dtype=torch.uint8, generator=generator)
    for i in range(4):
        leaves[("next", "obs", f"feature{i}")] = torch.randn(ROWS, 128, generator=generator)
    leaves[("next", "reward")] = torch.randn(ROWS, 1, generator=generator)
    leaves[("next", "done")] = torch.rand(ROWS, 1, generator=generator) < 0.01
    leaves[("action",)] = torch.randint(0, 10, (ROWS, 64), generator=generator)
    return leaves


def _as_tensordict(lib, leaves: dict):
    td = lib.TensorDict(batch_size=[ROWS])
    for key, tensor in leaves.items():
        td.set(key, tensor)
    return td


def _nested_data() -> dict:
    return {"leaves": _nested_leaves(), "dir": _scratch("nested")}


def _table_columns() -> dict:
    generator = torch.Generator().manual_seed(1)
    columns = {}
    for i in range(4):
        columns[f"f32_{i}"] = torch.randn(TABLE_ROWS, generator=generator)
    for i in range(2):
        columns[f"f64_{i}"] = torch.randn(TABLE_ROWS, generator=generator, dtype=torch.float64)
    for i in range(2):
        columns[f"i64_{i}"] = torch.randint(0, 1 << 40, (TABLE_ROWS,), generator=generator)
    for i in range(2):
        columns[f"i32_{i}"] = torch.randint(0, 1 << 20, (TABLE_ROWS,), generator=generator, dtype=torch.int32)
    return columns


def _table_data() -> dict:
    return {"columns": _table_columns(), "dir": _scratch("table")}


# --------------------------------------------------------------------------- HDF5
def _h5_floor_write(path: str, leaves: dict) -> None:
    """What a user writes with h5py: one group per nested level, one dataset per leaf."""
    import h5py

    with h5py.File(path, "w") as file:
        for key, tensor in leaves.items():
            group = file
            for part in key[:-1]:
                group = group.require_group(part)
            group.create_dataset(key[-1], data=tensor.numpy())


def _h5_floor_read(path: str) -> dict:
    """Every dataset of the file as a tensor, by nested key."""
    import h5py

    out: dict = {}
    with h5py.File(path, "r") as file:
        stack = [((), file)]
        while stack:
            prefix, group = stack.pop()
            for name, node in group.items():
                if isinstance(node, h5py.Group):
                    stack.append((prefix + (name,), node))
                else:
                    out[prefix + (name,)] = torch.from_numpy(node[()])
    return out


def _h5_cases() -> list:
    def write_lib(lib, data):
        td = _as_tensordict(lib, data["leaves"])
        path = _new_path(data, lib.__name__, ".h5")

        def run():
            td.to_h5(path).close()

        return run

    def write_floor(data):
        path = _new_path(data, FLOOR, ".h5")
        return lambda: _h5_floor_write(path, data["leaves"])

    def read_setup():
        data = _nested_data()
        data["path"] = os.path.join(data["dir"], "data.h5")
        _h5_floor_write(data["path"], data["leaves"])
        generator = torch.Generator().manual_seed(2)
        data["rows"] = torch.randperm(ROWS, generator=generator)[:PICKED_ROWS].sort().values
        return data

    def read_lib(lib, data):
        from_h5, path = lib.from_h5, data["path"]  # resolved once, as `from torchdict import from_h5` does

        def run():
            td = from_h5(path)
            try:
                return td.to_tensordict()
            finally:
                td.close()

        return run

    def read_floor(data):
        return lambda: _h5_floor_read(data["path"])

    def rows_lib(lib, data):
        td = lib.from_h5(data["path"])
        rows = data["rows"]
        if lib.__name__ == "torchdict":
            return lambda: td[rows]  # a TensorDict of the rows, read now
        return lambda: td[rows].to_tensordict()  # upstream's td[rows] is a lazy view: read the rows

    def rows_floor(data):
        import h5py

        file = h5py.File(data["path"], "r")
        datasets = {}
        stack = [((), file)]
        while stack:
            prefix, group = stack.pop()
            for name, node in group.items():
                if isinstance(node, h5py.Group):
                    stack.append((prefix + (name,), node))
                else:
                    datasets[prefix + (name,)] = node
        rows = data["rows"].numpy()
        return lambda: {key: torch.from_numpy(dataset[rows]) for key, dataset in datasets.items()}

    size = "100 MB"
    return [
        Case(f"to_h5 {size}, 21 leaves (floor: h5py create_dataset loop)", setup=_nested_data, target=TARGET,
             fresh=True, max_samples=7, impls={**for_libraries(write_lib), FLOOR: write_floor},
             note=f"{WRITE_NOTE} to_h5 returns the file open: the call closes it, as the floor closes its file."),
        Case(f"from_h5 {size}, 21 leaves, read whole (floor: h5py read loop)", setup=read_setup, target=TARGET,
             max_samples=7, impls={**for_libraries(read_lib), FLOOR: read_floor},
             note="Opens the file, reads every dataset into a tensor (from_h5(...).to_tensordict()), closes it."),
        Case(f"h5 td[{PICKED_ROWS} sorted random rows] (floor: h5py fancy indexing)", setup=read_setup,
             target=TARGET, impls={**for_libraries(rows_lib), FLOOR: rows_floor},
             note="File open before timing; each call reads the same 256 sorted rows of all 21 datasets into "
                  "tensors (upstream's td[rows] is a lazy view: the call adds .to_tensordict())."),
    ]


# --------------------------------------------------------------------------- Arrow / Parquet
def _table_floor(columns: dict):
    import pyarrow as pa

    return pa.table({name: tensor.numpy() for name, tensor in columns.items()})


def _columns_floor(table) -> dict:
    return {name: torch.from_numpy(column.to_numpy()) for name, column in zip(table.column_names, table.columns)}


def _quiet_first_call(run):
    """Call ``run`` once with warnings off: torch warns, once per process, that the numpy arrays Arrow gives
    are read-only (the floor takes them as they are; torchdict checks the buffers and copies read-only ones)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run()
    return run


def _arrow_cases() -> list:
    def to_arrow_lib(lib, data):
        td, to_arrow = lib.TensorDict(data["columns"], batch_size=[TABLE_ROWS]), lib.to_arrow
        return lambda: to_arrow(td)

    def to_arrow_floor(data):
        return lambda: _table_floor(data["columns"])

    def arrow_setup():
        data = _table_data()
        data["table"] = _table_floor(data["columns"])
        return data

    def from_arrow_lib(lib, data):
        from_arrow, table = lib.from_arrow, data["table"]
        return lambda: from_arrow(table)

    def from_arrow_floor(data):
        table = data["table"]
        return _quiet_first_call(lambda: _columns_floor(table))

    def to_parquet_lib(lib, data):
        td = lib.TensorDict(data["columns"], batch_size=[TABLE_ROWS])
        path = _new_path(data, lib.__name__, ".parquet")
        return lambda: td.to_parquet(path)

    def to_parquet_floor(data):
        import pyarrow.parquet as pq

        path = _new_path(data, FLOOR, ".parquet")
        return lambda: pq.write_table(_table_floor(data["columns"]), path)

    def parquet_setup():
        import pyarrow.parquet as pq

        data = _table_data()
        data["path"] = os.path.join(data["dir"], "data.parquet")
        pq.write_table(_table_floor(data["columns"]), data["path"])
        return data

    def from_parquet_lib(lib, data):
        from_parquet, path = lib.TensorDict.from_parquet, data["path"]
        return lambda: from_parquet(path)

    def from_parquet_floor(data):
        import pyarrow.parquet as pq

        path = data["path"]
        return _quiet_first_call(lambda: _columns_floor(pq.read_table(path)))

    shape = f"10 cols x {TABLE_ROWS // 1_000_000}M rows"
    return [
        Case(f"to_arrow {shape} (floor: pa.table of numpy views)", setup=_table_data, target=TARGET,
             impls={**for_libraries(to_arrow_lib), FLOOR: to_arrow_floor}),
        Case(f"from_arrow {shape} (floor: from_numpy(column.to_numpy()))", setup=arrow_setup, target=TARGET,
             impls={**for_libraries(from_arrow_lib), FLOOR: from_arrow_floor},
             note="An in-memory table (buffers owned by numpy); every implementation returns tensors viewing them."),
        Case(f"to_parquet {shape} (floor: pq.write_table)", setup=_table_data, target=TARGET, fresh=True,
             max_samples=7, impls={**for_libraries(to_parquet_lib), FLOOR: to_parquet_floor},
             note=f"{WRITE_NOTE} pyarrow's default options (snappy) for everyone."),
        Case(f"from_parquet {shape} (floor: pq.read_table + from_numpy)", setup=parquet_setup, target=TARGET,
             max_samples=7, impls={**for_libraries(from_parquet_lib), FLOOR: from_parquet_floor},
             note="Reads the whole file into tensors (the page cache is warm)."),
    ]


# --------------------------------------------------------------------------- safetensors
def _flat_names(leaves: dict) -> dict:
    return {".".join(key): tensor for key, tensor in leaves.items()}


def _safetensors_cases() -> list:
    def write_lib(lib, data):
        td = _as_tensordict(lib, data["leaves"])
        path = _new_path(data, lib.__name__, ".safetensors")
        to_safetensors = lib.to_safetensors
        return lambda: to_safetensors(td, path)

    def write_floor(data):
        from safetensors.torch import save_file

        flat = _flat_names(data["leaves"])
        path = _new_path(data, FLOOR, ".safetensors")
        return lambda: save_file(flat, path)

    def read_setup():
        import torchdict

        data = _nested_data()
        data["path"] = os.path.join(data["dir"], "data.safetensors")
        # written once by torchdict (upstream's layout: both libraries read it); the floor ignores the metadata
        torchdict.to_safetensors(_as_tensordict(torchdict, data["leaves"]), data["path"])
        return data

    def read_lib(lib, data):
        from_safetensors, path = lib.from_safetensors, data["path"]
        return lambda: from_safetensors(path)

    def read_floor(data):
        from safetensors.torch import load_file

        return lambda: load_file(data["path"])

    return [
        Case("to_safetensors 100 MB, 21 leaves (floor: save_file)", setup=_nested_data, target=TARGET,
             fresh=True, max_samples=7, impls={**for_libraries(write_lib), FLOOR: write_floor},
             note=f"{WRITE_NOTE} The floor saves a flat dict of the same tensors (names joined with '.'), "
                  "built before timing."),
        Case("from_safetensors 100 MB, 21 leaves (floor: load_file)", setup=read_setup, target=TARGET,
             impls={**for_libraries(read_lib), FLOOR: read_floor},
             note="The floor returns a flat dict; torchdict and upstream rebuild the nested TensorDict."),
    ]


def cases() -> list:
    return _h5_cases() + _arrow_cases() + _safetensors_cases()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run

    sys.exit(run.main(["--suite", "formats", *sys.argv[1:]]))
