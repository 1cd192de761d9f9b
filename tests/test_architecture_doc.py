"""docs/architecture.md names every module of the package, so the map of the code stays complete."""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_module_is_named_in_the_architecture_page():
    with open(os.path.join(ROOT, "docs", "architecture.md")) as handle:
        page = handle.read()
    package = os.path.join(ROOT, "src", "torchdict")
    missing = []
    for folder, _, files in os.walk(package):
        if "__pycache__" in folder:
            continue
        relative = os.path.relpath(folder, package)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            if relative == ".":
                named = name == "__init__.py" or f"`{name}`" in page
            else:  # a subpackage's module: named by its path, or by its name under its package's heading
                path = f"{relative}/{name}".replace(os.sep, "/")
                named = f"`{path}`" in page or (f"`{relative}/`" in page and (
                    name == "__init__.py" or f"`{name}`" in page))
            if not named:
                missing.append(name if relative == "." else f"{relative}/{name}")
    assert not missing, f"docs/architecture.md does not name {missing}"
