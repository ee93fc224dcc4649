"""Helpers of the concurrency tests: claim mixes, settling, and the invariants checked afterwards.

What must hold, checked by SQL over every allocation row:
* no device is held twice (dedicated), and no device is held dedicated and shared at once;
* no counter set of a partitionable GPU is over-consumed (MIG partitions of one GPU exclude each other);
* every claim's rows are exactly its status.allocation; claims not allocated hold nothing;
* every claim is Allocated, or Pending with the reason of an attempt made at the current fleet version.
"""
from __future__ import annotations

import random
import time
from collections import Counter, defaultdict

from django.db import connection

from claims.models import DeviceAllocation, PendingWake, Phase, ReleasedDevice, ResourceClaim
from claims.services import wake
from dra.engine.quantity import Q
from inventory.models import Device, ResourceSlice
from queues.services.resolve import PRIORITY_LABEL, QUEUE_LABELS
from scheduler.services import allocation
from tests.claims.fleet import gpu_claim, load_fleet

NS = "/api/v1/namespaces/race"
H100_NODES, MIG_NODES = 40, 4  # 320 whole GPUs; 224 1g.10gb MIG partitions at most


def mig_claim(name: str) -> dict:
    sel = {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'}}
    return {"kind": "ResourceClaim", "metadata": {"name": name}, "spec": {"devices": {"requests": [
        {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [sel]}}]}}}


def claim_bodies(n: int, prefix: str) -> list[dict]:
    rng = random.Random(n)
    out = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.6:
            out.append(gpu_claim(f"{prefix}-{i}"))
        elif kind < 0.75:
            out.append(gpu_claim(f"{prefix}-{i}", count=2))
        else:
            out.append(mig_claim(f"{prefix}-{i}"))
    return out


def submit(client, bodies, chunk=500):
    for start in range(0, len(bodies), chunk):
        resp = client.post(f"{NS}/resourceclaims/batch", {"items": bodies[start:start + chunk]}, format="json")
        assert resp.status_code == 201, resp.content[:2000]


def settled() -> bool:
    return not allocation.undecided_pending().exists()


def wait_settled(pool, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    stable_since = None
    while True:
        if settled():
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since > 1.0:
                return
        else:
            stable_since = None
        assert time.monotonic() < deadline, "claims did not settle\n" + pool.log_tail()
        time.sleep(0.2)


def assert_invariants() -> dict:
    with connection.cursor() as cur:
        cur.execute("""SELECT cluster, driver, pool, device, count(*) FROM claims_deviceallocation
                       WHERE share_id = '' AND NOT admin_access GROUP BY 1, 2, 3, 4 HAVING count(*) > 1""")
        assert cur.fetchall() == [], "a device is allocated twice"
        cur.execute("""SELECT cluster, driver, pool, device FROM claims_deviceallocation WHERE NOT admin_access
                       GROUP BY 1, 2, 3, 4 HAVING count(*) FILTER (WHERE share_id = '') > 0 AND count(*) > 1""")
        assert cur.fetchall() == [], "a device is held dedicated and shared at once"

    # Counters: what allocated partitions consume never exceeds what their GPU's counter set has.
    totals = {}
    for cluster, pool, obj in ResourceSlice.objects.values_list("cluster__name", "pool_name", "object"):
        for cs in obj["spec"].get("sharedCounters") or ():
            for cname, c in cs["counters"].items():
                totals[(cluster, pool, cs["name"], cname)] = Q.parse(c["value"]).value
    consumes = {(c, p, n): cc for c, p, n, cc in Device.objects.exclude(consumes_counters=[]).values_list(
        "cluster__name", "pool_name", "name", "consumes_counters")}
    used = defaultdict(int)
    for cluster, pool, device in DeviceAllocation.objects.values_list("cluster", "pool", "device"):
        for consumption in consumes.get((cluster, pool, device), ()):
            for cname, c in consumption["counters"].items():
                used[(cluster, pool, consumption["counterSet"], cname)] += Q.parse(c["value"]).value
    over = {k: (v, totals.get(k)) for k, v in used.items() if v > totals.get(k, 0)}
    assert not over, f"counters over-consumed: {list(over.items())[:5]}"

    # Every claim: rows match its allocation exactly; pending ones were tried and say why.
    rows = defaultdict(set)
    for claim_id, driver, pool, device in DeviceAllocation.objects.values_list("claim_id", "driver", "pool", "device"):
        rows[claim_id].add((driver, pool, device))
    phases = defaultdict(int)
    for claim in ResourceClaim.objects.all():
        phases[claim.phase] += 1
        if claim.phase == Phase.ALLOCATED:
            want = {(r["driver"], r["pool"], r["device"]) for r in claim.allocation["devices"]["results"]}
            assert rows.get(claim.id) == want, claim.name
        else:
            assert claim.id not in rows, claim.name
            assert claim.phase in (Phase.PENDING, Phase.RELEASED), (claim.name, claim.phase, claim.reason)
            if claim.phase == Phase.PENDING:
                # HeldForQueueHead: a node is kept for the head of the claim's queue (issue 15's reservation;
                # every claim here is in the default queue), and the message names the head's queue.
                assert claim.reason in ("Unsatisfiable", "LostRace", "HeldForQueueHead") and claim.attempts >= 1, (
                    claim.name, claim.reason, claim.message, claim.attempts)
    return dict(phases)


def load_race_fleet() -> None:
    load_fleet({"race": [("h100", H100_NODES), ("a100-mig", MIG_NODES)]})


def whole_gpus_held() -> int:
    return DeviceAllocation.objects.filter(driver="gpu.nvidia.com").exclude(device__contains="-mig-").count()


def free_whole_gpus_by_node() -> dict[str, int]:
    """Whole H100 GPUs no allocation row holds, counted per node."""
    held = set(DeviceAllocation.objects.values_list("cluster", "pool", "device"))
    free: dict[str, int] = defaultdict(int)
    for cluster, pool, name, node in (Device.objects.filter(driver="gpu.nvidia.com")
                                      .exclude(name__contains="-mig-")
                                      .values_list("cluster__name", "pool_name", "name", "node_name")):
        if (cluster, pool, name) not in held:
            free[node] += 1
    return dict(free)


def nodes_held_for_queue_heads() -> set[str]:
    """Nodes that pending claims were kept off because a queue's head waits for them (HeldForQueueHead), and
    the nodes waiting heads hold now (kept across rounds in their wake rows)."""
    rows = ResourceClaim.objects.filter(phase=Phase.PENDING, reason="HeldForQueueHead").values_list(
        "diagnostics", flat=True)
    kept = set(PendingWake.objects.exclude(head_of="").values_list("hold_node", flat=True))
    return ({((d or {}).get("diagnostics") or {}).get("node") for d in rows} | kept) - {None, ""}


def unexplained_idle_gpus() -> tuple[dict[str, int], set[str]]:
    """Whole GPUs left free after settling that nothing explains, by node, and the nodes held for heads.

    Demand far exceeds supply, so after settling every whole GPU should be held -- except on a node held for
    the head of a queue (scheduler.services.queue_holds): a 2-GPU head that does not fit anywhere keeps the node
    with the most free GPUs for itself, and the 1-GPU claims behind it are kept off that node
    (HeldForQueueHead) so that freed GPUs accumulate there. Such a node holds one free GPU at most (with two
    the head would fit)."""
    free = free_whole_gpus_by_node()
    held_nodes = nodes_held_for_queue_heads()
    return {node: n for node, n in free.items() if node not in held_nodes or n > 1}, held_nodes


def wake_state() -> str:
    """What the wake-up machinery holds after settling, for a failure message: the freed devices still offered
    (and whom they woke last), the candidates no device was offered to (counters reached), the pending reasons.
    A free GPU with no offer left and no candidate was dropped, or never offered; one with an offer was skipped."""
    offers = [(o.device, sorted(ResourceClaim.objects.filter(id__in=o.woken).values_list("name", "reason")))
              for o in ReleasedDevice.objects.order_by("id")[:10]]
    keys = [wake.ANY] + [wake.cluster_key(c) for c in
                         Device.objects.values_list("cluster__name", flat=True).distinct()]
    waiting = wake.candidates(keys, 512, QUEUE_LABELS, PRIORITY_LABEL)
    reasons = Counter(ResourceClaim.objects.filter(phase=Phase.PENDING).values_list("reason", flat=True))
    return f"offers left {offers}; candidates never offered a device: {len(waiting)}; pending by reason {dict(reasons)}"
