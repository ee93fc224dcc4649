"""The compiled-once claim reads (draservice.prepared) load what the ORM querysets they replace load (a claim's
reservations read only when it has some), and a release, which reads the claim once (locked, by name) and
answers without reading it again, answers what a read after it would."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from claims.api import serializers as s
from claims.models import ResourceClaim
from draservice.prepared import Prepared
from tests.claims.fleet import gpu_claim

NS = "/api/v1/namespaces/team-a"


def _orm(name: str) -> ResourceClaim:
    return s.claims_queryset(ResourceClaim.objects).get(namespace__name="team-a", name=name)


def test_load_claim_matches_the_orm_with_owner_and_reservations(admin_client, small_fleet):
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
                "spec": {"spec": gpu_claim("x")["spec"]}}
    assert admin_client.post(f"{NS}/resourceclaimtemplates", template, format="json").status_code == 201
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("plain", labels={"a": "b"}),
                             format="json").status_code == 201
    consumer = {"kind": "Consumer", "metadata": {"name": "pod"}, "spec": {"resourceClaims": [
        {"name": "made", "resourceClaimTemplateName": "t"}, {"name": "shared", "resourceClaimName": "plain"}]}}
    resp = admin_client.post(f"{NS}/consumers", consumer, format="json")
    assert resp.status_code == 201, resp.content
    made = next(x["resourceClaimName"] for x in resp.json()["status"]["resourceClaimStatuses"]
                if x["name"] == "made")
    for name in ("plain", made):
        fast, slow = s.load_claim("team-a", name), _orm(name)
        assert {f.attname: getattr(fast, f.attname) for f in ResourceClaim._meta.concrete_fields} == \
            {f.attname: getattr(slow, f.attname) for f in ResourceClaim._meta.concrete_fields}
        assert fast.namespace.name == "team-a"
        assert [(r.consumer.name, r.entry) for r in fast.reservations.all()] == [("pod", "made" if name == made
                                                                                   else "shared")]
        assert s.render_claim(fast, list(fast.reservations.all())) == \
            s.render_claim(slow, list(slow.reservations.all()))
    assert s.load_claim("team-a", made).owner.name == "pod"
    assert s.load_claim("team-a", "plain").owner is None
    assert s.load_claim("team-a", "missing") is None
    assert s.load_claim("team-b", "plain") is None
    assert s.claim_phase(_orm("plain").pk) == "Pending"


def test_a_stand_in_must_reach_the_parameters_once(db):
    with pytest.raises(ValueError, match="stand-in 0 appears 0 times"):
        Prepared(lambda name: ResourceClaim.objects.filter(name__startswith=name), ("\x00n",)).rows("x")


def test_release_answers_the_claim_as_a_read_after_it_does(admin_client, small_fleet):
    from scheduler.services import allocation

    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("held", labels={"a": "b"}),
                             format="json").status_code == 201
    consumer = {"kind": "Consumer", "metadata": {"name": "pod"}, "spec": {"resourceClaims": [
        {"name": "held", "resourceClaimName": "held"}]}}
    assert admin_client.post(f"{NS}/consumers", consumer, format="json").status_code == 201
    assert allocation.allocate_round().taken == 1
    assert admin_client.get(f"{NS}/resourceclaims/held").json()["status"]["phase"] == "Allocated"
    released = admin_client.post(f"{NS}/resourceclaims/held/release")
    assert released.status_code == 200, released.content
    read = admin_client.get(f"{NS}/resourceclaims/held")
    assert released.json()["status"]["phase"] == "Released"
    assert released.json() == read.json() and released["ETag"] == read["ETag"]
    assert released.json()["status"]["reservedFor"][0]["name"] == "pod"
    again = admin_client.post(f"{NS}/resourceclaims/held/release")  # a no-op: the same answer
    assert again.status_code == 200 and again.json() == read.json()


def _sqls(fn) -> tuple[object, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        out = fn()
    return out, [q["sql"] for q in ctx.captured_queries]


def _reads_of(table: str, sqls: list[str], where: str = "") -> list[str]:
    """Reads of ``table``'s rows (not subqueries of other reads that mention it)."""
    return [q for q in sqls if q.lstrip().startswith(f'SELECT "{table}".') and where in q]


BY_NAME = '"claims_resourceclaim"."name" = '


def test_a_read_asks_for_reservations_only_when_the_claim_has_some(admin_client, small_fleet):
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("alone"), format="json").status_code == 201
    resp, sqls = _sqls(lambda: admin_client.get(f"{NS}/resourceclaims/alone"))
    assert resp.status_code == 200 and "reservedFor" not in resp.json()["status"]
    assert len(_reads_of("claims_resourceclaim", sqls, BY_NAME)) == 1, sqls
    assert not _reads_of("claims_reservation", sqls), sqls
    # Its queue is resolved at the fleet stamp its read carries: the queues the POST read at it serve.
    assert not [q for q in sqls if 'FROM "queues_queue" ' in q], sqls
    assert s.render_claim(s.load_claim("team-a", "alone"), []) == s.render_claim(_orm("alone"), [])
    consumer = {"kind": "Consumer", "metadata": {"name": "pod"}, "spec": {"resourceClaims": [
        {"name": "alone", "resourceClaimName": "alone"}]}}
    assert admin_client.post(f"{NS}/consumers", consumer, format="json").status_code == 201
    resp, sqls = _sqls(lambda: admin_client.get(f"{NS}/resourceclaims/alone"))
    assert [r["name"] for r in resp.json()["status"]["reservedFor"]] == ["pod"]
    assert len(_reads_of("claims_reservation", sqls)) == 1, sqls


def test_a_release_reads_the_claim_once_and_answers_as_a_read_after_it(admin_client, small_fleet, monkeypatch):
    from claims.services import claims as claim_services
    from scheduler.services import allocation

    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("one"), format="json").status_code == 201
    assert allocation.allocate_round().taken == 1
    # Statements on psycopg's cursor (draservice.bulk.pg_execute), which Django's capture does not see.
    written: list[str] = []
    pg_execute = claim_services.pg_execute
    monkeypatch.setattr(claim_services, "pg_execute",
                        lambda sql, params: written.append(sql) or pg_execute(sql, params))
    released, sqls = _sqls(lambda: admin_client.post(f"{NS}/resourceclaims/one/release"))
    assert released.status_code == 200, released.content
    claim_reads = _reads_of("claims_resourceclaim", sqls)
    assert len(claim_reads) == 1 and BY_NAME in claim_reads[0] and "FOR UPDATE" in claim_reads[0], sqls
    assert not _reads_of("claims_reservation", sqls), sqls  # nothing reserved it: its read says so
    # Two statements in all: the locked read (which carries the fleet stamp the answer's queue is resolved at:
    # no read of the queues), then the row, its event, the freed rows and the wake counters in one.
    statements = [q for q in sqls if "SAVEPOINT" not in q]
    assert len(statements) == 1 and "claims_fleetstate" in statements[0], [q[:90] for q in statements]
    assert len(written) == 1, written
    assert all(f'"{table}"' in written[0] for table in ("claims_resourceclaim", "claims_claimevent",
                                                        "claims_freedcount", "claims_deviceallocation")), written
    read = admin_client.get(f"{NS}/resourceclaims/one")
    assert released.json() == read.json() and released["ETag"] == read["ETag"]
    assert read.json()["status"]["phase"] == "Released"
    assert admin_client.post(f"{NS}/resourceclaims/missing/release").status_code == 404
