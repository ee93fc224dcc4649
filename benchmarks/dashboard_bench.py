#!/usr/bin/env python
"""Dashboard benchmark: server time of the main pages on a 40,000-device fleet (5,000 nodes x 8 GPUs).

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice .venv/bin/python benchmarks/dashboard_bench.py
    [--nodes 5000] [--claims 20000] [--runs 10] [--churn-seconds 20] [--keep | --reuse] [--overview-only]

Builds the fleet with the inventory generator (``inventory.demo.synthetic_cluster``, pushed through the sync
service), then fills about half of it with single-GPU claims, some 8-GPU claims, claims shared by several
consumers and claims that cannot be placed, all through the claims services and the real allocator. Pages are
requested through Django's test client (URL routing, session auth, middleware, view, queries, template), so
the figures are server time without the network. Runs in a throw-away database (``<name>_dashbench``);
``--keep`` leaves it behind and ``--reuse`` measures on it again without building (before/after comparisons).

The overview (issue 14: "< 100 ms server time at 40,000 devices, independent of how often it is polled") is
measured under these regimes, the first two as the full page and as the live fragment htmx polls
(``HX-Request``):

* warm polls: nothing changed since the last request;
* cold after an allocation change: the first request after a claim was allocated or released;
* polls while allocations change every second: a second process allocates and releases a claim each second
  while this one polls every 250 ms (the dashboard of a busy fleet, polled by several people);
* the first request after an inventory change: a node's labels (the cluster's inventory version moves, no
  device does), and one node's slice re-pushed with a device tainted or untainted (its pool's devices move).

One ``met``/``MISSED`` line per goal, judged on the median (p95 printed beside it: the machine is shared).
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
    parser.add_argument("--churn-seconds", type=float, default=20, help="polling while allocations change")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database afterwards")
    parser.add_argument("--reuse", action="store_true", help="measure on a database a --keep run left")
    parser.add_argument("--overview-only", action="store_true", help="skip the other pages")
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
    print(f"dashboard benchmark: {args.nodes} nodes x 8 GPUs, {args.claims} single-GPU claims"
          f"{' (reused database)' if args.reuse else ''}", flush=True)
    if args.reuse:
        settings.DATABASES["default"]["NAME"] = test_db
        connection.close()
        run(args)
        return
    original = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        build(args)
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


def ms(client, url, **headers) -> float:
    started = time.perf_counter()
    resp = client.get(url, **headers)
    elapsed = 1000 * (time.perf_counter() - started)
    assert resp.status_code == 200, (url, resp.status_code)
    return elapsed


def p95(times):
    return sorted(times)[max(0, int(round(0.95 * len(times))) - 1)]


class Changes:
    """Allocation changes as the fleet sees them: a new single-GPU claim (allocated by the engine in this
    process: no broker) or the release of the oldest one still held, in turn."""

    def __init__(self):
        self.n = 0

    def __call__(self):
        from claims.models import Phase, ResourceClaim
        from claims.services.claims import create_claims, release_claim
        from frontend.demo import GPU, claim, request

        self.n += 1
        if self.n % 2:
            create_claims("churn", [claim(f"churn-{os.getpid()}-{self.n:05d}-{time.time_ns()}",
                                          [request("gpu", GPU, 1)])])
        else:
            held = ResourceClaim.objects.filter(phase=Phase.ALLOCATED).order_by("id").values_list("pk", flat=True)
            release_claim(held.first())


def churn(seconds: float) -> None:
    """The second process: one allocation change a second, for ``seconds``."""
    import django
    from django.db import connections

    connections.close_all()  # a fresh connection in this process, never the parent's
    django.setup()
    change = Changes()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        change()
        time.sleep(max(0.0, 1 - (time.monotonic() - started)))


def overview_figures(client, args) -> list[tuple[str, list[float], float | None]]:
    """(label, times, goal) for the overview under the regimes of the module docstring."""
    import multiprocessing

    from django.db import connections

    from inventory.models import Node, ResourceSlice
    from inventory.services.sync import put_node, put_resource_slice

    hx = {"HTTP_HX_REQUEST": "true"}
    out = []
    for label, headers in (("page", {}), ("live fragment", hx)):
        ms(client, "/", **headers)
        out.append((f"overview {label}, warm poll", [ms(client, "/", **headers) for _ in range(args.runs)], 100.0))
    change = Changes()
    for label, headers in (("page", {}), ("live fragment", hx)):
        times = []
        for _ in range(args.runs):
            change()
            times.append(ms(client, "/", **headers))
        out.append((f"overview {label}, cold after an allocation change", times, 100.0))

    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=churn, args=(args.churn_seconds,))
    proc.start()
    times = []
    try:
        while proc.is_alive():
            started = time.monotonic()
            times.append(ms(client, "/", **hx))
            time.sleep(max(0.0, 0.25 - (time.monotonic() - started)))
    finally:
        proc.join()
    out.append(("overview live fragment, polled while allocations change every second", times, 100.0))

    node = Node.objects.filter(cluster__name="bench").order_by("name").first()
    times = []
    for i in range(max(2, args.runs // 3)):
        put_node("bench", node.name, {"name": node.name, "labels": {**node.labels, "bench/touch": str(i)}})
        times.append(ms(client, "/"))
    out.append(("overview page, first after an inventory change (a node's labels)", times, 100.0))

    # A push that changes devices: one node's GPU slice re-pushed with a device tainted (a value of its own
    # each time, so that every push differs from what is stored, whatever an earlier run left), then untainted.
    row = ResourceSlice.objects.filter(cluster__name="bench").order_by("name").first()
    spec = row.object["spec"]
    times = []
    for i in range(max(2, args.runs // 3)):
        taints = [{"key": "bench/touch", "value": str(time.time_ns()), "effect": "NoSchedule"}] if i % 2 == 0 else []
        devices = [{**d, "taints": taints} if j == 0 else d for j, d in enumerate(spec["devices"])]
        put_resource_slice("bench", row.name, {**row.object, "spec": {**spec, "devices": devices}})
        times.append(ms(client, "/"))
    out.append(("overview page, first after an inventory change (a node's slice)", times, 100.0))
    return out


def run(args):
    from django.contrib.auth import get_user_model
    from django.test import Client

    from claims.models import DeviceAllocation, Phase, ResourceClaim
    from inventory.models import Device

    devices = Device.objects.count()
    allocated = DeviceAllocation.objects.values("device", "pool").distinct().count()
    pending = ResourceClaim.objects.filter(phase=Phase.PENDING).count()
    print(f"  fleet: {devices} devices, {allocated} in use, {ResourceClaim.objects.count()} claims ({pending} pending)")

    # The cluster's agent would be heart-beating all along; without it the fleet turns stale after
    # STALE_CLUSTER_SECONDS and the pages would show a fleet with nothing on offer.
    from inventory.models import Cluster
    from inventory.services.clusters import record_heartbeat

    record_heartbeat(Cluster.objects.get(name="bench"), agent_version="bench")
    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_staff": True})
    client = Client()
    client.force_login(user)
    busy = DeviceAllocation.objects.filter(claim__name="train-0000").values_list("pool", flat=True).first()
    node = Device.objects.filter(pool_name=busy).values_list("node_name", flat=True).first() if busy else \
        Device.objects.values_list("node_name", flat=True).first()

    print(f"\n  {'overview':<72} {'median':>9} {'p95':>9} {'min':>9} {'n':>4}")
    verdicts = []
    for label, times, goal in overview_figures(client, args):
        median = statistics.median(times)
        print(f"  {label:<72} {median:7.1f}ms {p95(times):7.1f}ms {min(times):7.1f}ms {len(times):4d}", flush=True)
        if goal is not None:
            verdicts.append(f"  {'met' if median < goal else 'MISSED'}: {label} < {goal:.0f} ms "
                            f"(median {median:.1f} ms, p95 {p95(times):.1f} ms)")

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
    for label, url in pages[:1] if args.overview_only else pages:
        times, queries, size = timed_get(client, url, args.runs)
        print(f"  {label:<36} {statistics.median(times):7.1f}ms {p95(times):7.1f}ms {min(times):7.1f}ms {queries:8d} "
              f"{size / 1024:7.1f}", flush=True)
    print()
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()
