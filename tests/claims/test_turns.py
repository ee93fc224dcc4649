"""claims.services.turns without workers: how a round's groups are split into parts, and turns between two
database sessions."""
from __future__ import annotations

import pytest
from django.db import connections

from claims.services import turns

CLUSTERS = {"h": ["ta"], "l": ["tb"], "m": ["tc"], "any": ["tb", "ta"], "none": [], "mig": ["td"]}


def parts(order: list[str]) -> list[tuple[tuple[str, ...], list[str]]]:
    return [(p.clusters, p.groups) for p in turns.partition(order, lambda g: CLUSTERS[g])]


def test_each_cluster_is_a_part_of_its_own_in_queue_order():
    assert parts(["h", "l", "m", "mig", "none"]) == [
        (("ta",), ["h"]), (("tb",), ["l"]), (("tc",), ["m"]), (("td",), ["mig"]), ((), ["none"])]


def test_a_group_that_may_use_several_clusters_joins_their_parts():
    assert parts(["m", "h", "none", "l", "any", "h"]) == [
        (("tc",), ["m"]), (("ta", "tb"), ["h", "l", "any", "h"]), ((), ["none"])]


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
