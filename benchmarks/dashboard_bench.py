#!/usr/bin/env python
"""Dashboard benchmark: server time of the main pages on a 40,000-device fleet (5,000 nodes x 8 GPUs).

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice .venv/bin/python benchmarks/dashboard_bench.py
    [--nodes 5000] [--claims 20000] [--runs 10] [--keep]

Builds the fleet with the inventory generator (``inventory.demo.synthetic_cluster``, pushed through the sync
service), then fills about half of it with single-GPU claims, some 8-GPU claims, claims shared by several
consumers and claims that cannot be placed, all through the claims services and the real allocator. Pages are
requested through Django's test client (URL routing, session auth, middleware, view, queries, template), so
the figures are server time without the network. Runs in a throw-away database (``<name>_dashbench``).
Goal: overview under 300 ms.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=20000, help="single-GPU claims to allocate")
    parser.add_argument("--runs", type=int, default=10, help="timed requests per page (after one warm-up)")
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
    test_db = settings.DATABASES["default"]["NAME"] + "_dashbench"
    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = test_db
    original = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        run(args)
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(original, verbosity=0)


def step(label, fn):
    started = time.perf_counter()
    result = fn()
    print(f"  {label:<62} {time.perf_counter() - started:7.1f} s", flush=True)
    return result


def build(args):
    from claims.services.claims import create_claims
    from claims.services.consumers import create_consumer
    from claims.services.utilisation import record_snapshot
    from frontend.demo import GPU, H100, claim, consumer, request
    from inventory import demo
    from inventory.models import DeviceClass
    from inventory.services import fleet
    from inventory.services.clusters import create_cluster
    from inventory.services.sync import push_inventory

    for obj in demo.standard_device_classes():
        fleet.replace_fleet_object(DeviceClass, obj["metadata"]["name"], obj, None)
    create_cluster(name="bench", labels={"provider": "bench", "region": "bench-1"}, with_token=False)
    body = step(f"generate {args.nodes} nodes x 8 GPUs", lambda: demo.synthetic_cluster(args.nodes))
    step("push the inventory (sync service)", lambda: push_inventory("bench", body))

    def fill():
        batch = 1000
        for start in range(0, args.claims, batch):
            n = min(batch, args.claims - start)
            create_claims(f"team-{start // batch % 7}",
                          [claim(f"job-{start + i:06d}", [request("gpu", GPU, 1, [H100])]) for i in range(n)])
    step(f"{args.claims} single-GPU claims, allocated by the engine", fill)

    def big_and_shared():
        create_claims("training", [claim(f"train-{i:04d}", [request("gpus", GPU, 8, [H100])]) for i in range(200)])
        create_claims("serving", [claim(f"shared-{i:03d}", [request("gpu", GPU, 1, [H100])]) for i in range(100)])
        for i in range(100):
            for j in range(3):
                create_consumer("serving", consumer(f"pod-{i:03d}-{j}", f"shared-{i:03d}"))
        # Cannot be placed: more GPUs than any node has; they stay pending with the engine's diagnostics.
        create_claims("ci", [claim(f"too-big-{i:03d}", [request("gpus", GPU, 16, [H100])]) for i in range(200)])
    step("200 x 8-GPU claims, 100 claims x 3 consumers, 200 unplaceable", big_and_shared)
    step("a utilisation snapshot", record_snapshot)


def timed_get(client, url, runs):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    resp = client.get(url)  # warm-up (template compilation, caches)
    assert resp.status_code == 200, (url, resp.status_code)
    times = []
    for _ in range(runs):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            resp = client.get(url)
            times.append(1000 * (time.perf_counter() - started))
        assert resp.status_code == 200, (url, resp.status_code)
    return times, len(queries), len(resp.content)


def run(args):
    from django.contrib.auth import get_user_model
    from django.test import Client

    from claims.models import DeviceAllocation, Phase, ResourceClaim
    from inventory.models import Device

    print(f"dashboard benchmark: {args.nodes} nodes x 8 GPUs, {args.claims} single-GPU claims")
    build(args)
    devices = Device.objects.count()
    allocated = DeviceAllocation.objects.values("device", "pool").distinct().count()
    pending = ResourceClaim.objects.filter(phase=Phase.PENDING).count()
    print(f"  fleet: {devices} devices, {allocated} in use, {ResourceClaim.objects.count()} claims ({pending} pending)")

    # The cluster's agent would be heart-beating all along; without it the fleet turns stale after
    # STALE_CLUSTER_SECONDS and the pages would show a fleet with nothing on offer.
    from inventory.models import Cluster
    from inventory.services.clusters import record_heartbeat

    record_heartbeat(Cluster.objects.get(name="bench"), agent_version="bench")
    user = get_user_model().objects.create_user("bench", password="bench-password", is_staff=True)
    client = Client()
    client.force_login(user)
    busy = DeviceAllocation.objects.filter(claim__name="train-0000").values_list("pool", flat=True).first()
    node = Device.objects.filter(pool_name=busy).values_list("node_name", flat=True).first() if busy else \
        Device.objects.values_list("node_name", flat=True).first()
    pages = [
        ("overview", "/"),
        ("node (8 GPUs)", f"/clusters/bench/nodes/{node}/"),
        ("claims list", "/claims/"),
        ("claims list, Pending", "/claims/?phase=Pending"),
        ("claim (pending, with explanation)", "/claims/ci/too-big-000/"),
        ("cluster (5,000 nodes, first page)", "/clusters/bench/"),
        ("sharing", "/sharing/"),
        ("fragmentation", "/fragmentation/"),
    ]
    print(f"\n  {'page':<36} {'median':>9} {'p95':>9} {'min':>9} {'queries':>8} {'KB':>7}")
    for label, url in pages:
        times, queries, size = timed_get(client, url, args.runs)
        p95 = sorted(times)[max(0, int(round(0.95 * len(times))) - 1)]
        print(f"  {label:<36} {statistics.median(times):7.1f}ms {p95:7.1f}ms {min(times):7.1f}ms {queries:8d} "
              f"{size / 1024:7.1f}", flush=True)
    print("\n  goal: overview < 300 ms server time")


if __name__ == "__main__":
    main()
