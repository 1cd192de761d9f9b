#!/usr/bin/env bash
# Make sure a redis-server binary exists for the store tests (tests/_redis_server.py starts and stops one
# per test session on a unix socket): Debian's package, installed when missing and we may install it.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "redis-server not found and can't be installed here: the store tests will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q redis-server >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1; } \
  || echo "installing redis-server failed: the store tests will be skipped" >&2
# The package's service would keep a server on the default port; the tests start their own.
(command -v service >/dev/null 2>&1 && service redis-server stop >/dev/null 2>&1) || true
