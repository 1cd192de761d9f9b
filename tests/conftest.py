import os
import sys

# Let the tests run from a plain checkout as well as from an installed package.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Shared 2-core machines are slow and noisy: no per-example deadline, no "too slow" health check.
# CI (CI=true) replays the same examples every run, so a red run is never a fluke of the draw.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(scope="session")
def redis_server():
    """One redis-server for the session's store tests (tests/_redis_server.py; skipped when none can start,
    an error under TORCHDICT_REQUIRE_REDIS=1). The fault tests start servers of their own, which they kill."""
    from _redis_server import start_or_skip

    server = start_or_skip()
    yield server
    server.stop()
