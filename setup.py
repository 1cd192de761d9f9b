"""Build hook for the optional C helpers (everything else is in pyproject.toml).

``optional=True``: a machine without a C compiler still installs torchdict, which then
runs its pure-Python twins of these helpers (see src/torchdict/_accel.py).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("torchdict._speedups", ["src/torchdict/_speedups.c"], optional=True)])
