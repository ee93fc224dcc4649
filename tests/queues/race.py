"""The quota race, shared by the serialized and the racing worker modules: several real Celery workers
allocate for three queues at once, with releases churning, and quota must hold at every moment's end."""
from __future__ import annotations

import random
import threading
import time

from django.db import connections
from django.db.models import Count, Sum

from claims.dispatch import ALLOCATE_TASK
from claims.models import DeviceAllocation, Phase, ResourceClaim
from draservice.celery import app
from queues.models import QuotaCharge
from tests.claims.fleet import gpu_claim, load_fleet
from tests.claims.race import wait_settled
from tests.queues.conftest import queue_body

# 4 clusters x 5 nodes x 8 H100 = 160 GPUs; team-a may hold 30, team-b 20 + 10 borrowed; default takes the
# rest. Claims are pinned round-robin to the clusters, so that concurrent commits use disjoint devices (else the
# per-device locks alone would serialize them, and the quota locks would not be what is tested).
CLUSTERS = 4
NODES = 5
LIMITS = {"qa": 30, "qb": 30}


def setup_queues(client) -> None:
    load_fleet({f"c{i}": [("h100", NODES)] for i in range(CLUSTERS)})
    for body in (queue_body("team-a", namespaces=["qa"], gpus=30, borrowing=0),
                 queue_body("team-b", namespaces=["qb"], gpus=20, borrowing=10)):
        assert client.post("/api/v1/queues", body, format="json").status_code == 201


def held(namespace: str) -> int:
    return DeviceAllocation.objects.filter(claim__namespace__name=namespace, claim__phase=Phase.ALLOCATED).count()


def run_race(client, pool, n: int = 240) -> None:
    rng = random.Random(n)
    # The default queue ("qc") asks for at most ~80 GPUs: with the teams' 60 the fleet never runs out, so what
    # holds the teams back is their quota alone (not a full fleet: that would be preemption's business).
    sizes = {"qa": n, "qb": n, "qc": n // 4}
    bodies = {ns: [gpu_claim(f"{ns}-{i}", count=rng.choice((1, 1, 2)),
                             annotations={"draservice.io/allowed-clusters": f"name=c{i % CLUSTERS}"})
                   for i in range(sizes[ns])] for ns in ("qa", "qb", "qc")}
    stop = threading.Event()
    peaks: dict[str, int] = {"qa": 0, "qb": 0}

    def churn():
        # Release admitted claims while the workers admit: freed quota is raced for too. Watch the peak.
        try:
            while not stop.is_set():
                for ns in ("qa", "qb"):
                    peaks[ns] = max(peaks[ns], held(ns))
                    # A few at once: several workers then race for the freed quota (small rounds, below).
                    for name in (ResourceClaim.objects.filter(namespace__name=ns, phase=Phase.ALLOCATED)
                                 .order_by("?").values_list("name", flat=True)[:rng.randint(0, 4)]):
                        client.post(f"/api/v1/namespaces/{ns}/resourceclaims/{name}/release")
                for _ in range(8):
                    app.send_task(ALLOCATE_TASK, kwargs={"batch_size": 2})
                time.sleep(0.1)
        finally:
            connections.close_all()

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for start in range(0, n, 60):
            for ns, items in bodies.items():
                if items[start:start + 60]:
                    resp = client.post(f"/api/v1/namespaces/{ns}/resourceclaims/batch",
                                       {"items": items[start:start + 60]}, format="json")
                    assert resp.status_code == 201, resp.content[:500]
            # Many small rounds at once, so that every worker commits while the others do.
            for _ in range(4 * len(bodies)):
                app.send_task(ALLOCATE_TASK, kwargs={"batch_size": 6})
            time.sleep(0.3)
        time.sleep(4)  # churn goes on for a while: quota freed and raced for, again and again
    finally:
        stop.set()
        churner.join(30)
    wait_settled(pool, timeout=180)
    check(peaks)


def check(peaks: dict[str, int]) -> None:
    for ns, limit in LIMITS.items():
        assert held(ns) <= limit, (ns, held(ns))
        assert peaks[ns] <= limit, (ns, peaks)
        # Quota is used, not just respected: every 1-GPU claim still pending means the queue is full.
        pending_ones = ResourceClaim.objects.filter(namespace__name=ns, phase=Phase.PENDING,
                                                    reason="WaitingForQuota").count()
        assert pending_ones and held(ns) >= limit - 1, (ns, held(ns), pending_ones)
    # Charges are exactly what the admitted claims hold; claims not allocated hold nothing.
    rows = dict(DeviceAllocation.objects.filter(claim__phase=Phase.ALLOCATED).values("claim_id")
                .annotate(n=Count("id")).values_list("claim_id", "n"))
    charged = dict(QuotaCharge.objects.filter(claim__phase=Phase.ALLOCATED, unit="devices").values("claim_id")
                   .annotate(n=Sum("amount")).values_list("claim_id", "n"))
    assert {k: int(v) for k, v in charged.items()} == rows
    assert not DeviceAllocation.objects.exclude(claim__phase=Phase.ALLOCATED).exists()
    # The default queue borrowed what the teams could not use.
    assert held("qc") > 0
