"""Fixtures for the gang tests: the multi-rack fleet in the database, and the real workers under their local name.

API clients (``admin_client``, ``ns_client``) and the workers themselves come from tests/conftest.py."""
from __future__ import annotations

import pytest

from tests.gangs import fleet

NS = "team"


@pytest.fixture
def rack_fleet(db):
    """Cluster c1: zone-a/rack-a1 (blocks 1 and 2, two 8xH100 nodes each), zone-a/rack-a2 (block-3, two
    nodes), zone-b/rack-b1 (block-4, three nodes); templates h100x8 (8 GPUs) and gpu1 (1 GPU) in "team"."""
    from claims.services import templates as template_services

    fleet.load()
    template_services.create_template(NS, fleet.template_body("h100x8", 8))
    template_services.create_template(NS, fleet.template_body("gpu1", 1))


@pytest.fixture(scope="module")
def workers(worker_pool):
    """The suite-wide real Celery workers (tests/conftest.py; ``WORKERS`` and ``RACE`` in the module)."""
    return worker_pool
