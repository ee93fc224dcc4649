"""Per-cluster turns (scheduler.services.turns) with real workers: three worker processes place claims of four
clusters at the same time, one is SIGKILLed while it holds a cluster's turn, and still no device is
allocated twice (checked by SQL over every row, tests/claims/race.py), the killed worker's turn dies with its
session (the others go on placing claims in that cluster), and the workers did decide in parallel (their
allocation rounds overlap in time). No racing switch here: the workers run as deployed.
"""
from __future__ import annotations

import random
import time

import pytest
from django.db import connection
from django.utils import timezone

from claims.models import AllocationRound, ClaimEvent, DeviceAllocation, Phase, ResourceClaim
from scheduler.services import turns
from scheduler.tasks import allocate_pending
from tests.claims.fleet import gpu_claim, load_fleet
from tests.claims.race import assert_invariants, mig_claim, submit, wait_settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 3  # read by the worker_pool fixture
# 320 H100, 320 L4, 240 MI300X GPUs and 224 MIG partitions (1,104) for 1,600 claims: demand exceeds each.
CLUSTERS = {"ta": [("h100", 40)], "tb": [("l4", 80)], "tc": [("mi300x", 30)], "td": [("a100-mig", 4)]}


def selector_claim(name: str, device_class: str, product: str) -> dict:
    body = gpu_claim(name, device_class=device_class)
    domain = device_class
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["{domain}"].productName == "{product}"'}}]
    return body


def bodies(n: int, prefix: str) -> list[dict]:
    """Claims each of which only one cluster can hold, and some (any NVIDIA GPU) that ta or tb can."""
    rng = random.Random(n)
    out = []
    for i in range(n):
        name, kind = f"{prefix}-{i}", rng.random()
        if kind < 0.25:
            out.append(selector_claim(name, "gpu.nvidia.com", "NVIDIA H100 80GB HBM3"))
        elif kind < 0.5:
            out.append(selector_claim(name, "gpu.nvidia.com", "NVIDIA L4"))
        elif kind < 0.7:
            out.append(gpu_claim(name, device_class="gpu.amd.com"))
        elif kind < 0.9:
            out.append(mig_claim(name))
        else:
            out.append(gpu_claim(name))  # two clusters: its part takes both turns, in ascending order
    return out


def turns_held(app_name: str) -> list[str]:
    """The clusters whose turn a session of ``app_name`` holds (pg_locks shows a bigint advisory key as its
    high and low 32 bits)."""
    keys = {}
    for name in CLUSTERS:
        k = turns.turn_id(name) & 0xFFFFFFFFFFFFFFFF
        keys[(k >> 32, k & 0xFFFFFFFF)] = name
    with connection.cursor() as cur:
        cur.execute("SELECT l.classid::bigint, l.objid::bigint FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                    "WHERE a.application_name = %s AND l.locktype = 'advisory' AND l.granted", [app_name])
        return sorted(keys[row] for row in cur.fetchall() if row in keys)


def overlapping_rounds() -> int:
    """Pairs of allocation rounds that placed claims during a common instant. One worker's rounds follow one
    another, so an overlap is two workers deciding (and committing) at once."""
    spans = sorted((f.timestamp() - s, f.timestamp()) for f, s in AllocationRound.objects.filter(allocated__gt=0)
                   .values_list("finished_at", "seconds"))
    pairs, ends = 0, []
    for start, end in spans:
        ends = [e for e in ends if e > start]
        pairs += len(ends)
        ends.append(end)
    return pairs


def test_workers_place_different_clusters_in_parallel_and_survive_sigkill(admin_client, live_broker):
    load_fleet(CLUSTERS)
    submit(admin_client, bodies(1600, "t"))
    for _ in range(WORKERS):  # every worker starts a task at once: three disjoint batches of every cluster
        allocate_pending.delay()
    deadline = time.monotonic() + 90
    victim, held = None, []
    while not held:  # kill a worker while it holds a cluster's turn (it is deciding or committing that part)
        assert time.monotonic() < deadline, "no worker ever held a turn\n" + live_broker.log_tail()
        if DeviceAllocation.objects.count() < 50:
            time.sleep(0.01)
            continue
        for i in range(WORKERS):
            held = turns_held(live_broker.app_name(i))
            if held:
                victim = i
                break
    live_broker.kill(victim)
    killed_at = timezone.now()
    allocate_pending.delay()  # what beat's periodic retry does for claims the killed worker had taken
    wait_settled(live_broker, timeout=240)

    phases = assert_invariants()
    placed_after = {c: ResourceClaim.objects.filter(cluster=c, allocated_at__gt=killed_at).count() for c in held}
    overlaps = overlapping_rounds()
    print(f"\n1600 claims, 4 clusters, 3 workers (worker {victim} SIGKILLed holding {held}): {phases}, "
          f"{DeviceAllocation.objects.count()} device rows, placed after the kill in {placed_after}, "
          f"{overlaps} overlapping rounds, {ClaimEvent.objects.filter(reason='LostRace').count()} lost races")
    # The killed worker's turns died with its session: the others went on placing claims in those clusters.
    assert all(placed_after.values()), placed_after
    assert overlaps > 0, "the workers never decided at the same time"
    # Demand exceeds every cluster's supply: each ends full (one-device claims, so no hole is left).
    free_by_cluster = {c: n for c, n in free_devices().items() if n}
    assert not free_by_cluster, f"devices left free while claims wait: {free_by_cluster}"
    assert phases[Phase.PENDING] > 0


def free_devices() -> dict[str, int]:
    """Whole GPUs no row holds, per cluster, in the clusters whose every GPU some claim here wants (td's
    partition devices exclude each other by counters, so some are always free there)."""
    with connection.cursor() as cur:
        cur.execute("""SELECT c.name, count(*) FROM inventory_device d JOIN inventory_cluster c ON c.id = d.cluster_id
                       WHERE c.name IN ('ta', 'tb', 'tc') AND d.driver IN ('gpu.nvidia.com', 'gpu.amd.com')
                       AND NOT EXISTS (
                           SELECT 1 FROM claims_deviceallocation a WHERE a.cluster = c.name AND a.pool = d.pool_name
                           AND a.device = d.name) GROUP BY c.name""")
        return dict(cur.fetchall())
