"""What queues add to the submission path stays small and does not grow with the queue (issues 14, 15 and 32).

A single POST of a claim answers with its queue but does not rank the queue (its ``positionInQueue`` is a
read's: GET, list); its queries are as many with a long queue as with none, and it does not read the queues:
the web process keeps them per fleet state (``resolve.Tree.at``), which every queue write moves, a rolled-back
one too. A commit into a queue without quota entries (the default queue alone, the common case) does not read
the queues' usage.
"""
from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from claims.services import insert
from draservice import bulk
from queues.models import QuotaCharge
from scheduler.services.allocation import allocate_round
from tests.queues.conftest import queue_body
from tests.queues.test_admission import Q, make, ns, submit

pytestmark = pytest.mark.django_db


def _post(client, name: str, monkeypatch) -> tuple[dict, list[str]]:
    """The answer and every statement of the POST: Django's and those sent on psycopg directly (the insert)."""
    raw: list[str] = []
    execute = bulk.pg_execute

    def counted(sql, params):
        raw.append(sql)
        return execute(sql, params)

    monkeypatch.setattr(insert, "pg_execute", counted)
    with CaptureQueriesContext(connection) as ctx:
        body = submit(client, "ci", name)
    return body, [q["sql"] for q in ctx.captured_queries] + raw


def test_a_post_does_not_rank_the_queue_and_costs_the_same_with_a_long_queue(admin_client, h100_fleet,
                                                                             monkeypatch):
    _post(admin_client, "warm", monkeypatch)  # the namespace's first claim creates it; caches fill
    _, short = _post(admin_client, "first", monkeypatch)
    for i in range(40):
        submit(admin_client, "ci", f"queued{i}")
    body, long = _post(admin_client, "last", monkeypatch)
    # The test's savepoint and its release, and the insert, which counts the pending claims against the
    # pending-claims cap (claims.services.caps) in its own statement; the queues are not read.
    assert len(long) == len(short) == 3, long
    assert sum("COUNT(" in sql.upper() for sql in long) == 1 and "COUNT(" in long[-1].upper(), long
    assert not any("queues_queue" in sql for sql in long), long
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


def test_a_post_answers_with_the_queue_a_queue_write_just_made_even_after_a_rollback(admin_client, h100_fleet):
    assert submit(admin_client, "ci", "before")["status"]["queue"] == "default"
    make(admin_client, queue_body("ci-queue", namespaces=["ci"]))  # moves the fleet version
    assert submit(admin_client, "ci", "after")["status"]["queue"] == "ci-queue"
    # A queue write rolled back, a claim answered in between: the fleet version is back where it was and moves
    # to the same number again with the next write, which the answer must not mistake for it.
    with pytest.raises(RuntimeError), transaction.atomic():
        unlisted = admin_client.patch(f"{Q}/ci-queue", {"spec": {"namespaces": []}}, format="json")
        assert unlisted.status_code == 200, unlisted.content
        assert submit(admin_client, "ci", "rolled-back")["status"]["queue"] == "default"
        raise RuntimeError("roll back")
    assert admin_client.patch(f"{Q}/ci-queue", {"spec": {"weight": 2}}, format="json").status_code == 200
    assert submit(admin_client, "ci", "again")["status"]["queue"] == "ci-queue"
