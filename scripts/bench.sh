#!/usr/bin/env bash
# Set up the benchmark environment (adds upstream tensordict) and run the benchmarks side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh requirements/bench.txt
exec .venv/bin/python benchmarks/run.py "$@"
