"""scheduler.services.turns without workers: how a round's groups are split into parts, and turns between two
database sessions."""
from __future__ import annotations

import time

import pytest
from django.db import connection, connections

from claims.models import DeviceAllocation, Phase, ResourceClaim
from scheduler.services import allocation, turns
from tests.claims.fleet import gpu_claim, load_fleet
from tests.claims.race import submit

CLUSTERS = {"h": ["ta"], "l": ["tb"], "m": ["tc"], "any": ["tb", "ta"], "none": [], "mig": ["td"]}


def parts(order: list[str]) -> list[tuple[tuple[str, ...], list[str]]]:
    return [(p.clusters, p.groups) for p in turns.partition(order, lambda g: CLUSTERS[g])]


def test_each_cluster_is_a_part_of_its_own_in_queue_order():
    assert parts(["h", "l", "m", "mig", "none"]) == [
        (("ta",), ["h"]), (("tb",), ["l"]), (("tc",), ["m"]), (("td",), ["mig"]), ((), ["none"])]


def test_a_group_that_may_use_several_clusters_joins_their_parts():
    assert parts(["m", "h", "none", "l", "any", "h"]) == [
        (("tc",), ["m"]), (("ta", "tb"), ["h", "l", "any", "h"]), ((), ["none"])]


def test_groups_whose_admission_reads_quota_share_one_part_in_queue_order():
    joined = turns.partition(["h", "l", "m", "h"], lambda g: CLUSTERS[g], lambda g: g in ("h", "m"))
    assert [(p.clusters, p.groups) for p in joined] == [(("ta", "tc"), ["h", "m", "h"]), (("tb",), ["l"])]


@pytest.mark.django_db(transaction=True)
def test_a_turn_is_held_by_one_session_until_released():
    other = connections.create_connection("default")
    try:
        assert turns.try_take(("ta", "tb"))
        with other.cursor() as cursor:  # another worker's session
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [turns.turn_id("tb")])
            assert cursor.fetchone()[0] is False
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [turns.turn_id("tc")])
            assert cursor.fetchone()[0] is True
        assert not turns.try_take(("tc",))
        turns.release(("ta", "tb"))
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [turns.turn_id("tb")])
            assert cursor.fetchone()[0] is True
    finally:
        other.close()


def holds_turn(conn, cluster: str) -> bool:
    """Whether ``conn``'s session holds ``cluster``'s turn (pg_locks shows a bigint key as two 32-bit halves)."""
    key = turns.turn_id(cluster) & 0xFFFFFFFFFFFFFFFF
    with conn.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                       "AND pid = pg_backend_pid() AND classid::bigint = %s AND objid::bigint = %s",
                       [key >> 32, key & 0xFFFFFFFF])
        return cursor.fetchone()[0] > 0


@pytest.mark.django_db
def test_a_part_whose_turn_stays_busy_is_handed_back_and_other_clusters_are_placed(admin_client, settings):
    """A worker that hangs holding a cluster's turn (stopped, not dead: its session lives) must not stall the
    others: a waiting worker gives up after CLAIMS_TURN_WAIT_SECONDS, hands that part back undecided, and still
    places the other clusters' claims; once the turn is free the handed-back claim is placed."""
    settings.CLAIMS_CLUSTER_TURNS = True
    settings.CLAIMS_TURN_WAIT_SECONDS = 0.5
    load_fleet({"ta": [("h100", 1)], "tb": [("mi300x", 1)]})
    submit(admin_client, [gpu_claim("on-ta", device_class="gpu.nvidia.com"),
                          gpu_claim("on-tb", device_class="gpu.amd.com")])
    hung = connections.create_connection("default")
    try:
        with hung.cursor() as cursor:  # the hung worker's session, holding ta's turn
            cursor.execute("SELECT pg_advisory_lock(%s)", [turns.turn_id("ta")])
        assert holds_turn(hung, "ta")
        started = time.monotonic()
        result = allocation.allocate_round()
        waited = time.monotonic() - started
        by_name = {c.name: c for c in ResourceClaim.objects.all()}
        assert by_name["on-tb"].phase == Phase.ALLOCATED
        assert by_name["on-ta"].phase == Phase.PENDING
        assert by_name["on-ta"].reason == "Deferred"
        assert by_name["on-ta"].taken_until is None  # handed back: any worker may take it now
        assert result.should_retry_soon
        assert 0.5 <= waited < 10, waited
        assert not holds_turn(connection, "ta")  # no turn kept by the timed-out wait
        assert DeviceAllocation.objects.filter(cluster="ta").count() == 0
    finally:
        hung.close()  # the hung worker dies at last: its turn goes with its session
    allocation.allocate_round()
    assert ResourceClaim.objects.get(name="on-ta").phase == Phase.ALLOCATED


@pytest.mark.django_db
def test_a_timed_out_wait_keeps_none_of_the_turns_it_took_before_the_busy_one():
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [turns.turn_id("tb")])
        assert turns.take(("ta", "tb"), timeout=0.2) is False  # ta is taken first (ascending), then tb waits
        assert not holds_turn(connection, "ta") and not holds_turn(connection, "tb")
        with connection.cursor() as cursor:  # the session is usable: the timeout was scoped to the wait
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] in ("0", "2s")
    finally:
        other.close()
    assert turns.take(("ta", "tb"), timeout=0.2) is True
    assert holds_turn(connection, "ta") and holds_turn(connection, "tb")
    turns.release(("ta", "tb"))
