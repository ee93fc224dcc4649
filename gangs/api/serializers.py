"""The Gang object out (``draservice.io/v1alpha1``, kind ``Gang``): spec as given (normalized), status as
the worker left it. Plain functions, as in the claims API; the DRF serializer documents the schema."""
from __future__ import annotations

from rest_framework import serializers

from claims.api.serializers import ts, unit_queue_status
from claims.models import ResourceClaim
from gangs.models import Gang, GangEvent, GangPhase
from gangs.spec import API_VERSION, KIND


def current_rendering(payload: dict) -> dict:
    """A replayed create's Gang as it is now (see ``claims.api.serializers.current_rendering``)."""
    uid = (payload.get("metadata") or {}).get("uid")
    if uid is None:  # not a rendering of a gang: nothing to read afresh
        return payload
    gang = Gang.objects.select_related("namespace").filter(uid=uid).first()
    return render_gang(gang) if gang else payload


def render_gang(gang: Gang, members: list | None = None) -> dict:
    """``members``: ``(GangMember, [claim names])`` pairs for the detail view; None leaves them out (lists)."""
    meta = {"name": gang.name, "namespace": gang.namespace.name, "uid": str(gang.uid),
            "resourceVersion": str(gang.resource_version), "generation": 1, "creationTimestamp": ts(gang.created_at)}
    if gang.labels:
        meta["labels"] = gang.labels
    if gang.annotations:
        meta["annotations"] = gang.annotations
    status: dict = {"phase": gang.phase, "reason": gang.reason, "message": gang.message,
                    "minMember": gang.min_member, "members": gang.member_count, "placed": gang.placed_count,
                    "waiting": gang.waiting_count, "attempts": gang.attempts}
    if gang.conditions:
        status["conditions"] = gang.conditions
    status.update(unit_queue_status(list(ResourceClaim.objects.select_related("namespace").filter(
        reservations__consumer__gang_member__gang=gang).distinct())))  # its queue, its first place there
    if gang.cluster:
        status["placement"] = {"cluster": gang.cluster, "domain": gang.in_level_order(gang.domain),
                               "preferredDomains": gang.preferred_domains}
    diag = gang.diagnostics or {}
    if gang.phase == GangPhase.PENDING and diag:
        status["pending"] = {"reason": diag.get("reason"), "closest": diag.get("closest"),
                             "domains": (diag.get("domains") or [])[:5],
                             "fleetCapacity": (diag.get("diagnostics") or {}).get("fleetCapacity"),
                             "memberFailure": (diag.get("diagnostics") or {}).get("memberFailure")}
    for key, value in (("lastAttemptTime", gang.last_attempt_at), ("placedTime", gang.placed_at),
                       ("deadline", gang.deadline), ("finishedTime", gang.finished_at)):
        if value:
            status[key] = ts(value)
    if members is not None:
        status["memberStatuses"] = [
            {"name": m.name, "consumer": m.consumer.name if m.consumer_id else None, "phase": m.phase,
             "cluster": m.cluster or None, "node": m.node or None, "labels": gang.in_level_order(m.labels),
             "claims": names}
            for m, names in members]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": gang.spec, "status": status}


def render_event(e: GangEvent) -> dict:
    return {"type": e.type, "reason": e.reason, "message": e.message, "data": e.data, "time": ts(e.created_at),
            "gang": {"namespace": e.namespace, "name": e.gang_name, "uid": str(e.gang_uid)}}


class GangSerializer(serializers.Serializer):
    """For the OpenAPI schema only: a ``draservice.io/v1alpha1`` Gang (see ``gangs.spec``)."""

    apiVersion = serializers.CharField(default=API_VERSION)
    kind = serializers.CharField(default=KIND)
    metadata = serializers.DictField()
    spec = serializers.DictField()
    status = serializers.DictField(read_only=True)
