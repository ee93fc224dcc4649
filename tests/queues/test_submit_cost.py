"""What queues add to the submission path stays small and does not grow with the queue (issues 14 and 15).

A single POST of a claim answers with its queue but does not rank the queue (its ``positionInQueue`` is a
read's: GET, list); its queries are as many with a long queue as with none. A commit into a queue without
quota entries (the default queue alone, the common case) does not read the queues' usage.
"""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queues.models import QuotaCharge
from scheduler.services.allocation import allocate_round
from tests.queues.test_admission import ns, submit

pytestmark = pytest.mark.django_db


def _post(client, name: str) -> tuple[dict, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        body = submit(client, "ci", name)
    return body, [q["sql"] for q in ctx.captured_queries]


def test_a_post_does_not_rank_the_queue_and_costs_the_same_with_a_long_queue(admin_client, h100_fleet):
    _post(admin_client, "warm")  # the namespace's first claim creates it; caches (device classes) fill
    _, short = _post(admin_client, "first")
    for i in range(40):
        submit(admin_client, "ci", f"queued{i}")
    body, long = _post(admin_client, "last")
    # Savepoint, the pending-claims cap's one bounded COUNT (claims.services.caps), the insert, the queues.
    assert len(long) == len(short) <= 4, long
    assert sum("COUNT(" in sql.upper() for sql in long) == 1, long
    assert not any("ROW_NUMBER" in sql.upper() for sql in long), long
    assert body["status"]["queue"] == "default" and "positionInQueue" not in body["status"]
    # A read ranks it: everything submitted before it is ahead.
    got = admin_client.get(f"{ns('ci')}/resourceclaims/last").json()["status"]
    assert got["queue"] == "default" and got["positionInQueue"] == 43


def test_a_batch_answer_gives_the_queue_without_ranking(admin_client, h100_fleet):
    items = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"b{i}"},
              "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
             for i in range(3)]
    with CaptureQueriesContext(connection) as ctx:
        resp = admin_client.post(f"{ns('ci')}/resourceclaims/batch", {"items": items}, format="json")
    assert resp.status_code == 201, resp.content
    assert [c["status"]["queue"] for c in resp.json()["items"]] == ["default"] * 3
    assert not any("ROW_NUMBER" in q["sql"].upper() for q in ctx.captured_queries)


def test_committing_into_a_queue_without_quota_does_not_read_usage(admin_client, h100_fleet):
    for i in range(3):
        submit(admin_client, "ci", f"c{i}")
    with CaptureQueriesContext(connection) as ctx:
        assert allocate_round().allocated == 3
    sqls = [q["sql"] for q in ctx.captured_queries]
    assert not any("SUM(" in s.upper() and "queues_quotacharge" in s for s in sqls), sqls
    # Charged all the same (the default queue's usage is what a later quota counts).
    assert sorted(QuotaCharge.objects.values_list("queue__name", "amount")) == [("default", 1)] * 3
