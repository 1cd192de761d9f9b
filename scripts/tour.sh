#!/usr/bin/env bash
# Set up the environment and run the main job: the tour of torchdict (the seed's examples).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh requirements/tour.txt
bash scripts/ensure_redis.sh  # the store section starts a redis-server of its own
exec .venv/bin/python examples/tour.py "$@"
