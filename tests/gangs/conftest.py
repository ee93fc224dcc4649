"""Fixtures for the gang tests: tokens and clients, the multi-rack fleet in the database, real workers."""
from __future__ import annotations

import os

import pytest
from rest_framework.test import APIClient

from tests.gangs import fleet

NS = "team"


def client_for(secret: str | None) -> APIClient:
    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def admin_client(db):
    from inventory.models import APIToken
    from inventory.services.tokens import issue_token

    _, secret = issue_token(kind=APIToken.ADMIN, name="gangs test admin")
    return client_for(secret)


@pytest.fixture
def ns_client(db):
    from inventory.models import APIToken
    from inventory.services.tokens import issue_token

    def make(*namespaces: str, read_only: bool = False) -> APIClient:
        _, secret = issue_token(kind=APIToken.NAMESPACE, namespaces=list(namespaces), read_only=read_only)
        return client_for(secret)
    return make


@pytest.fixture
def rack_fleet(db):
    """Cluster c1: zone-a/rack-a1 (blocks 1 and 2, two 8xH100 nodes each), zone-a/rack-a2 (block-3, two
    nodes), zone-b/rack-b1 (block-4, three nodes); templates h100x8 (8 GPUs) and gpu1 (1 GPU) in "team"."""
    from claims.services import claims as claim_services

    fleet.load()
    claim_services.create_template(NS, fleet.template_body("h100x8", 8))
    claim_services.create_template(NS, fleet.template_body("gpu1", 1))


@pytest.fixture(scope="module")
def workers(request, django_db_setup, django_db_blocker):
    """Real Celery worker processes (``WORKERS`` in the module, default 1; ``RACE`` to drop the turn lock)."""
    from tests.gangs.workers import Workers

    url = os.environ.get("TEST_BROKER_URL")
    if not url:
        pytest.fail("TEST_BROKER_URL is not set (make test sets it): the worker tests need a real Redis")
    pool = Workers(url, race=getattr(request.module, "RACE", False))
    with django_db_blocker.unblock():
        pool.start(getattr(request.module, "WORKERS", 1))
    yield pool
    pool.stop()


@pytest.fixture
def live_broker(workers, settings):
    """This process enqueues to the real broker (as the web server does) instead of running tasks inline."""
    from kombu import pools

    from draservice.celery import app

    keys = ("broker_url", "task_always_eager", "task_default_queue")
    saved = {k: app.conf[k] for k in keys}
    settings.CELERY_BROKER_URL = workers.broker_url
    app.conf.update(broker_url=workers.broker_url, task_always_eager=False, task_default_queue=workers.queue)
    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    from tests.claims.workers import reset_dispatch_state

    reset_dispatch_state(workers.broker_url)
    yield workers
    app.conf.update(saved)
    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    from tests.claims.workers import wait_until_idle

    wait_until_idle(workers.broker_url, workers.queue)
