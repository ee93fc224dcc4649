#!/usr/bin/env python
"""Inventory benchmark: push a synthetic 5,000-node x 8-GPU cluster, re-push it, and list it.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice .venv/bin/python benchmarks/inventory_bench.py
    [--nodes 5000] [--keep]

Runs against a throw-away database (``<name>_bench``) created and migrated here, through the real HTTP
stack (Django test client: URL routing, authentication, JSON parsing, the sync service, serializers), so
the figures include everything but the network. Goal: a full push under 10 s.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database afterwards")
    args = parser.parse_args()

    import django
    from django.conf import settings

    django.setup()
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        sys.exit("The benchmark runs against PostgreSQL: set DATABASE_URL (make bench does).")
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    settings.ALLOWED_HOSTS = ["*"]
    # A database of its own: the benchmark must not touch real data, and starts from empty.
    test_db = settings.DATABASES["default"]["NAME"] + "_bench"
    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = test_db
    original = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        run(args.nodes)
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(original, verbosity=0)


def _timed(label, fn, figures):
    # Wall time is what a client sees; CPU time of this process (the web side) is shown beside it because
    # on a shared machine wall time also measures the neighbours. PostgreSQL's own work is in wall only.
    started, cpu = time.perf_counter(), time.process_time()
    result = fn()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    figures.append((label, elapsed))
    print(f"  {label:<62} {elapsed:7.2f} s wall {cpu:7.2f} s cpu", flush=True)
    return result


def run(nodes: int):
    from django.test import Client

    from draservice.models import APIToken
    from draservice.tokens import issue_token
    from inventory import demo
    from inventory.models import Device
    from inventory.services.clusters import create_cluster
    from inventory.signals import inventory_changed

    # Measure the inventory alone: what other apps do on inventory_changed is not part of the push.
    inventory_changed.receivers = []
    figures = []
    print(f"inventory benchmark: {nodes} nodes x 8 GPUs (synthetic H100 HGX slices); {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    body = _timed("generate the push body", lambda: demo.synthetic_cluster(nodes), figures)
    payload = _timed("encode JSON", lambda: json.dumps(body, separators=(",", ":")), figures)
    devices = sum(len(s["spec"]["devices"]) for s in body["resourceSlices"])
    print(f"  body: {len(body['resourceSlices'])} slices, {devices} devices, {len(payload) / 1e6:.1f} MB")
    _, secret = create_cluster(name="bench", labels={"provider": "bench"})
    _, admin = issue_token(kind=APIToken.ADMIN)
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}

    def push():
        resp = client.put("/api/v1/clusters/bench/inventory", payload, content_type="application/json", **auth)
        assert resp.status_code == 200, resp.content[:2000]
        return resp.json()

    first = _timed("full push, empty cluster (PUT /inventory)", push, figures)
    assert first["devices"] == nodes * 8, first
    second = _timed("full push again, nothing changed", push, figures)
    assert not second["changed"], second
    for obj in body["resourceSlices"][: max(1, len(body["resourceSlices"]) // 10)]:
        obj["spec"]["pool"]["generation"] += 1
    payload = json.dumps(body, separators=(",", ":"))
    third = _timed("full push, 10% of the slices changed", push, figures)
    assert third["resourceSlices"]["updated"] == max(1, len(body["resourceSlices"]) // 10), third

    admin_auth = {"HTTP_AUTHORIZATION": f"Bearer {admin}"}

    def list_all(path, limit=1000):
        url, count = f"{path}?limit={limit}", 0
        while url:
            resp = client.get(url, **admin_auth)
            assert resp.status_code == 200, resp.content[:500]
            data = resp.json()
            count += len(data["results"])
            url = data["next"]
        return count

    devices = _timed("list all devices (GET /devices, pages of 1000)", lambda: list_all("/api/v1/devices"), figures)
    assert devices == Device.objects.count()
    _timed("first page of 100 devices", lambda: client.get("/api/v1/devices", **admin_auth), figures)
    _timed("filter ?attribute=gpu.nvidia.com/productName=... (page of 100)", lambda: client.get(
        "/api/v1/devices", {"attribute": "gpu.nvidia.com/productName=NVIDIA H100 80GB HBM3"}, **admin_auth), figures)
    _timed("filter ?node=bench-h100-04999", lambda: client.get(
        "/api/v1/devices", {"node": f"bench-h100-{nodes - 1:05d}"}, **admin_auth), figures)
    _timed("list all resourceslices (pages of 1000)", lambda: list_all("/api/v1/resourceslices"), figures)
    _timed("GET /clusters/bench/inventory (whole state)", lambda: client.get(
        "/api/v1/clusters/bench/inventory", **admin_auth), figures)
    try:
        from inventory.snapshot import build_fleet_snapshot
    except ImportError:
        build_fleet_snapshot = None
    if build_fleet_snapshot is not None:
        _timed("build_fleet_snapshot() for the engine", build_fleet_snapshot, figures)
    _timed("delete the cluster", lambda: client.delete("/api/v1/clusters/bench", **admin_auth), figures)
    push_time = dict(figures)["full push, empty cluster (PUT /inventory)"]
    verdict = "OK" if push_time < 10 else "OVER GOAL"
    print(f"full push of {nodes} nodes x 8 GPUs: {push_time:.2f} s (goal < 10 s): {verdict}; "
          f"load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
