"""The change log: every claim write lands in it (by trigger, whatever the write path), watches read it in
seq order and stop at a gap until it is settled, retention gives 410."""
from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from claims.models import ResourceClaim
from claims.services import claims as claim_services
from draservice import changes
from draservice.models import Change
from tests.claims import fleet

NS = "team-a"
# Real commits: a change is settled only once its writer has ended, which a test-wide transaction never does.
pytestmark = pytest.mark.django_db(transaction=True)


def head() -> int:
    """The settled watermark, past seqs that earlier tests' rolled-back or truncated rows left behind."""
    changes.seal()
    return changes.seal()


def claim_body(name: str) -> dict:
    return fleet.gpu_claim(name)


@pytest.fixture
def device_class(db):
    fleet.load_device_classes()


def test_create_edit_delete_are_logged_with_the_objects_change_seq(device_class):
    start = head()
    claim = claim_services.create_claims(NS, [claim_body("a")])[0]
    claim.refresh_from_db()
    rows = list(Change.objects.filter(seq__gt=start).order_by("seq"))
    # Created, then (the in-process round ran at commit) attempted: each change of resource_version is logged.
    assert (rows[0].resource, rows[0].namespace, rows[0].name, rows[0].type) == ("resourceclaims", NS, "a", "ADDED")
    assert all(r.type == "MODIFIED" for r in rows[1:])
    assert claim.change_seq == rows[-1].seq
    # Bookkeeping that leaves resource_version alone is not a change, and keeps change_seq.
    ResourceClaim.objects.filter(id=claim.id).update(taken_until=None, change_seq=1)
    assert Change.objects.filter(seq__gt=start).count() == len(rows)
    claim.refresh_from_db()
    assert claim.change_seq == rows[-1].seq
    claim_services.update_claim(claim.id, {**claim_body("a"), "metadata": {"name": "a", "labels": {"x": "1"}}})
    claim_services.delete_claim(claim.id)
    rows = list(Change.objects.filter(seq__gt=start).order_by("seq"))
    assert [r.type for r in rows][:2] == ["ADDED", "MODIFIED"] and rows[-1].type == "DELETED"
    assert rows[-1].tombstone["name"] == "a" and rows[-1].tombstone["labels"] == {"x": "1"}
    assert changes.settled() == rows[-1].seq


def test_cursor_reads_in_order_filtered_by_resource_and_namespace(device_class):
    start = head()
    claim_services.create_claims(NS, [claim_body("a"), claim_body("b")])
    claim_services.create_claims("team-b", [claim_body("c")])
    cursor = changes.Cursor(start)
    got = cursor.read({"resourceclaims"}, NS)
    assert [(c.name, c.type) for c in got][:2] == [("a", "ADDED"), ("b", "ADDED")]
    assert {c.name for c in got} == {"a", "b"} and [c.seq for c in got] == sorted(c.seq for c in got)
    assert cursor.seq == head()  # team-b's change was passed over, not left behind
    assert cursor.read({"resourceclaims"}, NS) == []


def test_retention_compacts_and_expired_positions_are_refused(device_class):
    claim_services.create_claims(NS, [claim_body("a"), claim_body("b")])
    last = head()
    Change.objects.update(at=Change.objects.first().at - timedelta(hours=2))
    assert changes.compact(timedelta(hours=1)) >= 2
    with pytest.raises(changes.Expired):
        changes.check_not_expired(last - 1)
    changes.check_not_expired(last)  # nothing newer than head was removed


def test_a_gap_in_flight_holds_the_watch_until_its_writer_ends(device_class):
    """Writer A takes a seq and stays open; B commits a later seq. A watch must not pass A's seq (it would
    never see A's change); once A commits, both arrive in order. A rollback's seq is skipped once settled."""
    from django.conf import settings

    start = head()
    db = settings.DATABASES["default"]
    dsn = f"host={db['HOST']} port={db['PORT'] or 5432} user={db['USER']} dbname={db['NAME']}"
    ns_id = claim_services.get_namespace_for_write(NS).id
    insert = ("INSERT INTO claims_resourceclaim (namespace_id, name, uid, resource_version, labels, annotations, "
              "spec, source_api_version, preferred_cluster, phase, reason, message, conditions, cluster, node, "
              "attempts, created_at, updated_at) VALUES (%s, %s, gen_random_uuid(), 1, '{}', '{}', '{}', "
              "'resource.k8s.io/v1', '', 'Pending', '', '', '[]', '', '', 0, now(), now())")
    with psycopg.connect(dsn) as a, psycopg.connect(dsn, autocommit=True) as b:
        a.execute(insert, (ns_id, "slow"))
        b.execute(insert, (ns_id, "fast"))
        cursor = changes.Cursor(start)
        assert cursor.read({"resourceclaims"}) == []  # "fast" is visible but waits behind "slow"'s seq
        assert cursor.read({"resourceclaims"}) == []
        a.commit()
    got = cursor.read({"resourceclaims"})
    assert [c.name for c in got] == ["slow", "fast"]
    with psycopg.connect(dsn) as a, psycopg.connect(dsn, autocommit=True) as b:
        a.execute(insert, (ns_id, "rolled-back"))
        b.execute(insert, (ns_id, "after"))
        assert cursor.read({"resourceclaims"}) == []
        a.rollback()
    got = cursor.read({"resourceclaims"})  # the gap's writer has ended: its seq is settled
    assert [c.name for c in got] == ["after"]
    connection.close()
