#!/usr/bin/env bash
# Set up the environment and run the whole test suite (slow and multi-process tests included),
# then the fast tests again on the pure-Python twins of the C helpers (see src/torchdict/_accel.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh requirements/test.txt
bash scripts/ensure_redis.sh
.venv/bin/python -m pytest -q "$@"
echo "--- again without the C helpers (TORCHDICT_PURE_PYTHON=1), slow tests left out"
TORCHDICT_PURE_PYTHON=1 .venv/bin/python -m pytest -q -m "not slow" -p no:cacheprovider "$@"
