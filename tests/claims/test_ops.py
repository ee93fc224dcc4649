"""Operations: utilisation snapshots, metrics, reacting to inventory changes, and `manage.py serve`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from claims.models import FleetState, UtilisationSnapshot
from claims.services import utilisation
from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.services import sync
from scheduler.services import allocation
from tests.claims.fleet import cluster_body, gpu_claim
from tests.live import free_port

NS = "/api/v1/namespaces/ops"


def run_rounds():
    while allocation.allocate_round().taken:
        pass


@pytest.mark.django_db
def test_utilisation_snapshot_and_metrics(admin_client, small_fleet):
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("three", count=3), format="json")
    run_rounds()
    assert utilisation.record_snapshot() > 0
    row = UtilisationSnapshot.objects.get(cluster="c1", product="NVIDIA H100 80GB HBM3")
    assert (row.devices_total, row.devices_allocated) == (16, 3)
    listed = admin_client.get("/api/v1/utilisation?product=NVIDIA H100 80GB HBM3").json()
    assert listed["results"][0]["devices_allocated"] == 3
    metrics = admin_client.get("/metrics").content.decode()
    assert 'draservice_claims{phase="Allocated"} 1.0' in metrics
    assert 'draservice_device_allocations{cluster="c1"} 3.0' in metrics


@pytest.mark.django_db
def test_a_snapshot_walks_the_inventory_only_when_it_changed(admin_client, small_fleet, monkeypatch):
    walked = []
    utilisation._inventory["key"] = None  # what an earlier test of this process counted
    real = utilisation.product_name
    monkeypatch.setattr(utilisation, "product_name", lambda device: walked.append(1) or real(device))
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("one"), format="json")
    run_rounds()
    utilisation.record_snapshot()
    first = len(walked)
    assert first > 0
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("two"), format="json")
    run_rounds()
    utilisation.record_snapshot()
    assert len(walked) == first  # the same inventory: its counts kept, only the allocations read
    latest = UtilisationSnapshot.objects.filter(cluster="c1", product="NVIDIA H100 80GB HBM3").latest("taken_at")
    assert (latest.devices_total, latest.devices_allocated) == (16, 2)
    sync.push_inventory("c1", cluster_body("c1", [("h100", 3), ("a100-mig", 1)]))  # a third H100 node
    utilisation.record_snapshot()
    assert len(walked) > first
    latest = UtilisationSnapshot.objects.filter(cluster="c1", product="NVIDIA H100 80GB HBM3").latest("taken_at")
    assert (latest.devices_total, latest.devices_allocated) == (24, 2)


@pytest.mark.django_db
def test_inventory_change_makes_pending_claims_try_again(admin_client, small_fleet,
                                                         django_capture_on_commit_callbacks):
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("big", count=8), format="json")
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("big-2", count=8), format="json")
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("big-3", count=8), format="json")
    run_rounds()
    pending = admin_client.get(f"{NS}/resourceclaims/big-3").json()["status"]
    assert pending["reason"] == "Unsatisfiable"
    version = FleetState.objects.get().version
    # A third H100 node arrives: the inventory's signal (sent after its commit) bumps the fleet version and
    # asks for an allocation round, which (no broker here) runs inline.
    with django_capture_on_commit_callbacks(execute=True):
        sync.push_inventory("c1", cluster_body("c1", [("h100", 3), ("a100-mig", 1)]))
    assert FleetState.objects.get().version > version
    assert admin_client.get(f"{NS}/resourceclaims/big-3").json()["status"]["phase"] == "Allocated"


def _http(port, method, path, token, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, json.loads(resp.read())


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_serve_without_broker_allocates_in_process(small_fleet):
    """What `make run` starts: gunicorn plus the in-process worker, no Celery broker."""
    from tests.claims.workers import ROOT, test_database_url

    _, token = issue_token(kind=APIToken.ADMIN, name="serve test")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "CELERY_BROKER_URL"}
    env.update(DATABASE_URL=test_database_url(), DJANGO_SETTINGS_MODULE="draservice.settings",
               PYTHONPATH=str(ROOT))
    log = Path(f"/tmp/claims-serve-{port}.log")
    proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port), "--threads", "8"],
                            cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=1)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        started = time.monotonic()
        status, body = _http(port, "POST", f"{NS}/resourceclaims", token, gpu_claim("via-serve", count=2))
        assert status == 201 and body["status"]["phase"] == "Pending"  # the POST does not allocate inline
        status, body = _http(port, "GET", f"{NS}/resourceclaims/via-serve?wait=20s", token)
        assert body["status"]["phase"] == "Allocated", (body["status"], log.read_text()[-3000:])
        assert time.monotonic() - started < 10
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
