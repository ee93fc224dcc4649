"""Fixtures for the inventory tests: tokens, API clients, the shared real-slices fixture."""
import json
import os

import pytest

from inventory.services.clusters import create_cluster
from tests.conftest import client_for


@pytest.fixture(autouse=True)
def _inventory_urls(settings):
    # The real URLconf by default. INVENTORY_TESTS_LOCAL_URLCONF=1 mounts only the inventory API (same
    # paths), to test it while other apps' views are mid-change.
    if os.environ.get("INVENTORY_TESTS_LOCAL_URLCONF") == "1":
        settings.ROOT_URLCONF = "tests.inventory.urls"


@pytest.fixture
def cluster_factory(db):
    def make(name="c1", labels=None):
        cluster, secret = create_cluster(name=name, labels=labels or {})
        return cluster, client_for(secret)
    return make


@pytest.fixture(scope="session")
def real_slices(shared_dir):
    with open(os.path.join(shared_dir, "fixtures", "real-slices.json")) as fh:
        return json.load(fh)


@pytest.fixture(scope="session")
def real_cel(shared_dir):
    with open(os.path.join(shared_dir, "fixtures", "real-cel.json")) as fh:
        return json.load(fh)
