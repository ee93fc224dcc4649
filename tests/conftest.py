"""Suite-wide fixtures. The tests use the machine's real PostgreSQL (DATABASE_URL, set by `make test`)."""
import os

import pytest
from django.conf import settings

SHARED_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared"))


def pytest_configure(config):
    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine and not os.environ.get("ALLOW_NON_POSTGRES_TESTS"):
        raise pytest.UsageError(
            f"The tests run against PostgreSQL (DATABASE_URL); got {engine}. Use `make test`."
        )
    # One test database per pytest process: several suites running at once on one machine (developers,
    # helpers, CI) must not drop each other's database mid-run.
    default = settings.DATABASES["default"]
    name = os.environ.get("TEST_DATABASE_NAME") or f"test_{default['NAME']}_{os.getpid()}"
    default.setdefault("TEST", {})["NAME"] = name


@pytest.fixture(scope="session")
def shared_dir():
    if not os.path.isdir(SHARED_DIR):
        pytest.fail(f"shared material not found at {SHARED_DIR}")
    return SHARED_DIR
