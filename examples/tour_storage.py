"""The tour's storage sections: HDF5 and zarr files, tables and safetensors, tensorclass readers, archives and the
key-value store. examples/tour.py runs them in order with the rest of the guide."""
from __future__ import annotations

import os
import shutil
import tempfile

import torch

from torchdict import TensorDict, lazy_stack, tensorclass
from tour_common import section


def hdf5_and_zarr() -> None:
    section("HDF5 and zarr files")
    from torchdict import PersistentTensorDict, from_h5, from_zarr

    folder = tempfile.mkdtemp()
    try:
        data = TensorDict(obs=torch.arange(12.0).view(6, 2), next={"reward": torch.arange(6)},
                          label="episode-1", batch_size=[6])
        with data.to_h5(os.path.join(folder, "data.h5")) as td:
            print(type(td).__name__, td.batch_size, td.keys(True, True))
            rows = td[torch.tensor([4, 1])]  # reads two rows of each dataset
            print(type(rows).__name__, rows["obs"].tolist(), rows["next", "reward"].tolist())
            td[0:2] = 0  # writes those rows in the file
        with from_h5(os.path.join(folder, "data.h5")) as td:
            print("reopened:", td["obs"][:3].tolist(), td["label"])
            try:
                td["obs"] = torch.zeros(6, 2)
            except OSError as error:
                print("read-only file:", type(error).__name__)
        store = data.to_zarr(os.path.join(folder, "data.zarr"), chunks=(2,))
        print(type(store).__name__, store.backend, store[5]["obs"].tolist())
        again = from_zarr(os.path.join(folder, "data.zarr"))
        print("zarr keeps the batch size:", again.batch_size, again["next"].batch_size)
        assert isinstance(again, PersistentTensorDict)
    finally:
        shutil.rmtree(folder)


def tables_and_files() -> None:
    section("Tables and files: safetensors, Arrow, Parquet, pandas, structured arrays")
    import numpy as np

    from torchdict import from_arrow, from_parquet, from_safetensors, to_arrow, to_safetensors

    td = TensorDict(obs=torch.arange(6.0).reshape(3, 2), reward=torch.tensor([1.0, 0.0, 2.0]),
                    info={"step": torch.arange(3)}, batch_size=[3])
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "episode.safetensors")
        to_safetensors(td, path)  # nested keys stored as "info.step"; batch size in the metadata
        loaded = from_safetensors(path)  # memory-mapped
        print("safetensors:", loaded.batch_size, loaded["info", "step"].tolist())
        flat = TensorDict(reward=td["reward"], step=td["info", "step"], batch_size=[3])
        table = to_arrow(flat)
        print("arrow:", table.schema.names, table.num_rows)
        print("from_arrow:", from_arrow(table)["reward"].tolist())
        parquet = os.path.join(folder, "episode.parquet")
        flat.set("who", ["ann", "bob", "cy"])  # one string per row
        flat.to_parquet(parquet)
        back = from_parquet(parquet)
        print("parquet row 1:", back[1]["who"], back[1]["reward"].item())
    frame = td.exclude("obs").to_pandas(separator=".")
    print("pandas columns:", list(frame.columns))
    print("from_pandas:", TensorDict.from_pandas(frame, separator=".")["info", "step"].tolist())
    records = np.array([(1, 0.5), (2, 1.5)], dtype=[("id", "i8"), ("score", "f4")])
    shared = TensorDict.from_struct_array(records)
    records["score"] += 1  # the TensorDict views the array's memory
    print("struct array:", shared["score"].tolist(), shared.to_struct_array().dtype.names)


def tensorclass_readers() -> None:
    section("Tensorclasses from tables and files, and in lazy stacks")
    from typing import Optional

    import numpy as np
    import pandas as pd

    @tensorclass
    class Step:
        reward: torch.Tensor
        step: torch.Tensor
        who: Optional[str] = None

    steps = Step.from_pandas(pd.DataFrame({"reward": [1.0, 0.0, 2.0], "step": [0, 1, 2]}))
    print("Step.from_pandas:", type(steps).__name__, steps.batch_size, steps.reward.tolist(), "| who:", steps.who)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "steps.parquet")
        TensorDict(reward=steps.reward, step=steps.step, who=["ann", "bob", "cy"], batch_size=[3]).to_parquet(path)
        back = Step.from_parquet(path)  # through pyarrow: one string per row
        print("Step.from_parquet row 1:", back[1].who, back[1].step.item())
        csv = os.path.join(folder, "steps.csv")
        pd.DataFrame({"reward": [1.0], "step": [0], "extra": [5]}).to_csv(csv, index=False)
        try:
            Step.from_csv(csv)
        except ValueError as err:
            print("Step.from_csv refuses a column that is not a field:", "extra" in str(err))
    records = np.array([(0.5, 7), (1.5, 8)], dtype=[("reward", "f4"), ("step", "i8")])
    print("Step.from_struct_array:", Step.from_struct_array(records).step.tolist())
    lazy = lazy_stack([TensorDict(s=steps, batch_size=[3]), TensorDict(s=steps.apply(lambda t: t + 10),
                                                                      batch_size=[3])])
    stacked = lazy.get("s")  # the members' Steps, stacked: a Step
    print("lazy.get('s'):", type(stacked).__name__, tuple(stacked.batch_size), stacked.step.tolist(),
          "| to_tensordict:", type(lazy.to_tensordict()["s"]).__name__)


def archives() -> None:
    section("Archives: a save in one file, mapped once, checked on load")
    import struct
    import zipfile

    import torchdict

    folder = tempfile.mkdtemp()
    try:
        data = TensorDict(obs=torch.arange(6.0).view(3, 2), next={"reward": torch.ones(3)}, task="walk",
                          batch_size=[3])
        path = os.path.join(folder, "episode.tdz")
        data.save(path)  # one zip file; the tensors stored uncompressed and aligned
        loaded = torchdict.load(path)  # maps the file once: each leaf is a view into it
        print("archive:", torchdict.is_memmap_archive(path), sorted(zipfile.ZipFile(path).namelist()))
        print("loaded:", loaded["obs"].tolist(), loaded["next", "reward"].tolist(), loaded["task"])
        print("one subtree:", torchdict.load(path, subpath="next")["reward"].tolist())
        with open(path, "r+b") as handle:  # damage one byte of the "obs" payload
            info = zipfile.ZipFile(path).getinfo("obs.memmap")
            handle.seek(info.header_offset + 26)
            name_length, extra_length = struct.unpack("<2H", handle.read(4))
            handle.seek(info.header_offset + 30 + name_length + extra_length)
            handle.write(b"\xff")
        try:
            torchdict.load(path)
        except zipfile.BadZipFile as error:
            print("refused:", str(error).split(": ")[1].split(" (")[0])
        buffer = TensorDict(obs=torch.zeros(2), batch_size=[2]).memmap_like(os.path.join(folder, "buffer.tdz"))
        buffer["obs"][1] = 7  # written in place: the archive is unsealed...
        print("written in place:", torchdict.load(os.path.join(folder, "buffer.tdz"))["obs"].tolist())
        torchdict.refresh_archive_checksums(os.path.join(folder, "buffer.tdz"))  # ...and sealed again
        print("sealed again:", zipfile.ZipFile(os.path.join(folder, "buffer.tdz")).testzip() is None)
        torchdict.save(data.exclude("task"), os.path.join(folder, "rows"))
        torchdict.append_memmap(os.path.join(folder, "rows"), TensorDict(obs=torch.full((1, 2), -1.0),
                                next={"reward": torch.zeros(1)}, batch_size=[1]))
        print("appended:", torchdict.load(os.path.join(folder, "rows"))["obs"][:, 0].tolist())
        flat, layout = data.exclude("task").pack()
        print("packed:", tuple(flat.shape), layout.keys, "->", layout.unpack(flat[:1])["obs"].tolist())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def store() -> None:
    section("Stores: one TensorDict shared by processes (TensorDictStore)")
    import subprocess
    import sys
    import time

    binary = shutil.which("redis-server")
    try:
        import redis  # the [store] extra
    except ImportError:
        binary = None
    if binary is None:
        print("no redis-server (or no redis client) here: the store section is skipped")
        return
    from torchdict.store import TensorDictStore

    folder = tempfile.mkdtemp(prefix="tour-redis-")
    sock = os.path.join(folder, "redis.sock")
    server = subprocess.Popen([binary, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no",
                               "--dir", folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        probe, deadline = redis.Redis(unix_socket_path=sock), time.monotonic() + 10
        while True:  # wait until the server answers
            try:
                probe.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        probe.close()
        buffer = TensorDictStore.from_schema({"obs": ([3], torch.float32), ("info", "worker"): ([], torch.int64)},
                                             batch_size=[8], unix_socket_path=sock, prefix="tour")
        # Two worker processes reconnect by the store's id; each writes its own rows (0, 2, 4, ... and 1, 3, ...).
        worker = (
            "import sys, torch\n"
            "from torchdict import TensorDict\n"
            "from torchdict.store import TensorDictStore\n"
            "sock, td_id, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
            "buffer = TensorDictStore.from_store(unix_socket_path=sock, prefix='tour', td_id=td_id)\n"
            "rows = torch.arange(rank, 8, 2)\n"
            "buffer[rows] = TensorDict(obs=rows[:, None].float().expand(-1, 3) * 10,\n"
            "                          info={'worker': torch.full_like(rows, rank)}, batch_size=[len(rows)])\n")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
        workers = [subprocess.Popen([sys.executable, "-c", worker, sock, buffer._td_id, str(rank)], env=env)
                   for rank in (0, 1)]
        print("worker exit codes:", [process.wait(timeout=120) for process in workers])
        print("keys:", buffer.keys(include_nested=True, leaves_only=True), "batch_size:", buffer.batch_size)
        rows = torch.tensor([6, 1, 4])
        sample = buffer[rows]  # reads only these 3 rows' bytes from the server
        print(f"sample of rows {rows.tolist()}: {type(sample).__name__}, obs[:, 0] = {sample['obs'][:, 0].tolist()},"
              f" written by workers {sample['info', 'worker'].tolist()}")
        print("every row written once:", bool((buffer["obs"][:, 0] == torch.arange(8) * 10).all()))
        buffer.clear_redis()
        buffer.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
