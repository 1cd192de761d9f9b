"""The main job: examples/tour.py runs the guide's examples end to end and prints what the guide shows."""
import os
import subprocess
import sys

import pytest

from test_printing import SEED_FLAT as SEED_FLAT_REPR  # the guide's first printed TensorDict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_tour_runs_and_prints_the_guide_outputs():
    env = dict(os.environ, TORCHDICT_TOUR_DATASET_SIZE="1000", PYTHONPATH=os.path.join(ROOT, "src"))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "tour.py")], capture_output=True,
                            text=True, timeout=240, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert SEED_FLAT_REPR in out
    assert "RuntimeError: Cannot modify locked TensorDict." in out
    assert "torch.Size([12])\ntorch.Size([12])\ntorch.Size([3, 4, 1])" in out
    assert "weight: Parameter(shape=torch.Size([4, 3]), device=cpu, dtype=torch.float32, is_shared=False)" in out
    assert "y[0] == 0, y[1] == 4: True" in out
    assert "worker 0 received a = 41.0" in out
    assert "torch.Size([100, 6117])" in out or "torch.Size([100," in out
    assert "td[0]: torch.Size([2]) | stacked: torch.Size([3, 2, 2])" in out
    assert "members after clamp_: [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]" in out
    assert "episodes: torch.Size([3, -1]) | returns: [5.0, 3.0, 7.0] | first steps: torch.Size([3])" in out
    assert "update refused; obs untouched: True" in out
    assert "TimeoutError: map: chunk 0 ran longer than timeout=0.5 s" in out
    assert "ckpt holds step 2" in out and "RuntimeError: Refusing to follow the symlink" in out
    assert "critic loss went down: True\ntrue reward went up: True" in out
    assert "greedy action is the mean: True" in out and "log_prob recomputed: True" in out
    assert "TensorDict [[8.0, 9.0], [2.0, 3.0]] [4, 1]" in out and "read-only file: ReadOnlyStorageError" in out
    assert "safetensors: torch.Size([3]) [0, 1, 2]" in out and "parquet row 1: bob 0.0" in out
    assert ("Step.from_pandas: Step torch.Size([3]) [1.0, 0.0, 2.0] | who: None\n"
            "Step.from_parquet row 1: bob 1\n"
            "Step.from_csv refuses a column that is not a field: True\n"
            "Step.from_struct_array: [7, 8]\n"
            "lazy.get('s'): Step (2, 3) [[0, 1, 2], [10, 11, 12]] | to_tensordict: TensorDict") in out
    assert "refused: the entry 'obs.memmap' does not match its CRC-32 checksum" in out
    assert "appended: [0.0, 2.0, 4.0, -1.0]" in out
    assert ("every row written once: True" in out) or ("the store section is skipped" in out)
    assert "compiled step: torch.Size([2, 3])" in out and "equals eager: True" in out
    assert "moved: meta True meta" in out and "to where the leaves are, no copy: True" in out
    assert "compiled td -= t in place: True | td ** t: torch.Size([4])" in out
    assert "channels_last: True | to(other=...): torch.float16" in out
    assert "consolidated recv: a = 41.0  b.c = 1.0" in out
    assert "TensorDict(batch_size=[3], fields={done: bool[], obs: f32[2]})" in out
    assert "[0, 1] [[1], [0, 2]]" in out
    assert "read here: run\nin the folder: run" in out and "lazy pack: (2, 2) ('x',)" in out
    assert ("table: (2, 3) () True\nstacked: (2, 4) MetaData True\nafter clone: NonTensorStack\n"
            "applied: UnbatchedTensor [1.0, 2.0, 3.0]\nMetaData[str]: Expected data of type str, got int") in out
    assert ("True ['z', 'b', 'c']\n[[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]\nunpadded: [(1, 2), (3, 2)]\n"
            "True [0.0, 1.0, 2.0]") in out
    assert out.rstrip().endswith("The tour ran to the end.")
