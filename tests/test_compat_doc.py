"""docs/compat.md's table of upstream names says, for each, whether torchdict has it: keep it true."""
from __future__ import annotations

import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "compat.md")
# The script that writes the table also answers "does torchdict have this name" for the test.
_spec = importlib.util.spec_from_file_location("compat_table", os.path.join(ROOT, "scripts", "compat_table.py"))
compat_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compat_table)


def _rows() -> list:
    with open(DOC) as handle:
        text = handle.read()
    table = text.split("<!-- compat-table-start -->")[1].split("<!-- compat-table-end -->")[0]
    return re.findall(r"^\| `([^`]+)` \| (\w+) \| (yes|not yet) \|$", table, re.M)


def test_the_table_lists_upstream_names():
    assert len(_rows()) > 90


@pytest.mark.parametrize("name, kind, status", _rows())
def test_each_row_matches_the_package(name, kind, status):
    assert compat_table.has_name(name, kind if kind != "module" else "(module)") == (status == "yes"), f"docs/compat.md: `{name}` is marked {status!r}"
