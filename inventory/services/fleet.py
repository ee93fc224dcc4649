"""Admin-managed, fleet-wide DeviceClasses and DeviceTaintRules (cluster-scoped ones come with pushes)."""
from __future__ import annotations

from django.db import IntegrityError, transaction

from dra.k8s import slices as k8s
from draservice import audit
from draservice.errors import Conflict, Invalid, PreconditionFailed
from draservice.etag import check_if_match
from inventory.models import DeviceClass, DeviceTaintRule
from inventory.services.sync import cel_compiler, taint_rule_columns
from inventory.signals import send_after_commit

KINDS = {
    DeviceClass: (lambda obj: k8s.normalize_device_class(obj, cel_compiler(pushed=False)), lambda obj: {},
                  "deviceclass"),
    DeviceTaintRule: (k8s.normalize_device_taint_rule, taint_rule_columns, "devicetainterule"),
}


def audited(obj: dict) -> dict:
    """What the audit trail records of a fleet object: its spec, labels and annotations."""
    meta = obj.get("metadata") or {}
    return {"metadata": {"labels": meta.get("labels") or {}, "annotations": meta.get("annotations") or {}},
            "spec": obj.get("spec")}


def _normalize(model, body, url_name: str | None):
    normalize, _, _ = KINDS[model]
    if isinstance(body, dict) and "object" in body and "spec" not in body:
        body = body["object"]  # accept the read representation back
    if url_name and isinstance(body, dict) and isinstance(body.get("metadata"), dict) \
            and not body["metadata"].get("name"):
        body = {**body, "metadata": {**body["metadata"], "name": url_name}}
    try:
        obj = normalize(body)
    except k8s.ObjectInvalid as exc:
        raise Invalid(exc.errors) from exc
    if url_name and obj["metadata"]["name"] != url_name:
        raise Invalid([("metadata.name", f"Invalid value: {obj['metadata']['name']!r}: must match the name "
                                            f"in the URL ({url_name!r})")])
    return obj


def create_fleet_object(model, body):
    obj = _normalize(model, body, None)
    _, columns, reason = KINDS[model]
    try:
        with transaction.atomic():
            row = model.objects.create(cluster=None, name=obj["metadata"]["name"], object=obj, **columns(obj))
            audit.record(model.__name__, row.name, audit.CREATE, None, audited(obj))
    except IntegrityError as exc:
        raise Conflict(f"{model.__name__} {obj['metadata']['name']!r} already exists.") from exc
    send_after_commit(cluster=None, cluster_id=None, inventory_version=None, reason=reason)
    return row


def replace_fleet_object(model, name: str, body, if_match: list[str] | None):
    """PUT: replace (or create when absent and If-Match is not given). Returns (row, created)."""
    obj = _normalize(model, body, name)
    _, columns, reason = KINDS[model]
    with transaction.atomic():
        row = model.objects.select_for_update().filter(cluster=None, name=name).first()
        if row is None:
            if if_match is not None:
                raise PreconditionFailed(f"{model.__name__} {name!r} does not exist, so If-Match cannot match.")
            row = model.objects.create(cluster=None, name=name, object=obj, **columns(obj))
            audit.record(model.__name__, name, audit.CREATE, None, audited(obj))
            created = True
        else:
            check_if_match(if_match, row.resource_version)
            created = False
            if row.object == obj:
                return row, False  # nothing changed: same ETag, nobody to tell
            audit.record(model.__name__, name, audit.UPDATE, audited(row.object), audited(obj))
            row.object = obj
            for key, value in columns(obj).items():
                setattr(row, key, value)
            row.resource_version += 1
            row.save()
        send_after_commit(cluster=None, cluster_id=None, inventory_version=None, reason=reason)
    return row, created


def delete_fleet_object(model, name: str, if_match: list[str] | None) -> None:
    _, _, reason = KINDS[model]
    with transaction.atomic():
        row = model.objects.select_for_update().get(cluster=None, name=name)
        check_if_match(if_match, row.resource_version)
        audit.record(model.__name__, name, audit.DELETE, audited(row.object), None)
        row.delete()
        send_after_commit(cluster=None, cluster_id=None, inventory_version=None, reason=reason)
