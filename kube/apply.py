"""Server-side apply (``PATCH`` with ``application/apply-patch+yaml``) and ``metadata.managedFields`` at the /k8s
door, as kube-apiserver answers them. The merge and the field sets are ``kube.managed`` and ``kube.fieldsets``
(pure); this module keeps each object's managers (``kube.models.ManagedFields``) and drives the stores.

Every write through the door is recorded: creates, updates and patches as ``Update`` entries of their
``fieldManager`` (else the User-Agent's product, as upstream), applies as ``Apply`` entries. An apply that
changes neither the object nor its managers writes nothing (the object's resourceVersion stays)."""
from __future__ import annotations

import json

from django.db import transaction
from django.utils import timezone

from draservice import dryrun
from draservice.errors import ServiceError
from draservice.problems import FieldError
from kube import fieldsets, managed, schemas
from kube.models import ManagedFields
from kube.registry import Resource
from kube.status import KubeError
from kube.stores import check_version

MAX_MANAGER = 128


def _invalid_options(causes: list[tuple[str, str, str]]) -> KubeError:
    listed = [f"{field}: {message}" for field, _, message in causes]
    shown = listed[0] if len(listed) == 1 else "[" + ", ".join(listed) + "]"
    return KubeError(422, f'PatchOptions.meta.k8s.io "" is invalid: {shown}', "Invalid",
                     {"group": "meta.k8s.io", "kind": "PatchOptions",
                      "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes]})


def write_options(params, is_apply: bool) -> tuple[str, bool]:
    """``fieldManager`` and ``force``, checked as kube-apiserver's ValidatePatchOptions does."""
    manager, force = params.get("fieldManager", ""), params.get("force")
    causes = []
    if force is not None and not is_apply:
        causes.append(("force", "FieldValueForbidden", "Forbidden: may not be specified for non-apply patch"))
    if is_apply and not manager:
        causes.append(("fieldManager", "FieldValueRequired", "Required value: is required for apply patch"))
    if len(manager.encode()) > MAX_MANAGER:
        causes.append(("fieldManager", "FieldValueTooLong", f"Too long: may not be more than {MAX_MANAGER} bytes"))
    elif not manager.isprintable():
        causes.append(("fieldManager", "FieldValueInvalid",
                       f"Invalid value: {json.dumps(manager)}: must only contain printable characters"))
    if causes:
        raise _invalid_options(causes)
    if force not in (None, "", "true", "false", "True", "False", "1", "0"):
        raise KubeError(400, f'invalid boolean value for force: "{force}"')
    return manager, force in ("true", "True", "1")


def manager_of(request) -> str:
    """An update's manager: its fieldManager, else the User-Agent's product (``kubectl``), as upstream."""
    given = request.query_params.get("fieldManager")
    if given:
        return given
    return (request.headers.get("User-Agent") or "").split("/")[0][:MAX_MANAGER] or "unknown"


def _now() -> str:
    return timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ")


def _where(resource: Resource, rendered: dict) -> dict:
    meta = rendered.get("metadata") or {}
    return {"resource": resource.plural, "namespace": meta.get("namespace") or "" if resource.namespaced else "",
            "name": meta.get("name") or ""}


def owners_of(resource: Resource, rendered: dict) -> list[managed.Owner]:
    row = ManagedFields.objects.filter(**_where(resource, rendered)).first()
    uid = str((rendered.get("metadata") or {}).get("uid") or "")
    return managed.decode(row.entries) if row is not None and row.uid == uid else []


def save(resource: Resource, rendered: dict, owners: list[managed.Owner]) -> None:
    entries = managed.encode(owners)
    where = _where(resource, rendered)
    if not entries:
        ManagedFields.objects.filter(**where).delete()
        return
    ManagedFields.objects.update_or_create(**where, defaults={
        "uid": str((rendered.get("metadata") or {}).get("uid") or ""), "entries": entries})


def attach(resource: Resource, rendered: list[dict]) -> None:
    """``metadata.managedFields`` on each rendered object that has managers (one query for a page)."""
    if not rendered:
        return
    names = {str((r.get("metadata") or {}).get("name") or "") for r in rendered}
    rows = {(row.namespace, row.name): row for row in ManagedFields.objects.filter(
        resource=resource.plural, name__in=names)}
    for obj in rendered:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            continue
        row = rows.get((meta.get("namespace") or "" if resource.namespaced else "", meta.get("name") or ""))
        if row is not None and row.uid == str(meta.get("uid") or "") and row.entries:
            meta["managedFields"] = row.entries


def forget(resource: Resource, rendered: dict) -> None:
    ManagedFields.objects.filter(**_where(resource, rendered)).delete()


def node_of(resource: Resource, version: str):
    return schemas.definition(resource.kind, resource.group, version)


def track(view, before: dict, after: dict, body: dict | None) -> None:
    """Record a create (``before`` {}), update or patch by its manager; ``after`` gets its managedFields.
    Managers a body names in ``metadata.managedFields`` replace the stored ones (how clients reset them, and
    how kubectl moves client-side apply's fields to its server-side manager)."""
    resource, version = view.resource, view.kwargs["version"]
    given = managed.decode(((body or {}).get("metadata") or {}).get("managedFields"))
    owners = given or (owners_of(resource, after) if before else [])
    owners = managed.update(before, after, owners, manager_of(view.request), resource.api_version(version),
                            node_of(resource, version), _now())
    save(resource, after, owners)
    attach(resource, [after])


def serve(view, request, kw) -> tuple[dict, int, list[str]]:
    """An apply: the object as stored after it, the status code (201 when it created the object), warnings."""
    manager, force = write_options(request.query_params, True)
    config = view._body(request)
    if (config.get("metadata") or {}).get("managedFields") is not None:
        raise KubeError(400, "metadata.managedFields must be nil")
    if not config.get("apiVersion") or not config.get("kind"):
        raise KubeError(400, "apiVersion and kind must be set in an applied configuration")
    namespace, name, version = kw.get("namespace"), kw["name"], kw["version"]
    cleaned, warnings = view._check_body(config, namespace, name)
    try:
        obj = view.store.get(namespace, name)
    except KubeError as exc:
        if exc.code != 404:
            raise
        obj = None
    live = view.store.render(obj, version) if obj is not None else {}
    if obj is not None:
        dryrun.keep_version(live["metadata"].get("resourceVersion"))
        check_version(view.resource, config, live["metadata"].get("resourceVersion"), name)
    owners = owners_of(view.resource, live) if obj is not None else []
    api_version = view.resource.api_version(version)
    try:
        merged, after = managed.apply(live, cleaned, owners, manager, api_version, force,
                                      node_of(view.resource, version), _now())
    except managed.ApplyConflict as exc:
        raise KubeError(409, str(exc), "Conflict", {"causes": managed.conflict_causes(exc.conflicts)}) from None
    body = _object(merged, view.resource, version, namespace, name)
    with transaction.atomic():
        if obj is None:
            created = view.store.create(view, namespace, view._check_body(body, namespace, name)[0])
            rendered = view.store.render(created, version)
            save(view.resource, rendered, after)
            attach(view.resource, [rendered])
            return rendered, 201, warnings
        if _same(view.store, live, merged, version):
            if managed.encode(after) != managed.encode(owners):
                save(view.resource, live, after)
            attach(view.resource, [live])
            return live, 200, warnings
        save(view.resource, live, after)
        rendered, more = view.replaced(obj, view._check_body(body, namespace, name)[0])
        attach(view.resource, [rendered])
        return rendered, 200, warnings + more


def _object(merged: dict, resource: Resource, version: str, namespace: str | None, name: str) -> dict:
    meta = {**(merged.get("metadata") or {}), "name": name}
    if namespace:
        meta["namespace"] = namespace
    return {**merged, "apiVersion": resource.api_version(version), "kind": resource.kind, "metadata": meta}


def _same(store, live: dict, merged: dict, version: str) -> bool:
    """Whether the merged object is what is stored already, as the store compares them (its defaults)."""
    before = fieldsets.managed_part(live)
    if before == merged:
        return True
    try:
        return bool(store.canonical(before, version) == store.canonical(merged, version))
    except (FieldError, ServiceError):
        return False
