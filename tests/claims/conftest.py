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
