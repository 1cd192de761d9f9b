"""Build hook for the optional C helpers (everything else is in pyproject.toml).

``optional=True``: a machine without a C compiler still installs torchdict, which then
runs the pure-Python twins of these helpers (see src/torchdict/_accel.py).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "torchdict._speedups",
    sources=[f"src/torchdict/_csrc/{name}.c" for name in ("module", "tree", "tensorclass")],
    depends=["src/torchdict/_csrc/speedups.h"],
    optional=True,
)])
