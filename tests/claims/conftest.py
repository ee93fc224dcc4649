"""Fixtures for the claims tests: tokens and clients, a small real fleet, claim bodies."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from inventory.models import APIToken
from inventory.services.tokens import issue_token
from tests.claims import fleet as fleet_helpers


def client_for(secret: str | None) -> APIClient:
    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def admin_client(db):
    _, secret = issue_token(kind=APIToken.ADMIN, name="claims test admin")
    return client_for(secret)


@pytest.fixture
def ns_client(db):
    def make(*namespaces: str, read_only: bool = False) -> APIClient:
        _, secret = issue_token(kind=APIToken.NAMESPACE, namespaces=list(namespaces), read_only=read_only)
        return client_for(secret)
    return make


@pytest.fixture
def small_fleet(db):
    """One cluster: two 8xH100 nodes and one 8xA100 node with MIG partitions (the shared fixtures' shapes)."""
    return fleet_helpers.load_fleet({"c1": [("h100", 2), ("a100-mig", 1)]})


@pytest.fixture
def two_clusters(db):
    """c-h100 (two H100 nodes, labels env=gpu) and c-mig (one A100 MIG node, labels env=mig)."""
    return fleet_helpers.load_fleet({"c-h100": [("h100", 2)], "c-mig": [("a100-mig", 1)]},
                                    labels={"c-h100": {"env": "gpu"}, "c-mig": {"env": "mig"}})


@pytest.fixture
def classes(db):
    fleet_helpers.load_device_classes()


# --------------------------------------------------------------------------------------------- real workers

@pytest.fixture(scope="module")
def worker_pool(request, django_db_setup, django_db_blocker):
    """Real Celery worker processes (module-wide; ``WORKERS`` in the module, default 1) on the test database
    and TEST_BROKER_URL's Redis."""
    import os

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
    from tests.claims.workers import reset_dispatch_state

    reset_dispatch_state(worker_pool.broker_url)
    yield worker_pool
    app.conf.update(saved)
    _reset_celery_connections(app)
    from tests.claims.workers import wait_until_idle

    wait_until_idle(worker_pool.broker_url, worker_pool.queue)



def _reset_celery_connections(app):
    # Celery caches its connection and producer pools (in kombu's global registry) on first use; a changed
    # broker URL needs new ones.
    from kombu import pools

    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
