"""docs/architecture.md names every module of the package, so the map of the code stays complete."""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_module_is_named_in_the_architecture_page():
    with open(os.path.join(ROOT, "docs", "architecture.md")) as handle:
        page = handle.read()
    package = os.path.join(ROOT, "src", "torchdict")
    modules = [name for name in os.listdir(package) if name.endswith(".py") and name != "__init__.py"]
    missing = [name for name in sorted(modules) if f"`{name}`" not in page]
    assert not missing, f"docs/architecture.md does not name {missing}"
