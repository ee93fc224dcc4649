"""A recorded day for the replay pages' tests: queues made through the API (their audit events moved before the
window, as if made the day before), and claims as the claims' history and the usage ledger keep them once the
claims themselves are gone. What happened is known by construction (``HAPPENED``)."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.utils import timezone

from claims.models import ClaimHistory
from draservice.models import AuditEvent
from tests.claims.fleet import gpu_claim, load_fleet
from tests.queues.conftest import queue_body
from usage.models import UsageInterval

NODE = "c1-h100-000"  # load_fleet's one 8-GPU node
HOUR = 3600
# (queue, claim, GPUs, its first GPU, arrival and start and end in hours from the window's start)
CLAIMS = [("a", "a-burst", 8, 0, 0, 0, 4), ("b", "b-big", 4, 0, 1, 4, 6), ("b", "b-small", 2, 4, 2, 4, 5)]
# What happened, per queue, as the replay's "actual" figures must say: waits p50/p95 in seconds,
# device-hours (a: 8 GPUs x 4 h; b: 4 x 2 h + 2 x 1 h) and their shares of the 42 device-hours.
HAPPENED = {"a": {"waitP50Seconds": 0.0, "waitP95Seconds": 0.0, "deviceHours": 32.0, "shareOfDeviceHours": 0.7619,
                  "preemptions": 0, "claims": 1, "started": 1},
            "b": {"waitP50Seconds": 2.5 * HOUR, "waitP95Seconds": 3.0 * HOUR, "deviceHours": 10.0,
                  "shareOfDeviceHours": 0.2381, "preemptions": 0, "claims": 2, "started": 2}}


def recorded_day(client, more_queues: int = 0) -> tuple[datetime, datetime]:
    """Queues a and b (nominal 4 GPUs each) on one 8-GPU node and ``CLAIMS``; with ``more_queues``, as many
    more queues with one one-GPU claim each (eight at a time, for an hour each, from the window's start + 6 h).
    Returns the window (a day, three days ago)."""
    load_fleet({"c1": [("h100", 1)]})
    start = timezone.now().replace(microsecond=0) - timedelta(days=3)
    claims = list(CLAIMS) + [(f"q{i:02d}", f"q{i:02d}-one", 1, i % 8, 6 + i // 8, 6 + i // 8, 7 + i // 8)
                             for i in range(more_queues)]
    for name in dict.fromkeys(q for q, *_ in claims):
        body = queue_body(name, namespaces=[f"team-{name}"], gpus=4)
        assert client.post("/api/v1/queues", body, format="json").status_code == 201
    AuditEvent.objects.filter(kind="Queue").update(at=start - timedelta(days=1))
    for queue, name, gpus, first, arrival, began, ended in claims:
        uid = uuid.uuid4()
        ClaimHistory.objects.create(claim_uid=uid, namespace=f"team-{queue}", claim_name=name, labels={},
                                    spec=gpu_claim(name, gpus)["spec"], created_at=start + timedelta(hours=arrival))
        UsageInterval.objects.bulk_create([
            UsageInterval(claim_id=0, claim_uid=uid, claim_name=name, namespace=f"team-{queue}", queue=queue,
                          cluster="c1", node=NODE, driver="gpu.nvidia.com", pool=NODE, device=f"gpu-{i}",
                          sharing="exclusive", weight=1, started_at=start + timedelta(hours=began),
                          ended_at=start + timedelta(hours=ended)) for i in range(first, first + gpus)])
    return start, start + timedelta(days=1)
