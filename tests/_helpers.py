"""Shared test utilities."""
from __future__ import annotations

import os
from typing import Any

import torch

from torchdict import NonTensorData, NonTensorStack, TensorDict


def snapshot(td: TensorDict) -> Any:
    """Everything observable about a TensorDict, to check that a failed op changed nothing."""
    entries = []
    for key, value in td.items(include_nested=True):
        if isinstance(value, torch.Tensor):
            entries.append((key, id(value), value.detach().clone()))
        elif isinstance(value, (NonTensorData, NonTensorStack)):
            entries.append((key, id(value), value.tolist()))
        else:
            entries.append((key, id(value), value.batch_size, value.is_locked))
    return td.batch_size, td.device, td.is_locked, entries


def assert_same_snapshot(before: Any, after: Any) -> None:
    assert before[:3] == after[:3]
    assert len(before[3]) == len(after[3])
    for old, new in zip(before[3], after[3]):
        assert old[:2] == new[:2]
        if isinstance(old[2], torch.Tensor):
            assert torch.equal(old[2], new[2])
        else:
            assert old[2:] == new[2:]


def to_plain(td: TensorDict) -> dict:
    """A nested plain dict with the same leaves (non-tensor data as raw values)."""
    return td.to_dict()


def running_children(pid):
    """Pids of live (not zombie) processes whose parent is ``pid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry))
    return found


def is_running(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
