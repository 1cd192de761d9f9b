"""Print the table of upstream tensordict's top-level names and whether torchdict has each (docs/compat.md).

Run: ``.venv/bin/python scripts/compat_table.py`` and paste the output between the table markers; the test
``tests/test_compat_doc.py`` fails while the table and the package disagree.
"""
from __future__ import annotations

import importlib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CENSUS = os.path.join(os.path.dirname(ROOT), "shared", "spec", "API_CENSUS.md")


def upstream_top_level(census_text: str) -> list:
    """``(name, kind)`` for each top-level name of upstream tensordict, as the census lists them."""
    section = census_text.split("## Top-level names of `tensordict`")[1].split("\n## ")[0]
    return re.findall(r"^- `([^`]+)` (\(module\)|class|function|constant)", section, re.M)


def has_name(name: str, kind: str) -> bool:
    if kind == "(module)":
        try:
            importlib.import_module(f"torchdict.{name}")
        except ImportError:
            return False
        return True
    return hasattr(importlib.import_module("torchdict"), name)


def main() -> None:
    sys.path.insert(0, os.path.join(ROOT, "src"))
    with open(CENSUS) as handle:
        names = upstream_top_level(handle.read())
    print("| upstream name | kind | torchdict |")
    print("|---|---|---|")
    for name, kind in names:
        print(f"| `{name}` | {kind.strip('()')} | {'yes' if has_name(name, kind) else 'not yet'} |")


if __name__ == "__main__":
    main()
