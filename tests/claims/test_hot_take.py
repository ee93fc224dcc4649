"""A round's take (``taken_until``/``taken_by``, columns no index covers) updates its claims in place where the
page has room: the claims table keeps a fifth of each page free (migration 0021), and an update that stays on its
page (a heap-only tuple) adds nothing to the table's dozen indexes. Real PostgreSQL, its own counters."""
from __future__ import annotations

import pytest
from django.db import connection, transaction

from claims.services import claims as claim_services
from claims.services import taking
from tests.claims.deferred import deferred
from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

CLAIMS = 200
ROUND = 20


def updates() -> tuple[int, int]:
    """(updates, heap-only updates) of the claims table, this backend's included."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # flushed when the backend is next idle
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                       "WHERE relname = 'claims_resourceclaim'")
        return cursor.fetchone()


def test_a_take_updates_its_claims_in_place():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's heap-only tuples")
    load_fleet({"c1": [("h100", 1)]})
    before = updates()
    taken = 0
    for start in range(0, CLAIMS, ROUND):  # claims POSTed one by one, taken a round's worth at a time
        with deferred():  # pending and never attempted: all of them eligible for the take
            for i in range(start, start + ROUND):
                claim_services.create_claims("team-a", [gpu_claim(f"c-{i}")])
        with transaction.atomic():
            taken += len(taking.take(ROUND)[0])
    assert taken == CLAIMS
    after = updates()
    updated, in_place = after[0] - before[0], after[1] - before[1]
    # A fifth of each page kept free holds the new version of about one row in four of a page filled at once
    # (in the service's steady state more: releases leave dead versions that the page's pruning reclaims, and
    # the soak's takes were nearly all in place); on full pages none is.
    assert updated >= CLAIMS and in_place >= 0.25 * updated, (updated, in_place)
