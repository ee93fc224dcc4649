"""Replay of a busy day on the live service (issue 39): how long it takes, and whether it delays allocation.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice BENCH_BROKER_URL=redis://127.0.0.1:6379/8 \\
        .venv/bin/python benchmarks/replay_day_bench.py [--canary-every 3] [--check]

What it does:

1. its own database ``<DATABASE_URL's name>_replay_day_bench``; a fleet of 1,024 GPUs (128 nodes of 8 H100 of
   ``inventory.demo``, one cluster) through the inventory's sync service; an admin token;
2. ``manage.py serve``, an allocation worker (``celery worker``) and a replay worker (``celery worker -Q
   <REPLAY_QUEUE> --pool solo``, as compose's ``replay-worker``) against BENCH_BROKER_URL (FLUSHED at start);
3. queues a, b, c through the API (namespaces team-a/b/c, weights 1:2:1, nominal 256/512/256 GPUs, unlimited
   borrowing, fair sharing with a one-day half-life), made the day before the window; b's weight set to 1 at noon
   of the window (a PATCH whose audit event is moved there: the replay switches configuration mid-day);
4. a day of history written as the service keeps it (``benchmarks/_day_trace.py``): ~22,700 claims of 1 (50 %),
   2 (25 %), 4 (15 %) or 8 (10 %) GPUs holding 5-60 min, offered at 1.1x the fleet from 2 h before the window to
   its end, so a backlog builds up (median wait ~1.8 h); ~21,000 ran, ~740 were given up on, ~950 still waited
   when it ended; ~21,000 of them are in the window (the replay's claims). That is the claims' history rows,
   ~50,000 usage-ledger intervals and ~65,000 claim events;
5. ``POST /api/v1/replays`` of the 24 h window, timed until Succeeded (wall, and the CPU the replay reports and
   the replay worker's process used), while a canary claim (1 GPU, namespace ``canary``) is POSTed every
   ``--canary-every`` seconds and long-polled until Allocated, then released: submit->allocated per canary.

Goals: the replay Succeeds in < 120 s wall, and every canary is allocated in < 2 s. Measured (load ~6-7 on 2
CPUs shared with other work): before the replay's round stopped walking the backlog, Failed at the 120 s CPU budget
after 149 s wall, 55 % of the way (the whole day ~410 s of CPU); after, Succeeded in 12 s wall, 9.4 s of CPU; the
canaries ~0.1 s (max 0.22 s) either way. Results:
bench-results/replay_day.json. Everything runs on this one machine (clients, web, both workers, PostgreSQL).
Nothing happens at import.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._live import Client, Stack, bench_database, pct, recreate_database  # noqa: E402
from benchmarks._soak import cpu_seconds  # noqa: E402

BASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
BENCH_DB, DB_URL = bench_database(BASE_URL, "replay_day_bench")
BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/8")
WALL_GOAL, CANARY_GOAL = 120.0, 2.0


def setup(shape) -> str:
    """Migrate, load the fleet; the admin token."""
    import django

    django.setup()
    from django.core.management import call_command

    from benchmarks._day_trace import CLUSTER, node_name
    from draservice.models import APIToken
    from draservice.tokens import issue_token
    from inventory import demo
    from inventory.models import DeviceClass
    from inventory.services import clusters, fleet, sync

    call_command("migrate", verbosity=0)
    for obj in demo.standard_device_classes():
        fleet.create_fleet_object(DeviceClass, obj)
    clusters.create_cluster(name=CLUSTER, labels={"shape": "h100"}, with_token=False)
    slices, nodes = [], []
    for i in range(shape.nodes):
        slices += demo.node_slices("h100", node_name(i))
        nodes.append({"name": node_name(i), "labels": {"kubernetes.io/hostname": node_name(i)}})
    devices = sync.push_inventory(CLUSTER, {"resourceSlices": slices, "nodes": nodes})["devices"]
    _, secret = issue_token(kind=APIToken.ADMIN, name="replay day bench")
    print(f"{time.strftime('%H:%M:%S')} fleet: {shape.nodes} nodes, {devices} devices", flush=True)
    return secret


def record_day(http: Client, shape, start) -> dict:
    """The queues through the API (made the day before; b's weight changed at noon), then the day's rows."""
    from benchmarks import _day_trace
    from draservice.models import AuditEvent

    for body in _day_trace.queue_bodies(shape):
        status, got = http.call("POST", "/api/v1/queues", body)
        assert status == 201, got
    AuditEvent.objects.filter(kind="Queue").update(at=start - timedelta(days=1))
    if shape.weight_change is not None:
        at, name, weight = shape.weight_change
        status, got = http.call("PATCH", f"/api/v1/queues/{name}", {"spec": {"weight": weight}})
        assert status == 200, got
        AuditEvent.objects.filter(kind="Queue", operation="Update").update(at=start + timedelta(seconds=at))
    t = time.monotonic()
    day = _day_trace.happened(shape)
    rows = _day_trace.write(day, start)
    ran = sum(1 for c in day.claims if c.run is not None)
    print(f"{time.strftime('%H:%M:%S')} day written in {time.monotonic() - t:.0f} s: {rows}; {len(day.claims)} "
          f"claims, {ran} ran", flush=True)
    return rows


class Canaries(threading.Thread):
    """A 1-GPU claim every ``every`` seconds until stopped: POST, long poll until Allocated, release."""

    def __init__(self, port: int, token: str, every: float):
        super().__init__(daemon=True)
        self.http, self.every = Client(port, token), every
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.done = threading.Event()

    def one(self, name: str) -> float | None:
        base = "/api/v1/namespaces/canary/resourceclaims"
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                               "count": 1}}]}}}
        t = time.monotonic()
        status, got = self.http.call("POST", base, body)
        if status != 201:
            self.failures.append(f"{name}: POST {status} {str(got)[:200]}")
            return None
        status, got = self.http.call("GET", f"{base}/{name}?wait=30s")
        took = time.monotonic() - t
        if (got.get("status") or {}).get("phase") != "Allocated":
            self.failures.append(f"{name}: {got.get('status')}")
            return None
        self.http.call("POST", f"{base}/{name}/release", {})
        return took

    def run(self) -> None:
        i = 0
        while not self.done.is_set():
            i += 1
            t = time.monotonic()
            took = self.one(f"canary-{i}")
            if took is not None:
                self.latencies.append(took)
            self.done.wait(max(0.0, self.every - (time.monotonic() - t)))


def replay(stack: Stack, http: Client, token: str, start, every: float) -> dict:
    """POST the replay of the window, canaries meanwhile; its figures."""
    canaries = Canaries(stack.port, token, every)
    window = {"start": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
              "end": (start + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    worker_cpu = cpu_seconds(stack.pid("replay-worker"))
    load_before = os.getloadavg()
    t = time.monotonic()
    status, got = http.call("POST", "/api/v1/replays", {"window": window})
    assert status == 202, got
    canaries.start()
    name = got["metadata"]["name"]
    while True:
        time.sleep(0.5)
        status, got = http.call("GET", f"/api/v1/replays/{name}")
        if got["status"]["state"] not in ("Pending", "Running"):
            break
        if time.monotonic() - t > 1200:
            raise SystemExit("the replay has not finished after 20 minutes")
    wall = time.monotonic() - t
    load = os.getloadavg()
    canaries.done.set()
    canaries.join(60)
    results = got["status"]["results"] or {}
    return {"state": got["status"]["state"], "message": got["status"]["message"], "wall_s": round(wall, 1),
            "replay_cpu_s": results.get("cpuSeconds"),
            "worker_cpu_s": round(cpu_seconds(stack.pid("replay-worker")) - worker_cpu, 1),
            "claims": results.get("claims"), "rounds": results.get("rounds"), "load_before": load_before,
            "load_after": load, "canaries": [round(x, 3) for x in canaries.latencies],
            "canary_failures": canaries.failures,
            "queues": {q["name"]: {"actual": q["actual"], "replayed": q["replayed"]}
                       for q in results.get("queues") or []}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--canary-every", type=float, default=3.0, help="seconds between canary claims")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args()
    if not BASE_URL.startswith("postgres"):
        sys.exit("replay_day_bench needs PostgreSQL: set DATABASE_URL=postgresql://...")
    os.environ.update(DATABASE_URL=DB_URL, CELERY_BROKER_URL=BROKER,
                      LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "WARNING"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")
    recreate_database(BASE_URL, BENCH_DB)
    from benchmarks._day_trace import DayShape

    shape = DayShape()
    token = setup(shape)
    from django.conf import settings
    from django.utils import timezone

    stack = Stack(BROKER, web_workers=2, web_threads=8, prefix="replay-day-")
    stack.start()
    stack.start_replay_worker(settings.REPLAY_QUEUE)
    out: dict = {"cpus": os.cpu_count(), "budget_s": settings.REPLAY_CPU_SECONDS}
    try:
        http = Client(stack.port, token)
        start = timezone.now().replace(microsecond=0) - timedelta(days=1, hours=4)
        out["rows"] = record_day(http, shape, start)
        Canaries(stack.port, token, 0).one("warm-up")  # the allocation worker builds its fleet snapshot
        time.sleep(2)  # the replay worker is up
        out.update(replay(stack, http, token, start, args.canary_every))
    finally:
        stack.stop()
    return report(out, args.check)


def report(out: dict, check: bool) -> int:
    (ROOT / "bench-results" / "replay_day.json").write_text(json.dumps(out, indent=2, default=str))
    lat = out["canaries"]
    print(f"replay of {out['claims']} claims: {out['state']} {out['message'] or ''} in {out['wall_s']} s wall, "
          f"{out['replay_cpu_s']} s CPU reported ({out['worker_cpu_s']} s of the replay worker's process), "
          f"{out['rounds']} rounds; budget {out['budget_s']:g} s of CPU")
    for name, q in sorted(out["queues"].items()):
        a, r = q["actual"], q["replayed"]
        print(f"  queue {name}: share actual {a['shareOfDeviceHours']} replayed {r['shareOfDeviceHours']}, wait p50 "
              f"actual {a['waitP50Seconds']} s replayed {r['waitP50Seconds']} s, preemptions {r['preemptions']}")
    print(f"canaries: {len(lat)} allocated, p50 {pct(lat, 50):.3f} s, max {max(lat, default=float('nan')):.3f} s; "
          f"failures {out['canary_failures'] or 'none'}")
    load = f"(load average before {out['load_before'][0]:.2f}, after {out['load_after'][0]:.2f} on {out['cpus']} CPUs)"
    checks = [(out["state"] == "Succeeded" and out["wall_s"] < WALL_GOAL,
               f"the day's replay Succeeded in < {WALL_GOAL:g} s wall: {out['state']} in {out['wall_s']} s "
               f"({out['replay_cpu_s']} s CPU) {load}"),
              (bool(lat) and not out["canary_failures"] and max(lat) < CANARY_GOAL,
               f"every canary allocated in < {CANARY_GOAL:g} s during the replay: {len(lat)} canaries, max "
               f"{max(lat, default=float('nan')):.3f} s {load}")]
    for ok, text in checks:
        print(f"  {'met   ' if ok else 'MISSED'} {text}")
    return 1 if check and not all(ok for ok, _ in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
