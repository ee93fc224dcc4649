"""Replay accuracy on a recording made through the real service (issue 39, "Done when" 1).

The live service (``manage.py serve``, an allocation worker, a replay worker on ``-Q <REPLAY_QUEUE>``, PostgreSQL,
Redis) on a scratch database, driven only over HTTP, as ``queue_bench``'s shape scaled to a small fleet: queues
a, b and c under the root with nominal quotas of a quarter of the fleet each (a quarter unassigned), weights
1:2:1, unlimited borrowing, preemption grace 0 (the victims' users stop at once, as the replay assumes); each
submits claims of 1-8 GPUs as a Poisson stream at ``--load`` x the fleet, and releases each claim ``--hold``
seconds after it was (last) allocated, through the API, as a user whose job ended. Queue c starts a quarter into
the run, so a and b borrow its nominal first and it has to reclaim it (preemptions).

Then a replay of the window is asked for through ``POST /api/v1/replays`` with the live configuration and waited
for; each queue's share of the GPU-hours replayed must be within 3 percentage points of what happened. Then the
what-if (a's weight 4, b's 1) is replayed and printed.

    python benchmarks/replay_bench.py [--minutes 120] [--nodes 8] [--check]
    python benchmarks/replay_bench.py --replay-only [--check]   # replay the last recording again (same database)

The recording's window and database are kept in bench-results/replay-bench.json, so a later checkout can replay
it again (``--replay-only``). Nothing happens at import.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")

from benchmarks._live import Client, Stack, bench_database, recreate_database  # noqa: E402
from benchmarks._queue_world import gpu_claim, queue_body  # noqa: E402
from benchmarks._replay_world import poisson  # noqa: E402
from benchmarks._soak_phases import Heartbeats  # noqa: E402

BASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/9")
STATE = ROOT / "bench-results" / "replay-bench.json"
QUEUES = ("a", "b", "c")
WEIGHTS = {"a": 1, "b": 2, "c": 1}
TOLERANCE = 0.03


def load() -> str:
    return f"(load {os.getloadavg()[0]:.2f})"


def stamp() -> str:
    return time.strftime("%H:%M:%S")


def setup(nodes: int) -> str:
    """The scratch database's fleet (``nodes`` x 8 H100 in one cluster) and an admin token."""
    import django

    django.setup()
    from django.core.management import call_command

    from draservice.models import APIToken
    from draservice.tokens import issue_token
    from inventory import demo
    from inventory.models import DeviceClass
    from inventory.services import clusters, fleet, sync

    call_command("migrate", verbosity=0)
    for obj in demo.standard_device_classes():
        fleet.create_fleet_object(DeviceClass, obj)
    clusters.create_cluster(name="replay-h100", labels={}, with_token=False)
    slices, node_list = [], []
    for i in range(nodes):
        node = f"h100-node-{i:03d}"
        slices += demo.node_slices("h100", node)
        node_list.append({"name": node, "labels": {"kubernetes.io/hostname": node}})
    devices = sync.push_inventory("replay-h100", {"resourceSlices": slices, "nodes": node_list})["devices"]
    _, secret = issue_token(kind=APIToken.ADMIN, name="replay bench")
    print(f"{stamp()} fleet: {devices} devices on {nodes} nodes ({8 * nodes} GPUs)", flush=True)
    return secret


def make_queues(client: Client, gpus: int) -> None:
    for name in QUEUES:
        body = queue_body(name, namespaces=[f"team-{name}"], gpus=gpus // 4, weight=WEIGHTS[name],
                          preemption={"reclaimWithinCohort": "Any", "graceSeconds": 0})
        status, out = client.call("POST", "/api/v1/queues", body)
        assert status == 201, (status, out)


def record(client: Client, gpus: int, seconds: float, load_factor: float, hold: tuple[float, float],
           seed: int = 7) -> dict:
    """Drive the stream; the window and what was submitted."""
    from django.utils import timezone

    from claims.models import Phase, ResourceClaim

    rng = random.Random(seed)
    sizes = (1, 8)
    mean = (sizes[0] + sizes[1]) / 2 * (hold[0] + hold[1]) / 2
    rate = load_factor * gpus / mean / len(QUEUES)  # claims per second per queue
    start = timezone.now()
    began = time.monotonic()
    holds: dict[str, float] = {}
    submitted = released = n = 0
    tick, next_report = 0.5, began + 60
    while (elapsed := time.monotonic() - began) < seconds:
        for q in QUEUES:
            if q == "c" and elapsed < seconds / 4:
                continue
            for _ in range(poisson(rng, rate * tick)):
                n += 1
                name = f"{q}{n}"
                status, out = client.call("POST", f"/api/v1/namespaces/team-{q}/resourceclaims",
                                          gpu_claim(name, rng.randint(*sizes)))
                assert status == 201, (status, out)
                holds[f"team-{q}/{name}"] = rng.uniform(*hold)
                submitted += 1
        now = timezone.now()
        for ns, name, allocated_at in ResourceClaim.objects.filter(
                phase=Phase.ALLOCATED, namespace__name__in=[f"team-{q}" for q in QUEUES]).values_list(
                "namespace__name", "name", "allocated_at"):
            if (now - allocated_at).total_seconds() >= holds.get(f"{ns}/{name}", 0):
                status, out = client.call("POST", f"/api/v1/namespaces/{ns}/resourceclaims/{name}/release", {})
                if status == 200:
                    released += 1
        if time.monotonic() >= next_report:
            pending = ResourceClaim.objects.filter(phase=Phase.PENDING).count()
            print(f"{stamp()} {elapsed / 60:5.1f} min: {submitted} submitted, {released} released, "
                  f"{pending} pending {load()}", flush=True)
            next_report += 60
        time.sleep(max(0.0, tick - (time.monotonic() - began - elapsed)))
    return {"start": start.isoformat(), "end": timezone.now().isoformat(), "submitted": submitted,
            "released": released}


def replay(client: Client, window: dict, configuration: dict | None = None, timeout: float = 1800) -> dict:
    body: dict = {"window": {"start": window["start"], "end": window["end"]}}
    if configuration:
        body["configuration"] = configuration
    t0, cpu = time.monotonic(), None
    status, out = client.call("POST", "/api/v1/replays", body)
    assert status == 202, (status, out)
    name = out["metadata"]["name"]
    while time.monotonic() - t0 < timeout:
        status, out = client.call("GET", f"/api/v1/replays/{name}")
        state = out.get("status", {}).get("state")
        if state in ("Succeeded", "Failed"):
            break
        time.sleep(1)
    results = out["status"].get("results") or {}
    cpu = results.get("cpuSeconds")
    print(f"{stamp()} replay {name}: {state} in {time.monotonic() - t0:.1f} s wall, CPU {cpu} s {load()}; "
          f"{out['status'].get('message', '')}", flush=True)
    if state != "Succeeded":
        raise SystemExit(f"replay {name} did not succeed: {out['status']}")
    return results


def shares(results: dict, side: str) -> dict[str, float]:
    return {q["name"]: q[side]["shareOfDeviceHours"] or 0.0 for q in results["queues"] if q["name"] in QUEUES}


def table(results: dict) -> None:
    print(f"  {'queue':6} {'share actual':>12} {'replayed':>9} {'wait p50 actual/replayed':>26} "
          f"{'p95 actual/replayed':>22} {'preemptions':>12}")
    for q in results["queues"]:
        if q["name"] not in QUEUES:
            continue
        a, r = q["actual"], q["replayed"]
        print(f"  {q['name']:6} {a['shareOfDeviceHours'] or 0:12.3f} {r['shareOfDeviceHours'] or 0:9.3f} "
              f"{_s(a.get('waitP50Seconds')):>12}/{_s(r.get('waitP50Seconds')):<12} "
              f"{_s(a.get('waitP95Seconds')):>10}/{_s(r.get('waitP95Seconds')):<11} "
              f"{a.get('preemptions')}/{r.get('preemptions')}")


def _s(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def judge(results: dict, what_if: dict) -> bool:
    actual, replayed = shares(results, "actual"), shares(results, "replayed")
    table(results)
    worst = max(abs(actual[q] - replayed[q]) for q in actual)
    ok = worst <= TOLERANCE
    print(f"  [{'met' if ok else 'MISSED'}] largest share difference replayed vs actual = {100 * worst:.1f} pp "
          f"(goal <= {100 * TOLERANCE:.0f} pp)", flush=True)
    changed = shares(what_if, "replayed")
    print("  what-if (a weight 4, b weight 1): " + ", ".join(
        f"{q} {replayed[q]:.3f} -> {changed[q]:.3f}" for q in QUEUES if q in changed), flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=120)
    parser.add_argument("--nodes", type=int, default=8, help="nodes of 8 H100 GPUs")
    parser.add_argument("--load", type=float, default=1.3, help="offered GPU-seconds over the fleet's")
    parser.add_argument("--hold", type=float, nargs=2, default=(30.0, 300.0), metavar=("MIN", "MAX"))
    parser.add_argument("--replay-only", action="store_true", help="replay the last recording again")
    parser.add_argument("--check", action="store_true", help="exit 1 when the goal is missed")
    args = parser.parse_args()

    if args.replay_only:
        state = json.loads(STATE.read_text())
        os.environ["DATABASE_URL"] = state["database_url"]
        import django

        django.setup()
        from draservice.models import APIToken
        from draservice.tokens import issue_token

        _, token = issue_token(kind=APIToken.ADMIN, name="replay bench again")
    else:
        name, url = bench_database(BASE_URL, "replay")
        recreate_database(BASE_URL, name)
        os.environ["DATABASE_URL"] = url
        token = setup(args.nodes)
        state = {"database_url": url}
    stack = Stack(BROKER, web_workers=1, web_threads=8, prefix="replay-",
                  env={"DATABASE_URL": os.environ["DATABASE_URL"], "CELERY_BROKER_URL": BROKER})
    stack.start()
    from django.conf import settings
    stack.start_replay_worker(settings.REPLAY_QUEUE)
    beats = Heartbeats()  # the cluster's agent: without it the cluster is stale after 5 minutes, nothing placed
    beats.start()
    try:
        client = Client(stack.port, token)
        if not args.replay_only:
            make_queues(client, args.nodes * 8)
            print(f"{stamp()} recording {args.minutes:g} min at load {args.load} (holds {args.hold[0]:g}-"
                  f"{args.hold[1]:g} s) {load()}", flush=True)
            state.update(record(client, args.nodes * 8, args.minutes * 60, args.load, tuple(args.hold)))
            STATE.write_text(json.dumps(state, indent=1))
            print(f"{stamp()} recorded {state['start']} .. {state['end']}: {state['submitted']} claims submitted, "
                  f"{state['released']} released {load()}", flush=True)
        live = replay(client, state)
        what_if = replay(client, state, {"queues": [{"name": "a", "spec": {"weight": 4}},
                                                    {"name": "b", "spec": {"weight": 1}}]})
        ok = judge(live, what_if)
    finally:
        beats.stop()
        stack.stop()
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
