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


# ------------------------------------------------------------------------------------- API clients (all suites)

def client_for(secret: str | None):
    """An API client that sends ``Authorization: Bearer <secret>`` (none without a secret)."""
    from rest_framework.test import APIClient

    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def admin_client(db):
    from inventory.models import APIToken
    from inventory.services.tokens import issue_token

    _, secret = issue_token(kind=APIToken.ADMIN, name="test admin")
    return client_for(secret)


@pytest.fixture
def ns_client(db):
    """``ns_client("team-a", read_only=False)``: a client holding a namespace token for those namespaces."""
    from inventory.models import APIToken
    from inventory.services.tokens import issue_token

    def make(*namespaces: str, read_only: bool = False):
        _, secret = issue_token(kind=APIToken.NAMESPACE, namespaces=list(namespaces), read_only=read_only)
        return client_for(secret)
    return make


# ------------------------------------------------------------------------- real Celery workers (claims, gangs)

@pytest.fixture(scope="module")
def worker_pool(request, django_db_setup, django_db_blocker):
    """Real Celery worker processes (module-wide; ``WORKERS`` in the module, default 1) on the test database
    and TEST_BROKER_URL's Redis."""
    from tests.claims.workers import WorkerPool

    url = os.environ.get("TEST_BROKER_URL")
    if not url:
        pytest.fail("TEST_BROKER_URL is not set (make test sets it): the worker tests need a real Redis")
    pool = WorkerPool(url, race=getattr(request.module, "RACE", False))
    with django_db_blocker.unblock():
        pool.start(getattr(request.module, "WORKERS", 1))
    yield pool
    pool.stop()


@pytest.fixture
def live_broker(worker_pool, settings):
    """This process enqueues to the real broker (as the web server does) instead of running tasks eagerly."""
    from draservice.celery import app

    keys = ("broker_url", "task_always_eager", "task_default_queue")
    saved = {k: app.conf[k] for k in keys}
    settings.CELERY_BROKER_URL = worker_pool.broker_url
    app.conf.update(broker_url=worker_pool.broker_url, task_always_eager=False,
                    task_default_queue=worker_pool.queue)
    _reset_celery_connections(app)
    from tests.claims.workers import reset_dispatch_state, wait_until_idle

    reset_dispatch_state(worker_pool.broker_url)
    yield worker_pool
    app.conf.update(saved)
    _reset_celery_connections(app)
    wait_until_idle(worker_pool.broker_url, worker_pool.queue)


def _reset_celery_connections(app):
    # Celery caches its connection and producer pools (in kombu's global registry) on first use; a changed
    # broker URL needs new ones.
    from kombu import pools

    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
