"""Fixtures for the queue tests: a real fleet pushed through the inventory services, queue bodies."""
from __future__ import annotations

import pytest

from tests.claims import fleet as fleet_helpers


@pytest.fixture
def h100_fleet(db):
    """One cluster c1 (labels region=eu): two nodes of 8 H100 = 16 GPUs."""
    return fleet_helpers.load_fleet({"c1": [("h100", 2)]}, labels={"c1": {"region": "eu"}})


def queue_body(name: str, *, namespaces=(), parent=None, gpus=None, borrowing=None, lending=None, **spec) -> dict:
    quotas = spec.pop("quotas", None)
    if quotas is None and gpus is not None:
        devices = {"nominal": gpus}
        if borrowing is not None:
            devices["borrowingLimit"] = borrowing
        if lending is not None:
            devices["lendingLimit"] = lending
        quotas = [{"deviceClassName": "gpu.nvidia.com", "devices": devices}]
    body = {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"namespaces": list(namespaces), **({"parent": parent} if parent else {}),
                     **({"quotas": quotas} if quotas is not None else {}), **spec}}
    return body
