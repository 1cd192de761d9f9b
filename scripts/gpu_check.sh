#!/usr/bin/env bash
# Device checks for a machine with a CUDA device: the device tests on CUDA, then the
# host-to-device benchmark (benchmarks/h2d_transfer.py). Without a CUDA device it says so and
# exits 0: those tests' CPU parts run in the ordinary test suite.
#
#   bash scripts/gpu_check.sh              # uses .venv/bin/python (made first if .venv is absent)
#   PYTHON=python3 bash scripts/gpu_check.sh   # any interpreter that has torch (torchdict: from src/)
#
# Takes under 4 minutes on an H200 (the tests about 1, the benchmark well under 1).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PYTHON:-}" ]; then
  if [ ! -x .venv/bin/python ]; then
    bash scripts/setup_venv.sh requirements/test.txt
  fi
  PYTHON=.venv/bin/python
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device: skipping the device tests and the host-to-device benchmark."
  exit 0
fi
"$PYTHON" -c "import torch; print('CUDA device:', torch.cuda.get_device_name(), '| torch', torch.__version__)"

echo "--- device tests on CUDA (tests parametrized on device, -k cuda)"
"$PYTHON" -m pytest -q -p no:cacheprovider tests/test_devices.py -k "cuda"

echo "--- host-to-device transfer of a 100-leaf TensorDict"
"$PYTHON" benchmarks/h2d_transfer.py
