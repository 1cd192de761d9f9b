"""An RL-style data pipeline written against upstream tensordict's API, run unchanged on torchdict.

This is the program a tensordict user already has: the process-wide toggles set at start-up, a
preallocated replay storage written one step at a time, episodes of different lengths kept in a lazy
stack, tensorclass records, a memory-mapped copy on disk, and a ``map`` preprocessing pass. The only line
that names the library is the import at the bottom; ``tests/test_from_tensordict_example.py`` runs
:func:`pipeline` with both libraries and compares every output.

Run it with ``python examples/from_tensordict.py`` (torchdict) or ``python examples/from_tensordict.py
tensordict`` (upstream, when installed).
"""
from __future__ import annotations

import importlib
import sys
import tempfile
from types import ModuleType
from typing import Any, Dict

import torch

OBS, ACTIONS, ENVS, STEPS = 4, 2, 3, 6
EPISODE_LENGTHS = (5, 3, 7)


def normalise_observation(step: Any) -> Any:
    """The ``map`` preprocessing: a module-level function, so worker processes can import it."""
    step.set("obs_norm", (step.get("obs") - 0.5) * 2)
    return step


def _rollout(lib: ModuleType, steps: int, seed: int) -> Any:
    """One environment's trajectory: observations, actions, rewards and a nested "next" entry."""
    generator = torch.Generator().manual_seed(seed)
    obs = torch.rand(steps + 1, OBS, generator=generator)
    return lib.TensorDict(
        {
            "obs": obs[:-1],
            "action": torch.randint(ACTIONS, (steps,), generator=generator),
            "next": {"obs": obs[1:], "reward": torch.rand(steps, 1, generator=generator),
                     "done": torch.arange(steps).eq(steps - 1).unsqueeze(-1)},
        },
        batch_size=[steps],
    )


def pipeline(lib: ModuleType, workers: int = 2) -> Dict[str, Any]:
    """Run the whole pipeline with ``lib`` (tensordict or torchdict); returns what a test compares."""
    lib.set_list_to_stack(True).set()
    lib.set_lazy_legacy(False).set()
    TensorDict, tensorclass = lib.TensorDict, lib.tensorclass
    out: Dict[str, Any] = {}

    # 1. Preallocated storage, written step by step as a collector would.
    first = _rollout(lib, ENVS, seed=0)[0]
    storage = first.expand(STEPS, ENVS).clone().zero_()
    for t in range(STEPS):
        storage[t] = _rollout(lib, ENVS, seed=t + 1)
    out["storage"] = storage.to_dict()
    out["storage_batch"] = list(storage.batch_size)
    out["mean_reward"] = storage["next", "reward"].mean().item()
    out["done_steps"] = storage.get(("next", "done")).sum().item()

    # 2. Episodes of different lengths: a lazy stack, read member by member and padded.
    episodes = [_rollout(lib, length, seed=100 + i) for i, length in enumerate(EPISODE_LENGTHS)]
    lazy = lib.LazyStackedTensorDict.lazy_stack(episodes, dim=0)
    out["lazy_batch"] = list(lazy.batch_size)
    out["lazy_member_1"] = lazy[1].to_dict()
    out["returns"] = torch.stack([episode["next", "reward"].sum() for episode in lazy.unbind(0)])
    padded = lib.pad_sequence(episodes, return_mask=True)
    out["padded_obs"] = padded["obs"]
    out["padded_mask"] = padded["masks", "obs"]
    out["lazy_scaled_action"] = (lazy.apply(lambda x: x * 2)[2]["action"])

    # 3. Tensorclass records built from the storage and sliced like tensors.
    @tensorclass
    class Transition:
        obs: torch.Tensor
        action: torch.Tensor
        reward: torch.Tensor

    flat = storage.reshape(-1)
    records = Transition(obs=flat["obs"], action=flat["action"], reward=flat["next", "reward"],
                         batch_size=flat.batch_size)
    best = records[records.reward.squeeze(-1) > 0.5]
    out["best_count"] = best.batch_size[0]
    out["best_actions"] = best.action
    out["records_stacked"] = torch.stack([records[0], records[-1]]).obs

    # 4. A memory-mapped copy on disk, loaded back.
    with tempfile.TemporaryDirectory() as folder:
        saved = storage.memmap(folder)
        loaded = TensorDict.load_memmap(folder)
        out["memmap_same"] = bool((loaded == storage).all())
        out["memmap_locked"] = saved.is_locked
        del saved, loaded

    # 5. Preprocessing with map: rows processed in worker processes, order kept.
    processed = flat.map(normalise_observation, dim=0, num_workers=workers, chunksize=4)
    out["obs_norm"] = processed["obs_norm"]
    return out


def _library(name: str) -> ModuleType:
    return importlib.import_module(name)


if __name__ == "__main__":
    library = _library(sys.argv[1] if len(sys.argv) > 1 else "torchdict")
    results = pipeline(library)
    for name in ("storage_batch", "mean_reward", "done_steps", "lazy_batch", "best_count", "memmap_same"):
        value = results[name]
        print(f"{name}: {round(value, 4) if isinstance(value, float) else value}")
