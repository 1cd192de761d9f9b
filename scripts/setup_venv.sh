#!/usr/bin/env bash
# Create .venv (if missing) and install the pinned requirements file given as $1, plus torchdict itself.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements="${1:-requirements/test.txt}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$requirements" 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e . 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
