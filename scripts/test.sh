#!/usr/bin/env bash
# Set up the environment and run the whole test suite (slow and multi-process tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh requirements/test.txt
exec .venv/bin/python -m pytest -q "$@"
