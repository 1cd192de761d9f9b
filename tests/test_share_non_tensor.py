"""memmap(..., share_non_tensor=True): non-tensor values shared between processes through the saved folder.

Differential against upstream tensordict 0.15.3 (which shares them through multiprocessing values and managers)
for what one process observes, and spawned processes for what the others see.
"""
import copy
import json
import multiprocessing
import os
import pickle
import subprocess
import sys

import pytest
import tensordict
import torch

import torchdict
from torchdict import NonTensorData, NonTensorStack, TensorDict

LIBS = {"torchdict": torchdict, "tensordict": tensordict}
BATCHES = [(), (2,), (2, 3), (1, 2, 2)]


@pytest.fixture(autouse=True)
def _stop_upstreams_manager():
    """Upstream shares list and dict values through a multiprocessing Manager, a server process it starts once
    and keeps: stop it after each test, so that no test leaves a process behind (other files check that)."""
    yield
    upstream_tensorclass = sys.modules["tensordict.tensorclass"]  # the module (the package's name is the decorator)
    manager = getattr(upstream_tensorclass, "_MP_MANAGER", None)
    if manager is not None:
        manager.shutdown()
        upstream_tensorclass._MP_MANAGER = None


def plain(value):
    """Upstream's LinkedList and nested lists as plain lists."""
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def build(lib, batch):
    td = lib.TensorDict(
        a=torch.zeros(*batch, 2),
        name=lib.NonTensorData("orig", batch_size=batch),
        count=lib.NonTensorData(3, batch_size=batch),
        flag=lib.NonTensorData(True, batch_size=batch),
        config=lib.NonTensorData({"lr": 0.1, "layers": [2, 3]}, batch_size=batch),
        nested=lib.TensorDict(inner=lib.NonTensorData(1.5, batch_size=batch), batch_size=batch),
        batch_size=batch,
    )
    if batch:
        values = [f"v{i}" for i in range(batch[0])]
        td["stack"] = lib.NonTensorStack(*[lib.NonTensorData(value, batch_size=batch[1:]) for value in values])
    return td


def observe(td, batch):
    seen = {key: plain(td[key]) for key in ("name", "count", "flag", "config", ("nested", "inner"))}
    if batch:
        seen["stack"] = plain(td["stack"])
    return seen


def scenario(lib, folder, batch):
    """What one process reads after each in-place write into a shared memory-mapped TensorDict."""
    td = build(lib, batch).memmap(folder, share_non_tensor=True)
    log = [observe(td, batch)]
    td.update_({"name": lib.NonTensorData("updated", batch_size=batch)})
    log.append(observe(td, batch))
    td.set_(("nested", "inner"), lib.NonTensorData(2.5, batch_size=batch))
    log.append(observe(td, batch))
    td.update_(lib.TensorDict(count=lib.NonTensorData(7, batch_size=batch), batch_size=batch))
    log.append(observe(td, batch))
    td.get("flag").update_(lib.NonTensorData(False))
    log.append(observe(td, batch))
    td.update_({"config": lib.NonTensorData({"lr": 0.5}, batch_size=batch)})
    log.append(observe(td, batch))
    if batch:
        row = lib.TensorDict(a=torch.ones(*batch[1:], 2), name=lib.NonTensorData("updated", batch_size=batch[1:]),
                             count=lib.NonTensorData(7, batch_size=batch[1:]),
                             flag=lib.NonTensorData(False, batch_size=batch[1:]),
                             config=lib.NonTensorData({"lr": 0.5}, batch_size=batch[1:]),
                             nested=lib.TensorDict(inner=lib.NonTensorData(2.5, batch_size=batch[1:]),
                                                   batch_size=batch[1:]),
                             stack=lib.NonTensorData("row", batch_size=batch[1:]), batch_size=batch[1:])
        td[0] = row
        log.append(observe(td, batch))
        log.append(td["a"].sum().item())
    reloaded = lib.TensorDict.load_memmap(folder)
    log.append(observe(reloaded, batch))
    return log


@pytest.mark.parametrize("batch", BATCHES)
def test_in_place_writes_match_upstream_and_reach_the_folder(tmp_path, batch):
    logs = {name: scenario(lib, tmp_path / name, batch) for name, lib in LIBS.items()}
    assert logs["torchdict"] == logs["tensordict"]


@pytest.mark.parametrize("batch", BATCHES[1:])
def test_a_different_value_written_at_an_index_is_refused_as_upstream(tmp_path, batch):
    for name, lib in LIBS.items():
        td = build(lib, batch).memmap(tmp_path / name, share_non_tensor=True)
        row = td[0].clone()
        row["name"] = "other"
        with pytest.raises(RuntimeError, match="does not match the previous"):
            td[0] = row
        assert td["name"] == "orig"


def test_refused_writes_change_nothing(tmp_path):
    td = build(torchdict, (2,)).memmap(tmp_path / "saved", share_non_tensor=True)
    before = open(tmp_path / "saved" / "meta.json").read()
    row = td[0].clone()
    row["name"] = "other"
    row["a"] = torch.full((2,), 5.0)
    with pytest.raises(RuntimeError, match="does not match the previous"):
        td[0] = row
    assert td["a"].sum() == 0  # checked before the first write
    # a value JSON can't hold, without allow_pickle: refused before the tensor is copied
    with pytest.raises(TypeError, match="allow_pickle=True"):
        td.update_({"a": torch.ones(2, 2), "name": NonTensorData(("a", "tuple"), batch_size=[2])})
    assert td["a"].sum() == 0 and td["name"] == "orig"
    # several values into one shared NonTensorData
    with pytest.raises(RuntimeError):
        td.set_("name", NonTensorStack("x", "y"))
    assert open(tmp_path / "saved" / "meta.json").read() == before


def test_pickled_values_are_shared_with_allow_pickle(tmp_path):
    td = TensorDict(a=torch.zeros(2), value=NonTensorData("x", batch_size=[2]), batch_size=[2])
    saved = td.memmap(tmp_path / "saved", share_non_tensor=True, allow_pickle=True)
    other = pickle.loads(pickle.dumps(saved))
    other.set_("value", NonTensorData(("a", b"bytes"), batch_size=[2]))
    assert saved["value"] == ("a", b"bytes")
    assert sorted(os.listdir(tmp_path / "saved")) == ["a.memmap", "meta.json", "value.pickle"]
    other.set_("value", NonTensorData("json again", batch_size=[2]))
    assert saved["value"] == "json again"
    assert sorted(os.listdir(tmp_path / "saved")) == ["a.memmap", "meta.json"]  # the stale pickle is gone
    assert TensorDict.load_memmap(tmp_path / "saved")["value"] == "json again"


def test_a_pickled_copy_shares_and_a_clone_does_not(tmp_path):
    saved = build(torchdict, (2,)).memmap(tmp_path / "saved", share_non_tensor=True)
    sent = pickle.loads(pickle.dumps(saved))
    cloned, deep = saved.clone(), copy.deepcopy(saved)
    sent.set_("name", NonTensorData("from the copy", batch_size=[2]))
    assert saved["name"] == "from the copy"
    assert cloned["name"] == "orig" and deep["name"] == "orig"
    # a copy of a leaf holds the value it had; a pickled leaf is still shared
    leaf = saved.get("name")
    assert copy.deepcopy(leaf).data == "from the copy"
    assert pickle.loads(pickle.dumps(leaf))._is_shared()
    assert not leaf.clone()._is_shared()


def test_without_a_prefix_the_values_are_shared_too(tmp_path):
    saved = build(torchdict, (2,)).memmap(share_non_tensor=True)
    sent = pickle.loads(pickle.dumps(saved))
    sent.set_(("nested", "inner"), NonTensorData(9.5, batch_size=[2]))
    assert saved["nested", "inner"] == 9.5
    td = TensorDict(a=torch.zeros(2), s=NonTensorData(("t",), batch_size=[2]), batch_size=[2])
    with pytest.raises(TypeError, match="allow_pickle=True"):
        td.memmap_(share_non_tensor=True)
    assert type(td["a"]) is torch.Tensor and not td.is_locked  # refused before anything changed
    assert td.memmap(share_non_tensor=True, allow_pickle=True)["s"] == ("t",)


@pytest.mark.parametrize("how", ["memmap_", "memmap_like", "atomic", "save", "top-level"])
def test_every_save_shares(tmp_path, how):
    td = build(torchdict, (2,))
    folder = tmp_path / "saved"
    if how == "memmap_":
        saved = td.memmap_(folder, share_non_tensor=True)
        assert saved is td
    elif how == "memmap_like":
        saved = td.memmap_like(folder, share_non_tensor=True)
    elif how == "atomic":
        saved = td.memmap(folder, share_non_tensor=True, atomic=True)
    elif how == "save":
        saved = td.save(folder, share_non_tensor=True)
    else:
        saved = torchdict.save(td, folder, share_non_tensor=True)
    pickle.loads(pickle.dumps(saved)).set_("name", NonTensorData("shared", batch_size=[2]))
    assert saved["name"] == "shared"
    assert TensorDict.load_memmap(folder)["name"] == "shared"  # the atomic save's handles point at `folder`


def test_lone_leaves_are_shared(tmp_path):
    for name, leaf in {"data": NonTensorData("one"), "stack": NonTensorStack("a", "b")}.items():
        saved = leaf.memmap(tmp_path / name, share_non_tensor=True)
        sent = pickle.loads(pickle.dumps(saved))
        if name == "data":
            sent.update_(NonTensorData("two"))
            assert saved.data == "two"
            assert NonTensorData.load_memmap(tmp_path / name).data == "two"
            assert tensordict.NonTensorData.load_memmap(tmp_path / name).data == "two"  # upstream reads it
        else:
            sent[1] = "B"
            assert saved.tolist() == ["a", "B"]
            assert NonTensorStack.load_memmap(tmp_path / name).tolist() == ["a", "B"]
    in_place = NonTensorData("x")
    in_place.memmap_(tmp_path / "in_place", share_non_tensor=True)
    pickle.loads(pickle.dumps(in_place)).update_(NonTensorData("y"))
    assert in_place.data == "y"


@torchdict.tensorclass
class Sample:
    x: torch.Tensor
    label: str


def test_tensorclass_and_lazy_stack_share(tmp_path):
    sample = Sample(x=torch.zeros(2), label="first", batch_size=[2]).memmap(tmp_path / "tc", share_non_tensor=True)
    pickle.loads(pickle.dumps(sample)).update_(Sample(x=torch.ones(2), label="second", batch_size=[2]))
    assert sample.label == "second" and sample.x.sum() == 2
    stack = torchdict.lazy_stack([TensorDict(a=torch.zeros(2), s="x"), TensorDict(a=torch.ones(2), s="y")])
    stack = stack.memmap(tmp_path / "lazy", share_non_tensor=True)
    pickle.loads(pickle.dumps(stack)).tensordicts[1].set_("s", NonTensorData("Y"))
    assert stack["s"] == ["x", "Y"]


def test_archives_cannot_share(tmp_path):
    td = build(torchdict, (2,))
    for call in (lambda: td.memmap(tmp_path / "x.tdz", share_non_tensor=True),
                 lambda: td.memmap(tmp_path / "y", archive=True, share_non_tensor=True),
                 lambda: torchdict.save(td, tmp_path / "z.tdz", share_non_tensor=True)):
        with pytest.raises(ValueError, match="share_non_tensor=True needs a folder"):
            call()
    assert os.listdir(tmp_path) == []


def test_a_save_without_sharing_is_unchanged(tmp_path):
    saved = build(torchdict, (2,)).memmap(tmp_path / "saved")
    assert not saved.get("name")._is_shared()
    meta = json.loads(open(tmp_path / "saved" / "meta.json").read())
    assert meta["entries"]["name"] == {"kind": "non_tensor", "batch_size": [2], "value": "orig"}


# ---------------------------------------------------------------------- other processes
def _serve(objects, commands, replies):
    """A spawned process: runs the parent's commands on the shared objects it received."""
    while True:
        command = commands.get()
        if command is None:
            return
        name, action, *args = command
        try:
            replies.put(("ok", _ACTIONS[action](objects[name], *args)))
        except Exception as error:  # reported to the parent
            replies.put(("error", type(error).__name__))


def _read(td, key):
    return plain(td[key])


def _hammer(td, key, position, count):
    for step in range(count):
        td[position] = TensorDict({key: f"{position}-{step}"}, batch_size=[])
    return count


def _update(td, key, value):
    td.update_({key: NonTensorData(value, batch_size=td.batch_size)})


def _leaf_update(leaf, value):
    leaf.update_(NonTensorData(value))


_ACTIONS = {
    "read": _read,
    "update_": _update,
    "set_at": lambda td, position, key, value: td.__setitem__(position, td[position].clone().set(key, value)),
    "leaf_update_": _leaf_update,
    "leaf_read": lambda leaf: leaf.tolist(),
    "hammer": lambda td, key, position, count: _hammer(td.select(key), key, position, count),
}


def _ask(commands, replies, *command):
    commands.put(command)
    status, value = replies.get(timeout=120)
    assert status == "ok", value
    return value


@pytest.mark.slow
def test_values_written_in_one_process_are_read_in_the_other(tmp_path):
    td = TensorDict(a=torch.zeros(4), name=NonTensorData("orig", batch_size=[4]),
                    labels=NonTensorStack("a", "b", "c", "d"), batch_size=[4])
    objects = {
        "folder": td.memmap(tmp_path / "saved", share_non_tensor=True),
        "anonymous": td.memmap(share_non_tensor=True),
        "lone": NonTensorData("lone").memmap(tmp_path / "lone", share_non_tensor=True),
    }
    context = multiprocessing.get_context("spawn")
    commands, replies = context.Queue(), context.Queue()
    child = context.Process(target=_serve, args=(objects, commands, replies))
    child.start()
    try:
        for name in ("folder", "anonymous"):
            shared = objects[name]
            assert _ask(commands, replies, name, "read", "name") == "orig"
            _ask(commands, replies, name, "update_", "name", "from the child")  # the child writes
            assert shared["name"] == "from the child"  # the parent reads it
            shared.update_({"name": NonTensorData("from the parent", batch_size=[4])})
            assert _ask(commands, replies, name, "read", "name") == "from the parent"
            _ask(commands, replies, name, "set_at", 2, "labels", "C")  # one element of a stack
            assert shared["labels"] == ["a", "b", "C", "d"]
            shared[0] = shared[0].clone().set("labels", "A")
            assert _ask(commands, replies, name, "read", "labels") == ["A", "b", "C", "d"]
            commands.put((name, "set_at", 1, "name", "not the same"))
            assert replies.get(timeout=120) == ("error", "RuntimeError")
            assert shared["name"] == "from the parent"
        _ask(commands, replies, "lone", "leaf_update_", "lone, rewritten")
        assert objects["lone"].data == "lone, rewritten"
        # element writes from both processes at once: each is a locked read-modify-write, none is lost
        shared = objects["folder"]
        commands.put(("folder", "hammer", "labels", 1, 30))
        _hammer(shared.select("labels"), "labels", 3, 30)
        assert replies.get(timeout=120) == ("ok", 30)
        assert shared["labels"] == ["A", "1-29", "C", "3-29"]
    finally:
        commands.put(None)
        child.join(120)
    assert child.exitcode == 0


@pytest.mark.slow
def test_reading_plain_leaves_pays_nothing_until_a_leaf_is_shared():
    # The __getattr__ shared leaves need slows every attribute lookup on the two classes: it is installed by
    # the first shared leaf only (td["key"] on an ordinary non-tensor entry keeps its speed otherwise).
    code = (
        "import torch, tempfile\n"
        "from torchdict import TensorDict, NonTensorData, NonTensorStack\n"
        "td = TensorDict(a=torch.zeros(2), s='x', batch_size=[2]).memmap(tempfile.mkdtemp())\n"
        "assert td['s'] == 'x'\n"
        "assert '__getattr__' not in NonTensorData.__dict__ and '__getattr__' not in NonTensorStack.__dict__\n"
        "td = TensorDict(a=torch.zeros(2), s='x', batch_size=[2]).memmap(share_non_tensor=True)\n"
        "assert '__getattr__' in NonTensorData.__dict__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(os.path.dirname(__file__)), "src")})
