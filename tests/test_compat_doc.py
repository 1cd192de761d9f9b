"""docs/compat.md's table of upstream names says, for each, whether torchdict has it: keep it true."""
from __future__ import annotations

import importlib
import os
import re

import pytest

import torchdict

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "compat.md")


def _rows() -> list:
    with open(DOC) as handle:
        text = handle.read()
    table = text.split("<!-- compat-table-start -->")[1].split("<!-- compat-table-end -->")[0]
    return re.findall(r"^\| `([^`]+)` \| (\w+) \| (yes|not yet) \|$", table, re.M)


def _has(name: str, kind: str) -> bool:
    if kind == "module":
        try:
            importlib.import_module(f"torchdict.{name}")
        except ImportError:
            return False
        return True
    return hasattr(torchdict, name)


def test_the_table_lists_upstream_names():
    assert len(_rows()) > 90


@pytest.mark.parametrize("name, kind, status", _rows())
def test_each_row_matches_the_package(name, kind, status):
    assert _has(name, kind) == (status == "yes"), f"docs/compat.md: `{name}` is marked {status!r}"
