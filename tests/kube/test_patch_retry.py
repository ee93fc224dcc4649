"""A patch that names no resourceVersion applies to the object as it is when written: a concurrent write between
the door's read and its write (a worker deciding the claim) is retried on the fresh object, as kube-apiserver's
GuaranteedUpdate does; one that names a version gets its 409."""
from __future__ import annotations

import json

import pytest

from claims.models import ResourceClaim
from kube import stores
from tests.claims import fleet
from tests.kube.test_door import CLAIMS, claim, post

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(admin_client):
    fleet.load_fleet({"c1": [("h100", 1)]})
    fleet.load_device_classes()
    return admin_client


@pytest.fixture
def concurrent_writes(monkeypatch):
    """The first ``n`` reads of a claim by the door are each followed by another writer's change to it."""
    left = {"n": 0}
    read = stores.ClaimStore.get

    def get(self, namespace, name):
        obj = read(self, namespace, name)
        if left["n"] > 0:
            left["n"] -= 1
            ResourceClaim.objects.filter(pk=obj.pk).update(resource_version=obj.resource_version + 1)
        return obj
    monkeypatch.setattr(stores.ClaimStore, "get", get)
    return left


def test_a_patch_without_a_version_is_retried_over_a_concurrent_write(admin, concurrent_writes):
    assert post(admin, claim("p")).status_code == 201
    concurrent_writes["n"] = 2
    resp = admin.patch(f"{CLAIMS}/p", json.dumps({"metadata": {"labels": {"a": "1"}}}),
                       content_type="application/merge-patch+json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["metadata"]["labels"] == {"a": "1"} and concurrent_writes["n"] == 0


def test_a_patch_naming_a_version_gets_its_conflict(admin, concurrent_writes):
    created = post(admin, claim("p")).json()
    concurrent_writes["n"] = 1
    body = {"metadata": {"labels": {"a": "1"}, "resourceVersion": created["metadata"]["resourceVersion"]}}
    resp = admin.patch(f"{CLAIMS}/p", json.dumps(body), content_type="application/merge-patch+json")
    assert resp.status_code == 409 and resp.json()["reason"] == "Conflict"


def test_retries_are_bounded(admin, concurrent_writes):
    assert post(admin, claim("p")).status_code == 201
    concurrent_writes["n"] = 100
    resp = admin.patch(f"{CLAIMS}/p", json.dumps({"metadata": {"labels": {"a": "1"}}}),
                       content_type="application/merge-patch+json")
    assert resp.status_code == 409 and concurrent_writes["n"] == 95  # 5 attempts, then the Conflict
