"""Counted costs of a round, so that a later change cannot make them grow silently: the statements one round
sends are the same whether it places 10, 100 or 1,000 claims (take, commit, events, ledger, quota charges and
claim status are set-based), counted on real PostgreSQL twice: with Django's ``CaptureQueriesContext``, and at
the driver (every ``execute``, ``executemany`` and ``COPY`` of psycopg's cursors), which also sees the bulk
writes that bypass Django's cursor (``draservice.bulk``)."""
from __future__ import annotations

from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from claims.models import Phase, ResourceClaim
from claims.services import claims as claim_services
from scheduler.services import allocation
from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = [pytest.mark.django_db, pytest.mark.live]

SIZES = (10, 100, 1000)


@contextmanager
def driver_statements():
    """Every statement psycopg's cursors send (Django's and the raw ones), as a list that fills up."""
    sent: list[str] = []
    originals = {name: getattr(psycopg.Cursor, name) for name in ("execute", "executemany", "copy")}

    def counting(name):
        def send(self, query, *args, **kwargs):
            sent.append(f"{name}: {query}")
            return originals[name](self, query, *args, **kwargs)
        return send

    try:
        for name in originals:
            setattr(psycopg.Cursor, name, counting(name))
        yield sent
    finally:
        for name, original in originals.items():
            setattr(psycopg.Cursor, name, original)


def statements_of_a_round(n: int, prefix: str) -> tuple[int, int]:
    """(statements Django saw, statements the driver sent) for a round that places ``n`` new claims."""
    for start in range(0, n, 1000):
        claim_services.create_claims("team-a", [gpu_claim(f"{prefix}-{i}")
                                                for i in range(start, min(n, start + 1000))])
    with CaptureQueriesContext(connection) as ctx, driver_statements() as sent:
        result = allocation.allocate_round(batch_size=max(SIZES))
    assert (result.taken, result.allocated) == (n, n)
    django = [q["sql"] for q in ctx.captured_queries]
    # A change-log follower whose page comes back empty reads the log's state row for its compaction mark
    # (draservice.changes.Follower._query): one statement or none by whether a read found nothing new, never
    # more with the round's size. Left out of both counts, so that the comparison is of what grows.
    probes = sum(1 for sql in django if sql.startswith(STATE_PROBE))
    return len(django) - probes, len(sent) - probes


STATE_PROBE = 'SELECT "draservice_changelogstate"."id"'


def test_statements_per_round_are_the_same_for_10_100_and_1000_claims():
    load_fleet({"c1": [("h100", 140)]})  # 1,120 GPUs: every claim below is placed
    statements_of_a_round(1, "warm")  # the first round builds the fleet view and the engine
    counts = {n: statements_of_a_round(n, f"r{n}") for n in SIZES}
    assert ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() == 1 + sum(SIZES)
    assert counts[10] == counts[100] == counts[1000], counts
    assert counts[10][1] > counts[10][0]  # the driver saw the bulk writes Django's context does not
