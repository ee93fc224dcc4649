"""Kubernetes shapes out: ResourceClaim, ResourceClaimTemplate, Consumer, their lists, events.

Objects are rendered from model rows by plain functions (they are Kubernetes JSON, not model fields); the
DRF serializers below exist to document request and response bodies in the OpenAPI schema.
"""
from __future__ import annotations

from django.db.models import Exists, OuterRef
from rest_framework import serializers

from claims import claims_sql, k8s
from claims.models import (
    ClaimEvent,
    Consumer,
    Phase,
    Reservation,
    ResourceClaim,
    ResourceClaimTemplate,
    UtilisationSnapshot,
)
from claims.services import queueing
from claims.services.consumers import API_VERSION as CONSUMER_API_VERSION
from dra.k8s.fields import ts
from draservice.prepared import Prepared, set_prefetched


def queue_status(claims: list, estimate: bool = False, position: bool = True,
                 stamp: str | None = None) -> dict[int, dict]:
    """Queue fields of ``claims``' status (queue, positionInQueue, estimate), from the queues app (this door
    renders above it). ``estimate``: also the start-time estimate (costlier: a single claim's read asks for
    it, lists and create answers do not); ``position``: also ``positionInQueue`` (a window over the queue's
    pending claims: reads ask for it, create answers do not -- a claim just created joins its queue's tail,
    and ranking the whole queue on every POST made submission cost grow with the queue); ``stamp``: see
    ``queueing.queue_status``."""
    return queueing.queue_status(claims, estimate, position, stamp)


def _metadata(obj, namespace: str) -> dict:
    meta = {"name": obj.name, "namespace": namespace, "uid": str(obj.uid),
            "resourceVersion": str(obj.resource_version), "generation": 1,
            "creationTimestamp": ts(obj.created_at)}
    if obj.labels:
        meta["labels"] = obj.labels
    if obj.annotations:
        meta["annotations"] = obj.annotations
    return meta


PREEMPTION_FIELDS = ("stopBy", "forceAt", "confirmedAt", "confirmedBy")  # status.preemption (the rest is internal)


def render_claim(claim: ResourceClaim, reservations: list | None = None, queue: dict | None = None,
                 estimate: bool = False) -> dict:
    """``reservations``: the claim's Reservation rows with their consumers (prefetched by the caller);
    ``queue``: its queue status fields (``queue_status``), looked up when not given (with the start-time
    estimate when ``estimate``: a read of this one claim)."""
    meta = _metadata(claim, claim.namespace.name)
    owner = claim.owner if claim.owner_id else None
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": CONSUMER_API_VERSION, "kind": "Consumer", "name": owner.name,
                                    "uid": str(owner.uid), "controller": True}]
    status: dict = {}
    if claim.allocation:
        status["allocation"] = claim.allocation  # exactly what the engine computed
    if reservations is None:
        reservations = list(claim.reservations.select_related("consumer"))
    if reservations:
        status["reservedFor"] = [{"apiGroup": "draservice.io", "resource": "consumers", "name": r.consumer.name,
                                  "uid": str(r.consumer.uid)} for r in reservations]
    status["phase"] = str(claim.phase)
    if claim.reason:
        status["reason"] = claim.reason
    if claim.message:
        status["message"] = claim.message
    if claim.cluster:
        status["cluster"] = claim.cluster
    if claim.node:
        status["node"] = claim.node
    if claim.conditions:
        status["conditions"] = claim.conditions
    status["attempts"] = claim.attempts
    for key, value in (("lastAttemptTime", claim.last_attempt_at), ("allocatedTime", claim.allocated_at),
                       ("releasedTime", claim.released_at)):
        if value:
            status[key] = ts(value)
    if claim.lease_seconds:
        status["lease"] = {"leaseDurationSeconds": claim.lease_seconds, "expireTime": ts(claim.lease_expires_at),
                           "renewTime": ts(claim.lease_renewed_at)}
    if claim.preemption:
        status["preemption"] = {k: claim.preemption[k] for k in PREEMPTION_FIELDS if claim.preemption.get(k)}
    if queue is None:  # resolved at the fleet stamp the claim's read carries, if it does (``load_claim``)
        queue = queue_status([claim], estimate, stamp=getattr(claim, "fleet_stamp", None)).get(claim.id, {})
    status.update(queue)
    return {"apiVersion": k8s.V1, "kind": "ResourceClaim", "metadata": meta, "spec": claim.spec, "status": status}


def claims_queryset(qs):
    return qs.select_related("namespace", "owner").prefetch_related("reservations__consumer")


# The reads of one claim (GET, and the writes that answer with the claim): what ``claims_queryset`` loads, with
# the querysets compiled once (draservice.prepared). Stand-ins: no namespace or name holds a NUL, no id is < 0.
# ``reserved``: whether any reservation exists (most claims have none), so that their read is skipped then;
# ``fleet_stamp``: what the answer's queue is resolved at (``render_claim``).
_CLAIM_BY_NAME = Prepared(lambda ns, name: ResourceClaim.objects.select_related("namespace", "owner")
                          .annotate(reserved=Exists(Reservation.objects.filter(claim_id=OuterRef("pk"))),
                                    fleet_stamp=claims_sql.fleet_stamp_expression())
                          .filter(namespace__name=ns, name=name).order_by(), ("\x00ns", "\x00name"))
_RESERVATIONS = Prepared(lambda claim_id: Reservation.objects.select_related("consumer").filter(claim_id=claim_id),
                         (-7_000_000_001,))


_PHASE = Prepared(lambda claim_id: ResourceClaim.objects.only("id", "phase").filter(pk=claim_id).order_by(),
                  (-7_000_000_001,))


def claim_phase(claim_id: int) -> str | None:
    """The claim's phase now (None: deleted); a long poll asks every couple of seconds."""
    claim = _PHASE.first(claim_id)
    return claim.phase if claim is not None else None


def load_claim(namespace: str, name: str) -> ResourceClaim | None:
    """The claim ``namespace``/``name`` as ``claims_queryset`` loads it (namespace, owner, reservations with
    their consumers), or None."""
    claim = _CLAIM_BY_NAME.first(namespace, name)
    if claim is not None:
        attach_reservations(claim)
    return claim


def attach_reservations(claim: ResourceClaim) -> None:
    """The reservations of a claim read with the ``reserved`` annotation: read only if it says there are any
    (it was read in the claim's own statement, one snapshot: most claims have none)."""
    if claim.reserved:  # type: ignore[attr-defined]  # the annotation
        load_reservations(claim)
    else:
        set_prefetched(claim, "reservations", [])


def load_reservations(claim: ResourceClaim) -> None:
    """Read the claim's reservations (with their consumers) now: ``claim.reservations.all()`` answers them."""
    set_prefetched(claim, "reservations", _RESERVATIONS.rows(claim.id), back="claim")


def render_claims(claims) -> list[dict]:
    """Render claims loaded through ``claims_queryset`` (no query per claim)."""
    claims = list(claims)
    queues = queue_status(claims)
    return [render_claim(c, list(c.reservations.all()), queues.get(c.id, {})) for c in claims]


def render_new_claims(claims: list[ResourceClaim]) -> list[dict]:
    """Claims just created (nothing reserves them yet), their queue looked up once for all. Not their
    ``positionInQueue``: they joined their queue's tail, and a read (GET, list) ranks them. Their queue is
    resolved against the queues as of the fleet state their insert read (``fleet_stamp``, set by the create on
    PostgreSQL): a web process keeps the queues it read at a stamp until a queue write moves it."""
    queues = queue_status(claims, position=False, stamp=getattr(claims[0], "fleet_stamp", None) if claims else None)
    return [render_claim(c, [], queues.get(c.id, {})) for c in claims]


def current_rendering(payload: dict) -> dict:
    """An earlier answer (an ``Idempotency-Key`` replay) re-rendered from its objects as they are now: a
    retried create must not tell a client "Pending" about a claim that has since been allocated or released.
    Objects deleted since keep their first rendering."""
    if payload.get("kind") == "List":
        return {**payload, "items": [current_rendering(item) for item in payload.get("items") or []]}
    uid = (payload.get("metadata") or {}).get("uid")
    if uid is None:  # not a rendering of an object: nothing to read afresh
        return payload
    if payload.get("kind") == "ResourceClaim":
        claim = claims_queryset(ResourceClaim.objects).filter(uid=uid).first()
        if claim is None:
            return payload
        # Rendered as a create answer is (``render_new_claims``): a retried create answers as the first did.
        return render_claim(claim, list(claim.reservations.all()),
                            queue_status([claim], position=False).get(claim.id, {}))
    if payload.get("kind") == "Consumer":
        consumer = Consumer.objects.select_related("namespace").filter(uid=uid).first()
        return render_consumer(consumer) if consumer else payload
    return payload


def render_list(kind: str, items: list[dict], api_version: str = k8s.V1, meta: dict | None = None) -> dict:
    """A Kubernetes list; ``meta``: the paginator's ``list_metadata()`` (resourceVersion, continue)."""
    return {"apiVersion": api_version, "kind": kind, "metadata": dict(meta or {}), "items": items}


def render_template(template: ResourceClaimTemplate) -> dict:
    return {"apiVersion": k8s.V1, "kind": "ResourceClaimTemplate",
            "metadata": _metadata(template, template.namespace.name), "spec": template.spec}


def consumer_phase(claims: list[ResourceClaim]) -> str:
    phases = {c.phase for c in claims}
    if Phase.FAILED in phases:
        return Phase.FAILED
    if Phase.RELEASED in phases:
        return Phase.RELEASED
    if claims and phases == {Phase.ALLOCATED}:
        return Phase.ALLOCATED
    return Phase.PENDING


def render_consumer(consumer: Consumer, reservations: list | None = None) -> dict:
    if reservations is None:
        reservations = list(consumer.reservations.select_related("claim"))
    by_entry = {r.entry: r.claim for r in reservations}
    statuses = [{"name": e["name"], "resourceClaimName": by_entry[e["name"]].name,
                 "phase": str(by_entry[e["name"]].phase)}
                for e in consumer.spec.get("resourceClaims", []) if e["name"] in by_entry]
    claims = list(by_entry.values())
    status = {"phase": str(consumer_phase(claims)), "resourceClaimStatuses": statuses}
    status.update(_unit_queue_status(claims))
    nodes = {(c.cluster, c.node) for c in claims if c.phase == Phase.ALLOCATED}
    if len(nodes) == 1:
        cluster, node = nodes.pop()
        status["cluster"] = cluster
        if node:
            status["node"] = node
    return {"apiVersion": CONSUMER_API_VERSION, "kind": "Consumer",
            "metadata": _metadata(consumer, consumer.namespace.name), "spec": consumer.spec, "status": status}


def _unit_queue_status(claims: list[ResourceClaim]) -> dict:
    """A consumer's (or gang's) queue fields: its claims' queue, and the first place one of them holds."""
    queues = queue_status(claims)
    if not queues:
        return {}
    out = dict(next(iter(queues.values())))
    out.pop("positionInQueue", None)
    places = [q["positionInQueue"] for q in queues.values() if "positionInQueue" in q]
    if places:
        out["positionInQueue"] = min(places)
    return out


unit_queue_status = _unit_queue_status


def render_event(event: ClaimEvent) -> dict:
    out = {"type": event.type, "reason": event.reason, "message": event.message, "time": ts(event.created_at),
           "claim": {"namespace": event.namespace, "name": event.claim_name, "uid": str(event.claim_uid)}}
    if event.data:
        out["data"] = event.data
    return out


# --------------------------------------------------------------------------------------------- schema only

class KubeObjectSerializer(serializers.Serializer):
    """A Kubernetes object (JSON or YAML): apiVersion, kind, metadata, spec; status on the way out."""

    apiVersion = serializers.CharField(required=False)
    kind = serializers.CharField(required=False)
    metadata = serializers.DictField()
    spec = serializers.DictField()
    # Not read-only: a read-only field is required in the response schema, and templates have no status.
    status = serializers.DictField(required=False, help_text="set by the server (claims, consumers); ignored "
                                                             "on the way in")


class KubeListSerializer(serializers.Serializer):
    apiVersion = serializers.CharField(required=False)
    kind = serializers.CharField(required=False)
    items = KubeObjectSerializer(many=True)


class RenewSerializer(serializers.Serializer):
    ttl = serializers.CharField(required=False, help_text="new lease duration, e.g. 15m (default: the claim's)")


class ExplainSerializer(serializers.Serializer):
    claim = serializers.DictField()
    phase = serializers.CharField()
    reason = serializers.CharField()
    message = serializers.CharField()
    current = serializers.BooleanField(help_text="whether the diagnostics were computed at the current fleet version")
    diagnostics = serializers.DictField(allow_null=True)


class EventSerializer(serializers.Serializer):
    type = serializers.CharField()
    reason = serializers.CharField()
    message = serializers.CharField()
    time = serializers.DateTimeField()
    # DRF's serializer metaclass takes declared fields off the class: this does not shadow ``Serializer.data``.
    data = serializers.DictField(required=False)  # type: ignore[assignment]


class UtilisationSerializer(serializers.ModelSerializer):
    class Meta:
        model = UtilisationSnapshot
        fields = ["taken_at", "cluster", "driver", "product", "devices_total", "devices_allocated",
                  "shares_allocated"]
