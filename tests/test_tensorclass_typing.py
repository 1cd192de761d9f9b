"""Static typing of tensorclasses: mypy sees the fields and the ``__init__`` signature.

``tensorclass`` and ``TensorClass`` carry ``typing.dataclass_transform``, so a type
checker synthesises the constructor from the annotations (plus the keyword-only
``batch_size``/``device``/``names`` of ``TensorClass``). Torch itself is not analysed
(``follow_imports = skip``: a tensor is ``Any`` to mypy here), which keeps a cold run
at a few seconds.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mypy")

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

HEADER = '''
import torch
from torchdict import TensorClass, tensorclass


class Obs(TensorClass):
    pixels: torch.Tensor
    step: int = 0


@tensorclass
class Pair:
    left: torch.Tensor
    right: torch.Tensor
'''

GOOD = HEADER + '''
obs = Obs(torch.zeros(2, 3), batch_size=[2])
obs2 = Obs(pixels=torch.zeros(2), step=3, device="cpu", names=None)
pixels: torch.Tensor = obs.pixels
step: int = obs.step
part: Obs = obs[0]
reshaped: Obs = obs.reshape(2, 1)
pieces: tuple[Obs, ...] = obs.unbind(0)
pair = Pair(torch.zeros(1), right=torch.ones(1))
left: torch.Tensor = pair.left
'''

# Each line must be reported, with the error code in the comment.
BAD = HEADER + '''
Obs(step=1)  # call-arg: "pixels" missing
Obs(torch.zeros(1), step="three")  # arg-type
Obs(torch.zeros(1), nope=1)  # call-arg: unknown field
Pair(torch.zeros(1))  # call-arg: "right" missing
text: str = Obs(torch.zeros(1)).step  # assignment: the field is an int
'''


pytestmark = pytest.mark.slow  # one cold mypy run over torchdict: ~5 s idle, ~20 s on a busy machine


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory) -> dict:
    """Run mypy once over both examples; ``{file name: {line: message}}`` of the errors."""
    folder = tmp_path_factory.mktemp("typing")
    (folder / "good.py").write_text(textwrap.dedent(GOOD))
    (folder / "bad.py").write_text(textwrap.dedent(BAD))
    (folder / "mypy.ini").write_text(textwrap.dedent(f"""\
        [mypy]
        mypy_path = {SRC}
        follow_imports = silent
        [mypy-torch.*]
        follow_imports = skip
        follow_untyped_imports = True
        """))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(folder / "mypy.ini"), "--cache-dir",
         str(folder / "cache"), "--no-error-summary", "--hide-error-context", "good.py", "bad.py"],
        capture_output=True, text=True, cwd=str(folder), timeout=300,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2 would be a crash or a bad config
    errors: dict = {"good.py": {}, "bad.py": {}}
    for line in result.stdout.splitlines():
        if ": error: " in line:
            file_name, line_number = line.split(":")[:2]
            errors.setdefault(file_name, {})[int(line_number)] = line
    return errors


def test_well_typed_tensorclass_code_passes_mypy(mypy_errors):
    assert mypy_errors["good.py"] == {}
    assert set(mypy_errors) == {"good.py", "bad.py"}, mypy_errors  # no error from torchdict itself


def test_mypy_reports_missing_unknown_and_mistyped_fields(mypy_errors):
    reported = mypy_errors["bad.py"]
    lines = textwrap.dedent(BAD).splitlines()
    expected = {number: text.split("# ")[1].split(":")[0] for number, text in enumerate(lines, start=1)
                if "  # " in text}
    assert set(reported) == set(expected), reported
    for number, code in expected.items():
        assert f"[{code}]" in reported[number], reported[number]
    assert '"pixels"' in reported[min(expected)]
