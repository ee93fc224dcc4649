"""benchmarks/queue_scenarios.py, reduced (each scenario once, small), against a live service on the test
database: ``manage.py serve``, two Celery worker processes and beat on TEST_BROKER_URL's Redis (flushed: it is
this xdist worker's own), everything through the HTTP API. Every figure must be met.

Every scenario's guarantee is built, so every one runs here; the full sizes are ``benchmarks/queue_scenarios.py``
without ``--small``."""
from __future__ import annotations

import os

import pytest

from benchmarks._live import Stack
from benchmarks._queue_world import World
from benchmarks.queue_scenarios import run_scenarios
from draservice.models import APIToken
from draservice.tokens import issue_token
from tests.claims import workers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MET = {"reclaim", "reclaim-mig", "reclaim-gang", "tree-lending0", "tree-reclaim", "gang-head", "fair", "simulate",
       "flood"}


@pytest.fixture
def world():
    broker = os.environ.get("TEST_BROKER_URL")
    if not broker:
        pytest.fail("TEST_BROKER_URL is not set (make test sets it): the scenarios need a real Redis")
    _, token = issue_token(kind=APIToken.ADMIN, name="queue scenarios")
    stack = Stack(broker, web_workers=1, web_threads=8, concurrency=2, beat=True,
                  prefix=f"test-queue-scenarios-{os.getpid()}-",
                  env={"DATABASE_URL": workers.test_database_url(), "CELERY_BROKER_URL": broker, "LOG_LEVEL": "WARNING",
                       "DJANGO_SETTINGS_MODULE": "draservice.settings"})
    stack.start()
    try:
        yield World(stack.port, token, small=True)
    finally:
        stack.stop()


def test_reduced_queue_scenarios_are_met(world):
    figures = run_scenarios(world, MET)
    assert {f.scenario.split("-")[0] for f in figures} >= {"reclaim", "tree", "gang", "fair", "simulate", "flood"}
    assert len(figures) >= 31, [f.line() for f in figures]
    missed = [f.line() for f in figures if not f.met]
    assert not missed, "\n".join(missed)

